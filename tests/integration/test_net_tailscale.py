"""--tailscale in the test internet (no tailscaled there): the tailnet's ranges are
opened, nothing else is, and the missing MagicDNS is said out loud."""

from __future__ import annotations

import pytest

from tests.conftest import NetBoxy
from tests.harness.fakenet import plan
from tests.harness.topology import Topology

# connect, then wait for the far side to have the bytes (the recorder closes once it
# read them): the local handshake alone completes before boxyd has even dialled
PROBE = (
    "import socket\n"
    "s = socket.socket(); s.settimeout(5)\n"
    "try:\n    s.connect(('100.64.1.1', 80)); s.sendall(b'hi'); s.recv(16); print('connected')\n"
    "except OSError as e:\n    print('refused', e.errno)\n"
)


def test_without_tailscaled_ranges_open_and_the_user_is_told(
    netboxy: NetBoxy, net: Topology
) -> None:
    r = netboxy.run("--net", "public", "--tailscale", cmd=["python3", "-c", PROBE])
    assert r.returncode == 0, r.stderr
    assert b"tailscaled is not running" in r.stderr
    assert r.stdout.strip() == b"connected"
    assert net.recorder_hits("cgnat") > 0


def test_without_tailscale_the_tailnet_range_is_refused(netboxy: NetBoxy, net: Topology) -> None:
    r = netboxy.run("--net", "public", cmd=["python3", "-c", PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"refused")
    assert net.recorder_hits("cgnat") == 0


def test_tailscale_relaxes_nothing_else_in_allowlist_mode(netboxy: NetBoxy, net: Topology) -> None:
    # A hard-coded tailnet address has no DNS binding: still refused. (The handshake
    # may complete — TPROXY — but no byte from the host comes back.)
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n"
        "    s.connect(('100.64.1.1', 80)); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "    print('ESCAPED' if s.recv(100) else 'closed')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
    )
    r = netboxy.run(
        "--net",
        "allowlist",
        "--allow-host",
        "www.boxy.test",
        "--tailscale",
        cmd=["python3", "-c", probe],
    )
    assert b"ESCAPED" not in r.stdout
    assert r.stdout.startswith((b"refused", b"closed")), (r.stdout, r.stderr)
    assert net.recorder_hits("cgnat") == 0


# Every port of Tailscale's own addresses, TCP and UDP: refused at the SYN (connect
# fails at once with ECONNREFUSED, no handshake) or with port unreachable, never relayed.
QUAD100_PROBE = r"""
import socket, sys, time
for addr in sys.argv[1:]:
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    for port in (80, 8080, 443, 22):
        s = socket.socket(fam); s.settimeout(5); t = time.monotonic()
        try:
            s.connect((addr, port)); print("ESCAPED tcp", addr, port)
        except OSError as e:
            print("tcp", addr, port, e.errno, "fast" if time.monotonic() - t < 1 else "slow")
    u = socket.socket(fam, socket.SOCK_DGRAM); u.settimeout(2); u.connect((addr, 9999))
    u.send(b"x")
    try:
        u.recv(16); print("ESCAPED udp", addr)
    except OSError as e:
        print("udp", addr, 9999, e.errno)
"""


@pytest.mark.parametrize("mode", ["public", "allowlist"])
def test_tailscales_own_addresses_are_refused_on_every_port(
    netboxy: NetBoxy, net: Topology, mode: str
) -> None:
    # Landlock would refuse an unlisted port before nftables sees it: list them all.
    flags = ["--allow-host", "www.boxy.test:80,8080,443,22"] if mode == "allowlist" else []
    r = netboxy.run(
        "--net",
        mode,
        *flags,
        "--tailscale",
        "-v",
        cmd=["python3", "-c", QUAD100_PROBE, plan.QUAD100_V4, plan.QUAD100_V6],
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "ESCAPED" not in out, out
    lines = out.splitlines()
    for addr in (plan.QUAD100_V4, plan.QUAD100_V6):
        for port in (80, 8080, 443, 22):
            assert f"tcp {addr} {port} 111 fast" in lines, out  # ECONNREFUSED: reset at SYN
        # an ICMP error (prohibited: EHOSTUNREACH for v4, EACCES for v6), not a timeout
        assert any(ln in lines for ln in (f"udp {addr} 9999 113", f"udp {addr} 9999 13")), out
    err = r.stderr.decode()
    for addr in (plan.QUAD100_V4, f"[{plan.QUAD100_V6}]"):
        for port in (80, 8080):
            assert (
                f"net.ip deny tcp://{addr}:{port}: Tailscale's own services "
                "(boxy's upstream resolver only)"
            ) in err, err
    assert net.recorder_hits("quad100") == 0
    assert net.recorder_hits("tailnet") == 0
