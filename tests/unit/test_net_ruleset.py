"""The gateway's nftables ruleset as data: structure, order, validation.

tests/integration/test_netns.py loads the same ruleset into a real netns and sends
traffic through it; these check what must hold whatever the kernel does.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from typing import Any

import pytest

from boxy.errors import SetupError
from boxyd.net import ruleset as rs
from boxyd.net.ranges import static_prefixes

BASE: dict[str, Any] = {
    "deny_v4": ["10.0.0.0/8", "192.168.0.0/16", "169.254.0.0/16"],
    "deny_v6": ["fc00::/7", "fe80::/10"],
    "except_v4": [],
    "except_v6": [],
}


def build(mode: str = "allowlist", **kw: Any) -> dict[str, Any]:
    return rs.gateway_ruleset(mode=mode, **{**BASE, **kw})


def objects(ruleset: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [o[kind] for o in ruleset["nftables"] if kind in o]


def chain(ruleset: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in objects(ruleset, "chain") if c["name"] == name]
    return c


def rules(ruleset: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in objects(ruleset, "rule") if r["chain"] == name]


def comments(ruleset: dict[str, Any], name: str) -> list[str]:
    return [r["comment"] for r in rules(ruleset, name)]


def rule(ruleset: dict[str, Any], name: str, comment: str) -> list[dict[str, Any]]:
    (r,) = [r for r in rules(ruleset, name) if r["comment"] == comment]
    expr: list[dict[str, Any]] = r["expr"]
    return expr


def sets(ruleset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in objects(ruleset, "set")}


def elems(ruleset: dict[str, Any], name: str) -> list[Any]:
    elem: list[Any] = sets(ruleset)[name].get("elem", [])
    return elem


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def collapsed(nets: Iterable[Network]) -> list[Network]:
    """sorted(ipaddress.collapse_addresses(NETS)), NETS of one family (it refuses a mix)."""
    nets = list(nets)
    v4 = [n for n in nets if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in nets if isinstance(n, ipaddress.IPv6Network)]
    if v4 and v6:
        raise TypeError("collapse_addresses: networks of both families")
    return sorted([*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6)])


def prefix(cidr: str) -> dict[str, Any]:
    addr, length = cidr.split("/")
    return {"prefix": {"addr": addr, "len": int(length)}}


def matches(expr: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["match"] for e in expr if "match" in e]


def verdict(expr: list[dict[str, Any]]) -> dict[str, Any]:
    return expr[-1]


# ------------------------------------------------------------------- the table ---


def test_one_table_inet_boxy_and_every_object_in_it() -> None:
    r = build()
    assert objects(r, "table") == [{"family": "inet", "name": "boxy"}]
    for kind in ("set", "chain", "rule"):
        for o in objects(r, kind):
            assert (o["family"], o["table"]) == ("inet", "boxy"), o


def test_is_plain_json_and_deterministic() -> None:
    assert json.loads(json.dumps(build())) == build()


def test_chains_hooks_priorities_policies() -> None:
    r = build()
    assert chain(r, "prerouting") == {
        "family": "inet",
        "table": "boxy",
        "name": "prerouting",
        "type": "filter",
        "hook": "prerouting",
        "prio": -150,
        "policy": "drop",
    }
    assert (chain(r, "input")["hook"], chain(r, "input")["prio"], chain(r, "input")["policy"]) == (
        "input",
        0,
        "drop",
    )
    assert (chain(r, "forward")["hook"], chain(r, "forward")["policy"]) == ("forward", "drop")
    assert rules(r, "forward") == []
    assert (chain(r, "output")["hook"], chain(r, "output")["policy"]) == ("output", "accept")
    assert "hook" not in chain(r, "refuse")  # a regular chain, reached by goto only


def test_every_chain_and_set_referenced_exists_and_is_declared_first() -> None:
    r = build(tcp_ports=[80])
    chains: set[str] = set()
    declared: set[str] = set()
    referenced: set[str] = set()
    for obj in r["nftables"]:
        if "chain" in obj:
            chains.add(obj["chain"]["name"])
        if "set" in obj:
            declared.add(obj["set"]["name"])
        if "rule" in obj:
            assert obj["rule"]["chain"] in chains
            for e in obj["rule"]["expr"]:
                if "goto" in e:
                    assert e["goto"]["target"] in chains
                for m in [e["match"]] if "match" in e else []:
                    if isinstance(m["right"], str) and m["right"].startswith("@"):
                        assert m["right"][1:] in declared, m
                        referenced.add(m["right"][1:])
    assert referenced == declared  # and no set is left unused


# ------------------------------------------------------------------ prerouting ---

PREROUTING = [
    "loopback",
    "only the sandbox link",
    "neighbour discovery",
    "ping refused",
    "ping6 refused",
    "other icmp",
    "other icmpv6",
    "dns udp",
    "dns tcp",
    "dns without listener",
    "gateway address",
    "gateway address v6",
    "gateway link-local",
    "gateway local",
    "denied range",
    "denied range v6",
    "refused udp port",
    "unbound address",
    "unbound address v6",
    "tcp relay",
    "udp relay",
]


def test_prerouting_order() -> None:
    assert comments(build(), "prerouting") == PREROUTING


def test_prerouting_order_with_a_tcp_port_list() -> None:
    got = comments(build(tcp_ports=[443, 80]), "prerouting")
    assert got == [*PREROUTING[:-4], "refused tcp port", *PREROUTING[-4:]]


def test_dns_before_gateway_before_denials_before_tproxy() -> None:
    c = comments(build(), "prerouting")
    assert c.index("dns udp") < c.index("dns tcp") < c.index("gateway address")
    assert c.index("gateway local") < c.index("denied range") < c.index("refused udp port")
    assert c.index("refused udp port") < c.index("tcp relay") < c.index("udp relay")


def test_only_gw0_traffic_gets_past_the_second_rule() -> None:
    r = build()
    assert rule(r, "prerouting", "loopback") == [
        {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}},
        {"accept": None},
    ]
    assert rule(r, "prerouting", "only the sandbox link") == [
        {"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "gw0"}},
        {"drop": None},
    ]


def test_dns_goes_to_the_dns_listener_from_any_address() -> None:
    r = build(dns_port=5353, mark=7)
    for proto in ("udp", "tcp"):
        expr = rule(r, "prerouting", f"dns {proto}")
        assert matches(expr) == [
            {"op": "==", "left": {"payload": {"protocol": proto, "field": "dport"}}, "right": 53}
        ]
        assert expr[1:] == [
            {"tproxy": {"port": 5353}},
            {"mangle": {"key": {"meta": {"key": "mark"}}, "value": 7}},
            {"accept": None},
        ]


def test_dns_never_falls_through_to_the_relays() -> None:
    expr = rule(build(), "prerouting", "dns without listener")
    assert {
        "op": "==",
        "left": {"payload": {"protocol": "th", "field": "dport"}},
        "right": 53,
    } in matches(expr)
    assert verdict(expr) == {"drop": None}


def test_default_dns_port_is_53() -> None:
    # UDP answers leave the listener with IP_PKTINFO, which cannot set the source port.
    assert rule(build(), "prerouting", "dns udp")[1] == {"tproxy": {"port": 53}}


def test_the_gateway_itself_is_refused() -> None:
    r = build()
    daddr = {
        "ip": {"payload": {"protocol": "ip", "field": "daddr"}},
        "ip6": {"payload": {"protocol": "ip6", "field": "daddr"}},
    }
    assert matches(rule(r, "prerouting", "gateway address")) == [
        {"op": "==", "left": daddr["ip"], "right": prefix("10.0.2.0/24")}
    ]
    assert matches(rule(r, "prerouting", "gateway address v6")) == [
        {"op": "==", "left": daddr["ip6"], "right": prefix("fd00::/64")}
    ]
    assert matches(rule(r, "prerouting", "gateway link-local")) == [
        {"op": "==", "left": daddr["ip6"], "right": prefix("fe80::/10")}
    ]
    assert matches(rule(r, "prerouting", "gateway local")) == [
        {
            "op": "==",
            "left": {"fib": {"result": "type", "flags": ["daddr"]}},
            "right": {"set": ["local", "broadcast", "multicast"]},
        }
    ]
    for c in ("gateway address", "gateway address v6", "gateway link-local", "gateway local"):
        assert verdict(rule(r, "prerouting", c)) == {"goto": {"target": "refuse"}}


def test_link_constants_agree_with_the_gateway_rule() -> None:
    import ipaddress

    for host, link in (
        (rs.GATEWAY_V4, rs.LINK_V4),
        (rs.SANDBOX_V4, rs.LINK_V4),
        (rs.GATEWAY_V6, rs.LINK_V6),
        (rs.SANDBOX_V6, rs.LINK_V6),
    ):
        assert ipaddress.ip_address(host) in ipaddress.ip_network(link)


def test_denials_are_lifted_only_by_exceptions() -> None:
    r = build()
    for comment, proto, suffix in (("denied range", "ip", "4"), ("denied range v6", "ip6", "6")):
        expr = rule(r, "prerouting", comment)
        left = {"payload": {"protocol": proto, "field": "daddr"}}
        assert matches(expr) == [
            {"op": "==", "left": left, "right": f"@deny{suffix}"},
            {"op": "!=", "left": left, "right": f"@except{suffix}"},
        ]
        assert verdict(expr) == {"goto": {"target": "refuse"}}


COUNT = [
    {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": {"set": ["tcp", "udp"]}}},
    {"counter": rs.REFUSED_COUNTER},
]


def test_refuse_chain_resets_tcp_and_prohibits_the_rest() -> None:
    assert [r["expr"] for r in rules(build(), "refuse")] == [
        # every refused connection is counted, every refusal reported to boxyd (NFLOG,
        # rate-bounded), then refused
        COUNT,
        [
            {"limit": {"rate": rs.NFLOG_RATE, "per": "second", "burst": rs.NFLOG_RATE}},
            {"log": {"group": rs.NFLOG_GROUP, "snaplen": rs.NFLOG_SNAPLEN}},
        ],
        [
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
            {"reject": {"type": "tcp reset"}},
        ],
        [{"reject": {"type": "icmpx", "expr": "admin-prohibited"}}],
    ]


def test_refused_ports_are_reported_then_refused_as_closed_ports() -> None:
    assert [r["expr"] for r in rules(build(), "refuse_port")] == [
        COUNT,
        [
            {"limit": {"rate": rs.NFLOG_RATE, "per": "second", "burst": rs.NFLOG_RATE}},
            {"log": {"group": rs.NFLOG_GROUP, "snaplen": rs.NFLOG_SNAPLEN}},
        ],
        [
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}},
            {"reject": {"type": "tcp reset"}},
        ],
        [{"reject": {"type": "icmpx", "expr": "port-unreachable"}}],
    ]


def test_refused_udp_ports_get_port_unreachable() -> None:
    expr = rule(build(), "prerouting", "refused udp port")
    assert matches(expr) == [
        {
            "op": "==",
            "left": {"payload": {"protocol": "udp", "field": "dport"}},
            "right": "@refused_udp_ports",
        }
    ]
    assert verdict(expr) == {"goto": {"target": "refuse_port"}}


@pytest.mark.parametrize("mode,ports", [("allowlist", [443]), ("public", [])])
def test_quic_refused_in_allowlist_mode_only(mode: str, ports: list[int]) -> None:
    r = build(mode)
    assert elems(r, "refused_udp_ports") == ports
    assert "flags" not in sets(r)["refused_udp_ports"]


def test_refused_udp_ports_explicit_sorted_deduplicated() -> None:
    assert elems(build("public", refuse_udp_ports=[443, 3478, 443]), "refused_udp_ports") == [
        443,
        3478,
    ]
    assert elems(build("allowlist", refuse_udp_ports=[]), "refused_udp_ports") == []


def test_tcp_port_list_resets_other_ports() -> None:
    r = build(tcp_ports=[443, 80, 443])
    assert elems(r, "tcp_ports") == [80, 443]
    expr = rule(r, "prerouting", "refused tcp port")
    assert matches(expr) == [
        {
            "op": "!=",
            "left": {"payload": {"protocol": "tcp", "field": "dport"}},
            "right": "@tcp_ports",
        }
    ]
    assert verdict(expr) == {"goto": {"target": "refuse_port"}}


def test_no_tcp_port_list_means_no_set_and_no_rule() -> None:
    r = build()
    assert "tcp_ports" not in sets(r)
    assert "refused tcp port" not in comments(r, "prerouting")


def test_relays_tproxy_with_mark() -> None:
    r = build(tcp_port=2001, udp_port=2002, mark=0x42)
    for comment, proto, port in (("tcp relay", "tcp", 2001), ("udp relay", "udp", 2002)):
        assert rule(r, "prerouting", comment) == [
            {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": proto}},
            {"tproxy": {"port": port}},
            {"mangle": {"key": {"meta": {"key": "mark"}}, "value": 0x42}},
            {"accept": None},
        ]


def test_prerouting_accepts_only_loopback_nd_and_tproxied() -> None:
    """Fail closed: nothing else is accepted, so a missing listener means a drop."""
    for r in (build(), build("public", tcp_ports=[80])):
        for rl in rules(r, "prerouting"):
            if verdict(rl["expr"]) == {"accept": None}:
                assert rl["comment"] in ("loopback", "neighbour discovery") or any(
                    "tproxy" in e for e in rl["expr"]
                ), rl


def test_icmp() -> None:
    r = build()
    nd = rule(r, "prerouting", "neighbour discovery")
    assert matches(nd)[0]["right"] == {
        "set": ["nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-solicit"]
    }
    assert "echo-request" not in json.dumps(nd)
    for c, proto in (("ping refused", "icmp"), ("ping6 refused", "icmpv6")):
        expr = rule(r, "prerouting", c)
        assert matches(expr) == [
            {
                "op": "==",
                "left": {"payload": {"protocol": proto, "field": "type"}},
                "right": "echo-request",
            }
        ]
        assert verdict(expr) == {"reject": {"type": "icmpx", "expr": "admin-prohibited"}}
    assert verdict(rule(r, "prerouting", "other icmp")) == {"drop": None}
    assert verdict(rule(r, "prerouting", "other icmpv6")) == {"drop": None}


# ----------------------------------------------------------------------- input ---


def test_input_accepts_loopback_tproxied_and_nd_only() -> None:
    r = build(mark=9)
    assert comments(r, "input") == ["loopback", "tproxied", "neighbour discovery"]
    assert rule(r, "input", "tproxied") == [
        {"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 9}},
        {"accept": None},
    ]
    assert rule(r, "input", "neighbour discovery") == rule(r, "prerouting", "neighbour discovery")


# ------------------------------------------------------------------------ sets ---


def test_prefix_sets_are_interval_sets() -> None:
    s = sets(build())
    for name, type_ in (
        ("deny4", "ipv4_addr"),
        ("deny6", "ipv6_addr"),
        ("except4", "ipv4_addr"),
        ("except6", "ipv6_addr"),
    ):
        assert s[name]["type"] == type_
        assert s[name]["flags"] == ["interval"]


def test_empty_sets_have_no_elements_key() -> None:
    s = sets(build())
    assert "elem" not in s["except4"] and "elem" not in s["except6"]


def test_overlapping_and_adjacent_prefixes_are_merged() -> None:
    r = build(
        deny_v4=["192.0.0.0/24", "192.0.0.0/29", "10.0.0.0/9", "10.128.0.0/9", "203.0.113.0/24"],
        deny_v6=["fe80::/10", "fe80::/64", "2001:db8::/32"],
    )
    assert elems(r, "deny4") == [
        prefix("10.0.0.0/8"),
        prefix("192.0.0.0/24"),
        prefix("203.0.113.0/24"),
    ]
    assert elems(r, "deny6") == [prefix("2001:db8::/32"), prefix("fe80::/10")]


def test_adjacent_prefixes_that_are_no_prefix_together_become_one_range() -> None:
    r = build(
        deny_v4=["11.0.0.0/8", "12.0.0.0/8", "13.0.0.0/8", "192.0.2.0/24"],
        deny_v6=["::/81", "::8000:0:0/82", "::c000:0:0/83", "2001:db8::/32"],
    )
    assert elems(r, "deny4") == [
        {"range": ["11.0.0.0", "13.255.255.255"]},
        prefix("192.0.2.0/24"),
    ]
    assert elems(r, "deny6") == [
        {"range": ["::", "::dfff:ffff:ffff"]},
        prefix("2001:db8::/32"),
    ]


def test_the_static_deny_sets_cover_exactly_their_prefixes() -> None:
    """Merging into ranges neither widens nor narrows a set: every address the
    prefixes name is in an element, and every element is made of them."""
    s = static_prefixes()
    r = build(deny_v4=s.deny_v4, deny_v6=s.deny_v6)
    for name, prefixes in (("deny4", s.deny_v4), ("deny6", s.deny_v6)):
        covered = collapsed(ipaddress.ip_network(p) for p in prefixes)
        spans: list[Network] = []
        for e in elems(r, name):
            if "prefix" in e:
                net = ipaddress.ip_network(f"{e['prefix']['addr']}/{e['prefix']['len']}")
                spans += [net]
            else:
                lo, hi = (ipaddress.ip_address(a) for a in e["range"])
                spans += list(ipaddress.summarize_address_range(lo, hi))
        assert collapsed(spans) == covered
    assert len(elems(r, "deny6")) < len(s.deny_v6) / 2  # and far fewer elements


def test_single_addresses_become_full_length_prefixes() -> None:
    r = build(except_v4=["169.254.169.254/32"], except_v6=["fd77::1/128"])
    assert elems(r, "except4") == [prefix("169.254.169.254/32")]
    assert elems(r, "except6") == [prefix("fd77::1/128")]


# ------------------------------------------------------------------ validation ---


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"deny_v4": ["10.0.0.1/8"]}, "deny_v4: '10.0.0.1/8' is not a prefix"),
        ({"deny_v4": ["nonsense"]}, "deny_v4: 'nonsense' is not a prefix"),
        ({"deny_v4": ["fc00::/7"]}, "deny_v4: fc00::/7 is not an IPv4 prefix"),
        ({"deny_v6": ["10.0.0.0/8"]}, "deny_v6: 10.0.0.0/8 is not an IPv6 prefix"),
        ({"except_v4": "10.0.0.0/8"}, "except_v4 must be a list"),
        ({"except_v6": [None]}, "except_v6: None is not a prefix"),
        ({"tcp_port": 0}, "tcp_port 0 is not a port"),
        ({"udp_port": 70000}, "udp_port 70000 is not a port"),
        ({"dns_port": True}, "dns_port True is not a port"),
        ({"dns_port": 15001}, "dns_port 15001 is also a relay port"),
        ({"dns_port": 15002}, "dns_port 15002 is also a relay port"),
        ({"refuse_udp_ports": [443, -1]}, "refused UDP port -1"),
        ({"tcp_ports": ["80"]}, "TCP port '80'"),
        ({"mark": 0}, "mark 0 must be a non-zero 32-bit integer"),
        ({"mark": 1 << 32}, "must be a non-zero 32-bit integer"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(SetupError) as err:
        build(**kw)
    assert str(err.value).startswith("gateway netns: nftables ruleset: ")
    assert needle in str(err.value)


@pytest.mark.parametrize("mode", ["none", "", "Public"])
def test_modes_without_a_gateway_are_refused(mode: str) -> None:
    with pytest.raises(SetupError, match="has no gateway"):
        build(mode)


def test_tcp_and_udp_relays_may_share_a_port() -> None:
    r = build(tcp_port=15000, udp_port=15000)
    assert rule(r, "prerouting", "tcp relay")[1] == rule(r, "prerouting", "udp relay")[1]


def test_udp_port_list_refuses_other_ports_as_closed() -> None:
    r = build(udp_ports=[9999, 5353, 9999])
    assert elems(r, "udp_ports") == [5353, 9999]
    expr = rule(r, "prerouting", "udp port not allowed")
    assert matches(expr) == [
        {
            "op": "!=",
            "left": {"payload": {"protocol": "udp", "field": "dport"}},
            "right": "@udp_ports",
        }
    ]
    assert verdict(expr) == {"goto": {"target": "refuse_port"}}
    # after DNS (port 53 is the gateway's own) and before the relay
    order = comments(r, "prerouting")
    assert order.index("dns udp") < order.index("udp port not allowed") < order.index("udp relay")


def test_no_udp_port_list_means_no_set_and_no_rule() -> None:
    r = build()
    assert "udp_ports" not in sets(r)
    assert "udp port not allowed" not in comments(r, "prerouting")


# ------------------------------------------------------- bound addresses (allowlist) ---

SYN = {
    "match": {
        "op": "==",
        "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, {"|": ["syn", "ack"]}]},
        "right": "syn",
    }
}


def test_allowlist_resets_a_syn_to_an_unbound_address_before_tproxy() -> None:
    r = build(bound=["192.0.2.7", "2001:db8::7", "192.0.2.7"])
    c = comments(r, "prerouting")
    assert c.index("refused udp port") < c.index("unbound address") < c.index("tcp relay")
    for comment, proto, name in (
        ("unbound address", "ip", "bound4"),
        ("unbound address v6", "ip6", "bound6"),
    ):
        expr = rule(r, "prerouting", comment)
        assert expr[0] == SYN  # a SYN only: established flows outlive their binding
        assert expr[1] == {
            "match": {
                "op": "!=",
                "left": {"payload": {"protocol": proto, "field": "daddr"}},
                "right": f"@{name}",
            }
        }
        assert verdict(expr) == {"goto": {"target": "refuse"}}  # reported, then a reset
    s = sets(r)
    for name, kind, elem in (
        ("bound4", "ipv4_addr", ["192.0.2.7"]),
        ("bound6", "ipv6_addr", ["2001:db8::7"]),
    ):
        assert s[name]["type"] == kind and s[name]["flags"] == ["timeout"], s[name]
        assert s[name]["size"] == rs.BOUND_SIZE
        assert s[name].get("elem") == elem  # literal hosts: no timeout, never expire


def test_allowlist_without_literal_hosts_starts_with_empty_bound_sets() -> None:
    s = sets(build())
    assert "elem" not in s["bound4"] and "elem" not in s["bound6"]


def test_public_mode_has_no_bound_sets_and_refuses_them() -> None:
    r = build("public")
    assert "bound4" not in sets(r) and "unbound address" not in comments(r, "prerouting")
    with pytest.raises(SetupError, match="allowlist mode only"):
        build("public", bound=["192.0.2.7"])


def test_a_bad_bound_address_is_refused() -> None:
    with pytest.raises(SetupError, match="bound address 'nas' is not an address"):
        build(bound=["nas"])


def test_bound_set_names_and_the_socket_for_them() -> None:
    assert rs.BOUND_SETS == ("bound4", "bound6")
    assert rs.GATEWAY_SOCKETS[-1] == "nftset"
