"""Real clients read boxy's refusals (issue 34 §3, "Test with real clients"), in the test
internet: npm (the node profile's), pip and Python's resolver, each refused by name
(the DNS proxy) and on the wire (after its first record: a 403 for plain HTTP, an
access_denied alert for TLS).

What each prints, as of npm 11 and pip 23:
- a refused name: npm says "getaddrinfo ENOTFOUND NAME", pip "No matching
  distribution" (its index page's failure is a debug line): neither reads DNS
  options, so the EDE's text reaches them not; boxyctl's last lines name the flag.
  dnspython reads the EDE; the libc resolver fails at once (EAI_NONAME).
- plain HTTP: both print the 403's status line, whose reason phrase is boxy's
  (npm: "403 403 Forbidden by boxy: ... - GET URL"; pip: "HTTP error 403 Client
  Error: Forbidden by boxy: ... for url"). pip says nothing of an index page's 403.
- TLS: both print OpenSSL's "tlsv1 alert access denied" (the alert carries no text).

The on-the-wire case is a request to the address of an allowed name (bound by a
lookup first): it names no host, so only a host allowed with its port would take it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import User
from tests.escape.netutil import run_probes
from tests.harness.fakenet import plan
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

WWW = plan.SERVER_BY_NAME["www"].v4
BIND = "getent ahostsv4 www.boxy.test >/dev/null"  # the address gets its binding
FLAGS = ("--allow-host", "www.boxy.test")
# boxyctl's last lines, which the agent reading the run sees with the client's output
SAID_AT_THE_END = (
    "boxyctl: refused.boxy.test: not on the allowlist; --allow-host refused.boxy.test allows it"
)


def sections(stdout: str) -> dict[str, str]:
    """Output between `echo == LABEL` lines, by label."""
    out: dict[str, str] = {}
    label = ""
    for line in stdout.splitlines():
        if line.startswith("== "):
            label = line[3:]
            out[label] = ""
        elif label:
            out[label] += line + "\n"
    return out


def _script(steps: dict[str, str]) -> list[str]:
    body = "; ".join(f"echo '== {label}'; {cmd} 2>&1; echo EXIT $?" for label, cmd in steps.items())
    return ["sh", "-c", f"{BIND}; {body}"]


def _run_steps(
    net: Topology, user: User, workdir: Path, steps: dict[str, str], *flags: str
) -> dict[str, str]:
    """STEPS run in one sandbox: what each printed, by label. Each step's "name" is
    refused by the DNS proxy, and boxyctl names it with its flag; no refused request
    reached the server."""
    run = run_probes(net, user, workdir, *flags, *FLAGS, cmd=_script(steps))
    got = sections(run.stdout)
    assert set(got) == set(steps), run.describe()
    assert SAID_AT_THE_END in run.stderr, run.stderr
    assert not run.server_events, run.server_events
    return got


def test_npm_prints_why_boxy_refused(net: Topology, user: User, workdir: Path) -> None:
    npm = "npm view leftpad --fetch-retries=0 --registry"
    steps = {
        "name": f"{npm} https://refused.boxy.test/",
        "http": f"{npm} http://{WWW}/",
        "tls": f"{npm} https://{WWW}/",
    }
    got = _run_steps(net, user, workdir, steps, "-p", "node")
    assert "getaddrinfo ENOTFOUND refused.boxy.test" in got["name"], got["name"]
    assert (
        "npm error 403 403 Forbidden by boxy: HTTP without Host: only a host allowed with "
        f":80 takes that; --allow-host www.boxy.test:80 allows it (a running session: "
        f"boxyctl allow ID www.boxy.test:80) - GET http://{WWW}/leftpad"
    ) in got["http"], got["http"]
    assert "ERR_SSL_TLSV1_ALERT_ACCESS_DENIED" in got["tls"], got["tls"]
    assert "tlsv1 alert access denied" in got["tls"], got["tls"]


def test_pip_prints_why_boxy_refused(net: Topology, user: User, workdir: Path) -> None:
    pip = f"python3 -m pip download --no-deps -d dl --retries 0 --trusted-host {WWW}"
    steps = {
        "name": f"{pip} --index-url https://refused.boxy.test/simple leftpad",
        "http": f"{pip} http://{WWW}/leftpad-1.0.tar.gz",
        "tls": f"{pip} --index-url https://{WWW}/simple leftpad",
    }
    got = _run_steps(net, user, workdir, steps)
    assert "No matching distribution found for leftpad" in got["name"], got["name"]
    assert (
        "because of HTTP error 403 Client Error: Forbidden by boxy: HTTP without Host: "
        "only a host allowed with :80 takes that; --allow-host www.boxy.test:80 allows it"
    ) in got["http"], got["http"]
    assert "[SSL: TLSV1_ALERT_ACCESS_DENIED] tlsv1 alert access denied" in got["tls"], got["tls"]


RESOLVE = r"""
import socket, time
import dns.resolver
t0 = time.monotonic()
try:
    socket.getaddrinfo("refused.boxy.test", 443)
    print("LIBC resolved")
except socket.gaierror as e:
    print("LIBC", e.errno == socket.EAI_NONAME, round(time.monotonic() - t0, 2), e)
r = dns.resolver.Resolver()
r.use_edns(0, 0, 1232)  # EDNS: room for the EDE
for name in ("refused.boxy.test", "www.boxy.test"):
    try:
        print("DNSPYTHON", name, "answer", r.resolve(name, "A")[0])
    except dns.resolver.NXDOMAIN as e:
        for msg in e.responses().values():
            for ede in msg.extended_errors():
                print("DNSPYTHON", name, "EDE", ede.code, ede.text)
"""


def test_pythons_resolver_fails_cleanly_and_dnspython_reads_the_ede(
    net: Topology, user: User, workdir: Path
) -> None:
    """The libc resolver (socket.getaddrinfo) has no room for the text: it fails at
    once, as for a name that does not exist. dnspython, asked with EDNS, hands the
    program boxy's Extended DNS Error (RFC 8914: 15, Blocked)."""
    import dns

    shutil.copytree(Path(dns.__file__).parent, workdir / "dns")  # the sandbox has none
    user.chown(workdir / "dns")
    run = run_probes(net, user, workdir, *FLAGS, cmd=["python3", "-c", RESOLVE])
    lines = run.stdout.splitlines()
    (libc,) = [ln for ln in lines if ln.startswith("LIBC ")]
    assert libc.startswith("LIBC True ") and float(libc.split()[2]) < 2, run.describe()
    assert (
        "DNSPYTHON refused.boxy.test EDE 15 boxy: refused.boxy.test is not on this "
        "sandbox's allowlist; --allow-host refused.boxy.test allows it (a running session: "
        "boxyctl allow ID refused.boxy.test)"
    ) in lines, run.describe()
    assert f"DNSPYTHON www.boxy.test answer {WWW}" in lines, run.describe()
