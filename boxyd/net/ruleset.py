"""The gateway netns's nftables ruleset, as libnftables JSON (pure: no I/O).

Everything arriving on gw0 from the sandbox is decided here first, in this order:

1. ICMPv6 neighbour discovery passes; pings are refused, other ICMP dropped.
2. DNS (UDP and TCP port 53, to ANY address) goes to boxy's DNS listener, so
   hard-coding 8.8.8.8 or the LAN resolver reaches boxy and nothing else.
3. The gateway itself (its addresses, the whole sandbox link, anything the
   kernel calls local/broadcast/multicast) is refused: the listener ports must
   not be dialled directly.
4. Denied ranges, unless excepted (--allow-cidr, --tailscale), are refused at
   SYN time: TPROXY completes the handshake before boxyd decides anything.
5. Refused ports (UDP/443 in allowlist mode, so QUIC falls back to TCP where
   the name is checked) are refused.
6. Allowlist mode: a TCP SYN to an address with no live DNS binding (not in the
   ``bound4``/``bound6`` sets, whose elements boxyd adds as bindings appear, each
   with the binding's lifetime as its timeout) is reset before TPROXY answers it.
7. The rest is TPROXY'd, marked, to the TCP or UDP relay listener.

Refusals are a TCP reset or an ICMP error, never a silent drop: a client fails
at once instead of waiting for its timeout. Whatever matches no rule is dropped
(chain policy). The listeners are bound to the wildcard address (TPROXY looks
them up by the packet's own destination), which is why step 3 exists.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from boxy.errors import SetupError

# The sandbox link (docs/design.md, "Network"). --allow-cidr may not overlap these.
SANDBOX_V4 = "10.0.2.15"
GATEWAY_V4 = "10.0.2.2"
LINK_V4 = "10.0.2.0/24"
SANDBOX_V6 = "fd00::15"
GATEWAY_V6 = "fd00::2"
LINK_V6 = "fd00::/64"
PAYLOAD_IF = "eth0"
GATEWAY_IF = "gw0"

TABLE = "boxy"
FAMILY = "inet"
MODES = ("public", "allowlist")

TCP_PORT = 15001
UDP_PORT = 15002
# DNS listens on 53 itself: a UDP reply leaves the listener with IP_PKTINFO, which
# sets the source address but not the port, and a client drops an answer that does
# not come from the port it asked (measured). The gateway netns may bind 53: stage 2
# holds CAP_NET_BIND_SERVICE over it.
DNS_PORT = 53
MARK = 1
NFLOG_GROUP = 1  # per gateway netns: each session has its own
NFLOG_SNAPLEN = 96  # IP and transport headers are all boxyd reads
NFLOG_RATE = 1000  # reports per second; refusals past it still happen, unreported
# ...but counted: every refusal bumps this named counter before the rate limit, and
# boxyd reads it (boxyd.net.nftcounter), so a flood's count is exact.
REFUSED_COUNTER = "refused"
# The sockets stage 2 makes in the gateway netns and sends to boxyd (step 4), in
# this order. DNS listens on port 53 itself so its replies can leave with
# IP_PKTINFO; replies to other UDP leave through the raw senders, since IP_PKTINFO
# sets a source address but never a source port.
# "nftset" is the netlink socket through which boxyd keeps the bound-address sets.
GATEWAY_SOCKETS = (
    "tcp4",
    "tcp6",
    "udp4",
    "udp6",
    "dns_udp4",
    "dns_udp6",
    "dns_tcp4",
    "dns_tcp6",
    "udp_reply4",
    "udp_reply6",
    "icmp4",
    "icmp6",
    "nflog",
    "nftset",
)
BOUND_SETS = ("bound4", "bound6")
BOUND_SIZE = 65536  # elements per family: boxyd.net.bindings.MAX_ENTRIES

# Neighbour discovery must pass or IPv6 on the link cannot work. Router
# solicitations are harmless: a netns with forwarding off ignores them.
ND_TYPES = ["nd-neighbor-solicit", "nd-neighbor-advert", "nd-router-solicit"]


def _fail(msg: str) -> SetupError:
    return SetupError(f"gateway netns: nftables ruleset: {msg}")


def _port(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise _fail(f"{what} {value!r} is not a port number (1-65535)")
    return value


def _prefixes(items: Iterable[str], version: int, what: str) -> list[dict[str, Any]]:
    """Validate, then merge overlapping and adjacent prefixes into as few intervals as
    cover them: an interval set refuses overlapping elements (the IANA registries
    overlap: 192.0.0.0/24 ⊃ /29), and each element costs the load. The v4 encodings
    in deny6 are runs of adjacent prefixes: 260 of them are 71 ranges, about a
    millisecond less of every networked start (docs/design.md, "Network")."""
    if isinstance(items, str):
        raise _fail(f"{what} must be a list of prefixes, not one string")
    nets = []
    for item in items:
        try:
            net = ipaddress.ip_network(item, strict=True)
        except (TypeError, ValueError) as e:
            raise _fail(f"{what}: {item!r} is not a prefix ({e})") from None
        if net.version != version:
            raise _fail(f"{what}: {item} is not an IPv{version} prefix")
        nets.append(net)
    runs: list[list[Any]] = []  # [first address, last address] of each merged run
    for n in sorted(ipaddress.collapse_addresses(nets)):  # type: ignore[type-var]
        if runs and int(n.network_address) == int(runs[-1][1]) + 1:
            runs[-1][1] = n.broadcast_address
        else:
            runs.append([n.network_address, n.broadcast_address])
    return [_interval(first, last) for first, last in runs]


def _interval(first: Any, last: Any) -> dict[str, Any]:
    """One set element from FIRST to LAST: a prefix when that is what it is."""
    (net, *more) = ipaddress.summarize_address_range(first, last)
    if not more:
        return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}
    return {"range": [str(first), str(last)]}


def _addresses(items: list[str], version: int) -> list[str]:
    out = []
    for item in items:
        try:
            addr = ipaddress.ip_address(item)
        except (TypeError, ValueError) as e:
            raise _fail(f"bound address {item!r} is not an address ({e})") from None
        if addr.version == version:
            out.append(str(addr))
    return sorted(set(out))


# Expressions, in libnftables-json(5) terms.


def _match(left: dict[str, Any], right: Any, op: str = "==") -> dict[str, Any]:
    return {"match": {"op": op, "left": left, "right": right}}


def _meta(key: str) -> dict[str, Any]:
    return {"meta": {"key": key}}


def _payload(protocol: str, field: str) -> dict[str, Any]:
    return {"payload": {"protocol": protocol, "field": field}}


def _prefix(cidr: str) -> dict[str, Any]:
    net = ipaddress.ip_network(cidr)
    return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}


ACCEPT: dict[str, Any] = {"accept": None}
DROP: dict[str, Any] = {"drop": None}
TCP_RESET: dict[str, Any] = {"reject": {"type": "tcp reset"}}
PROHIBITED: dict[str, Any] = {"reject": {"type": "icmpx", "expr": "admin-prohibited"}}
PORT_UNREACHABLE: dict[str, Any] = {"reject": {"type": "icmpx", "expr": "port-unreachable"}}
L4_TCP = _match(_meta("l4proto"), "tcp")
L4_UDP = _match(_meta("l4proto"), "udp")


def _goto(chain: str) -> dict[str, Any]:
    return {"goto": {"target": chain}}


def _tproxy(port: int, mark: int) -> list[dict[str, Any]]:
    # Without an address, TPROXY looks the socket up by the packet's own destination
    # and this port, in either family. If no listener is found the rule does not match
    # and the packet falls through to the chain's drop policy: fail closed.
    return [
        {"tproxy": {"port": port}},
        {"mangle": {"key": _meta("mark"), "value": mark}},
        ACCEPT,
    ]


def _rule(chain: str, comment: str, *expr: dict[str, Any]) -> dict[str, Any]:
    return {
        "rule": {
            "family": FAMILY,
            "table": TABLE,
            "chain": chain,
            "comment": comment,
            "expr": list(expr),
        }
    }


def _set(
    name: str, type_: str, elems: list[Any], interval: bool = True, timeout: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {"family": FAMILY, "table": TABLE, "name": name, "type": type_}
    if interval:
        body["flags"] = ["interval"]
    if timeout:  # elements may carry a timeout; those without one never expire
        body["flags"] = ["timeout"]
        body["size"] = BOUND_SIZE
    if elems:
        body["elem"] = elems
    return {"set": body}


def _chain(
    name: str, hook: str | None = None, prio: int = 0, policy: str = "drop"
) -> dict[str, Any]:
    body: dict[str, Any] = {"family": FAMILY, "table": TABLE, "name": name}
    if hook:
        body.update(type="filter", hook=hook, prio=prio, policy=policy)
    return {"chain": body}


ND = _match(_payload("icmpv6", "type"), {"set": ND_TYPES})


def _pre(comment: str, *expr: dict[str, Any]) -> dict[str, Any]:
    return _rule("prerouting", comment, *expr)


DADDR4 = _payload("ip", "daddr")
DADDR6 = _payload("ip6", "daddr")


def _prerouting(
    dns_port: int, mark: int, tcp_list: bool, udp_list: bool, bound: bool
) -> list[dict[str, Any]]:
    """Every prerouting rule before the relays, in the module docstring's order."""
    return [
        *_pre_link(),
        *_pre_dns(dns_port, mark),
        *_pre_gateway(),
        *_pre_denied(),
        *_pre_ports(tcp_list, udp_list),
        *(_pre_bound() if bound else []),
    ]


