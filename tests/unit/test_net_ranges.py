"""boxyd.net.ranges: every registry entry, its public neighbours, every IPv4-in-IPv6
encoding with private and public payloads, exceptions, and the nftables prefixes."""

from __future__ import annotations

import bisect
import ipaddress
import random
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

import pytest

from boxy import values
from boxy.errors import UsageError
from boxyd.net import ranges
from boxyd.net.ranges import (
    SANDBOX_NETS,
    TAILSCALE_NETS,
    Network,
    classify,
    denied,
    embedded_v4,
    static_prefixes,
)

# The registries as this test reads them; the module's tables must say the same.
V4 = [
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "CGNAT / tailnet (RFC 6598)"),
    ("100.100.100.100/32", "Tailscale's own services (boxy's upstream resolver only)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local / cloud metadata"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.0.0/29", "DS-Lite (RFC 7335)"),
    ("192.0.0.8/32", "IPv4 dummy address (RFC 7600)"),
    ("192.0.0.9/32", "PCP anycast (RFC 7723)"),
    ("192.0.0.10/32", "TURN anycast (RFC 8155)"),
    ("192.0.0.170/31", "NAT64/DNS64 discovery (RFC 7050)"),
    ("192.0.2.0/24", "documentation"),
    ("192.31.196.0/24", "AS112 DNS sink"),
    ("192.52.193.0/24", "AMT (RFC 7450)"),
    ("192.88.99.0/24", "6to4 relay anycast (deprecated)"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("192.175.48.0/24", "AS112 DNS sink"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "limited broadcast"),
]

NOT_GLOBAL = "reserved (outside global unicast 2000::/3)"
V6 = [
    ("::/3", NOT_GLOBAL),
    ("4000::/2", NOT_GLOBAL),
    ("8000::/1", NOT_GLOBAL),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "NAT64 local-use (RFC 8215)"),
    ("100::/64", "discard-only (RFC 6666)"),
    ("100:0:0:1::/64", "dummy prefix (RFC 9780)"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001:1::1/128", "PCP anycast (RFC 7723)"),
    ("2001:1::2/128", "TURN anycast (RFC 8155)"),
    ("2001:1::3/128", "DNS-SD SRP anycast (RFC 9665)"),
    ("2001:2::/48", "benchmarking"),
    ("2001:3::/32", "AMT (RFC 7450)"),
    ("2001:4:112::/48", "AS112 DNS sink"),
    ("2001:10::/28", "ORCHID (deprecated)"),
    ("2001:20::/28", "ORCHIDv2 (RFC 7343)"),
    ("2001:30::/28", "drone remote ID (RFC 9374)"),
    ("2001:db8::/32", "documentation"),
    ("2620:4f:8000::/48", "AS112 DNS sink"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 SIDs (RFC 9602)"),
    ("fc00::/7", "unique local (ULA)"),
    ("fd7a:115c:a1e0::53/128", "Tailscale's own services (boxy's upstream resolver only)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
]
# Encodings whose payload decides (carved out of the wider denied entries).
CARVE_OUTS = ["::ffff:0:0/96", "64:ff9b::/96", "2001::/32", "2002::/16"]


def test_tables_match_this_test() -> None:
    assert sorted(ranges.V4_TABLE) == sorted(V4)
    denied_v6 = [(p, r) for p, r in ranges.V6_TABLE if r is not None]
    assert sorted(denied_v6) == sorted(V6)
    assert sorted(p for p, r in ranges.V6_TABLE if r is None) == sorted(CARVE_OUTS)


def _points(prefix: str) -> list[str]:
    net = ip_network(prefix)
    first, last = int(net.network_address), int(net.broadcast_address)
    make = type(net.network_address)
    return [str(make(v)) for v in sorted({first, (first + last) // 2, last})]


def _innermost(table: list[tuple[str, str]], addr: str) -> str:
    a = ip_address(addr)
    hits = [(ip_network(p).prefixlen, r) for p, r in table if a in ip_network(p)]
    return max(hits)[1]


def _expected(addr: str) -> str:
    """The reason for a point of a table entry, as this test's tables say it."""
    a = ip_address(addr)
    table = V4 if a.version == 4 else V6
    if a.version == 6 and any(a in ip_network(c) for c in CARVE_OUTS):
        raise AssertionError("not a plain table point")
    return _innermost(table, addr)


def _v6_points() -> list[str]:
    out = []
    for p, _ in V6:
        for a in _points(p):
            if a in ("::", "::1") or not any(ip_address(a) in ip_network(c) for c in CARVE_OUTS):
                out.append(a)
    return out


V4_POINTS = [a for p, _ in V4 for a in _points(p)]


@pytest.mark.parametrize("addr", V4_POINTS)
def test_every_v4_entry_first_middle_last(addr: str) -> None:
    assert classify(addr) == _expected(addr)
    assert classify(IPv4Address(addr)) == _expected(addr)


@pytest.mark.parametrize("addr", _v6_points())
def test_every_v6_entry_first_middle_last(addr: str) -> None:
    reason = classify(addr)
    if embedded_v4(IPv6Address(addr)):  # ::/96, 64:ff9b:1::/48: the payload may name the reason
        assert reason is not None
        return
    assert reason == _expected(addr)


def test_v4_compatible_interior_points() -> None:
    # The /96 points above decode to 0.0.0.0/8 etc.; a public payload gets the entry's own reason.
    assert classify("::8.8.8.8") == "IPv4-compatible (deprecated)"
    assert classify("::10.0.0.1") == "IPv4-compatible-encoded 10.0.0.1: private (RFC 1918)"
    assert classify("::") == "unspecified"
    assert classify("::1") == "loopback"


@pytest.mark.parametrize(
    "addr",
    [
        "1.0.0.0",
        "1.1.1.1",
        "8.8.8.8",
        "9.255.255.255",
        "11.0.0.0",
        "11.0.0.1",
        "100.63.255.255",
        "100.128.0.0",
        "126.255.255.255",
        "128.0.0.0",
        "169.253.255.255",
        "169.255.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "191.255.255.255",
        "192.0.1.0",
        "192.0.3.0",
        "192.31.195.255",
        "192.31.197.0",
        "192.52.192.255",
        "192.52.194.0",
        "192.88.98.255",
        "192.88.100.0",
        "192.167.255.255",
        "192.169.0.0",
        "192.175.47.255",
        "192.175.49.0",
        "198.17.255.255",
        "198.20.0.0",
        "198.51.99.255",
        "198.51.101.0",
        "203.0.112.255",
        "203.0.114.0",
        "223.255.255.255",
        "2000::",
        "2000::1",
        "2001:200::",  # just past 2001::/23
        "2001:4860:4860::8888",
        "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
        "2001:db9::",
        "2003::",
        "2606:4700:4700::1111",
        "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff",
        "2620:4f:8001::",
        "3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "3fff:1000::",
        "2a00:1450:4001:80b::200e",
    ],
)
def test_public_neighbours(addr: str) -> None:
    assert classify(addr) is None
    assert denied(addr) is None


@pytest.mark.parametrize(
    "addr,reason",
    [
        ("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", NOT_GLOBAL),
        ("4000::", NOT_GLOBAL),
        ("fe00::1", NOT_GLOBAL),
        ("0:0:0:0:1::", NOT_GLOBAL),
        ("::ffff:0:0:0", NOT_GLOBAL),  # SIIT's IPv4-translated form: not decoded, reserved
        ("64:ff9b::1:0:0:0", NOT_GLOBAL),  # beside the /96, not in it
        ("169.254.169.254", "link-local / cloud metadata"),
        ("fd00::15", "unique local (ULA)"),
        ("fd7a:115c:a1e0::1", "unique local (ULA)"),
        ("100.100.100.100", "Tailscale's own services (boxy's upstream resolver only)"),
        ("100.100.100.101", "CGNAT / tailnet (RFC 6598)"),
    ],
)
def test_more_denials(addr: str, reason: str) -> None:
    assert classify(addr) == reason


# --- encodings, built here independently of the module ---------------------------


def nat64(v4: str) -> str:
    return str(IPv6Address(int(IPv6Address("64:ff9b::")) | int(IPv4Address(v4))))


def nat64_48(v4: str) -> str:
    """RFC 6052 §2.2 with the /48 local-use prefix: v4 split around the u-octet."""
    v = int(IPv4Address(v4))
    return str(IPv6Address(int(IPv6Address("64:ff9b:1::")) | (v >> 16) << 64 | (v & 0xFFFF) << 40))


def sixtofour(v4: str, rest: int = 0) -> str:
    return str(IPv6Address(0x2002 << 112 | int(IPv4Address(v4)) << 80 | rest))


def mapped(v4: str) -> str:
    return str(IPv6Address(0xFFFF << 32 | int(IPv4Address(v4))))


def teredo(server: str, client: str, flags: int = 0x8000, port: int = 0x63BF) -> str:
    c = ~int(IPv4Address(client)) & 0xFFFFFFFF
    s = int(IPv4Address(server))
    return str(IPv6Address(0x20010000 << 96 | s << 64 | flags << 48 | port << 32 | c))


def test_rfc_vectors() -> None:
    # RFC 6052 §2.4 (192.0.2.33 under a /48) and RFC 4380 §4 (the Teredo example).
    assert nat64_48("192.0.2.33") == "64:ff9b:1:c000:2:2100::"
    assert teredo("65.54.227.120", "192.0.2.45") == "2001:0:4136:e378:8000:63bf:3fff:fdd2"
    assert embedded_v4(IPv6Address("2001:0:4136:e378:8000:63bf:3fff:fdd2")) == [
        ("Teredo server", IPv4Address("65.54.227.120")),
        ("Teredo client", IPv4Address("192.0.2.45")),
    ]
    assert embedded_v4(IPv6Address("64:ff9b:1:c000:2:2100::")) == [
        ("NAT64", IPv4Address("192.0.2.33"))
    ]
    assert embedded_v4(IPv6Address("2606:4700::1")) == []
    assert embedded_v4(IPv6Address("::1")) == []


PRIVATE_PAYLOADS = [
    ("192.168.1.1", "private (RFC 1918)"),
    ("10.0.0.1", "private (RFC 1918)"),
    ("172.16.5.4", "private (RFC 1918)"),
    ("127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local / cloud metadata"),
    ("100.64.0.1", "CGNAT / tailnet (RFC 6598)"),
    ("0.0.0.0", "this network"),
    ("224.0.0.251", "multicast"),
    ("255.255.255.255", "limited broadcast"),
]
PUBLIC_PAYLOADS = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "11.0.0.1", "172.32.0.1"]


@pytest.mark.parametrize("v4,reason", PRIVATE_PAYLOADS)
@pytest.mark.parametrize(
    "encode,label",
    [
        (nat64, "NAT64-encoded"),
        (nat64_48, "NAT64-encoded"),
        (sixtofour, "6to4-encoded"),
        (mapped, "IPv4-mapped-encoded"),
        (lambda v4: teredo("8.8.8.8", v4), "Teredo-encoded client"),
        (lambda v4: teredo(v4, "8.8.8.8"), "Teredo-encoded server"),
    ],
)
def test_encoded_private_is_denied(
    encode: Callable[[str], str], label: str, v4: str, reason: str
) -> None:
    addr = encode(v4)
    assert classify(addr) == f"{label} {v4}: {reason}"
    assert classify(IPv6Address(addr)) == f"{label} {v4}: {reason}"


@pytest.mark.parametrize("v4", PUBLIC_PAYLOADS)
@pytest.mark.parametrize(
    "encode",
    [nat64, mapped, sixtofour, lambda v4: sixtofour(v4, 0x1234_5678), lambda v4: teredo(v4, v4)],
)
def test_encoded_public_is_allowed(encode: Callable[[str], str], v4: str) -> None:
    assert classify(encode(v4)) is None


@pytest.mark.parametrize("v4", PUBLIC_PAYLOADS)
def test_wholesale_encodings_stay_denied_with_public_payloads(v4: str) -> None:
    assert classify(nat64_48(v4)) == "NAT64 local-use (RFC 8215)"
    compat = str(IPv6Address(int(IPv4Address(v4))))
    assert classify(compat) == "IPv4-compatible (deprecated)"


def test_named_examples() -> None:
    assert classify("64:ff9b::192.168.1.1") == "NAT64-encoded 192.168.1.1: private (RFC 1918)"
    assert classify("64:ff9b::8.8.8.8") is None
    assert classify("2002:c0a8:0101::") == "6to4-encoded 192.168.1.1: private (RFC 1918)"
    assert classify("::ffff:127.0.0.1") == "IPv4-mapped-encoded 127.0.0.1: loopback"
    assert classify("2001:0:4136:e378:8000:63bf:3fff:fdd2") == (
        "Teredo-encoded client 192.0.2.45: documentation"
    )


def test_inputs() -> None:
    assert classify("fe80::1%eth0") == "link-local"
    assert classify(ip_address("10.1.2.3")) == "private (RFC 1918)"
    with pytest.raises(ValueError):
        classify("not-an-address")
    with pytest.raises(ValueError):
        classify("10.0.0.0/8")


# --- exceptions -------------------------------------------------------------------

LAN = ip_network("192.168.4.0/24")


@pytest.mark.parametrize(
    "addr,exceptions,expected",
    [
        ("192.168.4.7", [LAN], None),
        ("192.168.5.1", [LAN], "private (RFC 1918)"),
        (nat64("192.168.4.7"), [LAN], None),  # the embedded destination is excepted
        (sixtofour("192.168.4.7"), [LAN], None),
        (mapped("192.168.4.7"), [LAN], None),
        (teredo("8.8.8.8", "192.168.4.7"), [LAN], None),
        (nat64("192.168.5.7"), [LAN], "NAT64-encoded 192.168.5.7: private (RFC 1918)"),
        # An encoding prefix never opens what it carries.
        (nat64("192.168.4.7"), [ip_network("64:ff9b::/96")], "NAT64-encoded 192.168.4.7: "),
        (sixtofour("10.1.1.1"), [ip_network("2002::/16")], "6to4-encoded 10.1.1.1: "),
        (mapped("127.0.0.1"), [ip_network("::ffff:0:0/96")], "IPv4-mapped-encoded 127.0.0.1: "),
        # A wholesale-denied encoding needs both its own prefix and its payload opened.
        (nat64_48("192.168.4.7"), [LAN], "NAT64 local-use (RFC 8215)"),
        (nat64_48("192.168.4.7"), [LAN, ip_network("64:ff9b:1::/48")], None),
        (nat64_48("192.168.4.7"), [ip_network("64:ff9b:1::/48")], "NAT64-encoded 192.168.4.7"),
        (nat64_48("8.8.8.8"), [ip_network("64:ff9b:1::/48")], None),
        (str(IPv6Address(int(IPv4Address("192.168.4.7")))), [LAN], "IPv4-compatible"),
        # Teredo: each embedded address is lifted on its own.
        (teredo("192.168.4.1", "10.9.9.9"), [LAN], "Teredo-encoded client 10.9.9.9: "),
        (teredo("192.168.4.1", "10.9.9.9"), [LAN, ip_network("10.9.0.0/16")], None),
        # Version and scope.
        ("fd12::1", [ip_network("fd12::/16")], None),
        ("fd13::1", [ip_network("fd12::/16")], "unique local (ULA)"),
        ("10.0.0.1", [ip_network("::/1")], "private (RFC 1918)"),
        ("100.100.1.1", list(TAILSCALE_NETS), None),
        ("fd7a:115c:a1e0:ab12::1", list(TAILSCALE_NETS), None),
        ("fd7a:115c:a1e1::1", list(TAILSCALE_NETS), "unique local (ULA)"),
        ("100.128.0.1", list(TAILSCALE_NETS), None),  # public anyway
        ("127.0.0.1", list(TAILSCALE_NETS), "loopback"),
        # Tailscale's own services stay closed whatever opens the tailnet.
        ("100.100.100.100", list(TAILSCALE_NETS), "Tailscale's own services"),
        ("100.100.100.100", [ip_network("100.100.100.100/32")], "Tailscale's own services"),
        ("fd7a:115c:a1e0::53", list(TAILSCALE_NETS), "Tailscale's own services"),
        (
            nat64("100.100.100.100"),
            list(TAILSCALE_NETS),
            "NAT64-encoded 100.100.100.100: Tailscale",
        ),
        ("100.100.100.99", list(TAILSCALE_NETS), None),
        ("100.100.100.101", list(TAILSCALE_NETS), None),
        ("fd7a:115c:a1e0::52", list(TAILSCALE_NETS), None),
        # The sandbox's own link is never opened, whatever the caller passes.
        ("10.0.2.2", [ip_network("10.0.0.0/8")], "private (RFC 1918)"),
        ("fd00::2", [ip_network("fd00::/8")], "unique local (ULA)"),
        (nat64("10.0.2.2"), [ip_network("10.0.0.0/8")], "NAT64-encoded 10.0.2.2: "),
        ("10.0.3.1", [ip_network("10.0.0.0/8")], None),
    ],
)
def test_exceptions(addr: str, exceptions: list[Network], expected: str | None) -> None:
    got = denied(addr, exceptions)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.startswith(expected)


def test_constants() -> None:
    assert [str(n) for n in TAILSCALE_NETS] == ["100.64.0.0/10", "fd7a:115c:a1e0::/48"]
    assert [str(n) for n in SANDBOX_NETS] == ["10.0.2.0/24", "fd00::/64"]
    # values refuses --allow-cidr over these very prefixes
    for net in SANDBOX_NETS:
        with pytest.raises(UsageError, match="overlaps the sandbox's own network"):
            values.parse_cidr(str(net))


# --- the static nftables prefixes -------------------------------------------------


class _Set:
    """Prefixes (collapsed: disjoint) with an O(log n) membership test."""

    def __init__(self, prefixes: list[str]) -> None:
        nets = (ip_network(p) for p in prefixes)
        self.nets = sorted(nets, key=lambda n: (n.version, int(n.network_address)))
        self.keys = [(n.version, int(n.network_address)) for n in self.nets]

    def __contains__(self, addr: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        a = ip_address(addr) if isinstance(addr, str) else addr
        i = bisect.bisect_right(self.keys, (a.version, int(a))) - 1
        return i >= 0 and self.nets[i].version == a.version and a in self.nets[i]


STATIC = static_prefixes()


@pytest.mark.parametrize("prefix", STATIC.deny_v4 + STATIC.deny_v6)
def test_every_static_prefix_is_denied(prefix: str) -> None:
    net = ip_network(prefix)
    rng = random.Random(prefix)
    first, last = int(net.network_address), int(net.broadcast_address)
    samples = {first, last, (first + last) // 2} | {rng.randint(first, last) for _ in range(8)}
    make = type(net.network_address)
    for v in samples:
        assert classify(make(v)) is not None, (prefix, str(make(v)))


def test_static_contains_encoded_denied_ranges_not_whole_encodings() -> None:
    deny6 = set(STATIC.deny_v6)
    for p in ["64:ff9b::a00:0/104", "2002:a00::/24", "::ffff:a00:0/104", "2001:0:a00::/40"]:
        assert p in deny6
    deny = _Set(STATIC.deny_v6)
    for p in ["64:ff9b:1::/48", "fc00::/7", "fe80::/10", "ff00::/8", "::/96"]:
        net = ip_network(p)
        assert net.network_address in deny and net.broadcast_address in deny, p
    nets6 = [n for n in deny.nets if isinstance(n, IPv6Network)]
    assert len(nets6) == len(deny.nets)
    for whole in CARVE_OUTS + ["2000::/3"]:
        assert not any(IPv6Network(whole).subnet_of(n) for n in nets6), whole
    assert "10.0.0.0/8" in STATIC.deny_v4
    assert "169.254.0.0/16" in STATIC.deny_v4


@pytest.mark.parametrize(
    "addr",
    [nat64(v) for v in PUBLIC_PAYLOADS]
    + [sixtofour(v) for v in PUBLIC_PAYLOADS]
    + [mapped(v) for v in PUBLIC_PAYLOADS]
    + [teredo(v, v) for v in PUBLIC_PAYLOADS]
    + PUBLIC_PAYLOADS
    + ["2606:4700:4700::1111", "2001:200::1", "3fff:1000::1"],
)
def test_public_addresses_are_in_no_static_prefix(addr: str) -> None:
    assert addr not in _Set(STATIC.deny_v4 + STATIC.deny_v6)


def test_static_v4_matches_classify_exactly() -> None:
    # Every /16's first and last address, plus every table point.
    deny = _Set(STATIC.deny_v4)
    points = [IPv4Address(b << 16 | low) for b in range(1 << 16) for low in (0, 0xFFFF)]
    for addr in points + [IPv4Address(a) for a in V4_POINTS]:
        assert (classify(addr) is not None) == (addr in deny), addr


@pytest.mark.parametrize(
    "exceptions",
    [
        list(TAILSCALE_NETS),
        [ip_network("100.100.100.100/32")],
        [ip_network("100.0.0.0/8"), ip_network("fd7a::/16")],
    ],
)
def test_static_exceptions_never_open_tailscale_services(exceptions: list[Network]) -> None:
    s = static_prefixes(exceptions)
    accept, deny = _Set(s.accept_v4 + s.accept_v6), _Set(s.deny_v4 + s.deny_v6)
    for addr in (
        "100.100.100.100",
        "fd7a:115c:a1e0::53",
        nat64("100.100.100.100"),
        sixtofour("100.100.100.100"),
        mapped("100.100.100.100"),
    ):
        assert addr not in accept and addr in deny, addr
    if exceptions == list(TAILSCALE_NETS):  # the neighbours are opened as before
        for addr in (
            "100.100.100.99",
            "100.100.100.101",
            "100.64.0.0",
            "100.127.255.255",
            "fd7a:115c:a1e0::52",
            "fd7a:115c:a1e0::54",
            "fd7a:115c:a1e0:ffff::1",
        ):
            assert addr in accept, addr


def test_static_exceptions_cover_every_lifted_denial() -> None:
    exceptions = [LAN, ip_network("fd12:3456::/32"), ip_network("100.64.0.0/10")]
    s = static_prefixes(exceptions)
    # 100.64.0.0/10 less Tailscale's own 100.100.100.100, which no exception opens
    tailnet = list(IPv4Network("100.64.0.0/10").address_exclude(IPv4Network("100.100.100.100/32")))
    assert s.accept_v4 == [str(n) for n in ipaddress.collapse_addresses(tailnet)] + [
        "192.168.4.0/24"
    ]
    assert "fd12:3456::/32" in s.accept_v6
    assert "64:ff9b::c0a8:400/120" in s.accept_v6
    assert "2002:c0a8:400::/40" in s.accept_v6
    assert s.deny_v4 == STATIC.deny_v4 and s.deny_v6 == STATIC.deny_v6
    deny, accept = _Set(s.deny_v4 + s.deny_v6), _Set(s.accept_v4 + s.accept_v6)
    rng = random.Random(7)
    candidates = [
        "192.168.4.7",
        "192.168.5.1",
        "fd12:3456::1",
        "fd12:3457::1",
        "100.100.0.1",
        "100.100.100.100",
        nat64("100.100.100.100"),
    ]
    for _ in range(3000):
        v4 = str(IPv4Address(rng.choice([rng.getrandbits(32), 0xC0A80400 | rng.getrandbits(8)])))
        candidates += [
            v4,
            nat64(v4),
            sixtofour(v4, rng.getrandbits(80)),
            mapped(v4),
            teredo(v4, str(IPv4Address(rng.getrandbits(32)))),
            str(IPv6Address(rng.getrandbits(128))),
            str(IPv6Address(rng.getrandbits(3) << 125 | rng.getrandbits(100))),
        ]
    rejected = 0
    for addr in candidates:
        early = addr in deny and addr not in accept
        rejected += early
        # nftables rejects early only what boxyd would deny anyway.
        assert not early or denied(addr, exceptions) is not None, addr
    assert rejected > 1000  # the sample really exercised the lists


def test_static_prefixes_are_made_once_and_handed_out_fresh() -> None:
    """The denied prefixes are the same for every run (made once: issue #18); what a
    caller does with its lists never reaches the next run's ruleset."""
    first = ranges.static_prefixes()
    first.deny_v4.clear()
    first.deny_v6.append("::/0")
    again = ranges.static_prefixes([ipaddress.ip_network("192.0.2.7/32")])
    assert again.deny_v4 and "::/0" not in again.deny_v6
    assert again.accept_v4 == ["192.0.2.7/32"]
