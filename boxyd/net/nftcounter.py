"""How many packets the gateway netns's ruleset refused: its named counter, read by
boxyd over the netlink socket stage 2 opened there (boxyd.net.nftset says why boxyd
may use it).

The ruleset copies each refusal to boxyd over NFLOG, but rate-bounded
(ruleset.NFLOG_RATE) and into a socket buffer a flood overflows: a SYN flood of
711,989 attempts once came through as 6,999 reports. The counter, bumped by the
same rules before the rate limit, is exact; what it counted past the reports is a
refusal boxy counts without knowing where it went (docs/design.md, "Counts").

The encoder and parser are pure; ``Counter.read`` is the thin I/O around them.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time

from boxyd.net import netlink
from boxyd.net.netlink import NLM_F_REQUEST, NLMSG_ERROR, attr, attrs
from boxyd.net.nftset import NFNL_SUBSYS_NFTABLES, NFPROTO_INET, nfgen

# linux/netfilter/nf_tables.h
NFT_MSG_NEWOBJ = 18
NFT_MSG_GETOBJ = 19
NFTA_OBJ_TABLE = 1
NFTA_OBJ_NAME = 2
NFTA_OBJ_TYPE = 3
NFTA_OBJ_DATA = 4
NFT_OBJECT_COUNTER = 1
NFTA_COUNTER_PACKETS = 2
REPLY_WAIT = 1.0  # seconds; the kernel answers while send() runs, so this is a backstop


def request(table: str, name: str, seq: int) -> bytes:
    """NFT_MSG_GETOBJ for the counter NAME of TABLE (family inet)."""
    body = nfgen(NFPROTO_INET)
    body += attr(NFTA_OBJ_TABLE, table.encode() + b"\0")
    body += attr(NFTA_OBJ_NAME, name.encode() + b"\0")
    body += attr(NFTA_OBJ_TYPE, struct.pack("!I", NFT_OBJECT_COUNTER))
    return netlink.message((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ, NLM_F_REQUEST, seq, body)


def reply(data: bytes, seq: int) -> int | None:
    """The packet count in one read's answer to request SEQ; None when the read holds
    no answer to it (another's, or nothing whole). A refusal by the kernel raises
    OSError with its errno; an answer without a count raises ValueError."""
    try:
        found = [(k, p) for k, s, p in netlink.messages(data) if s == seq]
    except ValueError:
        return None
    for kind, payload in found:
        if kind == NLMSG_ERROR:
            err = netlink.error(payload)
            if err:
                raise OSError(err, os.strerror(err))
            continue
        if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ:
            obj = attrs(payload[4:])  # past the nfgenmsg
            packets = attrs(obj.get(NFTA_OBJ_DATA, b"")).get(NFTA_COUNTER_PACKETS, b"")
            if len(packets) != 8:
                raise ValueError("nft counter: the answer carries no packet count")
            return int.from_bytes(packets, "big")
    return None


class Counter:
    """One named counter of the gateway netns's table, through the socket stage 2
    opened there. ``read`` is synchronous: the kernel answers within send()."""

    def __init__(self, sock: socket.socket, table: str, name: str) -> None:
        self.sock, self.table, self.name = sock, table, name
        self._seq = (int(time.monotonic() * 1000) & 0x3FFFFFFF) | 0x40000000  # not nftset's

    def read(self) -> int:
        """The packets counted so far. Raises OSError naming the step when the kernel
        refuses or does not answer."""
        step = f"nft counter {self.table} {self.name}: read"
        self._seq = ((self._seq + 1) & 0x3FFFFFFF) | 0x40000000
        got: list[int] = []

        def take(data: bytes) -> bool:
            try:
                packets = reply(data, self._seq)
            except OSError as e:
                raise OSError(e.errno, f"{step}: {e.strerror}") from None
            except ValueError as e:
                raise OSError(errno.EPROTO, f"{step}: {e}") from None
            if packets is not None:
                got.append(packets)
            return bool(got)

        netlink.exchange(
            self.sock, request(self.table, self.name, self._seq), step, REPLY_WAIT, take
        )
        return got[0]
