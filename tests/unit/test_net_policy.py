"""boxyd.net.policy: the per-flow decision in both modes, layer by layer."""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import pytest

from boxy.errors import UsageError
from boxyd.net.policy import DNS, ECH_REFUSED, IP, PORT, SNI, NetPolicy, Verdict

PUB = "93.184.216.34"  # a public address the DNS answer bound
CDN = "151.101.1.1"  # a public address shared by several names
LAN = "192.168.4.9"
NO_BINDING = "no DNS binding for this address (hard-coded IP?)"
NOT_LISTED = "hostname not on the allowlist"
QUIC = "QUIC refused in allowlist mode (clients fall back to TCP)"


def allowlist(
    *hosts: str, ports: Iterable[int] = (), cidrs: Iterable[str] = (), tailscale: bool = False
) -> NetPolicy:
    return NetPolicy.from_spec("allowlist", list(hosts), list(ports), list(cidrs), tailscale)


PUBLIC = NetPolicy.from_spec("public", [], [], [], False)
OK_DNS = Verdict(True, DNS)


def refused(v: Verdict, layer: str, reason: str) -> bool:
    return not v.allow and v.layer == layer and v.reason == reason


# --- from_spec --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (("none", [], [], [], False), "--net: 'none' has no gateway policy"),
        (("both", [], [], [], False), "--net: 'both'"),
        (("public", ["a.example"], [], [], False), "cannot be combined with --net public"),
        (("allowlist", ["a.example:0"], [], [], False), "not a port number"),
        (("allowlist", ["*.com"], [], [], False), "a wildcard must be"),
        (
            ("allowlist", ["192.168.4.7:22"], [], [], False),
            r"192\.168\.4\.7:22: the address is in a denied range .private .RFC 1918..; open it with "
            r"--allow-cidr 192\.168\.4\.7 as well",
        ),
        (("allowlist", ["[fd00::7]:22"], [], [], False), "overlaps|denied range"),
        (("allowlist", [], [0], [], False), "--allow-port: 0 is not a port number"),
        (("allowlist", [], [65536], [], False), "--allow-port: 65536"),
        (("allowlist", [], [True], [], False), "--allow-port: True"),
        (("allowlist", [], ["80"], [], False), "--allow-port: '80'"),
        (("allowlist", [], [], ["0.0.0.0/0"], False), "every address"),
        (("allowlist", [], [], ["::/0"], False), "every address"),
        (("allowlist", [], [], ["10.0.0.0/8"], False), "overlaps the sandbox's own network"),
        (("allowlist", [], [], ["fd00::/64"], False), "overlaps the sandbox's own network"),
        (("public", [], [], ["10.0.2.15"], False), "overlaps"),
        (("allowlist", [], [], ["lan"], False), "not an address range"),
        (("allowlist", ["h.example:443/udp"], [], [], False), "QUIC .UDP/443. is refused"),
        (("allowlist", ["h.example:53,443/udp"], [], [], False), "QUIC"),
    ],
)
def test_from_spec_refuses(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        NetPolicy.from_spec(*args)


def test_from_spec_compiles() -> None:
    p = allowlist("A.Example.", "nas:22", "nas", "*.cdn.example:8443", "dns.example:53/udp")
    assert p.mode == "allowlist"
    assert p.global_ports == {80, 443}
    assert set(p.exact) == {"a.example", "nas", "dns.example"}
    assert set(p.wildcards) == {".cdn.example"}
    assert allowlist(ports=[8080, 8080]).global_ports == {8080}
    # --allow-port means nothing in public mode; still a valid spec.
    assert NetPolicy.from_spec("public", [], [22], [], False).mode == "public"


# --- DNS --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,allowed",
    [
        ("a.example", True),
        ("A.EXAMPLE.", True),
        ("b.a.example", False),  # exact names do not cover subdomains
        ("example", False),
        ("x.cdn.example", True),
        ("X.Y.CDN.Example.", True),
        ("cdn.example", False),  # a wildcard is strictly below
        ("xcdn.example", False),
        ("cdn.example.evil", False),
        ("dns.example", True),  # allowed for UDP only, still resolvable
        ("nas", True),
        ("evil.test", False),
    ],
)
def test_dns(name: str, allowed: bool) -> None:
    p = allowlist("a.example", "*.cdn.example", "dns.example:5353/udp", "nas:22")
    assert p.name_allowed(name) is allowed
    v = p.dns(name)
    assert v == (Verdict(True, DNS) if allowed else Verdict(False, DNS, NOT_LISTED))
    assert PUBLIC.name_allowed(name)