def _pre_link() -> list[dict[str, Any]]:
    return [
        _pre("loopback", _match(_meta("iifname"), "lo"), ACCEPT),
        _pre("only the sandbox link", _match(_meta("iifname"), GATEWAY_IF, "!="), DROP),
        _pre("neighbour discovery", ND, ACCEPT),
        # Pings fail at once ("prohibited") rather than hang; no echo reply ever returns.
        _pre("ping refused", _match(_payload("icmp", "type"), "echo-request"), PROHIBITED),
        _pre("ping6 refused", _match(_payload("icmpv6", "type"), "echo-request"), PROHIBITED),
        _pre("other icmp", _match(_meta("l4proto"), "icmp"), DROP),
        _pre("other icmpv6", _match(_meta("l4proto"), "icmpv6"), DROP),
    ]


def _pre_dns(dns_port: int, mark: int) -> list[dict[str, Any]]:
    # DNS before any address check: port 53 to ANY address is boxy's to answer.
    return [
        _pre("dns udp", _match(_payload("udp", "dport"), 53), *_tproxy(dns_port, mark)),
        _pre("dns tcp", _match(_payload("tcp", "dport"), 53), *_tproxy(dns_port, mark)),
        # Port 53 must never reach the relays, even with the DNS listener missing.
        _pre(
            "dns without listener",
            _match(_meta("l4proto"), {"set": ["tcp", "udp"]}),
            _match(_payload("th", "dport"), 53),
            DROP,
        ),
    ]


