"""The DNS proxy against a real DNS server, over loopback only.

The test runs its own small authoritative server (UDP and TCP on 127.0.0.1, an
ephemeral port) for the test names, which records every query it receives, and
points a DnsProxy at it. Nothing here sends a packet anywhere but 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import dns.asyncquery
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest

from boxyd.net import dnsproxy
from boxyd.net.bindings import TTL_FLOOR, Address, Bindings
from boxyd.net.dnsfilter import NOT_ALLOWED, name_text
from boxyd.net.dnsproxy import DnsProxy, DnsSession, TokenBucket
from boxyd.net.hostnet import host_has_ipv6_route, resolv_conf_nameservers
from boxyd.net.sockdiag import Flow

LOOPBACK = "127.0.0.1"
ECH = base64.b64encode(b"\x00\x06secret").decode()
BIG_TXT = " ".join(f'"{chr(97 + i) * 250}"' for i in range(12))  # ~3 KB: TC over UDP
HANG = "hang.ok.test"  # the server never answers it
ZONE: dict[str, list[tuple[str, str]]] = {
    "www.ok.test": [("A", "93.184.216.34"), ("AAAA", "2606:2800:220:1::1")],
    "rebind.ok.test": [("A", "192.168.1.1"), ("A", "127.0.0.1"), ("A", "169.254.169.254")],
    "mixed.ok.test": [("A", "192.168.1.1"), ("A", "93.184.216.35")],
    "alias.ok.test": [("CNAME", "hop1.cdn.test.")],
    "hop1.cdn.test": [("CNAME", "hop2.cdn.test.")],
    "hop2.cdn.test": [("A", "93.184.216.36")],
    "loop.ok.test": [("CNAME", "loop2.ok.test.")],
    "loop2.ok.test": [("CNAME", "loop.ok.test.")],
    "big.ok.test": [("TXT", BIG_TXT)],
    "svc.ok.test": [
        ("HTTPS", f"1 . alpn=h2 ipv4hint=93.184.216.37,10.0.0.1 ech={ECH} ipv6hint=2606:4700::1234")
    ],
    "v6only.ok.test": [("AAAA", "2606:4700::1")],
}
EVIL = "evil.test"  # every name under it has an A record: forwarding would "work"
SOA = "ns.test. admin.test. 1 7200 900 1209600 300"

DENIED = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
    )
]


class Policy:
    """A small real policy: allowlist by suffix (None: public mode), a range list."""

    def __init__(self, allowed: tuple[str, ...] | None = ("ok.test",)) -> None:
        self.allowed = allowed

    def name_allowed(self, name: str) -> bool:
        if self.allowed is None:
            return True
        return any(name == a or name.endswith("." + a) for a in self.allowed)

    def name_denied(self, name: str) -> bool:
        return False

    def address_denied(self, ip: Address) -> str | None:
        return next((f"in {net}" for net in DENIED if ip in net), None)


class AuthServer:
    """Authoritative for the test names on 127.0.0.1:PORT (UDP and TCP); records queries."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.refuse = refuse
        self.seen: list[tuple[str, str, str]] = []  # (name, type, "udp" | "tcp")
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(20):  # TCP must share the UDP port: retry if it is taken
            udp, _proto = await loop.create_datagram_endpoint(
                lambda: _Udp(self), local_addr=(LOOPBACK, 0)
            )
            port = udp.get_extra_info("sockname")[1]
            try:
                self.tcp = await asyncio.start_server(self._serve_tcp, LOOPBACK, port)
            except OSError:
                udp.close()
                continue
            self.udp, self.port = udp, port
            return
        raise RuntimeError("no free port for the test DNS server")

    async def stop(self) -> None:
        self.udp.close()
        self.tcp.close()
        await self.tcp.wait_closed()

    def names(self) -> list[str]:
        return [name for name, _, _ in self.seen]

    def reply(self, wire: bytes, transport: str) -> bytes | None:
        q = dns.message.from_wire(wire)
        question = q.question[0]
        name = name_text(question.name)
        self.seen.append((name, dns.rdatatype.to_text(question.rdtype), transport))
        if name == HANG:
            return None
        r = dns.message.make_response(q)
        r.flags |= dns.flags.AA
        if self.refuse:
            r.set_rcode(dns.rcode.REFUSED)
        else:
            self._answer(r, question.name, question.rdtype)
        limit = 65535 if transport == "tcp" else (q.payload if q.edns >= 0 else 512)
        return r.to_wire(max_size=limit, prefer_truncation=True)

    def _answer(
        self, r: dns.message.Message, qname: dns.name.Name, rdtype: dns.rdatatype.RdataType
    ) -> None:
        current, hops = qname, 0
        while True:
            records = self._records(name_text(current))
            if records is None:
                if current == qname:
                    r.set_rcode(dns.rcode.NXDOMAIN)
                r.authority.append(dns.rrset.from_text("test.", 300, "IN", "SOA", SOA))
                return
            cname = [rd for t, rd in records if t == "CNAME"]
            if cname and rdtype != dns.rdatatype.CNAME and hops < 8:
                self._add(r, current, "CNAME", cname[0])
                current, hops = dns.name.from_text(cname[0]), hops + 1
                continue
            wanted = [rd for t, rd in records if dns.rdatatype.from_text(t) == rdtype]
            for rd in wanted:
                self._add(r, current, dns.rdatatype.to_text(rdtype), rd)
            if not wanted:
                r.authority.append(dns.rrset.from_text("test.", 300, "IN", "SOA", SOA))
            return

    @staticmethod
    def _records(name: str) -> list[tuple[str, str]] | None:
        if name.endswith("." + EVIL):
            return [("A", "93.184.216.40")]
        return ZONE.get(name)

    @staticmethod
    def _add(r: dns.message.Message, name: dns.name.Name, rdtype: str, text: str) -> None:
        t = dns.rdatatype.from_text(rdtype)
        r.find_rrset(r.answer, name, dns.rdataclass.IN, t, create=True).add(
            dns.rdata.from_text(dns.rdataclass.IN, t, text), 5
        )

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(2), "big")
                reply = self.reply(await reader.readexactly(size), "tcp")
                if reply is not None:
                    writer.write(len(reply).to_bytes(2, "big") + reply)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: AuthServer) -> None:
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = self.server.reply(data, "udp")
        if reply is not None:
            self.transport.sendto(reply, addr)


