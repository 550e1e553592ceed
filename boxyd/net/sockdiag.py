"""Which socket of the payload's sent a flow (--ask names the program that asked): the
kernel's socket table of the payload netns, asked by the flow's addresses through
NETLINK_SOCK_DIAG (inet_diag's exact lookup, one request and one answer).

A netlink socket answers for the network namespace it was made in, and boxyd cannot
enter the payload's: stage 2 opens this one there at the end of step 3 and sends it
with the gateway's listeners ("sockdiag"). Asking needs no capability.

The gateway sees a flow from the sandbox as the payload's socket sent it (TPROXY keeps
both addresses), so the flow's source is that socket's own address and its
destination the socket's peer. An unconnected UDP socket (bound to the wildcard) is
found too: the kernel's lookup is the one that delivers a datagram.

The encoder and decoder (``request``, ``parse``) are pure; ``SockDiag`` is the I/O.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from dataclasses import dataclass

from boxyd.net import netlink
from boxyd.net.netlink import NLM_F_REQUEST, NLMSG_ERROR

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
ANSWER_WAIT = 0.5  # seconds; the kernel answers within send(): a backstop

# struct inet_diag_req_v2: family, protocol, ext, pad, states; then the sockid:
# sport, dport (big-endian), src[16], dst[16], interface, cookie[2]
_REQ = struct.Struct("=BBBxI")
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# struct inet_diag_msg: family, state, timer, retrans, the sockid (48 bytes),
# expires, rqueue, wqueue, uid, inode
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")
_SOCKID_SIZE = _SOCKID.size + _SOCKID_TAIL.size
MSG_SIZE = _MSG_HEAD.size + _SOCKID_SIZE + _MSG_TAIL.size

Endpoint = tuple[str, int]


@dataclass(frozen=True)
class Flow:
    """One flow as the gateway received it: PROTO "tcp" or "udp", SRC the payload's
    socket's address and port, DST where it sent to."""

    proto: str
    src: Endpoint
    dst: Endpoint


@dataclass(frozen=True)
class Owner:
    """The socket that sent a flow: its inode (what /proc/PID/fd/N links to, as
    socket:[INODE]) and the uid that made it."""

    inode: int
    uid: int


def _packed(addr: str, family: int) -> bytes:
    """ADDR in a sockid's 16-byte field (a v4 address in its first four)."""
    raw = ipaddress.ip_address(addr).packed
    if (family == socket.AF_INET) != (len(raw) == 4):
        raise ValueError(f"sock_diag: {addr} is not an address of family {family}")
    return raw.ljust(16, b"\0")


def request(flow: Flow, seq: int) -> bytes:
    """The exact lookup of FLOW's sending socket. For TCP the sockid is the socket's
    own view (src: its address); UDP's lookup takes them the other way round (the
    kernel's udp_dump_one: "src and dst are swapped for historical reasons")."""
    family = socket.AF_INET6 if ":" in flow.src[0] else socket.AF_INET
    if flow.proto == "tcp":
        proto, near, far = socket.IPPROTO_TCP, flow.src, flow.dst
    elif flow.proto == "udp":
        proto, near, far = socket.IPPROTO_UDP, flow.dst, flow.src
    else:
        raise ValueError(f"sock_diag: no lookup for {flow.proto!r}")
    body = _REQ.pack(family, proto, 0, 0xFFFFFFFF) + _SOCKID.pack(
        near[1], far[1], _packed(near[0], family), _packed(far[0], family)
    )
    body += _SOCKID_TAIL.pack(0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    return netlink.message(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, body)


def parse(data: bytes, seq: int) -> Owner | None | int:
    """One read's answer to request SEQ: the socket's Owner; None when this read holds
    no answer to SEQ (an older request's, given up on); an errno when the kernel
    refused (ENOENT: no such socket). ValueError: not an answer the kernel writes."""
    for kind, got, payload in netlink.messages(data):
        if got != seq:
            continue
        if kind == NLMSG_ERROR:
            return netlink.error(payload) or errno.EPROTO
        if kind != SOCK_DIAG_BY_FAMILY or len(payload) < MSG_SIZE:
            raise ValueError(f"sock_diag: unexpected answer (type {kind}, {len(payload)} bytes)")
        _, _, _, uid, inode = _MSG_TAIL.unpack_from(payload, _MSG_HEAD.size + _SOCKID_SIZE)
        return Owner(inode, uid)
    return None


class SockDiag:
    """The payload netns's socket table, through the socket stage 2 opened there.
    Blocking (the kernel answers within send(), so it is short); call it from a worker
    thread. One question at a time (a lock): the answers share the socket."""

    def __init__(self, sock: socket.socket) -> None:
        import threading  # boxyd's side only: stage 2 imports this module, not threads

        self.sock = sock
        self._seq = 0
        self._lock = threading.Lock()

    def owner(self, flow: Flow) -> Owner | None:
        """The socket that sent FLOW, or None: gone, not found, or the kernel would not
        say. Raises nothing for the payload's doing."""
        with self._lock:
            self._seq = self._seq % 0x7FFFFFFF + 1
            seq = self._seq
            try:
                data = request(flow, seq)
            except ValueError:
                return None
            found: list[Owner | None | int] = []

            def take(chunk: bytes) -> bool:
                found.append(parse(chunk, seq))
                return found[-1] is not None

            try:
                netlink.exchange(self.sock, data, "sock_diag", ANSWER_WAIT, take)
            except (OSError, ValueError):
                return None
        answer = found[-1] if found else None
        return answer if isinstance(answer, Owner) else None

    def close(self) -> None:
        with self._lock:  # not under a question in a worker thread (its fd reused)
            self.sock.close()


def open_socket() -> socket.socket:
    """Stage 2, in the payload netns at the end of step 3: the socket boxyd asks the
    payload's socket table through (sent with the listeners)."""
    return netlink.open_socket(NETLINK_SOCK_DIAG)