def test_address_and_address_denied() -> None:
    p = allowlist("a.example", cidrs=["192.168.4.0/24"])
    assert p.address(PUB) == Verdict(True, IP)
    assert p.address(LAN) == Verdict(True, IP)
    assert p.address("192.168.5.1") == Verdict(False, IP, "private (RFC 1918)")
    assert p.address_denied("64:ff9b::192.168.4.9") is None
    assert p.address_denied("64:ff9b::127.0.0.1") == "NAT64-encoded 127.0.0.1: loopback"
    assert PUBLIC.address("169.254.169.254") == Verdict(False, IP, "link-local / cloud metadata")
    assert PUBLIC.address_denied(IPv6Address("2002:c0a8:101::")) is not None


# --- public mode ------------------------------------------------------------------


@pytest.mark.parametrize("port", [1, 22, 80, 443, 8443, 65535])
def test_public_any_port_no_binding(port: int) -> None:
    assert PUBLIC.tcp_connect(PUB, port, []).allow
    assert PUBLIC.tcp_opaque(PUB, port, []).allow
    assert PUBLIC.tcp_name(PUB, port, "anything.test", [], kind="sni").allow
    assert PUBLIC.tcp_name(PUB, port, "other.test:81", ["x.test"], kind="host").allow
    assert PUBLIC.udp(PUB, port, []).allow


@pytest.mark.parametrize(
    "ip", ["10.1.2.3", "127.0.0.1", "169.254.169.254", "fd00::2", "64:ff9b::10.0.0.1", "::1"]
)
def test_public_still_checks_ranges(ip: str) -> None:
    for v in (
        PUBLIC.tcp_connect(ip, 443, ["a.example"]),
        PUBLIC.tcp_name(ip, 443, "a.example", ["a.example"]),
        PUBLIC.tcp_opaque(ip, 22, []),
        PUBLIC.udp(ip, 443, []),
    ):
        assert not v.allow and v.layer == IP and v.reason


def test_public_quic_allowed_and_ech_refused() -> None:
    assert PUBLIC.udp(PUB, 443, []) == Verdict(True, IP)
    assert ECH_REFUSED.allow is False and ECH_REFUSED.layer == SNI and "ECH" in ECH_REFUSED.reason


def test_public_cidr_and_tailscale_are_exceptions() -> None:
    p = NetPolicy.from_spec("public", [], [], ["192.168.4.0/24"], True)
    assert p.tcp_connect(LAN, 631, []).allow
    assert p.tcp_connect("100.100.7.7", 22, []).allow
    assert p.tcp_connect("fd7a:115c:a1e0::5", 22, []).allow
    assert not p.tcp_connect("192.168.5.1", 80, []).allow


# --- allowlist: TCP connect -------------------------------------------------------


def test_connect_needs_a_binding() -> None:
    p = allowlist("a.example")
    assert refused(p.tcp_connect(PUB, 443, []), DNS, NO_BINDING)
    assert p.tcp_connect(PUB, 443, ["a.example"]) == OK_DNS
    assert p.tcp_connect(PUB, 443, ["A.Example."]) == OK_DNS


def test_connect_ranges_come_first() -> None:
    p = allowlist("a.example")
    # A rebinding answer that slipped through still meets the range check.
    v = p.tcp_connect("10.9.9.9", 443, ["a.example"])
    assert refused(v, IP, "private (RFC 1918)")
    v = p.tcp_connect("64:ff9b::a9fe:a9fe", 443, ["a.example"])
    assert refused(v, IP, "NAT64-encoded 169.254.169.254: link-local / cloud metadata")