@pytest.fixture
async def server() -> AsyncIterator[AuthServer]:
    s = AuthServer()
    await s.start()
    yield s
    await s.stop()


@pytest.fixture
def proxy(server: AuthServer) -> DnsProxy:
    return DnsProxy([(LOOPBACK, server.port)], ipv6=False, timeout=1.0)


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)


@pytest.fixture
def events() -> Recorder:
    return Recorder()


@pytest.fixture
def session(events: Recorder) -> DnsSession:
    return DnsSession(Policy(), on_event=events)


async def ask(
    proxy: DnsProxy,
    session: DnsSession,
    name: str | dns.name.Name,
    rdtype: str = "A",
    *,
    use_edns: int | bool | None = None,
    payload: int | None = None,
) -> dns.message.Message:
    q = dns.message.make_query(name, rdtype, use_edns=use_edns, payload=payload)
    wire = await proxy.answer(q.to_wire(), tcp=False, session=session)
    assert wire is not None
    r = dns.message.from_wire(wire)
    assert r.id == q.id
    return r


def addresses(r: dns.message.Message) -> list[str]:
    return sorted(
        rd.address
        for rr in r.answer
        if rr.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA)
        for rd in rr
    )


async def test_allowed_name_is_resolved_bound_and_reported(
    proxy: DnsProxy, session: DnsSession, server: AuthServer, events: Recorder
) -> None:
    r = await ask(proxy, session, "WWW.ok.test")
    assert r.rcode() == dns.rcode.NOERROR
    assert addresses(r) == ["93.184.216.34"]
    assert r.answer[0].ttl == TTL_FLOOR  # the server said 5
    assert session.bindings.names("93.184.216.34") == {"www.ok.test"}
    assert ("www.ok.test", "A", "udp") in server.seen
    assert events.events[-1] == {
        "layer": "net.dns",
        "verdict": "allow",
        "name": "www.ok.test",
        "qtype": "A",
        "addrs": ["93.184.216.34"],
        "reason": None,
        "rcode": "NOERROR",
    }


