"""Linux socket helpers for the transparent (TPROXY) side of the gateway.

Stage 2 creates these sockets inside the gateway netns (``make_*``) and hands the
fds to boxyd, which can make no socket there itself; boxyd then receives the
sandbox's datagrams with their original destination (``recv_datagram``) and
answers them so that they appear to come from that destination (``send_from``).

Why there is a raw "reply sender": ``IP_PKTINFO``/``IPV6_PKTINFO`` set a reply's
source *address* only. Its source *port* is always the port the sending socket is
bound to, i.e. the TPROXY port (15002), and a client that connected its UDP socket
(glibc's resolver, most UDP libraries) drops a reply from any other port. Linux
has no control message for the source port, so replies for arbitrary original
destinations leave through a raw ``IPPROTO_UDP`` socket on which boxyd writes the
UDP header itself while the kernel still builds, routes and fragments the IP
packet. A transparent UDP socket bound to the very port being answered from (a
DNS listener bound to port 53) can use ``IP_PKTINFO`` directly; ``send_from``
accepts both and refuses to send a reply whose source port would be wrong.

Stdlib only; constants the ``socket`` module lacks are defined below from the
Linux uapi headers.
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import struct
from dataclasses import dataclass

# <linux/in.h>
IP_PKTINFO = 8
IP_TRANSPARENT = 19
IP_RECVORIGDSTADDR = 20
IP_ORIGDSTADDR = 20  # the cmsg type IP_RECVORIGDSTADDR delivers
# <linux/in6.h>
IPV6_CHECKSUM = 7
IPV6_V6ONLY = 26
IPV6_PKTINFO = 50
IPV6_RECVORIGDSTADDR = 74
IPV6_ORIGDSTADDR = 74
IPV6_TRANSPARENT = 75
# <asm-generic/socket.h>
SO_ATTACH_FILTER = 26

SOL_IP = socket.IPPROTO_IP
SOL_IPV6 = socket.IPPROTO_IPV6
_CLOEXEC_NONBLOCK = socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK

_SOCKADDR_IN = struct.Struct("=H")  # family (host order), then port and address
_PORT = struct.Struct("!H")
_IN_PKTINFO = struct.Struct("=i4s4s")  # ipi_ifindex, ipi_spec_dst, ipi_addr
_IN6_PKTINFO = struct.Struct("=16si")  # ipi6_addr, ipi6_ifindex
_UDP_HEADER = struct.Struct("!HHHH")  # source port, destination port, length, checksum
# Room for one sockaddr_in6 cmsg (the largest we ask for) and a spare.
_ANCBUF = 2 * socket.CMSG_SPACE(28)

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Datagram:
    data: bytes
    src: Address  # the sandbox's socket
    orig_dst: Address | None  # where the sandbox sent it; None if the socket does not report it
    truncated: bool  # larger than the buffer: data holds only its start


def _sockaddr(raw: bytes) -> Address | None:
    """(ip, port) from a sockaddr_in / sockaddr_in6 as the kernel wrote it."""
    if len(raw) < _SOCKADDR_IN.size:
        return None
    (family,) = _SOCKADDR_IN.unpack_from(raw)
    if family == socket.AF_INET and len(raw) >= 8:
        return socket.inet_ntop(socket.AF_INET, raw[4:8]), _PORT.unpack_from(raw, 2)[0]
    if family == socket.AF_INET6 and len(raw) >= 24:
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), _PORT.unpack_from(raw, 2)[0]
    return None


def recv_datagram(sock: socket.socket, bufsize: int) -> Datagram:
    """Receive one datagram from a transparent UDP socket, with its original
    destination. Raises BlockingIOError when none is waiting (non-blocking socket)."""
    data, ancdata, flags, src = sock.recvmsg(bufsize, _ANCBUF)
    orig: Address | None = None
    for level, kind, value in ancdata:
        if (level, kind) in ((SOL_IP, IP_ORIGDSTADDR), (SOL_IPV6, IPV6_ORIGDSTADDR)):
            orig = _sockaddr(value)
    return Datagram(data, (src[0], src[1]), orig, bool(flags & socket.MSG_TRUNC))


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of DATA, as UDP transmits it (0 → 0xffff).

    2**16 ≡ 1 (mod 0xffff), so the one's-complement sum of the 16-bit words is the
    whole buffer read as one big integer, mod 0xffff: fast without a C helper.
    """
    if len(data) % 2:
        data += b"\0"
    total = int.from_bytes(data, "big") % 0xFFFF or 0xFFFF
    return (~total & 0xFFFF) or 0xFFFF


