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
import socket
import struct
import time
from dataclasses import dataclass

from boxy import fdwait
from boxyd.net import netlink
from boxyd.net.netlink import NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR, attr, attrs

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

_NFGEN = struct.Struct("=BBH")  # family, version, res_id (big-endian group)
_CONFIG = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG
_PACKET = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET
PROTOCOLS = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp"}


@dataclass(frozen=True)
class Refused:
    """One packet nftables refused: where the sandbox tried to go."""

    proto: str  # tcp | udp | icmp | ip
    addr: str
    port: int  # 0 when the protocol has none


def open_socket(group: int, snaplen: int) -> socket.socket:
    """Bind a netlink socket to nflog GROUP in the current network namespace, copying
    SNAPLEN bytes of each packet. Needs CAP_NET_ADMIN over that namespace."""
    sock = socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER
    )
    try:
        sock.bind((0, 0))
        for setting in (
            attr(NFULA_CFG_CMD, struct.pack("=B3x", NFULNL_CFG_CMD_BIND)),
            attr(NFULA_CFG_MODE, struct.pack("!IBx", snaplen, NFULNL_COPY_PACKET)),
            # The kernel batches 100 packets or a second by default: a short run would end
            # before its refusals were delivered. Flush at once, or at the next timer
            # tick; the ruleset's rate limit bounds the cost.
            attr(NFULA_CFG_QTHRESH, struct.pack("!I", 1)),
            attr(NFULA_CFG_TIMEOUT, struct.pack("!I", 0)),
        ):
            _configure(sock, group, setting, "binding the group")
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def unbind(sock: socket.socket, group: int) -> list[Refused]:
    """Unbind GROUP and return every report still queued. The kernel delivers reports
    on its next timer tick; unbinding flushes them at once, ahead of its ack, so the
    last refusals of a run are counted without waiting for that tick."""
    setting = attr(NFULA_CFG_CMD, struct.pack("=B3x", NFULNL_CFG_CMD_UNBIND))
    return _configure(sock, group, setting, "unbind", timeout=0.1)


def _configure(
    sock: socket.socket, group: int, setting: bytes, what: str, timeout: float = 1.0
) -> list[Refused]:
    """One config message for GROUP; the reports read before its ack come back."""
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, socket.htons(group)) + setting
    sock.send(netlink.message(_CONFIG, NLM_F_REQUEST | NLM_F_ACK, 0, body))
    reports: list[Refused] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not fdwait.readable(sock, left):
            raise OSError(f"nflog: {what}: no answer")
        data = sock.recv(65536)
        reports += parse(data)
        err = _ack(data)
        if err is not None:
            if err:
                raise OSError(err, f"nflog: {what}: {os.strerror(err)}")
            return reports


def _ack(data: bytes) -> int | None:
    """The errno of the netlink ack in DATA (0: success), or None if there is none."""
    try:
        for kind, _, payload in netlink.messages(data):
            if kind == NLMSG_ERROR:
                return netlink.error(payload)
    except ValueError:
        pass
    return None


def parse(data: bytes) -> list[Refused]:
    """Every refused packet in one netlink read (several messages may share it)."""
    out: list[Refused] = []
    try:
        for kind, _, message in netlink.messages(data):
            if kind == _PACKET:
                payload = attrs(message[_NFGEN.size :]).get(NFULA_PAYLOAD)
                refused = _packet(payload) if payload else None
                if refused is not None:
                    out.append(refused)
    except ValueError:
        pass  # what came before the malformed message still counts
    return out


def _packet(p: bytes) -> Refused | None:
    """Destination and transport port from an IPv4 or IPv6 header (no extension
    headers are walked: a packet carrying them is reported without a port)."""
    if not p:
        return None
    version = p[0] >> 4
    if version == 4 and len(p) >= 20:
        ihl = (p[0] & 0x0F) * 4
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(p[16:20])
        proto, l4 = p[9], ihl
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