async def test_disallowed_names_never_reach_upstream(
    proxy: DnsProxy, session: DnsSession, server: AuthServer, events: Recorder
) -> None:
    tcp = await asyncio.start_server(lambda r, w: proxy.serve_tcp(r, w, session), LOOPBACK, 0)
    port = tcp.sockets[0].getsockname()[1]
    try:
        for i, rdtype in enumerate(["A", "AAAA", "TXT", "ANY", "HTTPS", "AXFR", "MX"]):
            name = f"{(b'secret-%d' % i).hex()}.{EVIL}"
            r = await ask(proxy, session, name, rdtype)
            assert r.rcode() == dns.rcode.NXDOMAIN, rdtype
            q = dns.message.make_query(name, rdtype)
            r = await dns.asyncquery.tcp(q, LOOPBACK, port=port, timeout=5)
            assert r.rcode() == dns.rcode.NXDOMAIN, rdtype
        # One label "secret.www.ok" under "test": its text ends with ".ok.test".
        tricky = dns.name.Name([b"secret.www.ok", b"test", b""])
        r = await ask(proxy, session, tricky)
        assert r.rcode() == dns.rcode.REFUSED
    finally:
        tcp.close()
        await tcp.wait_closed()
    assert not [n for n in server.names() if n.endswith(EVIL)]
    assert server.seen == []
    assert len(events.events) == 15
    assert all(e["verdict"] == "deny" for e in events.events)
    assert [e["reason"] for e in events.events[:14]] == [NOT_ALLOWED] * 14
    # Control: the same query in public mode does reach the server, so the
    # assertion above is about the proxy and not about a deaf server.
    public = DnsSession(Policy(allowed=None))
    r = await ask(proxy, public, f"6461746a.{EVIL}")
    assert addresses(r) == ["93.184.216.40"]
    assert server.names() == [f"6461746a.{EVIL}"]


async def test_rebinding_answer_is_emptied(
    proxy: DnsProxy, session: DnsSession, events: Recorder
) -> None:
    r = await ask(proxy, session, "rebind.ok.test")
    assert r.rcode() == dns.rcode.NOERROR and r.answer == []
    for a in ("192.168.1.1", "127.0.0.1", "169.254.169.254"):
        assert session.bindings.names(a) == frozenset()
    (event,) = events.events
    assert event["verdict"] == "deny" and event["addrs"] == []
    assert sorted(a for a, _ in event["denied"]) == ["127.0.0.1", "169.254.169.254", "192.168.1.1"]
    assert "192.168.1.1" in event["reason"]

    r = await ask(proxy, session, "mixed.ok.test")
    assert addresses(r) == ["93.184.216.35"]
    assert session.bindings.names("93.184.216.35") == {"mixed.ok.test"}
    assert session.bindings.names("192.168.1.1") == frozenset()


async def test_cname_chain_bound_to_the_question_name(
    proxy: DnsProxy, session: DnsSession, events: Recorder
) -> None:
    r = await ask(proxy, session, "alias.ok.test")
    assert r.rcode() == dns.rcode.NOERROR
    assert [rr.name.to_text() for rr in r.answer] == [
        "alias.ok.test.",
        "hop1.cdn.test.",
        "hop2.cdn.test.",
    ]
    assert addresses(r) == ["93.184.216.36"]
    assert session.bindings.names("93.184.216.36") == {"alias.ok.test"}
    assert events.events[-1]["chain"] == ["alias.ok.test", "hop1.cdn.test", "hop2.cdn.test"]
    # The CDN's own name is not on the allowlist: asked directly, it is refused.
    r = await ask(proxy, session, "hop2.cdn.test")
    assert r.rcode() == dns.rcode.NXDOMAIN