@pytest.mark.parametrize(
    "hosts,ports,port,allowed",
    [
        (["a.b.example"], [], 443, True),  # global default 80, 443
        (["a.b.example"], [], 80, True),
        (["a.b.example"], [], 22, False),
        (["a.b.example"], [8080], 8080, True),  # --allow-port replaces the default
        (["a.b.example"], [8080], 443, False),
        (["a.b.example:22"], [], 22, True),  # explicit ports only
        (["a.b.example:22"], [], 443, False),
        (["a.b.example:22", "a.b.example"], [], 443, True),  # both rules apply
        (["a.b.example:22", "a.b.example"], [], 22, True),
        (["a.b.example:8443,9443"], [8080], 9443, True),
        (["a.b.example:8443,9443"], [8080], 8080, False),
        (["a.b.example:5353/udp"], [], 443, False),  # UDP ports grant no TCP
        (["a.b.example:5353/udp"], [], 5353, False),
        (["*.b.example"], [], 443, True),
        (["*.b.example:22"], [], 22, True),
        (["*.b.example:22"], [], 443, False),
        (["*.b.example:22", "a.b.example"], [], 443, True),  # rules for one name add up
        (["*.b.example:22", "a.b.example"], [], 22, True),
    ],
)
def test_connect_ports(hosts: list[str], ports: list[int], port: int, allowed: bool) -> None:
    p = allowlist(*hosts, ports=ports)
    v = p.tcp_connect(PUB, port, ["a.b.example"])
    if allowed:
        assert v == OK_DNS
    else:
        assert refused(v, PORT, f"port {port} not allowed for a.b.example")


def test_connect_bound_names_any_may_allow() -> None:
    p = allowlist("a.example", "b.example:22")
    assert p.tcp_connect(CDN, 22, ["a.example", "b.example"]) == OK_DNS
    assert p.tcp_connect(CDN, 443, ["a.example", "b.example"]) == OK_DNS
    v = p.tcp_connect(CDN, 25, ["b.example", "a.example"])
    assert refused(v, PORT, "port 25 not allowed for a.example, b.example")


def test_connect_bound_name_not_listed() -> None:
    v = allowlist("a.example").tcp_connect(PUB, 443, ["stale.test"])
    assert refused(v, DNS, NOT_LISTED)


def test_connect_tailnet() -> None:
    hosts = ("nas:22",)
    assert refused(
        allowlist(*hosts).tcp_connect("100.101.1.2", 22, ["nas"]), IP, "CGNAT / tailnet (RFC 6598)"
    )
    p = allowlist(*hosts, tailscale=True)
    assert p.tcp_connect("100.101.1.2", 22, ["nas"]) == OK_DNS
    assert p.tcp_connect("fd7a:115c:a1e0::9", 22, ["nas"]) == OK_DNS
    # --tailscale lifts the range objection only: a hard-coded tailnet address is refused.
    assert refused(p.tcp_connect("100.101.1.2", 443, []), DNS, NO_BINDING)
    assert refused(p.tcp_connect("100.101.1.2", 443, ["nas"]), PORT, "port 443 not allowed for nas")
    assert not p.tcp_connect("192.168.1.1", 22, ["nas"]).allow


def test_allow_cidr_lifts_the_range_objection_and_only_that() -> None:
    """An address inside an opened prefix needs a binding, exactly like a public one."""
    p = allowlist("printer.local:631", "a.example", cidrs=["192.168.4.0/24"])
    assert refused(p.tcp_connect(LAN, 443, []), DNS, NO_BINDING)
    assert refused(p.tcp_connect("::ffff:192.168.4.9", 443, []), DNS, NO_BINDING)
    assert p.tcp_connect(LAN, 631, ["printer.local"]) == OK_DNS
    assert refused(p.tcp_connect("192.168.5.9", 443, []), IP, "private (RFC 1918)")
    assert refused(p.tcp_opaque(LAN, 443, []), DNS, NO_BINDING)  # an SSH banner, say
    assert refused(p.tcp_name(LAN, 443, "", []), DNS, NO_BINDING)  # TLS without SNI
    assert refused(
        p.tcp_name(LAN, 443, "a.example", []), SNI, "SNI names a.example, not bound to this address"
    )
    # A public prefix works the same way; so do the tailnet's ranges.
    q = allowlist(cidrs=["198.51.100.0/24"], ports=[8443])
    assert refused(q.tcp_connect("198.51.100.7", 8443, []), DNS, NO_BINDING)
    t = allowlist(tailscale=True)
    assert refused(t.tcp_connect("100.101.1.2", 443, []), DNS, NO_BINDING)