def _pre_gateway() -> list[dict[str, Any]]:
    # The gateway is no destination: its listeners are bound to the wildcard address.
    local = {"set": ["local", "broadcast", "multicast"]}
    return [
        _pre("gateway address", _match(DADDR4, _prefix(LINK_V4)), _goto("refuse")),
        _pre("gateway address v6", _match(DADDR6, _prefix(LINK_V6)), _goto("refuse")),
        _pre("gateway link-local", _match(DADDR6, _prefix("fe80::/10")), _goto("refuse")),
        _pre(
            "gateway local",
            _match({"fib": {"result": "type", "flags": ["daddr"]}}, local),
            _goto("refuse"),
        ),
    ]


def _pre_denied() -> list[dict[str, Any]]:
    # Static denials, at SYN time. An exception only lifts a denial.
    return [
        _pre(
            "denied range",
            _match(DADDR4, "@deny4"),
            _match(DADDR4, "@except4", "!="),
            _goto("refuse"),
        ),
        _pre(
            "denied range v6",
            _match(DADDR6, "@deny6"),
            _match(DADDR6, "@except6", "!="),
            _goto("refuse"),
        ),
    ]


def _pre_ports(tcp_list: bool, udp_list: bool) -> list[dict[str, Any]]:
    udp, tcp = _payload("udp", "dport"), _payload("tcp", "dport")
    rules = [_pre("refused udp port", _match(udp, "@refused_udp_ports"), _goto("refuse_port"))]
    if tcp_list:
        rules.append(
            _pre("refused tcp port", _match(tcp, "@tcp_ports", "!="), _goto("refuse_port"))
        )
    if udp_list:
        rules.append(
            _pre("udp port not allowed", _match(udp, "@udp_ports", "!="), _goto("refuse_port"))
        )
    return rules


