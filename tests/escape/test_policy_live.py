"""A running session's policy changed from outside (issue 34 §1), in the test internet:
`boxyctl allow ID HOST` opens a name the payload could not reach a moment before,
`boxyctl deny ID HOST` closes it again and cuts the connection it had open, a port
outside the session's Landlock rules is refused in one line, and each change is in
the audit log with who asked and in `show`. The payload is a real TLS client (Python's
ssl, verifying the test CA) against the topology's www server."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, NetBoxy, User
from tests.escape.netutil import parse_probes
from tests.escape.test_net_names import Live, audit_records, probe_dir, script, start_run
from tests.harness.topology import Topology

BODY = r"""
WAIT_S = 60  # the test answers within seconds; a bound for one that went wrong

def wait_for(name):
    t0 = time.time()
    while not os.path.exists(name) and time.time() - t0 < WAIT_S:
        time.sleep(0.05)

def attempt(label):
    addrs = resolve("www.boxy.test", socket.AF_INET)
    if not addrs:
        return report(label, "unresolved")
    return report(label, https(addrs[0], 443, "www.boxy.test", verify=True, timeout=5))

attempt("before")
print("WAIT-ALLOW", flush=True)
wait_for("allowed")
attempt("allowed")
addr = resolve("www.boxy.test", socket.AF_INET)[0]
held = client_ctx(True).wrap_socket(socket.create_connection((addr, 443), timeout=5),
                                    server_hostname="www.boxy.test")
report("held-open", "open")
print("WAIT-DENY", flush=True)
wait_for("denied")
attempt("after-deny")
try:
    held.sendall(request("www.boxy.test"))
    data = held.recv(4096)
    report("held", "answered" if data else "closed", escaped=bool(data))
except (OSError, ssl.SSLError) as e:
    report("held", "cut", detail=type(e).__name__)
print("DONE", flush=True)
"""


@dataclass
class PolicyRun:
    live: Live
    rc: int
    sid: str
    allow: subprocess.CompletedProcess[bytes]
    port: subprocess.CompletedProcess[bytes]
    deny: subprocess.CompletedProcess[bytes]
    show: str
    audit: list[dict[str, Any]]
    uid: int  # the test user's, who asked

    @property
    def probes(self) -> dict[str, dict[str, Any]]:
        return parse_probes(self.live.stdout)

    def describe(self) -> str:
        said = "\n".join(
            f"--- {name}: {p.returncode}\n{p.stdout.decode()}{p.stderr.decode()}"
            for name, p in (("allow", self.allow), ("port", self.port), ("deny", self.deny))
        )
        return f"--- run {self.rc}\n{self.live.stdout}\n{self.live.stderr}\n{said}"


def boxyctl_in(
    topology: Topology, user: User, wd: Path, *args: str
) -> subprocess.CompletedProcess[bytes]:
    """`boxyctl ARGS` as USER in the topology's host netns, beside its boxyd."""
    argv = [str(BIN / "boxyctl"), *args]
    env = NetBoxy(user, wd, topology).env()
    return subprocess.run(
        topology.exec_in_host(user.cmd(argv, env)), capture_output=True, timeout=60, cwd=wd
    )


def _session_of(topology: Topology, user: User, wd: Path) -> str:
    got = boxyctl_in(topology, user, wd, "ps", "--json")
    assert got.returncode == 0, got
    (sid,) = [s["id"] for s in json.loads(got.stdout)["sessions"] if "policy.py" in s["argv"]]
    return str(sid)


def _touch(wd: Path, user: User, name: str) -> None:
    (wd / name).touch()
    user.chown(wd / name)


@pytest.fixture(scope="module")
def policy_run(topology: Topology, user: User) -> Iterator[PolicyRun]:
    with probe_dir(topology, user, "policy") as wd:
        topology.assert_isolated()
        fname = script(wd, user, "policy.py", BODY)
        audit = wd / "audit.jsonl"
        flags = ("--net", "allowlist", "--allow-host", "other.boxy.test")
        live = start_run(
            topology, user, wd, *flags, "--audit-log", str(audit), cmd=["python3", fname]
        )
        try:
            assert live.wait_line("WAIT-ALLOW", 60) is not None, live.stdout + live.stderr
            sid = _session_of(topology, user, wd)
            allow = boxyctl_in(topology, user, wd, "allow", sid, "www.boxy.test")
            port = boxyctl_in(topology, user, wd, "allow", sid, "www.boxy.test:8443")
            _touch(wd, user, "allowed")
            assert live.wait_line("WAIT-DENY", 60) is not None, live.stdout + live.stderr
            deny = boxyctl_in(topology, user, wd, "deny", sid, "www.boxy.test")
            _touch(wd, user, "denied")
        finally:
            rc = live.finish(timeout=90)
        show = boxyctl_in(topology, user, wd, "show", sid).stdout.decode()
        yield PolicyRun(live, rc, sid, allow, port, deny, show, audit_records(audit), user.uid)


def test_a_name_allowed_while_the_session_runs_is_reachable_at_once(
    policy_run: PolicyRun,
) -> None:
    r = policy_run
    assert r.rc == 0 and "DONE" in r.live.stdout, r.describe()
    assert r.probes["before"]["outcome"] == "unresolved", r.describe()
    assert r.allow.returncode == 0, r.describe()
    said = r.allow.stdout.decode()
    assert f"session {r.sid}: " in said and " allow www.boxy.test (uid " in said, said
    allowed = r.probes["allowed"]
    assert (allowed["outcome"], allowed.get("status")) == ("answered", 200), r.describe()


def test_a_port_the_kernel_fixed_is_refused_in_one_line(policy_run: PolicyRun) -> None:
    r = policy_run
    err = r.port.stderr.decode().strip()
    assert r.port.returncode == 2, r.describe()
    assert len(err.splitlines()) == 1, err
    assert "TCP port 8443" in err and "Landlock" in err, err
    assert "a new run with --allow-host www.boxy.test:8443 allows it" in err, err


def test_a_name_denied_is_refused_and_its_open_connection_cut(policy_run: PolicyRun) -> None:
    r = policy_run
    assert r.deny.returncode == 0, r.describe()
    assert "deny www.boxy.test" in r.deny.stdout.decode(), r.describe()
    assert "1 open connection cut" in r.deny.stdout.decode(), r.describe()
    assert r.probes["after-deny"]["outcome"] == "unresolved", r.describe()
    assert r.probes["held"]["outcome"] in ("cut", "closed"), r.describe()
    assert "ESCAPED" not in r.live.stdout, r.describe()


def test_each_change_is_audited_with_who_asked_and_shown(policy_run: PolicyRun) -> None:
    r = policy_run
    changes = [x for x in r.audit if x.get("layer") == "net.policy" and x.get("hosts")]
    assert [(x["verdict"], x["hosts"]) for x in changes] == [
        ("allow", ["www.boxy.test"]),
        ("deny", ["www.boxy.test"]),
    ], changes
    for x in changes:
        assert x["via"] == "varlink" and isinstance(x["pid"], int) and x["pid"] > 1, x
        assert x["uid"] == r.uid, x
    policy = [ln for ln in r.show.splitlines() if ln.startswith("policy ")]
    assert len(policy) == 2, r.show
    assert " allow www.boxy.test (uid " in policy[0] and ", varlink)" in policy[0], policy
    assert " deny www.boxy.test (uid " in policy[1] and "1 open connection cut" in policy[1]
    # the refused port changed nothing
    assert "8443" not in r.show, r.show
