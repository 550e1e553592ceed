"""--tailscale in the test internet (no tailscaled there): the tailnet's ranges are
opened, nothing else is, and the missing MagicDNS is said out loud."""

from __future__ import annotations

# connect, then wait for the far side to have the bytes (the recorder closes once it
# read them): the local handshake alone completes before boxyd has even dialled
PROBE = ("import socket\n"
         "s = socket.socket(); s.settimeout(5)\n"
         "try:\n    s.connect(('100.64.1.1', 80)); s.sendall(b'hi'); s.recv(16); print('connected')\n"
         "except OSError as e:\n    print('refused', e.errno)\n")


def test_without_tailscaled_ranges_open_and_the_user_is_told(netboxy, net) -> None:
    r = netboxy.run("--net", "public", "--tailscale", cmd=["python3", "-c", PROBE])
    assert r.returncode == 0, r.stderr
    assert b"tailscaled is not running" in r.stderr
    assert r.stdout.strip() == b"connected"
    assert net.recorder_hits("cgnat") > 0


def test_without_tailscale_the_tailnet_range_is_refused(netboxy, net) -> None:
    r = netboxy.run("--net", "public", cmd=["python3", "-c", PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"refused")
    assert net.recorder_hits("cgnat") == 0


def test_tailscale_relaxes_nothing_else_in_allowlist_mode(netboxy, net) -> None:
    # A hard-coded tailnet address has no DNS binding: still refused. (The handshake
    # may complete — TPROXY — but no byte from the host comes back.)
    probe = ("import socket\n"
             "s = socket.socket(); s.settimeout(3)\n"
             "try:\n"
             "    s.connect(('100.64.1.1', 80)); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
             "    print('ESCAPED' if s.recv(100) else 'closed')\n"
             "except OSError as e:\n    print('refused', e.errno)\n")
    r = netboxy.run("--net", "allowlist", "--allow-host", "www.boxy.test", "--tailscale",
                    cmd=["python3", "-c", probe])
    assert b"ESCAPED" not in r.stdout
    assert r.stdout.startswith((b"refused", b"closed")), (r.stdout, r.stderr)
    assert net.recorder_hits("cgnat") == 0
