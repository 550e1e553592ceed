"""Per-session caps that keep one sandbox from holding the daemon's resources."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sandbox

HOLD_DNS_TCP = r"""
import socket, struct, time
held, reset = [], 0
for i in range(100):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(("10.0.2.2", 53))
        held.append(s)
    except OSError:
        reset += 1
time.sleep(0.3)
alive = 0
for s in held:  # one over the cap was accepted (TPROXY) and then reset
    s.setblocking(False)
    try:
        s.recv(1)  # b"": closed
    except BlockingIOError:
        alive += 1  # still open, waiting for a query
    except OSError:
        pass  # reset
print("ALIVE", alive)
# the session's own UDP DNS still answers while the TCP slots are full
import subprocess
print("LOOKUP", subprocess.run(["getent", "hosts", "www.boxy.test"], capture_output=True).returncode)
"""


def test_dns_over_tcp_connections_are_capped_per_session(netboxy) -> None:
    r = netboxy.run("--net", "public", cmd=["python3", "-c", HOLD_DNS_TCP], timeout=60)
    out = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert r.returncode == 0, r.stderr
    assert 0 < int(out["ALIVE"]) <= 64, out
    assert out["LOOKUP"] == "0"
