"""Address ranges the sandbox may never reach, and why (pure; imports only ``ipaddress``).

The tables follow the IANA IPv4 and IPv6 special-purpose address registries
(RFC 6890 and its successors), plus multicast, IPv4 240/4, the deprecated IPv6
site-local and v4-compatible blocks, and — for IPv6 — everything outside global
unicast 2000::/3: nothing public lives there, so a route to it can only be local.

IPv6 forms that carry an IPv4 address are decoded *first* and the embedded
address is checked with the IPv4 table, otherwise ``64:ff9b::192.168.1.1`` walks
through an IPv6-only test and out to the LAN:

=====================  ==========================================================
IPv4-mapped            ``::ffff:0:0/96``, the last 32 bits
IPv4-compatible        ``::/96`` (but ``::`` and ``::1``), the last 32 bits
NAT64 well-known       ``64:ff9b::/96``, the last 32 bits (RFC 6052 §2.2, /96)
NAT64 local-use        ``64:ff9b:1::/48``, bits 48–63 and 72–87 around the u-octet
                       (RFC 6052 §2.2, /48; RFC 8215)
6to4                   ``2002::/16``, bits 16–47
Teredo                 ``2001::/32``, server in bits 32–63, client = NOT(bits 96–127)
=====================  ==========================================================

Mapped, NAT64 well-known, 6to4 and Teredo may carry a *public* IPv4 address, and
then they are public too (a DNS64 network reaches the IPv4 internet only that
way). IPv4-compatible and NAT64 local-use are denied whatever they carry (the
first is obsolete; for the second the operator picks the prefix length inside the
/48, so no decoding is certain); their payload still names the reason when it is
itself denied.

Exceptions (``--allow-cidr`` prefixes, the tailnet's ranges with ``--tailscale``)
lift a denial only when they contain the address *that denial is about*: the
address itself for a table entry, the embedded IPv4 address for an encoded one.
So ``--allow-cidr 192.168.4.0/24`` also opens ``64:ff9b::192.168.4.7``, while
``--allow-cidr 64:ff9b::/96`` or ``2002::/16`` never opens an encoded private
address. The sandbox's own link (``SANDBOX_NETS``) and Tailscale's own service
addresses (``TAILSCALE_SERVICE_NETS``) are never lifted.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import NamedTuple

from boxy import values

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

# The sandbox's own link: an exception here would open the gateway itself.
SANDBOX_NETS: tuple[Network, ...] = tuple(ipaddress.ip_network(n) for n in values.SANDBOX_NETS)

# What --tailscale adds to the exceptions: Tailscale's CGNAT and ULA ranges.
TAILSCALE_NETS: tuple[Network, ...] = (
    ipaddress.ip_network("100.64.0.0/10"),
    ipaddress.ip_network("fd7a:115c:a1e0::/48"),
)

# Tailscale's own services inside the tailnet's ranges (quad-100 and its IPv6 twin:
# MagicDNS, the web client, the peer API on 80 and 8080). boxyd's resolver reaches
# MagicDNS from the host; the sandbox never reaches them, whatever opens the tailnet.
TAILSCALE_SERVICE_NETS: tuple[Network, ...] = (
    ipaddress.ip_network("100.100.100.100/32"),
    ipaddress.ip_network("fd7a:115c:a1e0::53/128"),
)
TAILSCALE_SERVICE = "Tailscale's own services (boxy's upstream resolver only)"

# No exception ever lifts these.
NEVER_LIFTED: tuple[Network, ...] = SANDBOX_NETS + TAILSCALE_SERVICE_NETS

_PRIVATE = "private (RFC 1918)"
_DOC = "documentation"
_AS112 = "AS112 DNS sink"

# (prefix, reason). Nested entries are fine: the longest match gives the reason.
V4_TABLE: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", _PRIVATE),
    ("100.64.0.0/10", "CGNAT / tailnet (RFC 6598)"),
    ("100.100.100.100/32", TAILSCALE_SERVICE),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local / cloud metadata"),
    ("172.16.0.0/12", _PRIVATE),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.0.0/29", "DS-Lite (RFC 7335)"),
    ("192.0.0.8/32", "IPv4 dummy address (RFC 7600)"),
    ("192.0.0.9/32", "PCP anycast (RFC 7723)"),
    ("192.0.0.10/32", "TURN anycast (RFC 8155)"),
    ("192.0.0.170/31", "NAT64/DNS64 discovery (RFC 7050)"),
    ("192.0.2.0/24", _DOC),
    ("192.31.196.0/24", _AS112),
    ("192.52.193.0/24", "AMT (RFC 7450)"),
    ("192.88.99.0/24", "6to4 relay anycast (deprecated)"),
    ("192.168.0.0/16", _PRIVATE),
    ("192.175.48.0/24", _AS112),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", _DOC),
    ("203.0.113.0/24", _DOC),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "limited broadcast"),
)

_NOT_GLOBAL = "reserved (outside global unicast 2000::/3)"

# None marks an encoding whose verdict is its payload's: it carves the prefix out
# of a wider denied entry (::/3, 2001::/23).
V6_TABLE: tuple[tuple[str, str | None], ...] = (
    ("::/3", _NOT_GLOBAL),
    ("4000::/2", _NOT_GLOBAL),
    ("8000::/1", _NOT_GLOBAL),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("::ffff:0:0/96", None),  # IPv4-mapped
    ("64:ff9b::/96", None),  # NAT64 well-known prefix
    ("64:ff9b:1::/48", "NAT64 local-use (RFC 8215)"),
    ("100::/64", "discard-only (RFC 6666)"),
    ("100:0:0:1::/64", "dummy prefix (RFC 9780)"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001::/32", None),  # Teredo
    ("2001:1::1/128", "PCP anycast (RFC 7723)"),
    ("2001:1::2/128", "TURN anycast (RFC 8155)"),
    ("2001:1::3/128", "DNS-SD SRP anycast (RFC 9665)"),
    ("2001:2::/48", "benchmarking"),
    ("2001:3::/32", "AMT (RFC 7450)"),
    ("2001:4:112::/48", _AS112),
    ("2001:10::/28", "ORCHID (deprecated)"),
    ("2001:20::/28", "ORCHIDv2 (RFC 7343)"),
    ("2001:30::/28", "drone remote ID (RFC 9374)"),
    ("2001:db8::/32", _DOC),
    ("2002::/16", None),  # 6to4
    ("2620:4f:8000::/48", _AS112),
    ("3fff::/20", _DOC),
    ("5f00::/16", "SRv6 SIDs (RFC 9602)"),
    ("fc00::/7", "unique local (ULA)"),
    ("fd7a:115c:a1e0::53/128", TAILSCALE_SERVICE),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)


class _Entry(NamedTuple):
    bits: int  # network address as an int
    mask: int
    prefixlen: int
    reason: str | None


def _compile(table: Iterable[tuple[str, str | None]]) -> tuple[_Entry, ...]:
    entries = []
    for prefix, reason in table:
        net = ipaddress.ip_network(prefix)
        entries.append(_Entry(int(net.network_address), int(net.netmask), net.prefixlen, reason))
    # Longest prefix first, so the first match is the most specific one.
    return tuple(sorted(entries, key=lambda e: -e.prefixlen))


_compiled: dict[int, tuple[_Entry, ...]] = {}


def _table(version: int) -> tuple[_Entry, ...]:
    # Compiled on first use: boxyctl imports this module (through boxy.values) on
    # every start and never looks anything up.
    entries = _compiled.get(version)
    if entries is None:
        entries = _compiled[version] = _compile(V4_TABLE if version == 4 else V6_TABLE)
    return entries


_ALL32 = 0xFFFFFFFF
_MAPPED = int(IPv6Address("::ffff:0:0"))
_NAT64 = int(IPv6Address("64:ff9b::"))
_NAT64_LOCAL = int(IPv6Address("64:ff9b:1::"))
_TEREDO = 0x2001_0000
_SIXTOFOUR = 0x2002


def _lookup(entries: tuple[_Entry, ...], value: int) -> _Entry | None:
    for e in entries:
        if value & e.mask == e.bits:
            return e
    return None


def _v4_reason(value: int) -> str | None:
    e = _lookup(_table(4), value)
    return e.reason if e else None


def embedded_v4(addr: IPv6Address) -> list[tuple[str, IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries, as (how, address) pairs.

    ``how`` names the encoding for log text ("NAT64", "Teredo-encoded client" …
    see ``_embedded``); an address that encodes nothing gives an empty list.
    """
    return [(how, IPv4Address(v4)) for how, v4 in _embedded(int(addr))]