@pytest.mark.parametrize("addr,mapped", [("192.168.4.7", "::ffff:192.168.4.7"), ("fd42::7", None)])
def test_a_literal_host_is_its_own_binding(addr: str, mapped: str | None) -> None:
    host = f"[{addr}]:22" if ":" in addr else f"{addr}:22"
    cidr = "192.168.4.0/24" if "." in addr else "fd42::/64"
    p = allowlist(host, f"{addr}", "dns.example:5353/udp", cidrs=[cidr])
    assert p.tcp_connect(addr, 22, []) == OK_DNS
    assert p.tcp_opaque(addr, 22, []) == OK_DNS  # an SSH banner: the address is the name
    assert p.tcp_name(addr, 443, "", []) == OK_DNS  # TLS to an address carries no SNI
    assert p.tcp_name(addr, 443, "anything.example", []) == OK_DNS
    if mapped:
        assert p.tcp_connect(mapped, 22, []) == OK_DNS
    other = addr[:-1] + "8"  # the next address of the same opened prefix
    assert refused(p.tcp_connect(other, 22, []), DNS, NO_BINDING)
    assert refused(p.tcp_opaque(other, 22, []), DNS, NO_BINDING)
    assert refused(p.tcp_connect(addr, 23, []), PORT, f"port 23 not allowed for {addr}")
    assert refused(p.udp(addr, 5353, []), PORT, f"UDP port 5353 not allowed for {addr}")
    assert not p.dns(addr).allow  # an address is never looked up


# --- allowlist: SNI / Host --------------------------------------------------------


def test_sni_allowed() -> None:
    p = allowlist("a.example", "*.cdn.example")
    assert p.tcp_name(PUB, 443, "a.example", ["a.example"]) == Verdict(True, SNI)
    assert p.tcp_name(PUB, 443, "A.EXAMPLE.", ["a.example"]) == Verdict(True, SNI)
    assert p.tcp_name(CDN, 443, "x.cdn.example", ["x.cdn.example", "b.test"]).allow


def test_sni_names_allowed_host_not_bound_here() -> None:
    # Forged SNI: an allowed name, sent to an address bound to another (allowed) name.
    p = allowlist("a.example", "b.example")
    v = p.tcp_name(CDN, 443, "a.example", ["b.example"])
    assert refused(v, SNI, "SNI names a.example, not bound to this address")


def test_sni_names_unlisted_host_on_shared_address() -> None:
    p = allowlist("a.example")
    v = p.tcp_name(CDN, 443, "evil.test", ["a.example"])
    assert refused(v, SNI, "SNI names evil.test: hostname not on the allowlist")
    # Even if evil.test is bound too (shared answer), it is not on the list.
    v = p.tcp_name(CDN, 443, "evil.test", ["a.example", "evil.test"])
    assert refused(v, SNI, "SNI names evil.test: hostname not on the allowlist")


def test_sni_wildcard_apex_not_covered() -> None:
    p = allowlist("*.cdn.example")
    v = p.tcp_name(CDN, 443, "cdn.example", ["cdn.example", "x.cdn.example"])
    assert refused(v, SNI, "SNI names cdn.example: hostname not on the allowlist")


def test_sni_port_checked_per_name() -> None:
    p = allowlist("a.example", "b.example:22")
    v = p.tcp_name(CDN, 22, "a.example", ["a.example", "b.example"])
    assert refused(v, PORT, "port 22 not allowed for a.example")
    assert p.tcp_name(CDN, 443, "a.example", ["a.example", "b.example"]).allow


@pytest.mark.parametrize(
    "header,allowed",
    [
        ("a.example", True),
        ("A.Example:80", True),
        ("a.example.:8080", True),  # the Host port is not the connection's
        (" a.example ", True),
        ("b.example", False),
        ("[::1]:80", False),
        ("93.184.216.34", False),
        ("a.example:80:80", False),
    ],
)
def test_host_header(header: str, allowed: bool) -> None:
    p = allowlist("a.example")
    v = p.tcp_name(PUB, 80, header, ["a.example"], kind="host")
    assert v.allow is allowed
    if not allowed:
        assert v.layer == SNI and v.reason.startswith("Host names ")


def test_missing_name() -> None:
    p = allowlist("a.example", "nas:443")
    v = p.tcp_name(PUB, 443, "", ["a.example"])
    assert refused(v, SNI, "TLS without SNI: only a host allowed with :443 takes that")
    v = p.tcp_name(PUB, 443, "", ["a.example"], kind="host")
    assert refused(v, SNI, "HTTP without Host: only a host allowed with :443 takes that")
    assert p.tcp_name(PUB, 443, "", ["nas"]).allow
    assert refused(p.tcp_name(PUB, 443, "", []), DNS, NO_BINDING)


