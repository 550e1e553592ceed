"""boxy's DNS proxy: the I/O around dnsfilter, for every session's port-53 traffic.

The gateway hands each query (a UDP datagram, or a TCP stream via
:meth:`DnsProxy.serve_tcp`) to :meth:`DnsProxy.answer` with the session it came
from. A query is parsed, checked (dnsfilter.decide_query: refused names never
leave), resolved upstream with a fresh query carrying only the question, filtered
(dnsfilter.filter_answer), its addresses bound in the session's Bindings, and only
then answered. Every decision is reported to the session's ``on_event``.

Bounds, so that one session cannot starve the others or hang its own payload:

- a per-session token bucket on queries (over it: REFUSED, counted, no event —
  a flood must not flood the event stream too);
- a per-session cap on queries waiting for upstream (over it: REFUSED) and a
  daemon-wide cap on concurrent upstream queries (waited for, within the
  deadline);
- one deadline per query across all upstream servers (UDP, then TCP when the
  answer is truncated); past it the client gets SERVFAIL, quickly enough that its
  own resolver does not time out first;
- UDP answers fit the client's advertised EDNS size (at most ``EDNS_PAYLOAD``;
  512 without EDNS); a bigger one is truncated with TC set so the client asks
  again over TCP;
- TCP: 2-byte length framing, queries of at most ``TCP_MAX_QUERY`` bytes, an idle
  timeout between queries and a read timeout within one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dns.asyncquery
import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype

from boxyd.net.bindings import Bindings
from boxyd.net.dnsfilter import (
    EDNS_PAYLOAD,
    NOT_ALLOWED,
    Binding,
    DnsPolicy,
    Filtered,
    Refusal,
    blocked,
    decide_query,
    filter_answer,
    name_text,
    refusal_response,
    response_for,
    upstream_query,
)
from boxyd.net.hostnet import Upstream, host_has_ipv6_route, resolv_conf_nameservers
from boxyd.net.sockdiag import Flow

Event = dict[str, Any]

QUERY_TIMEOUT = 3.0  # per client query, all upstream attempts included
RATE = 100.0  # queries per second per session, sustained
BURST = 200  # ... and in a burst (a cold `npm install` resolves a few dozen names at once)
SESSION_INFLIGHT = 32
# Answers a session was given, replayed for the same query bytes for a few seconds:
# a client without a cache (glibc, node) resolves before every connection, and
# parsing, asking upstream and filtering again costs it ~1.5 ms each time. Per
# session, so no session learns what another resolved. Bindings are renewed on
# every replay, with the TTL the replayed answer carries.
CACHE_SECONDS = 10.0
IPV6_RECHECK = 1.0  # seconds between looks at the host's IPv6 default route
CACHE_ENTRIES = 512
GLOBAL_INFLIGHT = 256
TCP_MAX_QUERY = 4096  # a query is a name and a few EDNS options; anything bigger is not DNS
TCP_IDLE_TIMEOUT = 10.0
TCP_READ_TIMEOUT = 5.0

_QR = 0x8000
_RA = 0x0080
_OPCODE_RD = 0x7800 | 0x0100


class UpstreamError(Exception):
    """No upstream server answered the query in time."""


class TokenBucket:
    """RATE tokens a second, at most BURST saved up; :meth:`take` spends one."""

    def __init__(
        self, rate: float, burst: float, now: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate > 0 and burst >= 1, not {rate}/{burst}")
        self.rate = rate
        self.burst = float(burst)
        self.now = now
        self.tokens = float(burst)
        self.last = now()

    def take(self) -> bool:
        t = self.now()
        self.tokens = min(self.burst, self.tokens + (t - self.last) * self.rate)
        self.last = t
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class DnsStats:
    queries: int = 0
    malformed: int = 0
    refused: int = 0  # answered locally by decide_query (names not allowed, ANY, AXFR, …)
    rate_limited: int = 0
    busy: int = 0  # over the session's in-flight cap
    upstream_errors: int = 0
    truncated: int = 0  # UDP answers sent with TC


@dataclass(frozen=True)
class AskUpstream:
    """A query answer_now() leaves to upstream (answer_upstream)."""

    query: dns.message.Message
    key: tuple[bool, bool, bytes]
    tcp: bool


@dataclass(frozen=True)
class AskUser(AskUpstream):
    """A name the allowlist does not hold, in a session that asks (--ask): paused in
    answer_upstream until DnsSession.ask says, then judged again by the policy."""

    name: str
    refusal: Refusal
    flow: Flow | None = None  # the query's own, to name the program that asked


def _parse(wire: bytes, session: DnsSession) -> dns.message.Message | bytes | None:
    """The query in WIRE; FORMERR's wire when it does not parse; None for a response
    (answering one could start a loop)."""
    try:
        query = dns.message.from_wire(wire)
    except Exception:  # hostile bytes: any parser failure is FORMERR
        session.stats.malformed += 1
        return _formerr(wire)
    return None if query.flags & dns.flags.QR else query


@dataclass
class _Cached:
    expires: float
    tail: bytes  # the wire answer after its ID
    bind: list[Binding]
    event: Event | None


@dataclass
class DnsSession:
    """What the proxy needs of one session."""

    policy: DnsPolicy
    bindings: Bindings = field(default_factory=Bindings)
    on_event: Callable[[Event], None] | None = None
    limiter: TokenBucket = field(default_factory=lambda: TokenBucket(RATE, BURST))
    max_inflight: int = SESSION_INFLIGHT
    # (suffix, servers): names under a suffix go to those servers instead of the
    # daemon's upstreams — --tailscale routes the tailnet's MagicDNS suffix this way
    routes: tuple[tuple[str, tuple[Upstream, ...]], ...] = ()
    cache: dict[tuple[bool, bool, bytes], _Cached] = field(default_factory=dict)
    # --ask: may a name the allowlist does not hold be looked up after all (it widens
    # the policy itself when the answer is yes); None: refused at once. Called with
    # the name, the port (None: a lookup) and the query's flow (None: not known)
    ask: Callable[[str, int | None, Flow | None], Awaitable[bool]] | None = None
    # --secret NAME@HOST: the name of a secret whose placeholder a query's name holds
    # (compared without case); such a query is refused whatever the policy says
    placeholder_in: Callable[[bytes], str | None] | None = None
    inflight: int = 0
    stats: DnsStats = field(default_factory=DnsStats)


def _placeholder(query: dns.message.Message, session: DnsSession) -> str | None:
    """Why QUERY is refused for a secret's placeholder in its name (a payload spelling
    one out to a resolver of its choosing), or None."""
    if session.placeholder_in is None or not query.question:
        return None
    found = session.placeholder_in(name_text(query.question[0].name).encode())
    return None if found is None else f"a secret's placeholder ({found}) in a DNS name"


class DnsProxy:
    """Answers sessions' DNS queries; one instance serves every session."""

    def __init__(
        self,
        upstreams: Sequence[Upstream] | None = None,
        *,
        ipv6: bool | None = None,
        timeout: float = QUERY_TIMEOUT,
        max_inflight: int = GLOBAL_INFLIGHT,
        max_udp_payload: int = EDNS_PAYLOAD,
        tcp_idle_timeout: float = TCP_IDLE_TIMEOUT,
        tcp_read_timeout: float = TCP_READ_TIMEOUT,
        resolv_conf: str | Path = "/etc/resolv.conf",
    ) -> None:
        if upstreams is None:
            upstreams = resolv_conf_nameservers(resolv_conf)
            if not upstreams:
                raise ValueError(
                    f"{resolv_conf} lists no nameserver: "
                    "configure upstream_dns for boxy's DNS proxy"
                )
        if not upstreams:
            raise ValueError("the DNS proxy needs at least one upstream server")
        self.upstreams = [(str(host), int(port)) for host, port in upstreams]
        self._ipv6_fixed = ipv6  # None: follow the host's routes (they change under a daemon)
        self._ipv6_checked = (-1.0, False)
        self.timeout = timeout
        self.max_udp_payload = max(512, max_udp_payload)
        self.tcp_idle_timeout = tcp_idle_timeout
        self.tcp_read_timeout = tcp_read_timeout
        self._upstream_slots = asyncio.Semaphore(max_inflight)

    @property
    def ipv6(self) -> bool:
        """Whether AAAA answers are kept: the host has an IPv6 default route now
        (looked up at most once a second), unless fixed at construction."""
        if self._ipv6_fixed is not None:
            return self._ipv6_fixed
        when, value = self._ipv6_checked
        now = time.monotonic()
        if now - when > IPV6_RECHECK:
            value = host_has_ipv6_route()
            self._ipv6_checked = (now, value)
        return value

    async def answer(
        self, wire: bytes, *, tcp: bool, session: DnsSession, flow: Flow | None = None
    ) -> bytes | None:
        """The wire response to the query WIRE from SESSION (sent on FLOW, when known),
        or None to send nothing (not a query, or too broken to answer)."""
        now = self.answer_now(wire, tcp=tcp, session=session, flow=flow)
        if not isinstance(now, AskUpstream):
            return now
        return await self.answer_upstream(now, session)

    def answer_now(
        self, wire: bytes, *, tcp: bool, session: DnsSession, flow: Flow | None = None
    ) -> bytes | None | AskUpstream:
        """What answer() says without asking upstream, in its order: malformed, a
        response, over the rate, cached (a client without a cache of its own asks
        again before every connection), refused, too many in flight. AskUpstream: the
        rest, for answer_upstream(). No task needed, so a cached answer costs none."""
        session.stats.queries += 1
        key = (self.ipv6, tcp, wire[2:])
        query: dns.message.Message | None = None
        if key not in session.cache:  # (cached bytes parsed as a query, and still do)
            parsed = _parse(wire, session)
            if not isinstance(parsed, dns.message.Message):
                return parsed  # FORMERR's wire, or nothing (a response, a scrap)
            query = parsed
        if not session.limiter.take():
            session.stats.rate_limited += 1
            query = query or dns.message.from_wire(wire)
            return self._wire(response_for(query, dns.rcode.REFUSED), query, tcp, session)
        cached = self._cached(session, key)
        if cached is not None:
            return wire[:2] + cached
        query = query or dns.message.from_wire(wire)
        secret = _placeholder(query, session)
        if secret is not None:
            session.stats.refused += 1
            self._emit(session, query, "deny", secret, dns.rcode.REFUSED, layer="net.secret")
            return self._wire(response_for(query, dns.rcode.REFUSED), query, tcp, session)
        refusal = decide_query(query, session.policy)
        if refusal is not None and refusal.reason == NOT_ALLOWED and session.ask is not None:
            name = name_text(query.question[0].name)
            if not session.policy.name_denied(name):  # `boxyctl deny`: refused, never asked
                return AskUser(query, key, tcp, name, refusal, flow)
        if refusal is not None:
            return self._refuse(query, refusal, tcp, session)
        if session.inflight >= session.max_inflight:
            session.stats.busy += 1
            return self._wire(response_for(query, dns.rcode.REFUSED), query, tcp, session)
        return AskUpstream(query, key, tcp)

    async def answer_upstream(self, ask: AskUpstream, session: DnsSession) -> bytes:
        """The rest of answer(): upstream's answer, filtered, bound, cached; an AskUser
        first waits for its answer, and a name still not allowed then is refused."""
        query, key, tcp = ask.query, ask.key, ask.tcp
        if isinstance(ask, AskUser):
            assert session.ask is not None
            allowed = await session.ask(ask.name, None, ask.flow)
            refusal = decide_query(query, session.policy) if allowed else ask.refusal
            if refusal is not None:
                return self._refuse(query, refusal, tcp, session)
        judged_by = session.policy  # a change replaces it (Gateway.set_policy), never edits it
        upstream = await self._ask_upstream(query, session)
        filtered = self._filter(query, upstream, session)
        if filtered.error is not None:
            self._emit(session, query, "allow", filtered.error, dns.rcode.SERVFAIL)
            return self._wire(filtered.response, query, tcp, session)
        # The policy may have changed while upstream answered (`boxyctl deny`): the
        # question is judged again by the one in force now, and an answer whose CNAME
        # chain passes through a denied name resolves that name: refused as it is.
        changed = session.policy is not judged_by
        refusal = decide_query(query, session.policy) if changed else None
        denied = next((n for n in filtered.chain[1:] if session.policy.name_denied(n)), None)
        if refusal is None and denied is not None:
            refusal = Refusal(
                dns.rcode.NXDOMAIN, f"CNAME chain through {denied}, {NOT_ALLOWED}",
                ede=(dns.edns.EDECode.BLOCKED, blocked(denied)),
            )  # fmt: skip
        if refusal is not None:
            return self._refuse(query, refusal, tcp, session)
        # Bind before answering: the client may connect the moment it has the answer.
        unbound = self._bind(session, filtered)
        if unbound is not None:
            self._emit(session, query, "deny", unbound, dns.rcode.SERVFAIL)
            return self._wire(response_for(query, dns.rcode.SERVFAIL), query, tcp, session)
        event = self._emit_filtered(session, query, filtered)
        response = self._wire(filtered.response, query, tcp, session)
        if len(session.cache) >= CACHE_ENTRIES:
            session.cache.pop(next(iter(session.cache)))  # the oldest
        session.cache[key] = _Cached(
            time.monotonic() + CACHE_SECONDS, response[2:], list(filtered.bind), event
        )
        return response

    def _refuse(
        self, query: dns.message.Message, refusal: Refusal, tcp: bool, session: DnsSession
    ) -> bytes:
        """The answer to QUERY refused by REFUSAL, counted and said."""
        session.stats.refused += 1
        self._emit(session, query, "deny", refusal.reason, refusal.rcode)
        return self._wire(refusal_response(query, refusal), query, tcp, session)

    @staticmethod
    def _cached(session: DnsSession, key: tuple[bool, bool, bytes]) -> bytes | None:
        """A fresh cached answer (all after its id) whose bindings still hold, else None."""
        hit = session.cache.get(key)
        if hit is None:
            return None
        if hit.expires > time.monotonic() and all(
            session.bindings.bind(b.ip, b.name, b.ttl) for b in hit.bind
        ):
            if session.on_event is not None and hit.event is not None:
                session.on_event(dict(hit.event))
            return hit.tail
        del session.cache[key]
        return None

    async def _ask_upstream(
        self, query: dns.message.Message, session: DnsSession
    ) -> dns.message.Message | Filtered:
        """Upstream's response, or a SERVFAIL (with why) when there is none."""
        session.inflight += 1
        try:
            return await self._resolve(upstream_query(query), route_for(session, query))
        except UpstreamError as e:
            session.stats.upstream_errors += 1
            why = f"upstream failed: {e}"
            return Filtered(response_for(query, dns.rcode.SERVFAIL), error=why)
        finally:
            session.inflight -= 1

    def _filter(
        self,
        query: dns.message.Message,
        upstream: dns.message.Message | Filtered,
        session: DnsSession,
    ) -> Filtered:
        if isinstance(upstream, Filtered):
            return upstream
        bindings = session.bindings
        try:
            return filter_answer(
                query,
                upstream,
                session.policy,
                ipv6=self.ipv6,
                ttl_floor=bindings.ttl_floor,
                ttl_cap=bindings.ttl_cap,
            )
        except (ValueError, dns.exception.DNSException) as e:
            why = f"unusable upstream answer: {e}"
            return Filtered(response_for(query, dns.rcode.SERVFAIL), error=why)

    @staticmethod
    def _bind(session: DnsSession, filtered: Filtered) -> str | None:
        """Bind every address the answer keeps; why not, at the first that fails."""
        bindings = session.bindings
        unpublished = bindings.unpublished
        for b in filtered.bind:
            if not bindings.bind(b.ip, b.name, b.ttl):
                if bindings.unpublished > unpublished:
                    return f"the gateway did not take {b.ip} into its bound addresses"
                return f"too many DNS bindings in this session ({bindings.max_entries})"
        return None

    async def serve_tcp(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: DnsSession,
        flow: Flow | None = None,
    ) -> None:
        """Answer DNS over one TCP connection (FLOW, when known) until the client closes
        it, idles, or sends something that is not a DNS query. Closes WRITER."""
        try:
            while True:
                try:
                    header = await asyncio.wait_for(reader.readexactly(2), self.tcp_idle_timeout)
                except (TimeoutError, asyncio.IncompleteReadError):
                    return
                size = int.from_bytes(header, "big")
                if size < 12 or size > TCP_MAX_QUERY:
                    return
                wire = await asyncio.wait_for(reader.readexactly(size), self.tcp_read_timeout)
                response = await self.answer(wire, tcp=True, session=session, flow=flow)
                if response is None:
                    return
                writer.write(len(response).to_bytes(2, "big") + response)
                await asyncio.wait_for(writer.drain(), self.tcp_idle_timeout)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _resolve(
        self, q: dns.message.Message, servers: Sequence[Upstream] | None = None
    ) -> dns.message.Message:
        """Q's answer from the first of SERVERS (default: the upstreams) that gives one
        within the deadline."""
        servers = list(servers or self.upstreams)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        errors: list[str] = []
        try:
            async with asyncio.timeout(self.timeout), self._upstream_slots:
                for i, (host, port) in enumerate(servers):
                    # Later servers keep their share of the deadline.
                    share = (deadline - loop.time()) / (len(servers) - i)
                    try:
                        response, _ = await dns.asyncquery.udp_with_fallback(
                            q,
                            host,
                            timeout=share,
                            port=port,
                            ignore_unexpected=True,
                            ignore_errors=True,
                        )
                    except (dns.exception.DNSException, OSError, EOFError) as e:
                        errors.append(f"{host}:{port}: {_describe(e)}")
                        continue
                    last = i == len(servers) - 1
                    if response.rcode() in (dns.rcode.SERVFAIL, dns.rcode.REFUSED) and not last:
                        errors.append(f"{host}:{port}: {dns.rcode.to_text(response.rcode())}")
                        continue
                    return response
        except TimeoutError:
            errors.append(f"no answer within {self.timeout:g}s")
        raise UpstreamError("; ".join(errors) or "no upstream server")

    def _wire(
        self,
        response: dns.message.Message,
        query: dns.message.Message,
        tcp: bool,
        session: DnsSession,
    ) -> bytes:
        if tcp:
            limit = 65535
        else:
            advertised = query.payload if query.edns >= 0 else 512
            limit = max(512, min(advertised, self.max_udp_payload))
        try:
            wire = response.to_wire(max_size=limit, prefer_truncation=not tcp)
        except dns.exception.TooBig:
            return response_for(query, dns.rcode.SERVFAIL).to_wire()
        if not tcp and wire[2] & (dns.flags.TC >> 8):
            session.stats.truncated += 1
        return wire

    def _emit(
        self,
        session: DnsSession,
        query: dns.message.Message,
        verdict: str,
        reason: str | None,
        rcode: dns.rcode.Rcode,
        **extra: Any,
    ) -> Event | None:
        if session.on_event is None:
            return None
        question = query.question[0] if query.question else None
        event: Event = {
            "layer": "net.dns",
            "verdict": verdict,
            "name": name_text(question.name) if question is not None else "",
            "qtype": dns.rdatatype.to_text(question.rdtype) if question is not None else "",
            "addrs": [],
            "reason": reason,
            "rcode": dns.rcode.to_text(rcode),
        }
        event.update(extra)
        session.on_event(dict(event))
        return event

    def _emit_filtered(
        self, session: DnsSession, query: dns.message.Message, filtered: Filtered
    ) -> Event | None:
        addrs = list(dict.fromkeys(str(b.ip) for b in filtered.bind))
        extra: dict[str, Any] = {"addrs": addrs}
        reason = None
        if filtered.denied:
            reason = "answer in a denied range removed: " + ", ".join(
                f"{addr} ({why})" for addr, why in filtered.denied
            )
            extra["denied"] = [list(d) for d in filtered.denied]
        if filtered.unrouted:
            extra["unrouted"] = list(filtered.unrouted)
        if filtered.ech_stripped:
            extra["ech_stripped"] = True
        if len(filtered.chain) > 1:
            extra["chain"] = list(filtered.chain)
        verdict = "deny" if filtered.denied else "allow"
        return self._emit(session, query, verdict, reason, filtered.response.rcode(), **extra)


def route_for(session: DnsSession, query: dns.message.Message) -> tuple[Upstream, ...] | None:
    """The servers for QUERY's name when it falls under one of the session's routes."""
    name = name_text(query.question[0].name) if query.question else ""
    for suffix, servers in session.routes:
        if name == suffix or name.endswith("." + suffix):
            return servers
    return None


def _formerr(wire: bytes) -> bytes | None:
    """A bare FORMERR for an unparseable query, when it has a query header to answer."""
    if len(wire) < 12:
        return None
    flags = int.from_bytes(wire[2:4], "big")
    if flags & _QR:
        return None
    flags = _QR | _RA | (flags & _OPCODE_RD) | dns.rcode.FORMERR
    return wire[:2] + flags.to_bytes(2, "big") + bytes(8)


def _describe(e: BaseException) -> str:
    if isinstance(e, dns.exception.Timeout):
        return "timed out"
    return str(e) or type(e).__name__