async def test_cname_loop_is_servfail(
    proxy: DnsProxy, session: DnsSession, events: Recorder
) -> None:
    r = await ask(proxy, session, "loop.ok.test")
    assert r.rcode() == dns.rcode.SERVFAIL and r.answer == []
    assert "loop" in events.events[-1]["reason"]


async def test_large_txt_truncates_over_udp_and_works_over_tcp(
    proxy: DnsProxy, session: DnsSession, server: AuthServer
) -> None:
    for kw in ({"use_edns": False}, {"use_edns": 0, "payload": 4096}):
        r = await ask(proxy, session, "big.ok.test", "TXT", **kw)
        assert r.flags & dns.flags.TC
    assert session.stats.truncated == 2
    # The proxy itself got the whole answer from upstream by falling back to TCP.
    assert ("big.ok.test", "TXT", "tcp") in server.seen

    tcp = await asyncio.start_server(lambda r, w: proxy.serve_tcp(r, w, session), LOOPBACK, 0)
    port = tcp.sockets[0].getsockname()[1]
    try:
        q = dns.message.make_query("big.ok.test", "TXT")
        r = await dns.asyncquery.tcp(q, LOOPBACK, port=port, timeout=5)
    finally:
        tcp.close()
        await tcp.wait_closed()
    assert not r.flags & dns.flags.TC
    ((rd,),) = [list(rr) for rr in r.answer]
    assert b"".join(rd.strings) == b"".join(bytes([97 + i]) * 250 for i in range(12))


async def test_https_record_loses_ech_and_unusable_hints(
    proxy: DnsProxy, session: DnsSession, events: Recorder
) -> None:
    r = await ask(proxy, session, "svc.ok.test", "HTTPS")
    ((rd,),) = [list(rr) for rr in r.answer]
    assert rd.to_text() == '1 . alpn="h2" ipv4hint="93.184.216.37"'
    assert session.bindings.names("93.184.216.37") == {"svc.ok.test"}
    assert session.bindings.names("10.0.0.1") == frozenset()
    event = events.events[-1]
    assert event["ech_stripped"] is True and event["unrouted"] == ["2606:4700::1234"]


async def test_aaaa_only_name_on_a_v4_host(server: AuthServer, session: DnsSession) -> None:
    v4 = DnsProxy([(LOOPBACK, server.port)], ipv6=False, timeout=1.0)
    r = await ask(v4, session, "v6only.ok.test", "AAAA")
    assert r.rcode() == dns.rcode.NOERROR and r.answer == []
    r = await ask(v4, session, "v6only.ok.test", "A")
    assert r.rcode() == dns.rcode.NOERROR and r.answer == []
    assert session.bindings.names("2606:4700::1") == frozenset()

    v6 = DnsProxy([(LOOPBACK, server.port)], ipv6=True, timeout=1.0)
    r = await ask(v6, session, "v6only.ok.test", "AAAA")
    assert addresses(r) == ["2606:4700::1"]
    assert session.bindings.names("2606:4700::1") == {"v6only.ok.test"}


async def test_sessions_do_not_share_bindings(proxy: DnsProxy) -> None:
    a, b = DnsSession(Policy()), DnsSession(Policy())
    await ask(proxy, a, "www.ok.test")
    assert a.bindings.names("93.184.216.34") == {"www.ok.test"}
    assert b.bindings.names("93.184.216.34") == frozenset()


async def test_silent_upstream_is_a_quick_servfail(
    server: AuthServer, session: DnsSession, events: Recorder
) -> None:
    proxy = DnsProxy([(LOOPBACK, server.port)], ipv6=False, timeout=0.5)
    # HANG is never answered: only the proxy's own 0.5 s timer ends this (30 s: a hang)
    r = await asyncio.wait_for(ask(proxy, session, HANG), 30)
    assert r.rcode() == dns.rcode.SERVFAIL
    assert session.stats.upstream_errors == 1
    assert events.events[-1]["rcode"] == "SERVFAIL"
    assert "upstream failed: no answer within 0.5s" in events.events[-1]["reason"]


