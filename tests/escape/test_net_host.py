"""The gateway dials from the host's network namespace: an address the host itself
holds must not become a way to its own services, even a public one (a server bound
to 0.0.0.0 answers on every address the machine has) and even in public mode."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import NetBoxy
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

HOST_PUBLIC = "11.77.0.1"  # public-looking, held by the topology's host netns only
LISTENER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 18081)); s.listen(16); s.settimeout(30)
print("LISTENING", flush=True)
try:
    while True:
        c, peer = s.accept()
        print("HIT", peer, flush=True)
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\nhost service\n"); c.close()
except socket.timeout:
    pass
"""
PROBE = r"""
import socket
for addr, port in (("HOST_PUBLIC", 18081), ("11.0.0.10", 8080)):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((addr, port)); s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        data = s.recv(100)
        print(addr, "ESCAPED" if b"host service" in data else "answered" if data else "closed")
    except OSError as e:
        print(addr, "refused", e.errno)
""".replace("HOST_PUBLIC", HOST_PUBLIC)


@pytest.fixture
def host_service(net: Topology, netboxy: NetBoxy) -> Iterator[subprocess.Popen[str]]:
    # First a flow, so boxyd has looked at the host's addresses just before this one
    # appears (a cache refreshed on a timer would then still miss it).
    warm = netboxy.run(
        "--net",
        "public",
        cmd=[
            "python3",
            "-c",
            "import socket; socket.create_connection(('11.0.0.10', 80), timeout=3).close()",
        ],
    )
    assert warm.returncode == 0, warm.stderr
    subprocess.run(
        ["ip", "-n", net.host_ns, "addr", "add", f"{HOST_PUBLIC}/32", "dev", "lo"], check=True
    )
    server = subprocess.Popen(
        net.exec_in_host([sys.executable, "-c", LISTENER]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "LISTENING"
        yield server
    finally:
        server.kill()
        server.wait()
        subprocess.run(["ip", "-n", net.host_ns, "addr", "del", f"{HOST_PUBLIC}/32", "dev", "lo"])


@pytest.mark.parametrize(
    "mode",
    [
        ["--net", "public"],
        # named as a host of its own: the binding is there, and
        # only the host-address check stands in the way
        ["--net", "allowlist", "--allow-host", f"{HOST_PUBLIC}:18081"],
    ],
)
def test_the_hosts_own_public_address_is_refused(
    netboxy: NetBoxy, host_service: subprocess.Popen[str], mode: list[str]
) -> None:
    r = netboxy.run(*mode, "-v", cmd=["python3", "-c", PROBE])
    lines = dict(line.split(" ", 1) for line in r.stdout.decode().splitlines())
    assert "ESCAPED" not in r.stdout.decode()
    assert lines[HOST_PUBLIC].startswith(("refused", "closed")), (r.stdout, r.stderr)
    assert b"an address of this machine" in r.stderr
    if mode[1] == "public":  # the control: the fake internet's server on that port answers
        assert lines["11.0.0.10"] == "answered", (r.stdout, r.stderr)
    host_service.kill()
    out, _ = host_service.communicate()
    assert "HIT" not in out