def _embedded(a: int) -> list[tuple[str, int]]:
    top96, low32 = a >> 32, a & _ALL32
    if top96 == _MAPPED >> 32:
        return [("IPv4-mapped", low32)]
    if top96 == 0 and a > 1:  # :: and ::1 are not v4-compatible (RFC 4291 §2.5.5.1)
        return [("IPv4-compatible", low32)]
    if top96 == _NAT64 >> 32:
        return [("NAT64", low32)]
    if a >> 80 == _NAT64_LOCAL >> 80:
        # RFC 6052 §2.2, /48 prefix: v4 bits 0–15 at 48–63, the u-octet at 64–71,
        # v4 bits 16–31 at 72–87.
        return [("NAT64", ((a >> 64) & 0xFFFF) << 16 | (a >> 40) & 0xFFFF)]
    if a >> 112 == _SIXTOFOUR:
        return [("6to4", (a >> 80) & _ALL32)]
    if a >> 96 == _TEREDO:
        return [("Teredo server", (a >> 64) & _ALL32), ("Teredo client", ~a & _ALL32)]
    return []


def _within(value: int, version: int, net: Network) -> bool:
    return net.version == version and value & int(net.netmask) == int(net.network_address)


def _lifted(value: int, version: int, exceptions: Iterable[Network]) -> bool:
    if any(_within(value, version, own) for own in NEVER_LIFTED):
        return False
    return any(_within(value, version, net) for net in exceptions)