async def test_next_upstream_is_tried(server: AuthServer, session: DnsSession) -> None:
    refusing = AuthServer(refuse=True)
    await refusing.start()
    try:
        proxy = DnsProxy(
            [(LOOPBACK, refusing.port), (LOOPBACK, server.port)], ipv6=False, timeout=1.0
        )
        r = await ask(proxy, session, "www.ok.test")
    finally:
        await refusing.stop()
    assert addresses(r) == ["93.184.216.34"]
    assert refusing.names() == ["www.ok.test"] and server.names() == ["www.ok.test"]


async def test_rate_limit_refuses_and_counts(proxy: DnsProxy, server: AuthServer) -> None:
    now = [0.0]
    session = DnsSession(Policy(), limiter=TokenBucket(rate=1, burst=3, now=lambda: now[0]))
    rcodes = [(await ask(proxy, session, "www.ok.test")).rcode() for _ in range(5)]
    assert rcodes == [dns.rcode.NOERROR] * 3 + [dns.rcode.REFUSED] * 2
    assert session.stats.rate_limited == 2
    assert len(server.seen) == 1  # the same query again is replayed from the session's cache
    now[0] += 1.0  # one token back
    assert (await ask(proxy, session, "www.ok.test")).rcode() == dns.rcode.NOERROR


async def test_inflight_cap_refuses_at_once(server: AuthServer) -> None:
    proxy = DnsProxy([(LOOPBACK, server.port)], ipv6=False, timeout=0.5)
    session = DnsSession(Policy(), max_inflight=1)
    slow = asyncio.create_task(ask(proxy, session, HANG))
    while session.inflight == 0 and not slow.done():  # out to upstream, never answered
        await asyncio.sleep(0)
    r = await ask(proxy, session, "www.ok.test")
    # Refused while the slow one is still waiting on upstream: not queued behind it.
    assert r.rcode() == dns.rcode.REFUSED and not slow.done()
    assert session.stats.busy == 1 and "www.ok.test" not in server.names()
    assert (await slow).rcode() == dns.rcode.SERVFAIL
    assert session.inflight == 0
    assert (await ask(proxy, session, "www.ok.test")).rcode() == dns.rcode.NOERROR


async def test_binding_table_full_is_servfail(proxy: DnsProxy, events: Recorder) -> None:
    session = DnsSession(Policy(), bindings=Bindings(max_entries=1), on_event=events)
    assert addresses(await ask(proxy, session, "www.ok.test")) == ["93.184.216.34"]
    r = await ask(proxy, session, "alias.ok.test")
    assert r.rcode() == dns.rcode.SERVFAIL
    assert "bindings" in events.events[-1]["reason"]
    assert session.bindings.names("93.184.216.36") == frozenset()


async def test_malformed_and_non_queries(
    proxy: DnsProxy, session: DnsSession, server: AuthServer
) -> None:
    garbage = bytes.fromhex("abcd0100") + b"\x00\x01\x00\x00\x00\x00\x00\x00" + b"\xff" * 20
    r = await proxy.answer(garbage, tcp=False, session=session)
    assert r is not None and r[:2] == b"\xab\xcd"
    assert dns.message.from_wire(r).rcode() == dns.rcode.FORMERR
    assert await proxy.answer(b"\x01\x02\x03", tcp=False, session=session) is None
    response = dns.message.make_response(dns.message.make_query("www.ok.test", "A")).to_wire()
    assert await proxy.answer(response, tcp=False, session=session) is None
    assert session.stats.malformed == 2
    assert server.seen == []