def _pre_bound() -> list[dict[str, Any]]:
    # Only a SYN: an established flow outlives its binding (boxyd holds it).
    syn = _match({"&": [_payload("tcp", "flags"), {"|": ["syn", "ack"]}]}, "syn")
    return [
        _pre("unbound address", syn, _match(DADDR4, "@bound4", "!="), _goto("refuse")),
        _pre("unbound address v6", syn, _match(DADDR6, "@bound6", "!="), _goto("refuse")),
    ]


def _check(mode: str, tcp_port: int, udp_port: int, dns_port: int, mark: int) -> None:
    if mode not in MODES:
        raise _fail(f"mode {mode!r} has no gateway (expected one of {', '.join(MODES)})")
    for port, what in ((tcp_port, "tcp_port"), (udp_port, "udp_port"), (dns_port, "dns_port")):
        _port(port, what)
    if dns_port in (tcp_port, udp_port):
        # DNS listens on both TCP and UDP; the relays may share one number.
        raise _fail(f"dns_port {dns_port} is also a relay port")
    if isinstance(mark, bool) or not isinstance(mark, int) or not 0 < mark <= 0xFFFFFFFF:
        raise _fail(f"mark {mark!r} must be a non-zero 32-bit integer")


def _refusal_chains() -> list[dict[str, Any]]:
    # Every refusal is counted, and copied (headers only, rate-bounded) to boxyd over
    # NFLOG: it never sees these flows otherwise, and -v, --net-log and --audit-log must.
    # The count is of connections (TCP and UDP), as the net log counts them: a refused
    # ping is reported, never counted as one.
    count = [_match(_meta("l4proto"), {"set": ["tcp", "udp"]}), {"counter": REFUSED_COUNTER}]
    report: list[dict[str, Any]] = [
        {"limit": {"rate": NFLOG_RATE, "per": "second", "burst": NFLOG_RATE}},
        {"log": {"group": NFLOG_GROUP, "snaplen": NFLOG_SNAPLEN}},
    ]
    return [
        _rule("refuse", "count", *count),
        _rule("refuse", "report", *report),
        _rule("refuse", "tcp", L4_TCP, TCP_RESET),
        _rule("refuse", "other", PROHIBITED),
        _rule("refuse_port", "count", *count),
        _rule("refuse_port", "report", *report),
        _rule("refuse_port", "tcp", L4_TCP, TCP_RESET),
        _rule("refuse_port", "udp", PORT_UNREACHABLE),
    ]


def _input_rules(mark: int) -> list[dict[str, Any]]:
    return [
        _rule("input", "loopback", _match(_meta("iifname"), "lo"), ACCEPT),
        _rule("input", "tproxied", _match(_meta("mark"), mark), ACCEPT),
        _rule("input", "neighbour discovery", ND, ACCEPT),
    ]


def _ports(ports: list[int], what: str) -> list[int]:
    return sorted({_port(p, what) for p in ports})