def denied(addr: Address | str, exceptions: Iterable[Network] = ()) -> str | None:
    """Why ``addr`` may not be reached, or None when it may.

    Embedded IPv4 addresses are checked before the IPv6 table; the first denial
    that no exception lifts is the answer (see the module docstring for which
    exception lifts what). Raises ValueError for a string that is no address.
    """
    ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
    a = int(ip)
    exceptions = tuple(exceptions)
    if ip.version == 4:
        reason = _v4_reason(a)
        return None if reason is None or _lifted(a, 4, exceptions) else reason
    for how, v4 in _embedded(a):
        reason = _v4_reason(v4)
        if reason is not None and not _lifted(v4, 4, exceptions):
            return f"{_encoded(how)} {IPv4Address(v4)}: {reason}"
    e = _lookup(_table(6), a)
    if e is None or e.reason is None or _lifted(a, 6, exceptions):
        return None
    return e.reason


def _encoded(how: str) -> str:
    # "NAT64" → "NAT64-encoded", "Teredo client" → "Teredo-encoded client"
    name, _, role = how.partition(" ")
    return f"{name}-encoded {role}".rstrip()


def classify(addr: Address | str) -> str | None:
    """Why ``addr`` is special (denied with no exceptions), or None for a public address."""
    return denied(addr)


class StaticPrefixes(NamedTuple):
    """What nftables rejects at SYN time, and the exceptions accepted before that.

    Everything in ``deny_*`` and not in ``accept_*`` is denied by ``denied()`` with
    the same exceptions; the converse need not hold (nftables cannot decode the
    Teredo client, which is NOT'ed into the last 32 bits), so boxyd still checks
    every flow. "accept" here only means "not rejected early".
    """

    deny_v4: list[str]
    deny_v6: list[str]
    accept_v4: list[str]
    accept_v6: list[str]


# Encodings whose payload is a prefix of the IPv6 address's bits: (base, shift) puts
# a v4 prefix of length L at prefix length (128 - shift - 32) + L.
_PREFIX_ENCODINGS = (
    (_MAPPED, 0),
    (_NAT64, 0),
    (_SIXTOFOUR << 112, 80),
    (_TEREDO << 96, 64),
)


def _encode_v4_prefix(net: IPv4Network) -> list[IPv6Network]:
    out = []
    for base, shift in _PREFIX_ENCODINGS:
        bits = base | int(net.network_address) << shift
        out.append(IPv6Network((bits, 128 - shift - 32 + net.prefixlen)))
    return out


