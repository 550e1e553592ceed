"""The gateway's set of bound addresses, kept by boxyd from the host netns.

In allowlist mode the gateway netns's ruleset resets a TCP SYN to an address that is
not in ``bound4``/``bound6`` before TPROXY could complete the handshake (docs/design.md,
"Network": an address with no live binding is refused at the SYN). boxyd adds an
element whenever the DNS proxy records a binding — before the answer is sent — with
the binding's lifetime as the element's timeout, so the kernel expires it by itself,
and refreshes the elements of addresses a flow still uses.

boxyd cannot open sockets in the gateway netns. Stage 2 opens a NETLINK_NETFILTER
socket there while it holds CAP_NET_ADMIN over the sandbox's user namespace and
hands it over with the listeners. The kernel checks the capability against the
socket's opener *and* the sender (__netlink_ns_capable); boxyd, with the uid that owns
that user namespace, in its parent, holds every capability in it.

The encoder (``batch``, ``acks``) is pure; ``BoundSet`` is the thin I/O around it.
Every message is acknowledged, and any failure is an OSError naming the step: the
caller then refuses the binding (fail closed: no element, no connection).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable

from boxyd.net import netlink
from boxyd.net.netlink import NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR, attr

# linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h
NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10  # NLMSG_MIN_TYPE
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_NEWSETELEM = 12
NFT_MSG_DELSETELEM = 14
NFPROTO_INET = 1
NFNETLINK_V0 = 0
NLM_F_CREATE = 0x400
NLA_F_NESTED = 0x8000
NFTA_SET_ELEM_LIST_TABLE = 1
NFTA_SET_ELEM_LIST_SET = 2
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY = 1
NFTA_SET_ELEM_TIMEOUT = 4  # be64, milliseconds
NFTA_DATA_VALUE = 1

_NFGEN = struct.Struct("!BBH")  # family, version, res_id (network order)
MAX_TIMEOUT_MS = 2**63 - 1
ACK_WAIT = 1.0  # seconds; the kernel acks while send() runs, so this is a backstop


def nfgen(family: int, res_id: int = 0) -> bytes:
    return _NFGEN.pack(family, NFNETLINK_V0, res_id)


def _nested(kind: int, payload: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, payload)


def element(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, timeout_ms: int | None) -> bytes:
    """One NFTA_LIST_ELEM: the address as the key, with a timeout unless None."""
    body = _nested(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, addr.packed))
    if timeout_ms is not None:
        if isinstance(timeout_ms, bool) or not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"nft set element timeout {timeout_ms!r} ms is out of range")
        body += attr(NFTA_SET_ELEM_TIMEOUT, struct.pack("!Q", timeout_ms))
    return _nested(NFTA_LIST_ELEM, body)


def setelem_message(
    kind: int, table: str, set_name: str, elements: Iterable[bytes], seq: int
) -> bytes:
    """NFT_MSG_NEWSETELEM (or DEL) for TABLE's SET (family inet), acknowledged."""
    elems = b"".join(elements)
    if not elems:
        raise ValueError("an nft set element message needs at least one element")
    body = nfgen(NFPROTO_INET)
    body += attr(NFTA_SET_ELEM_LIST_TABLE, table.encode() + b"\0")
    body += attr(NFTA_SET_ELEM_LIST_SET, set_name.encode() + b"\0")
    body += _nested(NFTA_SET_ELEM_LIST_ELEMENTS, elems)
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE if kind == NFT_MSG_NEWSETELEM else 0)
    return netlink.message((NFNL_SUBSYS_NFTABLES << 8) | kind, flags, seq, body)


def batch(messages: list[bytes], seq: int) -> bytes:
    """MESSAGES between NFNL_MSG_BATCH_BEGIN (sequence SEQ) and _END: one transaction,
    all of it or none. The messages' own sequence numbers are the caller's."""
    begin = netlink.message(
        NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, nfgen(socket.AF_UNSPEC, NFNL_SUBSYS_NFTABLES)
    )
    end = netlink.message(
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq + len(messages) + 1,
        nfgen(socket.AF_UNSPEC, NFNL_SUBSYS_NFTABLES),
    )
    return begin + b"".join(messages) + end