async def test_tcp_stream_bounds(server: AuthServer, session: DnsSession) -> None:
    proxy = DnsProxy([(LOOPBACK, server.port)], ipv6=False, timeout=1.0, tcp_idle_timeout=0.3)
    tcp = await asyncio.start_server(lambda r, w: proxy.serve_tcp(r, w, session), LOOPBACK, 0)
    port = tcp.sockets[0].getsockname()[1]
    try:
        # Two pipelined queries on one connection, answered in order.
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        queries = [dns.message.make_query(n, "A") for n in ("www.ok.test", "mixed.ok.test")]
        writer.write(b"".join(q.to_wire(prepend_length=True) for q in queries))
        for q in queries:
            size = int.from_bytes(await reader.readexactly(2), "big")
            r = dns.message.from_wire(await reader.readexactly(size))
            assert r.id == q.id and r.rcode() == dns.rcode.NOERROR
        # Then idle: the proxy's 0.3 s idle timer closes the connection (30 s: a hang).
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()

        # A length prefix bigger than any query: closed without an answer.
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        writer.write(b"\xff\xff" + b"\x00" * 100)
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()
    finally:
        tcp.close()
        await tcp.wait_closed()


def test_resolv_conf_nameservers(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# comment\nsearch example\nnameserver 127.0.0.53\n"
        "nameserver fe80::1%eth0\nnameserver bogus\noptions edns0\n"
    )
    assert resolv_conf_nameservers(conf) == [("127.0.0.53", 53), ("fe80::1%eth0", 53)]
    assert DnsProxy(resolv_conf=conf, ipv6=False).upstreams == [
        ("127.0.0.53", 53),
        ("fe80::1%eth0", 53),
    ]
    empty = tmp_path / "empty"
    empty.write_text("search example\n")
    with pytest.raises(ValueError, match="lists no nameserver"):
        DnsProxy(resolv_conf=empty, ipv6=False)


def test_host_has_ipv6_route() -> None:
    zero = "0" * 32
    lo_reject = f"{zero} 00 {zero} 00 {zero} ffffffff 00000001 00000000 00200200 lo\n"
    link = f"fe800000000000000000000000000000 40 {zero} 00 {zero} 00000100 00000001 00000000 00000001 eth0\n"
    default = f"{zero} 00 {zero} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00450003 eth0\n"
    assert not host_has_ipv6_route(lo_reject + link)
    assert host_has_ipv6_route(link + default + lo_reject)
    assert not host_has_ipv6_route("")


