"""Refusals are visible without -v: after a run with network that refused something,
one line says how much, and a name whose answers boxy removed (they pointed into a
refused range) is named with the --allow-cidr that would open it. Quiet otherwise."""

from __future__ import annotations

import pytest

from tests.escape.netutil import run_probes
from tests.harness.fakenet import plan

pytestmark = pytest.mark.sandbox

PROBE = r"""
import socket
for host in ("rebind-lan.boxy.test", "not-listed.boxy.test"):
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
        print("TRIED", host, "resolved")
    except socket.gaierror as e:
        print("TRIED", host, "refused", e.errno)
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("LAN", 443)); print("TRIED lan connected")
except OSError as e:
    print("TRIED lan refused", e.errno)
""".replace("LAN", plan.LAN_HOST)


def test_refusals_said_without_verbose(net, user, workdir) -> None:
    run = run_probes(net, user, workdir, "--net", "allowlist", "--allow-host", "rebind-lan.boxy.test",
                     "--allow-host", "www.boxy.test", cmd=["python3", "-c", PROBE])
    assert run.proc.returncode == 0, run.describe()
    lines = run.stderr.splitlines()
    summary = [ln for ln in lines if "(-v or --audit-log for details)" in ln]
    assert summary == ["boxyctl: 1 connection refused, 1 name not allowed, 1 DNS answer in a "
                       "refused range removed (-v or --audit-log for details)"], run.stderr
    hint = [ln for ln in lines if ln.startswith("boxyctl: rebind-lan.boxy.test answered with")]
    assert hint and f"--allow-cidr {plan.LAN_HOST}" in hint[0], run.stderr
    assert not any(" deny " in ln for ln in lines), "the denials themselves are -v's"


def test_a_quiet_run_is_quiet(net, user, workdir) -> None:
    run = run_probes(net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test",
                     cmd=["true"])
    assert run.proc.returncode == 0 and run.stderr == "", run.describe()