def send_from(sock: socket.socket, data: bytes, src: Address, dst: Address) -> int:
    """Send DATA to DST so that it arrives from SRC (a reply from the original destination).

    SOCK is either a raw reply sender (``make_udp_reply_sender``), which can use
    any source port, or a transparent UDP socket bound to SRC's port. Returns the
    number of payload bytes sent.
    """
    ip = ipaddress.ip_address(src[0])
    v6 = ip.version == 6
    if sock.type == socket.SOCK_RAW:
        dst_ip = ipaddress.ip_address(dst[0])
        length = _UDP_HEADER.size + len(data)
        if length > 0xFFFF:
            raise ValueError(f"UDP payload of {len(data)} bytes is too large")
        if v6:
            check = 0  # filled in by the kernel (IPV6_CHECKSUM)
        else:
            pseudo = ip.packed + dst_ip.packed + struct.pack("!BBH", 0, socket.IPPROTO_UDP, length)
            header = _UDP_HEADER.pack(src[1], dst[1], length, 0)
            check = _checksum(pseudo + header + data)
        segment = _UDP_HEADER.pack(src[1], dst[1], length, check) + data
        # A raw socket's port field is the protocol (0 = the socket's own), not a UDP port.
        sent = sock.sendmsg([segment], [_pktinfo(ip)], 0, (dst[0], 0))
        return sent - _UDP_HEADER.size
    bound = sock.getsockname()[1]
    if bound != src[1]:
        raise ValueError(
            f"cannot send from port {src[1]} through a UDP socket bound to port {bound}: "
            "IP_PKTINFO sets only the source address; use a raw reply sender "
            "(make_udp_reply_sender) for replies from other ports"
        )
    return sock.sendmsg([data], [_pktinfo(ip)], 0, dst)