# --- allowlist: opaque bytes ------------------------------------------------------


def test_opaque_needs_explicit_port() -> None:
    p = allowlist("a.example", "nas:22", "git.example:443")
    assert p.tcp_opaque(PUB, 22, ["nas"]) == OK_DNS
    assert p.tcp_opaque(PUB, 443, ["git.example"]) == OK_DNS
    v = p.tcp_opaque(PUB, 443, ["a.example"])
    assert refused(v, SNI, "neither TLS nor HTTP on port 443: allow the host with :443")
    assert refused(p.tcp_opaque(PUB, 22, ["a.example"]), PORT, "port 22 not allowed for a.example")
    assert refused(p.tcp_opaque(PUB, 22, []), DNS, NO_BINDING)
    assert refused(p.tcp_opaque(PUB, 23, ["nas"]), PORT, "port 23 not allowed for nas")


# --- allowlist: UDP ---------------------------------------------------------------


def test_udp() -> None:
    p = allowlist("a.example", "dns.example:5353,8853/udp", "nas:22", cidrs=["192.168.4.0/24"])
    assert p.udp(PUB, 5353, ["dns.example"]) == OK_DNS
    assert p.udp(PUB, 8853, ["DNS.example."]) == OK_DNS
    assert refused(
        p.udp(PUB, 5354, ["dns.example"]), PORT, "UDP port 5354 not allowed for dns.example"
    )
    assert refused(p.udp(PUB, 80, ["a.example"]), PORT, "UDP port 80 not allowed for a.example")
    assert refused(p.udp(PUB, 22, ["nas"]), PORT, "UDP port 22 not allowed for nas")
    assert refused(p.udp(PUB, 5353, []), DNS, NO_BINDING)
    assert refused(p.udp(LAN, 80, []), DNS, NO_BINDING)  # an opened prefix is no binding
    assert refused(p.udp(PUB, 5353, ["other.test"]), DNS, NOT_LISTED)
    assert refused(p.udp("10.0.0.53", 5353, ["dns.example"]), IP, "private (RFC 1918)")


@pytest.mark.parametrize("bound", [[], ["a.example"], ["dns.example"]])
def test_udp_quic_refused(bound: list[str]) -> None:
    p = allowlist("a.example", "dns.example:5353/udp")
    assert refused(p.udp(PUB, 443, bound), PORT, QUIC)
    assert refused(p.udp(IPv4Address(PUB), 443, bound), PORT, QUIC)


# --- Landlock ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "hosts,ports,cidrs,expected",
    [
        (["a.example"], [], [], [53, 80, 443]),
        (["nas:22"], [], [], [22, 53]),
        (["nas:22", "a.example"], [8443], [], [22, 53, 8443]),
        (["*.b.example:9000"], [], [], [53, 9000]),
        (["dns.example:5353/udp"], [], [], [53]),
        ([], [], ["192.168.4.0/24"], [53]),  # a prefix opens no port: its hosts do
        (["nas:22"], [631], ["192.168.4.0/24"], [22, 53]),
        (["192.168.4.7"], [631], ["192.168.4.0/24"], [53, 631]),
        ([], [], [], [53]),
    ],
)
def test_landlock_ports(
    hosts: list[str], ports: list[int], cidrs: list[str], expected: list[int]
) -> None:
    assert allowlist(*hosts, ports=ports, cidrs=cidrs).landlock_ports() == expected


def test_landlock_public() -> None:
    assert PUBLIC.landlock_ports() is None


def test_udp_ports_for_the_ruleset() -> None:
    assert PUBLIC.udp_ports() is None
    assert allowlist("a.example").udp_ports() == []
    assert allowlist(
        "dns.example:5353/udp", "v.example:9999,9998/udp", "a.example:22"
    ).udp_ports() == [5353, 9998, 9999]


# --- what the gateway's ruleset refused before boxyd saw it (NFLOG) ---------------

GATEWAY = "the gateway itself is not a destination"
OWN_LINK = "the sandbox's own link"
META = "link-local / cloud metadata"
TS_SVC = "Tailscale's own services (boxy's upstream resolver only)"


