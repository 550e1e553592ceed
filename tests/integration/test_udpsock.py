"""The transparent-socket helpers against real TPROXY.

A private topology of two network namespaces made for this module (root only;
nothing leaves them): a "sandbox" netns (eth0 10.0.2.15 / fd00::15, default
routes via the gateway) joined by a veth pair to a "gateway" netns (gw0
10.0.2.2 / fd00::2) whose nftables TPROXY rules and policy routing deliver
whatever the sandbox sends anywhere to the sockets under test. Sockets are made
in either namespace by switching this thread into it for the ``socket()`` call
only; a socket stays in the namespace it was made in.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import select
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from boxyd.net import udpsock
from boxyd.net.udpsock import (
    Datagram,
    make_transparent_tcp_listener,
    make_transparent_udp,
    make_udp_reply_sender,
    recv_datagram,
    send_from,
)
from tests.conftest import User

CLONE_NEWNET = 0x40000000
UDP_PORT, DNS_PORT, TCP_PORT = 15002, 53, 15001
TIMEOUT = 5.0
REPO = Path(__file__).resolve().parents[2]

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Fam:
    family: socket.AddressFamily
    client: str  # the sandbox's address
    remote: str  # a "public" destination, reachable only through TPROXY
    other: str  # a second one


V4 = Fam(socket.AF_INET, "10.0.2.15", "203.0.113.7", "198.51.100.9")
V6 = Fam(socket.AF_INET6, "fd00::15", "2001:db8::7", "2001:db8:1::9")
FAMS = pytest.mark.parametrize("fam", [V4, V6], ids=["v4", "v6"])

RULESET = f"""
table inet boxy_udpsock_test {{
  chain pre {{
    type filter hook prerouting priority mangle; policy accept;
    iifname "gw0" meta nfproto ipv4 udp dport 53 tproxy ip to :{DNS_PORT} meta mark set 1 accept
    iifname "gw0" meta nfproto ipv6 udp dport 53 tproxy ip6 to :{DNS_PORT} meta mark set 1 accept
    iifname "gw0" meta nfproto ipv4 meta l4proto udp tproxy ip to :{UDP_PORT} meta mark set 1 accept
    iifname "gw0" meta nfproto ipv6 meta l4proto udp tproxy ip6 to :{UDP_PORT} meta mark set 1 accept
    iifname "gw0" meta nfproto ipv4 meta l4proto tcp tproxy ip to :{TCP_PORT} meta mark set 1 accept
    iifname "gw0" meta nfproto ipv6 meta l4proto tcp tproxy ip6 to :{TCP_PORT} meta mark set 1 accept
  }}
}}
"""


def _run(*argv: str, input: str | None = None) -> None:
    r = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


class Topology:
    def __init__(self) -> None:
        tag = f"boxy-udpsock-test-{os.getpid()}"
        self.cli, self.gw = f"{tag}-cli", f"{tag}-gw"

    def build(self) -> None:
        c, g = self.cli, self.gw
        _run("ip", "netns", "add", c)
        _run("ip", "netns", "add", g)
        _run(
            "ip", "-n", c, "link", "add", "eth0", "type", "veth", "peer", "name", "gw0", "netns", g
        )
        for ns, dev, v4, v6 in (
            (c, "eth0", "10.0.2.15/24", "fd00::15/64"),
            (g, "gw0", "10.0.2.2/24", "fd00::2/64"),
        ):
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", v4, "dev", dev)
            _run("ip", "-n", ns, "-6", "addr", "add", v6, "dev", dev, "nodad")
            _run("ip", "-n", ns, "link", "set", dev, "up")
        _run("ip", "-n", c, "route", "add", "default", "via", "10.0.2.2")
        _run("ip", "-n", c, "-6", "route", "add", "default", "via", "fd00::2")
        # TPROXY picks the socket; this makes the kernel deliver the packet locally.
        for v in ("-4", "-6"):
            _run("ip", "-n", g, v, "rule", "add", "fwmark", "1", "lookup", "100")
            _run("ip", "-n", g, v, "route", "add", "local", "default", "dev", "lo", "table", "100")
        try:
            _run("ip", "netns", "exec", g, "nft", "-f", "-", input=RULESET)
        except RuntimeError as e:
            # a skip only for what doctor reports missing; any other failure is one
            from boxyd.daemon import doctor

            if not doctor.facts().get("nftables_tproxy"):
                pytest.skip(f"kernel lacks nftables TPROXY (nft_tproxy), as doctor says: {e}")
            raise

    def destroy(self) -> None:
        for ns in (self.cli, self.gw):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    @contextlib.contextmanager
    def inside(self, name: str) -> Iterator[None]:
        """Run the block with this thread in netns NAME (for socket creation)."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        target = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {name}")
            try:
                yield
            finally:
                if _libc.setns(home, CLONE_NEWNET) != 0:  # never run on in the wrong netns
                    err = ctypes.get_errno()
                    os.write(
                        2, f"setns back to the test's own netns failed: errno {err}\n".encode()
                    )
                    os._exit(1)
        finally:
            os.close(home)
            os.close(target)


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create its own network namespaces (ip netns add)")
    t = Topology()
    try:
        t.build()
        yield t
    finally:
        t.destroy()


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Collects sockets a test makes and closes them, so ports are free for the next."""
    made: list[socket.socket] = []
    yield made
    for s in made:
        s.close()


def _wait_readable(sock: socket.socket) -> None:
    r, _, _ = select.select([sock], [], [], TIMEOUT)
    assert r, "nothing arrived within the timeout"


def receive(sock: socket.socket, bufsize: int = 65535) -> Datagram:
    _wait_readable(sock)
    return recv_datagram(sock, bufsize)


def client_socket(
    topo: Topology, fam: Fam, made: list[socket.socket], kind: int = socket.SOCK_DGRAM
) -> socket.socket:
    with topo.inside(topo.cli):
        s = socket.socket(fam.family, kind)
    s.settimeout(TIMEOUT)
    made.append(s)
    return s


def gateway_socket(
    topo: Topology, made: list[socket.socket], make: Callable[..., socket.socket], *args: object
) -> socket.socket:
    with topo.inside(topo.gw):
        s = make(*args)
    made.append(s)
    return s


# -- UDP --------------------------------------------------------------------------------


@FAMS
def test_original_destination_and_a_reply_from_it(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    listener = gateway_socket(topo, sockets, make_transparent_udp, fam.family, UDP_PORT)
    sender = gateway_socket(topo, sockets, make_udp_reply_sender, fam.family)
    client = client_socket(topo, fam, sockets)
    # Connected, as glibc's resolver and most UDP clients are: the kernel then
    # delivers only datagrams whose source is exactly remote:9999.
    client.connect((fam.remote, 9999))
    client.send(b"question")

    dgram = receive(listener)
    assert dgram.data == b"question"
    assert dgram.orig_dst == (fam.remote, 9999)
    assert dgram.src == (fam.client, client.getsockname()[1])
    assert not dgram.truncated

    assert send_from(sender, b"answer", dgram.orig_dst, dgram.src) == 6
    assert client.recv(100) == b"answer"


@FAMS
def test_one_client_socket_many_destinations(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    listener = gateway_socket(topo, sockets, make_transparent_udp, fam.family, UDP_PORT)
    sender = gateway_socket(topo, sockets, make_udp_reply_sender, fam.family)
    client = client_socket(topo, fam, sockets)  # unconnected: it sees every source
    client.bind(("", 0))
    targets = [(fam.remote, 9999), (fam.other, 7777), (fam.remote, 123)]
    for i, t in enumerate(targets):
        client.sendto(b"to %d" % i, t)
    seen = [receive(listener) for _ in targets]
    # (orig_dst is None only from a socket that does not report it: never the listener's)
    assert sorted(d.orig_dst for d in seen) == sorted(targets)  # type: ignore[type-var]
    for d in seen:
        assert d.orig_dst is not None
        send_from(sender, b"from " + d.data[3:], d.orig_dst, d.src)
    got = {}
    for _ in targets:
        data, addr = client.recvfrom(100)
        got[addr[:2]] = data
    assert got == {t: b"from %d" % i for i, t in enumerate(targets)}


@FAMS
@pytest.mark.parametrize("size", [0, 1, 1471, 4001, 60001])
def test_replies_of_any_size_arrive_intact(
    topo: Topology, fam: Fam, size: int, sockets: list[socket.socket]
) -> None:
    # Odd sizes exercise the checksum's padding; past the MTU (1500) the kernel
    # fragments. A wrong UDP checksum would make the sandbox's kernel drop it.
    listener = gateway_socket(topo, sockets, make_transparent_udp, fam.family, UDP_PORT)
    sender = gateway_socket(topo, sockets, make_udp_reply_sender, fam.family)
    client = client_socket(topo, fam, sockets)
    client.connect((fam.remote, 4242))
    client.send(b"?")
    dgram = receive(listener)
    payload = os.urandom(size)
    assert dgram.orig_dst is not None
    assert send_from(sender, payload, dgram.orig_dst, dgram.src) == size
    assert client.recv(65536) == payload


@FAMS
def test_oversized_datagram_is_reported_truncated(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    listener = gateway_socket(topo, sockets, make_transparent_udp, fam.family, UDP_PORT)
    client = client_socket(topo, fam, sockets)
    client.sendto(b"x" * 3000, (fam.remote, 9999))
    dgram = receive(listener, 1000)
    assert dgram.truncated
    assert dgram.data == b"x" * 1000
    assert dgram.orig_dst == (fam.remote, 9999)


@FAMS
def test_pktinfo_reply_from_the_sockets_own_port(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    # A listener bound to the very port being answered from (DNS on 53) needs no
    # raw sender: IP_PKTINFO supplies the foreign source address.
    dns = gateway_socket(topo, sockets, make_transparent_udp, fam.family, DNS_PORT)
    client = client_socket(topo, fam, sockets)
    client.connect((fam.remote, 53))
    client.send(b"query")
    dgram = receive(dns)
    assert dgram.orig_dst == (fam.remote, 53)
    send_from(dns, b"response", dgram.orig_dst, dgram.src)
    assert client.recv(100) == b"response"


@FAMS
def test_pktinfo_cannot_change_the_source_port(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    listener = gateway_socket(topo, sockets, make_transparent_udp, fam.family, UDP_PORT)
    client = client_socket(topo, fam, sockets)
    client.sendto(b"q", (fam.remote, 9999))
    dgram = receive(listener)
    assert dgram.orig_dst is not None
    with pytest.raises(ValueError, match="bound to port 15002"):
        send_from(listener, b"r", dgram.orig_dst, dgram.src)
    # What the kernel would have done: source address right, port the listener's.
    listener.sendmsg([b"r"], [udpsock._pktinfo(ipaddress.ip_address(fam.remote))], 0, dgram.src)
    _, addr = client.recvfrom(100)
    assert addr[:2] == (fam.remote, UDP_PORT)


@FAMS
def test_reply_sender_never_queues_what_the_netns_receives(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    listener = gateway_socket(topo, sockets, make_transparent_udp, fam.family, UDP_PORT)
    sender = gateway_socket(topo, sockets, make_udp_reply_sender, fam.family)
    client = client_socket(topo, fam, sockets)
    for _ in range(20):
        client.sendto(b"noise", (fam.remote, 9999))
    for _ in range(20):
        receive(listener)
    r, _, _ = select.select([sender], [], [], 0.2)
    assert not r, "the raw reply sender queued received UDP packets"


# -- TCP --------------------------------------------------------------------------------


@FAMS
def test_tcp_listener_sees_the_original_destination(
    topo: Topology, fam: Fam, sockets: list[socket.socket]
) -> None:
    listener = gateway_socket(topo, sockets, make_transparent_tcp_listener, fam.family, TCP_PORT)
    client = client_socket(topo, fam, sockets, socket.SOCK_STREAM)
    client.connect((fam.remote, 443))
    _wait_readable(listener)
    conn, peer = listener.accept()
    sockets.append(conn)
    assert conn.getsockname()[:2] == (fam.remote, 443)
    assert peer[:2] == (fam.client, client.getsockname()[1])
    # inherited from the listener: the relay's writes to the sandbox are never Nagled
    assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    conn.setblocking(True)
    conn.sendall(b"hello from the gateway")
    assert client.recv(100) == b"hello from the gateway"


# -- under stage 2's real conditions ------------------------------------------------------


def test_helpers_work_under_the_identity_map_as_an_unprivileged_user(user: User) -> None:
    """Stage 2 makes these sockets as the user, in a user namespace that maps the
    user to itself, in a netns that namespace owns: no root anywhere."""
    script = textwrap.dedent("""
        import ctypes, os, socket
        from boxyd.net import udpsock
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.getuid(), os.getgid()
        assert uid != 0, "must run unprivileged"
        assert libc.unshare(0x10000000) == 0, ctypes.get_errno()  # CLONE_NEWUSER
        for f, v in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                     ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{f}", "w") as fh:
                fh.write(v)
        assert libc.unshare(0x40000000) == 0, ctypes.get_errno()  # CLONE_NEWNET
        for fam in (socket.AF_INET, socket.AF_INET6):
            udpsock.make_transparent_udp(fam, 15002).close()
            udpsock.make_transparent_tcp_listener(fam, 15001).close()
            udpsock.make_udp_reply_sender(fam).close()
        print("made all")
    """)
    r = user.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + script],
        cwd="/",
    )
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().strip() == "made all"


def test_transparent_needs_a_capability() -> None:
    script = textwrap.dedent("""
        import socket
        from boxyd.net import udpsock
        try:
            udpsock.make_transparent_udp(socket.AF_INET, 0)
        except PermissionError as e:
            print(e)
    """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", script]
    if os.geteuid() == 0:  # as root: drop to nobody, with no capabilities left
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, cwd="/")
    assert "CAP_NET_ADMIN" in r.stdout, (r.stdout, r.stderr)


# -- pure parts -----------------------------------------------------------------------------


def _reference_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = 0
    for i in range(0, len(data), 2):
        s += (data[i] << 8) | data[i + 1]
        s = (s & 0xFFFF) + (s >> 16)
    c = ~s & 0xFFFF
    return c or 0xFFFF


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x11",
        b"\xff\xff",
        b"\xff\xfe\x00\x01",
        b"\x01",
        bytes(range(256)) * 7 + b"\x9a",
        os.urandom(1501),
    ],
)
def test_checksum_matches_rfc1071(data: bytes) -> None:
    assert udpsock._checksum(data) == _reference_checksum(data)


def test_bad_family_is_refused() -> None:
    with pytest.raises(ValueError, match="AF_INET or AF_INET6"):
        make_transparent_udp(socket.AF_UNIX, 1)
