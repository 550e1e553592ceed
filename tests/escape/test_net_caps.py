"""Per-session caps that keep one sandbox from holding the daemon's resources."""

from __future__ import annotations

import pytest

from tests.conftest import NetBoxy
from tests.harness.topology import Topology

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


def test_dns_over_tcp_connections_are_capped_per_session(netboxy: NetBoxy) -> None:
    r = netboxy.run("--net", "public", cmd=["python3", "-c", HOLD_DNS_TCP], timeout=60)
    out = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert r.returncode == 0, r.stderr
    assert 0 < int(out["ALIVE"]) <= 64, out
    assert out["LOOKUP"] == "0"


UDP_NO_BINDING = r"""
import socket, time
for addr in ("11.0.0.50", "2a0b:4000::50"):  # udp.boxy.test, never resolved here
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM); s.settimeout(2); s.connect((addr, 9999))
    t = time.monotonic()
    try:
        s.send(b"boxy-probe")
        data = s.recv(100)
        print(addr, "ESCAPED" if data else "empty")
    except ConnectionRefusedError:
        print(addr, "refused", round((time.monotonic() - t) * 1000))
    except OSError as e:
        print(addr, "error", e.errno)
"""


def test_udp_refused_by_the_gateway_fails_fast(netboxy: NetBoxy, net: Topology) -> None:
    # A datagram to an address no allowed name answered with: boxyd refuses it, and
    # the client learns it at once (port unreachable), like TCP's reset.
    r = netboxy.run(
        "--net",
        "allowlist",
        "--allow-host",
        "udp.boxy.test:9999/udp",
        cmd=["python3", "-c", UDP_NO_BINDING],
    )
    assert b"ESCAPED" not in r.stdout
    lines = [line.split() for line in r.stdout.decode().splitlines()]
    assert [line[:2] for line in lines] == [
        ["11.0.0.50", "refused"],
        ["2a0b:4000::50", "refused"],
    ], (r.stdout, r.stderr)
    assert all(int(line[2]) < 500 for line in lines), lines
    assert not [e for e in net.server_events("udp") if e.get("kind") == "udp" or "udp" in str(e)]