async def test_replayed_answers_keep_the_id_renew_bindings_and_expire(
    proxy: DnsProxy, server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("boxyd.net.dnsproxy.time.monotonic", lambda: clock[0])
    bindings = Bindings(now=lambda: clock[0])
    session = DnsSession(Policy(), bindings=bindings)
    first = dns.message.make_query("www.ok.test", "A")
    wire = await proxy.answer(first.to_wire(), tcp=False, session=session)
    assert wire is not None
    a = dns.message.from_wire(wire)
    again = dns.message.make_query("www.ok.test", "A")
    again.id = (first.id + 1) % 65536
    clock[0] += 5
    wire = await proxy.answer(again.to_wire(), tcp=False, session=session)
    assert wire is not None
    b = dns.message.from_wire(wire)
    assert b.id == again.id and addresses(b) == addresses(a)
    assert len(server.seen) == 1
    # the replay bound the addresses again from its own time
    clock[0] += bindings.ttl_floor - 1
    assert all(bindings.names(ip) for ip in addresses(b))
    clock[0] += dnsproxy.CACHE_SECONDS
    await proxy.answer(again.to_wire(), tcp=False, session=session)
    assert len(server.seen) == 2  # expired: asked upstream again


async def test_a_cached_answer_needs_no_task_and_keeps_the_checks(
    proxy: DnsProxy, server: AuthServer
) -> None:
    """answer_now (the gateway's path for every UDP query): a query the cache holds is
    answered at once, with its own id, counted and rate-limited like any other; one
    it does not hold is left to upstream; garbage and responses as answer() has them."""
    session = DnsSession(Policy())
    q = dns.message.make_query("www.ok.test", "A")
    ask = proxy.answer_now(q.to_wire(), tcp=False, session=session)
    assert isinstance(ask, dnsproxy.AskUpstream), ask
    first = dns.message.from_wire(await proxy.answer_upstream(ask, session))
    again = dns.message.make_query("www.ok.test", "A")
    again.id = (q.id + 7) % 65536
    now = proxy.answer_now(again.to_wire(), tcp=False, session=session)
    assert isinstance(now, bytes)
    b = dns.message.from_wire(now)
    assert b.id == again.id and addresses(b) == addresses(first)
    assert len(server.seen) == 1 and session.stats.queries == 2
    session.limiter.tokens = 0.0
    session.limiter.rate = 1e-9  # nothing comes back during the test
    refused = proxy.answer_now(again.to_wire(), tcp=False, session=session)
    assert isinstance(refused, bytes)
    assert dns.message.from_wire(refused).rcode() == dns.rcode.REFUSED
    assert session.stats.rate_limited == 1 and session.stats.queries == 3
    assert proxy.answer_now(b"\x01\x02\x03", tcp=False, session=session) is None
    assert proxy.answer_now(first.to_wire(), tcp=False, session=session) is None  # a response
    assert session.stats.malformed == 1


async def test_sessions_do_not_share_replays(proxy: DnsProxy, server: AuthServer) -> None:
    q = dns.message.make_query("www.ok.test", "A").to_wire()
    for _ in range(2):
        await proxy.answer(q, tcp=False, session=DnsSession(Policy()))
    assert len(server.seen) == 2


async def test_a_lookup_asked_about_waits_for_its_answer_then_is_judged_again(
    proxy: DnsProxy, server: AuthServer, events: Recorder
) -> None:
    """--ask (issue 34 §2): a name the allowlist does not hold pauses in the proxy
    until the session's ask answers; yes (the asker widened the policy) resolves it
    upstream, no refuses it; nothing of a refused one reaches upstream."""
    asked: list[str] = []
    policy = Policy()
    session = DnsSession(policy, on_event=events)

    async def answer(name: str, port: int | None, flow: Flow | None) -> bool:
        assert port is None and flow is None  # a lookup; no flow given to answer()
        asked.append(name)
        await asyncio.sleep(0.05)  # the user thinking
        if name.startswith("hop2."):
            policy.allowed = (*(policy.allowed or ()), name)  # what Network.change does
            return True
        return False

    session.ask = answer
    yes, no = await asyncio.gather(
        ask(proxy, session, "hop2.cdn.test"), ask(proxy, session, "c2.cdn.test")
    )
    assert asked == ["hop2.cdn.test", "c2.cdn.test"]
    assert yes.rcode() == dns.rcode.NOERROR and addresses(yes) == ["93.184.216.36"]
    assert no.rcode() == dns.rcode.NXDOMAIN
    assert ("hop2.cdn.test", "A", "udp") in server.seen
    assert not [n for n in server.names() if n.startswith("c2.")]
    assert [e["verdict"] for e in events.events if e["name"] == "c2.cdn.test"] == ["deny"]


async def test_the_flow_a_query_came_on_reaches_the_question(
    proxy: DnsProxy, server: AuthServer
) -> None:
    """--ask names the program that asked: the query's flow (the payload's socket's
    address, where it sent to) is what the session's ask gets, for UDP and TCP alike."""
    got: list[tuple[str, int | None, Flow | None]] = []

    async def answer(name: str, port: int | None, flow: Flow | None) -> bool:
        got.append((name, port, flow))
        return False

    session = DnsSession(Policy(), ask=answer)
    udp = Flow("udp", ("10.0.2.15", 40001), ("10.0.2.2", 53))
    tcp = Flow("tcp", ("fd00::15", 40002), ("fd00::2", 53))
    for flow in (udp, tcp):
        q = dns.message.make_query("c2.cdn.test", "A").to_wire()
        r = await proxy.answer(q, tcp=flow.proto == "tcp", session=session, flow=flow)
        assert r is not None and dns.message.from_wire(r).rcode() == dns.rcode.NXDOMAIN
    assert got == [("c2.cdn.test", None, udp), ("c2.cdn.test", None, tcp)]
    assert not server.names()