def _subnet_of(a: Network, b: Network) -> bool:
    """A lies inside B; never across versions (ipaddress raises TypeError there)."""
    if isinstance(a, IPv4Network) and isinstance(b, IPv4Network):
        return a.subnet_of(b)
    if isinstance(a, IPv6Network) and isinstance(b, IPv6Network):
        return a.subnet_of(b)
    return False


def _exclude(net: Network, hole: Network) -> list[Network]:
    """NET without HOLE, which lies inside it (same version)."""
    if isinstance(net, IPv4Network) and isinstance(hole, IPv4Network):
        return list(net.address_exclude(hole))
    if isinstance(net, IPv6Network) and isinstance(hole, IPv6Network):
        return list(net.address_exclude(hole))
    return [net]


def _strings(nets: Iterable[Network]) -> list[str]:
    """NETS collapsed, as strings (collapse_addresses takes one version at a time)."""
    listed = list(nets)
    v4 = [n for n in listed if isinstance(n, IPv4Network)]
    v6 = [n for n in listed if isinstance(n, IPv6Network)]
    return [str(n) for n in ipaddress.collapse_addresses(v4)] + [
        str(n) for n in ipaddress.collapse_addresses(v6)
    ]


def _denied_nets(entries: tuple[_Entry, ...], version: int) -> list[Network]:
    make = IPv4Network if version == 4 else IPv6Network
    nets = [(make((e.bits, e.prefixlen)), e.reason) for e in entries]
    carve_outs = [n for n, reason in nets if reason is None]
    out: list[Network] = []
    for net, reason in nets:
        if reason is None:
            continue
        pieces = [net]
        for hole in carve_outs:
            if hole.prefixlen > net.prefixlen and _subnet_of(hole, net):
                pieces = [
                    rest
                    for piece in pieces
                    for rest in (_exclude(piece, hole) if _subnet_of(hole, piece) else [piece])
                ]
        out.extend(pieces)
    return out


def _carve(nets: tuple[Network, ...], holes: tuple[Network, ...]) -> tuple[Network, ...]:
    """NETS with every HOLE cut out: an exception's accept set must not open what no
    exception lifts (the ruleset would accept what denied() refuses)."""
    out: list[Network] = []
    for net in nets:
        pieces = [net]
        for hole in holes:
            kept: list[Network] = []
            for piece in pieces:
                if hole.version != piece.version or not hole.overlaps(piece):
                    kept.append(piece)
                elif _subnet_of(hole, piece):
                    kept.extend(_exclude(piece, hole))
                # else: the piece lies inside the hole and is dropped
            pieces = kept
        out.extend(pieces)
    return tuple(out)


def static_prefixes(exceptions: Iterable[Network] = ()) -> StaticPrefixes:
    """The prefixes for the gateway's nftables ruleset, as strings, collapsed.

    deny_v6 holds the denied IPv6 entries (with the payload-decided encodings cut
    out) plus the NAT64, mapped, 6to4 and Teredo-server forms of every denied
    IPv4 range — never a whole encoding prefix, which would cut off public
    addresses reached that way. accept_v6 likewise holds the encoded forms of the
    IPv4 exceptions, since ``denied()`` lets those through.
    """
    exceptions = _carve(tuple(exceptions), NEVER_LIFTED)
    deny_v4, deny_v6 = _denied_strings()
    accept_v4 = [n for n in exceptions if n.version == 4]
    accept_v6 = [n for n in exceptions if n.version == 6]
    accept_v6 += [enc for net in _v4(accept_v4) for enc in _encode_v4_prefix(net)]
    return StaticPrefixes(list(deny_v4), list(deny_v6), _strings(accept_v4), _strings(accept_v6))


@functools.cache
def _denied_strings() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The denied prefixes of the tables: the same for every run, and ~3.6 ms of
    ipaddress arithmetic on the event loop each time (issue #18), so made once."""
    deny_v4 = _denied_nets(_table(4), 4)
    deny_v6 = _denied_nets(_table(6), 6)
    deny_v6 += [enc for net in _v4(deny_v4) for enc in _encode_v4_prefix(net)]
    return tuple(_strings(deny_v4)), tuple(_strings(deny_v6))


def _v4(nets: Iterable[Network]) -> list[IPv4Network]:
    return [n for n in nets if isinstance(n, IPv4Network)]
