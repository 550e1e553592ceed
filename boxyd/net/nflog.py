"""NFLOG: how boxyd learns about the flows nftables refused at SYN time.

The gateway netns's ruleset rejects what addresses and ports alone decide (denied
ranges, the gateway's own addresses, refused ports) before any socket sees it, so
without this boxyd could neither report those denials (-v, --net-log, --audit-log)
nor count them. Each refusal is copied, headers only and rate-bounded, to an NFLOG
group; stage 2 binds a netlink socket to that group in the gateway netns (it needs
CAP_NET_ADMIN there) and hands the fd to boxyd, which only reads it.

Packets here come from the sandbox: the parser trusts no length and skips what it
cannot read.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import time
from dataclasses import dataclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_ULOG = 4
NFULNL_MSG_PACKET = 0
NFULNL_MSG_CONFIG = 1
NFULA_CFG_CMD = 1
NFULA_CFG_MODE = 2
NFULA_CFG_TIMEOUT = 3
NFULA_CFG_QTHRESH = 4
NFULNL_CFG_CMD_BIND = 1
NFULNL_CFG_CMD_UNBIND = 2
NFULNL_COPY_PACKET = 2
NFULA_PAYLOAD = 9
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
NLA_TYPE_MASK = 0x3FFF  # strips NLA_F_NESTED and NLA_F_NET_BYTEORDER

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NFGEN = struct.Struct("=BBH")  # family, version, res_id (big-endian group)
_NLA = struct.Struct("=HH")
PROTOCOLS = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp"}


@dataclass(frozen=True)
class Refused:
    """One packet nftables refused: where the sandbox tried to go."""

    proto: str  # tcp | udp | icmp | ip
    addr: str
    port: int  # 0 when the protocol has none


def _attr(kind: int, value: bytes) -> bytes:
    body = _NLA.pack(_NLA.size + len(value), kind) + value
    return body + b"\0" * (-len(body) % 4)


def open_socket(group: int, snaplen: int) -> socket.socket:
    """Bind a netlink socket to nflog GROUP in the current network namespace, copying
    SNAPLEN bytes of each packet. Needs CAP_NET_ADMIN over that namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
    try:
        sock.bind((0, 0))
        msg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG
        for seq, attr in enumerate((
            _attr(NFULA_CFG_CMD, struct.pack("=B3x", NFULNL_CFG_CMD_BIND)),
            _attr(NFULA_CFG_MODE, struct.pack("!IBx", snaplen, NFULNL_COPY_PACKET)),
            # The kernel batches 100 packets or a second by default: a short run would end
            # before its refusals were delivered. Flush at once, or at the next timer
            # tick; the ruleset's rate limit bounds the cost.
            _attr(NFULA_CFG_QTHRESH, struct.pack("!I", 1)),
            _attr(NFULA_CFG_TIMEOUT, struct.pack("!I", 0)),
        ), start=1):
            body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(group)) + attr
            sock.send(_NLMSG.pack(_NLMSG.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_ACK,
                                  seq, 0) + body)
            _expect_ack(sock.recv(65536))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def unbind(sock: socket.socket, group: int, timeout: float = 0.1) -> list[Refused]:
    """Unbind GROUP and return every report still queued. The kernel delivers reports
    on its next timer tick; unbinding flushes them at once, ahead of its ack, so the
    last refusals of a run are counted without waiting for that tick."""
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(group)) + _attr(
        NFULA_CFG_CMD, struct.pack("=B3x", NFULNL_CFG_CMD_UNBIND))
    msg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG
    sock.send(_NLMSG.pack(_NLMSG.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_ACK, 0xB0C5, 0)
              + body)
    out: list[Refused] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise OSError("nflog: no answer to unbind")
        data = sock.recv(65536)
        out += parse(data)
        err = _ack(data)
        if err is not None:
            if err:
                raise OSError(err, f"nflog: unbind: {os.strerror(err)}")
            return out


def _ack(data: bytes) -> int | None:
    """The errno of the netlink ack in DATA (0: success), or None if there is none."""
    pos = 0
    while pos + _NLMSG.size + 4 <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, pos)
        if kind == NLMSG_ERROR:
            return -struct.unpack_from("=i", data, pos + _NLMSG.size)[0]
        if length < _NLMSG.size:
            return None
        pos += (length + 3) & ~3
    return None


def _expect_ack(data: bytes) -> None:
    if len(data) < _NLMSG.size + 4:
        raise OSError("nflog: short netlink reply")
    _, kind, _, _, _ = _NLMSG.unpack_from(data)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, _NLMSG.size)
        if err != 0:
            raise OSError(-err, f"nflog: binding the group failed: {os.strerror(-err)}")


def parse(data: bytes) -> list[Refused]:
    """Every refused packet in one netlink read (several messages may share it)."""
    out: list[Refused] = []
    pos = 0
    while pos + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, pos)
        if length < _NLMSG.size or pos + length > len(data):
            break
        if kind == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET:
            payload = _payload(data[pos + _NLMSG.size + _NFGEN.size: pos + length])
            refused = _packet(payload) if payload else None
            if refused is not None:
                out.append(refused)
        pos += (length + 3) & ~3
    return out


def _payload(attrs: bytes) -> bytes | None:
    pos = 0
    while pos + _NLA.size <= len(attrs):
        length, kind = _NLA.unpack_from(attrs, pos)
        if length < _NLA.size or pos + length > len(attrs):
            return None
        if kind & NLA_TYPE_MASK == NFULA_PAYLOAD:
            return attrs[pos + _NLA.size: pos + length]
        pos += (length + 3) & ~3
    return None


def _packet(p: bytes) -> Refused | None:
    """Destination and transport port from an IPv4 or IPv6 header (no extension
    headers are walked: a packet carrying them is reported without a port)."""
    if not p:
        return None
    version = p[0] >> 4
    if version == 4 and len(p) >= 20:
        ihl = (p[0] & 0x0F) * 4
        proto, addr, l4 = p[9], ipaddress.IPv4Address(p[16:20]), ihl
        fragment_offset = struct.unpack_from("!H", p, 6)[0] & 0x1FFF
        if fragment_offset:
            l4 = -1  # a later fragment has no transport header
    elif version == 6 and len(p) >= 40:
        proto, addr, l4 = p[6], ipaddress.IPv6Address(p[24:40]), 40
    else:
        return None
    name = PROTOCOLS.get(proto, "ip")
    port = 0
    if name in ("tcp", "udp") and l4 >= 0 and len(p) >= l4 + 4:
        port = struct.unpack_from("!H", p, l4 + 2)[0]
    return Refused(name, str(addr), port)