def _sets(
    deny_v4: list[str],
    deny_v6: list[str],
    except_v4: list[str],
    except_v6: list[str],
    refused: list[int],
    allowed_tcp: list[int] | None,
    allowed_udp: list[int] | None,
    bound: list[str] | None,
) -> list[dict[str, Any]]:
    """The table's named sets: the static prefixes, the port lists, the bound sets."""
    sets = [
        _set("deny4", "ipv4_addr", _prefixes(deny_v4, 4, "deny_v4")),
        _set("deny6", "ipv6_addr", _prefixes(deny_v6, 6, "deny_v6")),
        _set("except4", "ipv4_addr", _prefixes(except_v4, 4, "except_v4")),
        _set("except6", "ipv6_addr", _prefixes(except_v6, 6, "except_v6")),
        _set("refused_udp_ports", "inet_service", refused, interval=False),
    ]
    if allowed_tcp is not None:
        sets.append(_set("tcp_ports", "inet_service", allowed_tcp, interval=False))
    if allowed_udp is not None:
        sets.append(_set("udp_ports", "inet_service", allowed_udp, interval=False))
    if bound is not None:
        for version, name in zip((4, 6), BOUND_SETS, strict=True):
            sets.append(
                _set(
                    name,
                    f"ipv{version}_addr",
                    _addresses(bound, version),
                    interval=False,
                    timeout=True,
                )
            )
    return sets


def gateway_ruleset(
    *,
    mode: str,
    deny_v4: list[str],
    deny_v6: list[str],
    except_v4: list[str],
    except_v6: list[str],
    tcp_port: int = TCP_PORT,
    udp_port: int = UDP_PORT,
    dns_port: int = DNS_PORT,
    refuse_udp_ports: list[int] | None = None,
    tcp_ports: list[int] | None = None,
    udp_ports: list[int] | None = None,
    mark: int = MARK,
    bound: list[str] | None = None,
) -> dict[str, Any]:
    """The whole table ``inet boxy``, loaded by stage 2 in one transaction.

    ``deny_*``: prefixes refused at SYN time unless inside an ``except_*`` prefix.
    ``refuse_udp_ports``: None means [443] in allowlist mode, none in public mode.
    ``udp_ports``: likewise for UDP (allowlist: the ``HOST:PORT/udp`` ports).
    ``tcp_ports``: None relays TCP to any port; a list relays only those ports and
    resets the rest at SYN time (the union of every port policy could allow).
    ``mark``: set on every TPROXY'd packet; stage 2 routes it to the local table.
    ``bound``: allowlist mode only: the addresses bound for good (literal
    ``--allow-host`` addresses); boxyd adds the DNS bindings as they appear.
    """
    _check(mode, tcp_port, udp_port, dns_port, mark)
    if bound is not None and mode != "allowlist":
        raise _fail("bound addresses mean something in allowlist mode only")
    if mode == "allowlist":
        bound = list(bound or [])
    if refuse_udp_ports is None:
        refuse_udp_ports = [443] if mode == "allowlist" else []
    refused = _ports(refuse_udp_ports, "refused UDP port")
    allowed_tcp = None if tcp_ports is None else _ports(tcp_ports, "TCP port")
    allowed_udp = None if udp_ports is None else _ports(udp_ports, "UDP port")

    lists = (allowed_tcp is not None, allowed_udp is not None, bound is not None)
    return {
        "nftables": [
            {"metainfo": {"json_schema_version": 1}},
            {"table": {"family": FAMILY, "name": TABLE}},
            {"counter": {"family": FAMILY, "table": TABLE, "name": REFUSED_COUNTER}},
            *_sets(
                deny_v4, deny_v6, except_v4, except_v6, refused, allowed_tcp, allowed_udp, bound
            ),
            _chain("refuse"),
            _chain("refuse_port"),
            _chain("prerouting", "prerouting", -150),  # mangle priority: where TPROXY belongs
            _chain("input", "input"),
            _chain("forward", "forward"),
            _chain("output", "output", policy="accept"),  # replies of the transparent sockets
            *_refusal_chains(),
            *_prerouting(dns_port, mark, *lists),
            _rule("prerouting", "tcp relay", L4_TCP, *_tproxy(tcp_port, mark)),
            _rule("prerouting", "udp relay", L4_UDP, *_tproxy(udp_port, mark)),
            *_input_rules(mark),
        ]
    }
