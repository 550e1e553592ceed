"""Attack 34: `boxyctl deny` on a running session, in the test internet.

One run, one `boxyctl deny` of three hosts, three claims attacked (README, "Widening a
session while it runs"; docs/design.md, "Changed while it runs"):

- pool: a connection accepted before the deny and still waiting out its first record
  (here a server-first one: other.boxy.test:2222, allowed with its port) is not an
  open flow the deny re-judges; it was judged afterwards by the verdict taken at its
  accept. The payload keeps opening such connections, so one is always in that
  window; after the deny, a line it sends still comes back from the denied host.
- cname: cname.boxy.test (allowed) is a CNAME chain to www.boxy.test (denied): its
  answer still resolves the denied name, and its address is reached.
- address: `deny 11.0.0.20` (every port, says the README) while cdn-a.boxy.test is
  allowed and answers with that address: the address is still reached through the name.

A probe prints `ESCAPED` only when the denied host answered after the deny.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import User
from tests.escape.netutil import parse_probes
from tests.escape.test_net_names import Live, probe_dir, script, start_run
from tests.escape.test_policy_live import boxyctl_in
from tests.harness.fakenet import plan
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

CDN_V4 = plan.SERVER_BY_NAME["cdn"].v4 or ""

BODY = r"""
WAIT_S = 30

def line_back(s, text, timeout=2.0):
    s.settimeout(timeout)
    s.sendall(text + b"\n")
    got, t0 = b"", time.time()
    while text not in got and time.time() - t0 < timeout:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return text in got

other = resolve("other.boxy.test", socket.AF_INET)[0]
pool, t0 = [], time.time()
print("POOL", flush=True)
while not os.path.exists("denied") and time.time() - t0 < WAIT_S:
    try:
        pool.append(socket.create_connection((other, 2222), timeout=2))
    except OSError:
        pass
    while len(pool) > 40:
        pool.pop(0).close()
    time.sleep(0.03)
time.sleep(1.0)  # every connection of the pool judged by now (0.25 s server-first wait)
back = 0
for s in pool:
    try:
        back += line_back(s, b"after-deny", 1.0)
    except OSError:
        pass
    s.close()
report("pool", "answered" if back else "cut", escaped=bool(back), count=back,
       total=len(pool))

r = dnsq("cname.boxy.test", "A")
www = [a for t, a in r.get("answers", []) if t == 1]
chain = [a for t, a in r.get("answers", []) if t == 5]
report("cname-dns", r.get("outcome", "?"), escaped=bool(www) and "www.boxy.test" in chain,
       addrs=www, chain=chain)
if www:
    got = https(www[0], 443, "cname.boxy.test", verify=True, timeout=3)
    report("cname-reach", got, escaped=got.get("status") == 200 and "www" in str(got))

cdn = resolve("cdn-a.boxy.test", socket.AF_INET)
if cdn:
    got = https(cdn[0], 443, "cdn-a.boxy.test", verify=True, timeout=3)
    report("address", got, escaped=cdn[0] == "__CDN__" and got.get("status") == 200, addr=cdn[0])
else:
    report("address", "unresolved")
print("DONE", flush=True)
""".replace("__CDN__", CDN_V4)


@dataclass
class DenyRun:
    live: Live
    rc: int
    deny: subprocess.CompletedProcess[bytes]

    @property
    def probes(self) -> dict[str, dict[str, object]]:
        return parse_probes(self.live.stdout)

    def describe(self) -> str:
        d = self.deny
        return (
            f"--- run {self.rc}\n{self.live.stdout}\n{self.live.stderr}\n"
            f"--- deny {d.returncode}\n{d.stdout.decode()}{d.stderr.decode()}"
        )


@pytest.fixture(scope="module")
def deny_run(topology: Topology, user: User) -> Iterator[DenyRun]:
    topology.assert_isolated()
    with probe_dir(topology, user, "attack34") as wd:
        fname = script(wd, user, "attack34.py", BODY)
        hosts = ("other.boxy.test:2222", "cname.boxy.test", "www.boxy.test", "cdn-a.boxy.test")
        flags = [x for h in hosts for x in ("--allow-host", h)]
        live = start_run(topology, user, wd, "--net", "allowlist", *flags, cmd=["python3", fname])
        try:
            assert live.wait_line("POOL", 60) is not None, live.stdout + live.stderr
            got = boxyctl_in(topology, user, wd, "ps", "--json")
            sessions = json.loads(got.stdout)["sessions"]
            (sid,) = [s["id"] for s in sessions if "attack34" in str(s["argv"])]
            time.sleep(1.0)  # the pool is full
            deny = boxyctl_in(
                topology, user, wd, "deny", sid, "other.boxy.test", "www.boxy.test", CDN_V4
            )
            (wd / "denied").touch()
            user.chown(wd / "denied")
        finally:
            rc = live.finish(timeout=60)
        yield DenyRun(live, rc, deny)


def test_deny_ran(deny_run: DenyRun) -> None:
    assert deny_run.deny.returncode == 0, deny_run.describe()
    assert "DONE" in deny_run.live.stdout, deny_run.describe()


@pytest.mark.parametrize("probe", ["pool", "cname-dns", "cname-reach", "address"])
def test_a_denied_host_is_not_reached_after_the_deny(deny_run: DenyRun, probe: str) -> None:
    r = deny_run
    assert probe in r.probes or probe == "cname-reach", r.describe()
    assert f"ESCAPED {probe} " not in r.live.stdout, r.describe()