def acks(data: bytes) -> dict[int, int]:
    """Sequence number → errno (0: success) of every NLMSG_ERROR in one read."""
    out: dict[int, int] = {}
    try:
        for kind, seq, payload in netlink.messages(data):
            if kind == NLMSG_ERROR:
                out[seq] = netlink.error(payload)
    except ValueError:
        pass  # what came before the malformed message still counts
    return out


def open_socket() -> socket.socket:
    """Stage 2, in the gateway netns while it holds CAP_NET_ADMIN over its user
    namespace: the socket boxyd sends set elements through (the kernel checks the
    opener's capability along with the sender's)."""
    return netlink.open_socket(NETLINK_NETFILTER)


class BoundSet:
    """The ``bound4``/``bound6`` sets of one gateway netns, through the socket stage 2
    opened there. Calls are synchronous: the kernel answers within send()."""

    def __init__(self, sock: socket.socket, table: str, sets: tuple[str, str]) -> None:
        self.sock = sock
        self.table = table
        self.sets = {4: sets[0], 6: sets[1]}
        self._seq = int(time.monotonic() * 1000) & 0x3FFFFFFF  # any start; ours alone

    def add(
        self, addrs: Iterable[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, float]]
    ) -> None:
        """Add (or refresh) each address with its timeout in seconds, in one batch.
        Raises OSError naming the step when the kernel refuses or does not answer."""
        by_family: dict[int, list[bytes]] = {4: [], 6: []}
        for addr, seconds in addrs:
            by_family[addr.version].append(element(addr, max(1, int(seconds * 1000))))
        begin = self._seq + 1
        msgs: list[bytes] = []
        for version, elems in by_family.items():
            if elems:
                msgs.append(
                    setelem_message(
                        NFT_MSG_NEWSETELEM,
                        self.table,
                        self.sets[version],
                        elems,
                        begin + 1 + len(msgs),
                    )
                )
        if not msgs:
            return
        self._seq = (begin + len(msgs) + 1) & 0x3FFFFFFF  # the end marker's number
        self._transact(batch(msgs, begin), list(range(begin + 1, begin + 1 + len(msgs))))

    def _transact(self, data: bytes, expect: list[int]) -> None:
        step = f"nft set {self.table} {'/'.join(self.sets.values())}: add elements"
        pending = set(expect)

        def take(got: bytes) -> bool:
            for seq, err in acks(got).items():
                if seq in pending:
                    if err:
                        raise OSError(err, f"{step}: {os.strerror(err)}")
                    pending.discard(seq)
            return not pending

        netlink.exchange(self.sock, data, step, ACK_WAIT, take)


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
REFRESH = 30.0  # seconds a held address's element is extended by
REFRESH_MARGIN = 10.0  # extended once less than this is left


class Publisher:
    """What boxyd's bindings publish into the gateway's sets, and for how long, so an
    address a flow still uses is refreshed before the kernel expires it."""

    def __init__(
        self,
        bound: BoundSet,
        on_error: Callable[[str], None],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bound = bound
        self.on_error = on_error
        self.now = now
        self.failures = 0
        self._until: dict[Address, float] = {}  # address -> when its element expires

    def publish(self, addr: Address, seconds: float) -> bool:
        """Bindings' publish(): the element for ADDR lives at least SECONDS from now.
        False when the kernel did not take it (the binding is then refused)."""
        until = self.now() + seconds
        if self._until.get(addr, 0.0) >= until:
            return True  # a re-add would only shorten it
        return self._add([(addr, seconds)])

    def refresh(self, held: Iterable[Address]) -> None:
        """Extend the elements of HELD addresses about to expire; forget expired ones."""
        now = self.now()
        due = [(a, REFRESH) for a in held if self._until.get(a, 0.0) < now + REFRESH_MARGIN]
        if due:
            self._add(due)
        for addr in [a for a, until in self._until.items() if until < now]:
            del self._until[addr]

    def _add(self, elems: list[tuple[Address, float]]) -> bool:
        now = self.now()
        try:
            self.bound.add(elems)
        except OSError as e:
            self.failures += 1
            self.on_error(str(e))
            return False
        for addr, seconds in elems:
            self._until[addr] = now + seconds
        return True