def _pktinfo(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[int, int, bytes]:
    """The control message that sets a datagram's source address (non-local is
    allowed on a transparent socket); interface 0 lets routing choose."""
    if ip.version == 6:
        return SOL_IPV6, IPV6_PKTINFO, _IN6_PKTINFO.pack(ip.packed, 0)
    return SOL_IP, IP_PKTINFO, _IN_PKTINFO.pack(0, ip.packed, ip.packed)


# -- sockets stage 2 makes in the gateway netns (they need CAP_NET_ADMIN or CAP_NET_RAW there)


def _family_opts(family: socket.AddressFamily) -> tuple[int, int, str]:
    if family == socket.AF_INET:
        return SOL_IP, IP_TRANSPARENT, "0.0.0.0"
    if family == socket.AF_INET6:
        return SOL_IPV6, IPV6_TRANSPARENT, "::"
    raise ValueError(f"address family must be AF_INET or AF_INET6, not {family!r}")


def _transparent(
    family: socket.AddressFamily,
    kind: int,
    port: int,
    host: str | None,
    extra: list[tuple[int, int, int]],
) -> socket.socket:
    level, transparent, any_addr = _family_opts(family)
    sock = socket.socket(family, kind | _CLOEXEC_NONBLOCK)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.setsockopt(level, transparent, 1)
        except PermissionError as e:
            raise PermissionError(
                e.errno,
                "IP_TRANSPARENT needs CAP_NET_ADMIN or CAP_NET_RAW "
                "in the network namespace's user namespace",
            ) from None
        if family == socket.AF_INET6:
            sock.setsockopt(SOL_IPV6, IPV6_V6ONLY, 1)  # v4 has its own socket
        for opt in extra:
            sock.setsockopt(*opt)
        sock.bind((host or any_addr, port))
    except BaseException:
        sock.close()
        raise
    return sock


def make_transparent_udp(
    family: socket.AddressFamily, port: int, host: str | None = None
) -> socket.socket:
    """A non-blocking UDP socket for TPROXY on PORT that reports each datagram's
    original destination (IP_RECVORIGDSTADDR) and may send from non-local addresses."""
    if family == socket.AF_INET6:
        recv_orig = (SOL_IPV6, IPV6_RECVORIGDSTADDR, 1)
    else:
        recv_orig = (SOL_IP, IP_RECVORIGDSTADDR, 1)
    return _transparent(family, socket.SOCK_DGRAM, port, host, [recv_orig])


def make_transparent_tcp_listener(
    family: socket.AddressFamily, port: int, host: str | None = None, backlog: int = 1024
) -> socket.socket:
    """A non-blocking listening TCP socket for TPROXY on PORT; ``getsockname()`` of
    an accepted connection is the sandbox's original destination.

    TCP_NODELAY is set here because every accepted socket inherits it: the gateway's
    writes to the sandbox are whatever upstream sent, and with Nagle a small one waits
    behind the payload's delayed ACK of the last (up to 40 ms each: a warm `pip
    install` took ~1.18x outside, ~1.07x without it; docs/design.md, "Gateway")."""
    nodelay = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = _transparent(family, socket.SOCK_STREAM, port, host, [nodelay])
    sock.listen(backlog)
    return sock


def make_udp_reply_sender(family: socket.AddressFamily) -> socket.socket:
    """A send-only raw UDP socket for ``send_from``: replies from any address and port.

    It needs CAP_NET_RAW in the network namespace's user namespace when made (stage 2
    has it); whoever holds the fd afterwards can send, but cannot receive.
    """
    level, transparent, _ = _family_opts(family)
    sock = socket.socket(family, socket.SOCK_RAW | _CLOEXEC_NONBLOCK, socket.IPPROTO_UDP)
    try:
        sock.setsockopt(level, transparent, 1)  # lets the source be a non-local address
        if family == socket.AF_INET6:
            sock.setsockopt(SOL_IPV6, IPV6_CHECKSUM, 6)  # the kernel fills the UDP checksum
        # A raw UDP socket gets a copy of every UDP packet the netns receives; a
        # filter that accepts nothing keeps them from queueing unread.
        _attach_drop_all(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # kernel rounds up to its minimum
    except BaseException:
        sock.close()
        raise
    return sock


def make_icmp_sender(family: socket.AddressFamily) -> socket.socket:
    """A send-only raw ICMP (ICMPv6) socket for ``send_port_unreachable``. Needs
    CAP_NET_RAW in the network namespace's user namespace when made (stage 2)."""
    proto = socket.IPPROTO_ICMPV6 if family == socket.AF_INET6 else socket.IPPROTO_ICMP
    sock = socket.socket(family, socket.SOCK_RAW | _CLOEXEC_NONBLOCK, proto)
    try:
        _attach_drop_all(sock)  # it would get a copy of every ICMP packet otherwise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def send_port_unreachable(sock: socket.socket, client: Address, dst: Address, data: bytes) -> None:
    """Tell CLIENT that its datagram to DST was refused, as a closed port would: the
    client's kernel matches the quoted headers to its socket and fails its next
    send/recv with ECONNREFUSED, instead of the client waiting out a timeout. The
    error is sent from the gateway's own address (no transparency needed); the
    quoted IP and UDP headers are rebuilt from what recvmsg reported."""
    src_ip, dst_ip = ipaddress.ip_address(client[0]), ipaddress.ip_address(dst[0])
    quoted = data[:8]
    udp = _UDP_HEADER.pack(client[1], dst[1], _UDP_HEADER.size + len(data), 0)
    if src_ip.version == 4:
        ip = struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + _UDP_HEADER.size + len(data),
            0,
            0,
            64,
            socket.IPPROTO_UDP,
            0,
            src_ip.packed,
            dst_ip.packed,
        )
        ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
        body = struct.pack("!I", 0) + ip + udp + quoted
        icmp = struct.pack("!BBH", 3, 3, 0) + body  # destination unreachable, port unreachable
        icmp = icmp[:2] + struct.pack("!H", _checksum(icmp)) + icmp[4:]
        sock.sendto(icmp, (client[0], 0))
    else:
        ip = struct.pack(
            "!IHBB16s16s",
            6 << 28,
            _UDP_HEADER.size + len(data),
            socket.IPPROTO_UDP,
            64,
            src_ip.packed,
            dst_ip.packed,
        )
        # type 1 (destination unreachable), code 4 (port unreachable); the kernel fills
        # the checksum of an ICMPv6 raw socket
        icmp = struct.pack("!BBHI", 1, 4, 0, 0) + ip + udp + quoted
        sock.sendto(icmp, (client[0], 0))


def _attach_drop_all(sock: socket.socket) -> None:
    # struct sock_filter {u16 code; u8 jt, jf; u32 k}: one "ret #0" (BPF_RET|BPF_K)
    insn = (ctypes.c_ubyte * 8).from_buffer_copy(struct.pack("=HBBI", 0x06, 0, 0, 0))
    # struct sock_fprog {unsigned short len; struct sock_filter *filter}
    prog = struct.pack("@HP", 1, ctypes.addressof(insn))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
