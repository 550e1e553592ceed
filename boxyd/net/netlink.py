"""Netlink framing, shared by boxy's netlink users: rtnetlink requests
(boxyd.net.rtnl), the NFLOG refusal reports (boxyd.net.nflog), the bound set and the
refusal counter (boxyd.net.nftset, boxyd.net.nftcounter). Messages, attributes and
one request's exchange; what they mean is each user's business."""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator

from boxy import fdwait

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED and NLA_F_NET_BYTEORDER

HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_ATTR = struct.Struct("=HH")


def open_socket(protocol: int) -> socket.socket:
    """A netlink socket of PROTOCOL, bound (the kernel picks its port id), in the
    network namespace of the caller: it answers for that one wherever its fd goes."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
    try:
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), kind, flags, seq, 0) + body


def messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, seq, payload) of each message in one read; ValueError at a length that
    does not fit (after the messages before it)."""
    pos = 0
    while pos + HEADER.size <= len(data):
        length, kind, _, seq, _ = HEADER.unpack_from(data, pos)
        if length < HEADER.size or pos + length > len(data):
            raise ValueError("netlink: malformed message length")
        yield kind, seq, data[pos + HEADER.size : pos + length]
        pos += (length + 3) & ~3


def error(payload: bytes) -> int:
    """The errno an NLMSG_ERROR payload carries (0: an ack)."""
    if len(payload) < 4:
        raise ValueError("netlink: short error message")
    return -int(struct.unpack_from("=i", payload)[0])


def attr(kind: int, payload: bytes) -> bytes:
    length = _ATTR.size + len(payload)
    return _ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def attrs(data: bytes) -> dict[int, bytes]:
    """Attribute type → value; stops at the first one whose length does not fit."""
    out: dict[int, bytes] = {}
    pos = 0
    while pos + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, pos)
        if length < _ATTR.size or pos + length > len(data):
            break
        out[kind & NLA_TYPE_MASK] = data[pos + _ATTR.size : pos + length]
        pos += (length + 3) & ~3
    return out


def exchange(
    sock: socket.socket, data: bytes, step: str, wait: float, take: Callable[[bytes], bool]
) -> None:
    """Send DATA on SOCK, then hand each read to TAKE until it says the answer is in
    (True), within WAIT seconds. The kernel answers within send(), so WAIT is a
    backstop. Raises OSError naming STEP: the send, no answer, the receive (ENOBUFS:
    answers were lost, ours perhaps); TAKE raises its own, which it names."""
    try:
        sock.send(data)
    except OSError as e:
        raise OSError(e.errno, f"{step}: send: {os.strerror(e.errno or 0)}") from None
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not fdwait.readable(sock, left):
            raise OSError(errno.ETIMEDOUT, f"{step}: no answer from the kernel")
        try:
            got = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError as e:
            raise OSError(e.errno, f"{step}: receive: {os.strerror(e.errno or 0)}") from None
        if take(got):
            return