@pytest.mark.parametrize(
    "policy", [PUBLIC, allowlist("www.example"), allowlist("www.example", tailscale=True)]
)
@pytest.mark.parametrize(
    ("addr", "proto", "port", "reason"),
    [
        ("10.0.2.2", "tcp", 15001, GATEWAY),
        ("fd00::2", "tcp", 80, GATEWAY),
        ("10.0.2.2", "icmp", 0, GATEWAY),
        ("10.0.2.15", "tcp", 80, OWN_LINK),  # the sandbox itself
        ("10.0.2.255", "udp", 9, OWN_LINK),  # the link's broadcast
        ("fd00::15", "udp", 9, OWN_LINK),
        ("fd00::7", "tcp", 80, OWN_LINK),
        ("169.254.169.254", "tcp", 80, META),
        ("169.254.169.254", "udp", 80, META),
        ("169.254.0.1", "icmp", 0, META),
        ("fe80::1", "tcp", 80, "link-local"),
        ("224.0.0.251", "udp", 5353, "multicast"),
        ("239.255.255.250", "udp", 1900, "multicast"),
        ("ff02::fb", "udp", 5353, "multicast"),
        ("255.255.255.255", "udp", 67, "limited broadcast"),
        ("127.0.0.1", "tcp", 22, "loopback"),
        ("192.168.1.10", "tcp", 22, "private (RFC 1918)"),
        ("fd12::1", "tcp", 22, "unique local (ULA)"),
        ("240.0.0.1", "tcp", 22, "reserved"),
        ("192.0.2.10", "tcp", 80, "documentation"),
        ("198.18.0.10", "tcp", 80, "benchmarking"),
        ("100.100.100.100", "tcp", 8080, TS_SVC),
        ("fd7a:115c:a1e0::53", "udp", 41641, TS_SVC),
    ],
)
def test_early_refusal_names_the_range(
    policy: NetPolicy, addr: str, proto: str, port: int, reason: str
) -> None:
    v = policy.early_refusal(addr, proto, port, [])
    assert refused(v, IP, reason), v
    assert "gateway" not in v.reason or addr in ("10.0.2.2", "fd00::2")


def test_gateway_addresses_agree_with_the_ruleset() -> None:
    from boxyd.net import policy, ruleset

    assert {str(a) for a in policy.GATEWAY_ADDRS} == {ruleset.GATEWAY_V4, ruleset.GATEWAY_V6}


def test_early_refusal_of_a_port_or_a_missing_binding() -> None:
    assert refused(allowlist("www.example").early_refusal(PUB, "udp", 443, []), PORT, QUIC)
    assert refused(allowlist("www.example").early_refusal(PUB, "tcp", 80, []), DNS, NO_BINDING)
    assert refused(
        allowlist("www.example").early_refusal(PUB, "tcp", 22, ["www.example"]),
        PORT,
        "port 22 not allowed for www.example",
    )


def test_early_refusal_names_the_check_that_refused_under_a_race() -> None:
    """Issue 33 §1: a hard-coded LAN address under --allow-cidr, refused by the ruleset
    for want of a binding, was logged "private (RFC 1918)" when a binding for another
    name to that address appeared in the same moment; alone it said "no DNS binding".
    The reason is the check that refused: no binding when the packet came."""
    from boxyd.net.policy import UNBOUND_WHEN_SENT

    p = allowlist("nas.example:80", cidrs=["192.168.0.0/16"])
    alone = p.early_refusal("192.168.1.10", "tcp", 80, [])
    assert refused(alone, DNS, NO_BINDING)
    raced = p.early_refusal("192.168.1.10", "tcp", 80, ["nas.example"])
    assert refused(raced, DNS, UNBOUND_WHEN_SENT), raced


def test_early_refusal_of_an_opened_range_names_the_range() -> None:
    # --allow-cidr opens multicast for boxyd, but the ruleset's local/broadcast/multicast
    # check still refused it: say which range, not the gateway.
    p = NetPolicy.from_spec("public", [], [], ["224.0.0.0/4"], False)
    assert refused(p.early_refusal("224.0.0.251", "udp", 5353, []), IP, "multicast")
    # A public address the ruleset refused anyway (nothing in boxyd's policy would)
    assert refused(PUBLIC.early_refusal(PUB, "tcp", 80, []), IP, "refused by the gateway's ruleset")
