"""One session's gateway in boxyd: every flow out of the sandbox ends here.

Stage 2 made the listener sockets in the gateway netns (TPROXY'd TCP, DNS over UDP
and TCP, other UDP) and handed them over; nftables there already refused what is
decidable from addresses and ports alone. This module decides the rest — by name
— and dials allowed flows from the host netns. Order per TCP flow (docs/design.md,
"Network"): address ranges, then this machine's own addresses, the DNS binding of
the destination, the name in the first record (SNI or Host, read off the wire,
never decrypted), ports. A denial after the handshake closes the client with a
reset.

Fair share: each session has its own listeners (one session's full backlog never
delays another's) and its own caps on concurrent flows, flows still waiting for
their first record, UDP flows, DNS-over-TCP connections and accepts per second.

Cost per TCP flow (bench/net.py): no task and no future; a listener's readiness
takes every queued connection, each decided by callbacks (``_Conn``, then
``relay.Flow``) through the gateway's own epoll set and one timer per deadline
length (``boxyd.net.poller``); the first record is read at accept when it is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import ipaddress
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import dns.message
import dns.rdatatype

from boxy.outcome import Counters
from boxyd.net import denial, nflog, nftcounter, nftset, refusals, relay, sni, udpsock
from boxyd.net.bindings import Address, Bindings
from boxyd.net.dnsproxy import AskUpstream, AskUser, DnsProxy, DnsSession, TokenBucket
from boxyd.net.hostsecrets import HostSecrets
from boxyd.net.netlog import NetLog
from boxyd.net.policy import ECH_REFUSED, NetPolicy, Verdict
from boxyd.net.poller import Deadlines, Poller
from boxyd.net.rtnl import LocalAddresses
from boxyd.net.ruleset import BOUND_SETS, GATEWAY_SOCKETS, NFLOG_GROUP, REFUSED_COUNTER, TABLE
from boxyd.net.sockdiag import Flow

if TYPE_CHECKING:
    from boxyd.net.secretflow import SecretFlow
    from boxyd.net.sessionca import SessionCA

log = logging.getLogger("boxyd")

LISTENERS = GATEWAY_SOCKETS  # see boxyd.net.ruleset


@dataclass(frozen=True)
class Limits:
    flows: int = 1024  # concurrent TCP flows
    pending: int = 128  # flows not yet past their first record
    first_record_timeout: float = 10.0  # a client that never finishes its ClientHello
    server_first_wait: float = 0.25  # how long a silent client delays an opaque-allowed dial
    connect_timeout: float = 15.0
    idle_timeout: float = 600.0  # no byte either way
    accept_rate: float = 500.0  # per second, with a burst of twice that
    udp_flows: int = 256
    dns_tcp: int = 64  # concurrent DNS-over-TCP connections (each idles out in seconds)
    udp_idle_timeout: float = 60.0
    sample_interval: float = 0.33  # byte counters into the net log, about three times a second


Event = dict[str, object]
NFLOG_SETTLE = 0.025  # seconds: one timer tick of NFLOG delivery, with margin


# (the sandbox socket, where it sent to): one relayed UDP flow
_UdpKey = tuple[udpsock.Address, udpsock.Address]


@dataclass(frozen=True)
class _Dgram:
    """A whole datagram from the sandbox, with the destination it was sent to."""

    data: bytes
    src: udpsock.Address
    dst: udpsock.Address


@dataclass
class _UdpFlow:
    upstream: socket.socket
    client: tuple[str, int]
    dst: tuple[str, int]
    handle: int
    up: int = 0
    down: int = 0
    last: float = field(default_factory=time.monotonic)


DRAIN_READS = 16  # reads of a refused client's unread bytes before its socket closes
LITERAL_FOR = 10 * 365 * 86400.0  # seconds: an address allowed as itself, for the run
LOCAL = LocalAddresses()  # this machine's addresses, shared by every session
_ALLOWED = Verdict(True, "net.ip")


def _not_this_machine(ip: Address) -> Verdict:
    """boxyd dials from the host netns: an address of the host itself would reach its
    own services (a server bound to 0.0.0.0 answers on every address it has)."""
    try:
        local = ip in LOCAL
    except OSError:  # cannot tell: refuse rather than guess
        local = True
    return Verdict(False, "net.ip", "an address of this machine") if local else _ALLOWED


ReadState = Literal["more", "decided", "closed", "failed"]


def read_first(client: socket.socket, inspector: sni.Inspector) -> tuple[ReadState, sni.Result]:
    """Read what the client has sent (non-blocking) until its first record decides.
    "more": nothing more there yet. Bounded in bytes (sni.MAX_INSPECT_BYTES) and
    reads (sni.MAX_INSPECT_READS); each byte is inspected once, however the client
    splits them; the bytes read are in INSPECTOR.data."""
    result: sni.Result = sni.NeedMore()
    while True:
        try:
            chunk = client.recv(16384)
        except (BlockingIOError, InterruptedError):
            return "more", result
        except OSError:
            return "failed", result
        if not chunk:
            return "closed", result
        result = inspector.feed(chunk)
        if not isinstance(result, sni.NeedMore):
            return "decided", result


class _Once:
    """An address that hashes and prints once: it keys several dicts per flow (the
    policy's verdicts, the bindings) and names the flow's events, and the stdlib
    computes both anew each time (Python calls). Mixed in before the address class."""

    __slots__ = ()
    _hash: int  # set by the subclass, whose slots hold them (two slotted bases cannot mix)
    _str: str

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self._str


class _V4(_Once, ipaddress.IPv4Address):
    __slots__ = ("_hash", "_str")

    def __init__(self, address: str) -> None:
        super().__init__(address)
        # the address class's own (past _Once in the order): equal to its hash and text
        self._hash, self._str = super(_Once, self).__hash__(), super(_Once, self).__str__()


class _V6(_Once, ipaddress.IPv6Address):
    __slots__ = ("_hash", "_str")

    def __init__(self, address: str) -> None:
        super().__init__(address)
        # the address class's own (past _Once in the order): equal to its hash and text
        self._hash, self._str = super(_Once, self).__hash__(), super(_Once, self).__str__()


def _ip(addr: str) -> Address:
    """The address getsockname() reported, parsed (the same few recur: cached)."""
    ip = _IPS.get(addr)
    if ip is None:
        if len(_IPS) >= 4096:
            _IPS.clear()
        ip = _IPS[addr] = _V6(addr) if ":" in addr else _V4(addr)
    return ip


_IPS: dict[str, Address] = {}


def _socket_of(fd: int, family: int, kind: int, proto: int) -> socket.socket:
    """A socket object for the accepted FD (closed if that fails: it is ours)."""
    try:
        return socket.socket(family, kind, proto, fileno=fd)
    except OSError:
        os.close(fd)
        raise


def _refused_by(policy: NetPolicy, conn: _Conn) -> bool:
    """POLICY no longer allows the flow CONN was decided as: the name it sent (SNI or
    Host), else every name its address was bound to, else its address, is refused, or
    the address itself was denied."""
    names = conn.names or frozenset({conn.addr})
    return (
        not policy.address(conn.ip).allow
        or bool(conn.name and policy.refuses(conn.name))
        or all(map(policy.refuses, names))
    )


_GONE = Verdict(False, "net.sni", "the client went away")
ACCEPT_BATCH = 64  # connections taken per wake-up of a listener


class _Conn:
    """One TCP flow until its relay starts: the first record read (bounded in time,
    bytes and reads: sni.Inspector) and, where it may go before the name is known,
    the dial in parallel. Driven by readiness callbacks: no task per connection.
    Holds the destination's binding until the flow ends (Gateway._relayed)."""

    __slots__ = (
        "gw", "ready", "client", "ip", "addr", "port", "names", "host", "opaque", "inspector",
        "result", "waiting", "reading", "upstream", "dialling", "writing", "connected", "dial_error",
        "verdict", "data", "name", "over", "asked", "__weakref__",
    )  # fmt: skip

    def __init__(
        self,
        gw: Gateway,
        client: socket.socket,
        ip: Address,
        addr: str,
        port: int,
        names: frozenset[str],
        opaque: Verdict,
    ) -> None:
        self.gw = gw
        assert gw.poller is not None  # (started)
        self.ready = gw.poller
        self.client, self.ip, self.addr, self.port = client, ip, addr, port
        self.names, self.host, self.opaque = names, (min(names) if names else None), opaque
        self.inspector = sni.Inspector()
        self.result: sni.Result = sni.NeedMore()
        self.waiting = False  # for the first record
        self.reading = False
        self.upstream: socket.socket | None = None
        self.dialling = False  # connect() in progress
        self.writing = False  # and its completion asked of the poller
        self.connected = False
        self.dial_error: str | None = None
        self.verdict: Verdict | None = None  # once the first record allowed it
        self.data = b""
        self.name: str | None = None
        self.over = False
        self.asked = False  # --ask: its first record's name was asked about (_ask)

    def start(self) -> None:
        gw = self.gw
        gw._conns.add(self)
        gw._waiting[self] = None
        self.waiting = True
        # Server-first protocols (SSH, SMTP …) and public mode: dial as soon as the
        # address passes; client bytes are still held until their first record is read.
        if self.opaque.allow:
            self._dial()
        (gw._server_first if self.opaque.allow else gw._first_record).add(self)
        self._readable()  # the record is often there already: no wake-up for it
        if self.dialling and not self.writing:  # the record is not all there yet
            self._wait_dial()

    def _readable(self) -> None:
        state, self.result = read_first(self.client, self.inspector)
        if state == "more":
            if not self.reading:
                self.ready.add_reader(self.client.fileno(), self._readable)
                self.reading = True
        elif state == "failed":
            self.decided(_GONE, None, None)
        elif state == "closed":  # judge what it sent, if anything
            self._judge(bytes(self.inspector.data) or None)
        else:
            self._judge(bytes(self.inspector.data))

    def _quiet(self) -> None:
        """The first record's time is up (Gateway._first_record, _server_first)."""
        if self.waiting:
            self._judge(bytes(self.inspector.data))

    def _judge(self, data: bytes | None) -> None:
        v, name = self.gw._judge(self.result, data, self.ip, self.port, self.names, self.opaque)
        self.decided(v, data, name)

    def decided(self, v: Verdict, data: bytes | None, name: str | None) -> None:
        """The first record's verdict (or an eviction's); DATA None: the client is gone."""
        if self.over or self.verdict is not None:
            return
        self._stop_reading()
        if not v.allow and data and self._ask(name):
            return
        if not v.allow or data is None:
            self._close_upstream()
            if data is None:  # the client closed without a byte
                self.client.close()
            else:
                # told in words only after a whole ClientHello or request was judged by
                # name (a stalled or evicted one is reset: nothing was asked of it)
                named = isinstance(self.result, (sni.TLS, sni.HTTP))
                self.gw._deny(
                    self.client, "tcp", self.addr, self.port, v, host=self.host, name=name,
                    first=data if named else b"",
                )  # fmt: skip
            self._end()
            return
        self.verdict, self.data, self.name = v, data, name
        if self.upstream is None and self.dial_error is None:
            self._dial()
        elif self.dialling:
            self._check_dial()
        else:
            self._proceed()

    def _ask(self, name: str | None) -> bool:
        """--ask: a first record whose name the allowlist does not hold waits, held here
        (nothing has gone upstream), while the user is asked (Gateway._asked); the
        answer has it judged again. False: not a question to ask (asked already, a name
        denied, ECH, no name)."""
        if self.asked or name is None or self.gw.ask is None:
            return False
        result = self.result
        if isinstance(result, sni.TLS) and not result.ech:
            host = self.gw.policy.askable(name, "sni")
        elif isinstance(result, sni.HTTP):
            host = self.gw.policy.askable(name, "host")
        else:
            return False
        if host is None:
            return False
        self.asked = True
        self.gw._spawn(self.gw._asked(self, host))
        return True

    def _stop_reading(self) -> None:
        self.gw._waiting.pop(self, None)
        self.waiting = False
        if self.reading:
            self.ready.remove_reader(self.client.fileno())
            self.reading = False

    def _dial(self) -> None:
        family = socket.AF_INET6 if self.ip.version == 6 else socket.AF_INET
        try:
            sock = socket.socket(
                family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
            )
        except OSError as e:
            self._dialled(e.strerror or str(e))
            return
        self.upstream = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex((self.addr, self.port))
        if err in (errno.EINPROGRESS, errno.EAGAIN):
            self.dialling = True
            self.gw._dials.add(self)
            if self.verdict is not None:
                self._check_dial()
            return
        self._dialled(os.strerror(err) if err else None)

    def _check_dial(self) -> None:
        """The upstream is needed now. A nearby peer has often answered already (the
        kernel handles its SYN-ACK before connect() returns to us): then go on at
        once, without a wake-up for the connection's completion."""
        assert self.upstream is not None
        try:
            self.upstream.getpeername()  # ENOTCONN until the handshake is done
        except OSError:
            if not self.writing:
                self._wait_dial()
            return
        self._stop_dial_wait()
        self._dialled(None)

    def _wait_dial(self) -> None:
        assert self.upstream is not None
        self.ready.add_writer(self.upstream.fileno(), self._writable)
        self.writing = True

    def _writable(self) -> None:
        assert self.upstream is not None
        self._stop_dial_wait()
        err = self.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self._dialled(os.strerror(err) if err else None)

    def _dial_late(self) -> None:
        """The dial's time is up (Gateway._dials)."""
        if self.dialling:
            self._stop_dial_wait()
            self._dialled(f"no answer within {self.gw.limits.connect_timeout:g}s")

    def _stop_dial_wait(self) -> None:
        self.dialling = False
        if self.writing:
            self.writing = False
            assert self.upstream is not None
            self.ready.remove_writer(self.upstream.fileno())

    def _dialled(self, error: str | None) -> None:
        if error is None:
            self.connected = True
        else:
            self.dial_error = error
            self._close_upstream()
        if self.verdict is not None:
            self._proceed()

    def _proceed(self) -> None:
        """Allowed: relay once the dial is done, or reset at once when it failed."""
        if self.connected:
            upstream, self.upstream = self.upstream, None
            assert upstream is not None
            self._end(release=False)  # the flow holds the binding from here
            self.gw._tcp_allowed(self, upstream)
        elif self.dial_error is not None:
            relay.reset(self.client)  # the sandbox learns at once, as from the real peer
            self.gw.netlog.conn(
                self.gw._t_ms(), "tcp", "error", self.addr, self.port, self.host, self.name,
                f"upstream: {self.dial_error}",
            )  # fmt: skip
            self._end()

    def _close_upstream(self) -> None:
        if self.upstream is not None:
            self._stop_dial_wait()
            self.upstream.close()
            self.upstream = None

    def abort(self) -> None:
        """The gateway is closing: the client gets a reset."""
        if self.over:
            return
        self._stop_reading()
        self._close_upstream()
        relay.reset(self.client)
        self._end()

    def _end(self, *, release: bool = True) -> None:
        self.over = True
        self.gw._conns.discard(self)
        if release:
            self.gw.bindings.release(self.ip)


class Gateway:
    def __init__(
        self,
        policy: NetPolicy,
        listeners: dict[str, socket.socket],
        dns: DnsProxy,
        *,
        on_event: Callable[[Event], None],
        limits: Limits | None = None,
        secrets: tuple[HostSecrets, SessionCA] | None = None,
    ) -> None:
        """SECRETS: --secret NAME@HOST's values and the session's CA (its connections
        to those hosts are terminated: boxyd/net/secretflow.py)."""
        self.policy = policy
        self.secrets = secrets
        self._verify: ssl.SSLContext | None = None  # TLS to a secret's host, made once
        self.listeners = listeners
        self._reply = {4: listeners["udp_reply4"], 6: listeners["udp_reply6"]}
        self._icmp = {4: listeners["icmp4"], 6: listeners["icmp6"]}
        self._icmp_budget = TokenBucket(200, 400)  # refused datagrams told per second
        self.dns = dns
        self.limits = limits or Limits()
        self.on_event = on_event
        self.netlog = NetLog()
        # Allowlist: every binding goes into the gateway's set of bound addresses
        # first, or the ruleset would reset the client's SYN (and it is refused).
        self.bound: nftset.Publisher | None = None
        if policy.mode == "allowlist":
            self.bound = nftset.Publisher(
                nftset.BoundSet(listeners["nftset"], TABLE, BOUND_SETS),
                on_error=lambda e: log.warning("gateway: %s (binding refused)", e),
            )
        self.bindings = Bindings(publish=self.bound.publish if self.bound else None)
        self.dns_session = DnsSession(
            policy=policy, bindings=self.bindings, on_event=self._dns_event,
            placeholder_in=secrets[0].found_folded if secrets else None,
        )  # fmt: skip
        # --ask, for a connection whose first record names a host not allowed: the
        # host, the port and the flow (boxyd/daemon/network.py); None: refused at once
        self.ask: Callable[[str, int | None, Flow | None], Awaitable[bool]] | None = None
        self.started = time.monotonic()
        self._accepts = TokenBucket(self.limits.accept_rate, 2 * self.limits.accept_rate)
        self._tasks: set[asyncio.Task[None]] = set()
        # id(flow) -> (flow, netlog handle, the connection it was decided as)
        self._flows: dict[int, tuple[relay.Flow | SecretFlow, int, _Conn]] = {}
        self._conns: set[_Conn] = set()  # TCP flows not relayed yet
        self._waiting: dict[_Conn, None] = {}  # first record not read yet, oldest first
        self._udp: dict[_UdpKey, _UdpFlow] = {}
        self.rate_limited = 0  # connections reset by the accept-rate or DNS-over-TCP cap
        # The ruleset's refusals, counted by the kernel; those NFLOG reported are rows
        # (_refused), the rest are counted without one (netlog.unnamed).
        self.refused = nftcounter.Counter(listeners["nftset"], TABLE, REFUSED_COUNTER)
        self._reported = self._unreported = 0
        self._counted = False  # the count is final (close() read it the last time)
        self._dns_tcp_open = 0
        self._closed = False
        self.poller: Poller | None = None  # the TCP flows' readiness, from start()

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.poller = Poller(loop)
        lim = self.limits
        self._server_first = Deadlines(loop, lim.server_first_wait, _Conn._quiet)
        self._first_record = Deadlines(loop, lim.first_record_timeout, _Conn._quiet)
        self._dials = Deadlines(loop, lim.connect_timeout, _Conn._dial_late)
        self._idle_checks = Deadlines(
            loop, relay.idle_tick(lim.idle_timeout), relay.Flow._check_idle
        )
        for name, sock in self.listeners.items():
            sock.setblocking(False)
            if name in ("tcp4", "tcp6"):
                self._listen(sock)
            elif name in ("dns_tcp4", "dns_tcp6"):
                self._spawn(self._accept_loop(sock, self._dns_tcp))
            elif name in ("dns_udp4", "dns_udp6"):
                loop.add_reader(sock.fileno(), self._dns_udp_readable, sock)
            elif name in ("udp4", "udp6"):
                loop.add_reader(sock.fileno(), self._udp_readable, sock)
            elif name == "nflog":
                loop.add_reader(sock.fileno(), self._nflog_readable, sock)
        self._spawn(self._sampler())

    async def close(self) -> None:
        """Abort every flow (each client gets a reset) and close the listeners."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if "nflog" in self.listeners:
            # Refusals of the last moments still count: the kernel delivers NFLOG
            # reports on its next timer tick, and unbinding the group flushes them.
            sock = self.listeners["nflog"]
            self._nflog_readable(sock)
            try:
                for r in nflog.unbind(sock, NFLOG_GROUP):
                    self._refused(r)
            except OSError as e:  # not expected; wait out the tick instead
                log.warning("gateway: %s", e)
                await asyncio.sleep(NFLOG_SETTLE)
                self._nflog_readable(sock)
        self._count_unnamed()  # every report is in: what the counter has past them is lost
        self._counted = True
        for name, sock in self.listeners.items():
            if name.startswith(("udp", "dns_udp", "nflog")):
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(sock.fileno())
        for conn in list(self._conns):
            conn.abort()
        for flow, _, _ in list(self._flows.values()):
            flow.abort()
        if self.poller is not None:
            self.poller.close()  # the TCP listeners' interest with it
            for queue in (self._server_first, self._first_record, self._dials):
                queue.close()
            self._idle_checks.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in list(self._udp):
            self._udp_close(key)
        for sock in self.listeners.values():
            sock.close()
        self._sample()
        self._count_unnamed()  # the resets at the accept rate up to the last
        if self.rate_limited:
            self.on_event(
                {
                    "layer": "net.ip",
                    "proto": "tcp",
                    "verdict": "deny",
                    "count": self.rate_limited,
                    "reason": f"reset at accept: over {self.limits.accept_rate:g}/s, or over "
                    f"{self.limits.dns_tcp} DNS-over-TCP connections",
                }
            )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def totals(self) -> Counters:
        """The net log's totals, its refusals nothing named counted now: read when
        someone asks (show, watch's tick, the end), not on every sample."""
        self._count_unnamed()
        return self.netlog.totals()

    def _count_unnamed(self) -> None:
        """Refused connections nothing named: the ruleset's count past its reports
        (a report still on its way is counted here until it comes), and the resets
        at the accept rate. A counter that cannot be read leaves the totals short:
        said, and they read "at least" (netlog.exact)."""
        if self.netlog.exact and not self._counted:
            try:
                self._unreported = max(0, self.refused.read() - self._reported)
            except OSError as e:
                log.warning("gateway: %s (counts from now on are lower bounds)", e)
                self.netlog.exact = False
        self.netlog.unnamed = self.rate_limited + self._unreported

    def _t_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

    def t_ms(self) -> int:
        """Milliseconds since the gateway started: the net log's clock."""
        return self._t_ms()

    # -- the policy changed while the session runs (`boxyctl allow` / `deny`) ------------
    def set_policy(self, policy: NetPolicy, *, cut: bool = True) -> int:
        """Decide by POLICY from now on: the DNS proxy's next question, the next
        connection, and (CUT) the flows already open: each one POLICY no longer allows
        is cut (a reset to the client) as a refusal. Returns how many were cut."""
        before = set(self.policy.literal_addresses())  # in the ruleset's set since the start
        self.policy = self.dns_session.policy = policy
        self.dns_session.cache.clear()  # answers decided by the old policy
        for addr in set(policy.literal_addresses()) - before:  # its own binding, for the run
            if self.bound is not None:
                self.bound.publish(ipaddress.ip_address(addr), LITERAL_FOR)
        if not cut:
            return 0
        return self._cut_refused(policy)

    def _cut_refused(self, policy: NetPolicy) -> int:
        cut = 0
        # Not relayed yet: the verdict taken at the accept (what may pass without a
        # name, as a server-first flow does when its client stays silent) is taken
        # anew; one already allowed and still dialling is judged as an open flow.
        for pending in list(self._conns):
            pending.opaque = policy.tcp_opaque(pending.ip, pending.port, pending.names)
            if pending.verdict is not None and _refused_by(policy, pending):
                pending.abort()
                cut += 1
        for flow, _, conn in list(self._flows.values()):
            if _refused_by(policy, conn):
                flow.abort()
                cut += 1
                # allowed when it began (the net log's row says so): cut, not refused
                self.on_event(
                    {"layer": "net.policy", "proto": "tcp", "verdict": "cut", "addr": conn.addr,
                     "port": conn.port, "host": conn.host, "sni": conn.name,
                     "reason": "denied while it was open (boxyctl deny)"}
                )  # fmt: skip
        for key, udp in list(self._udp.items()):
            ip = _ip(udp.dst[0])
            if not policy.udp(ip, udp.dst[1], self.bindings.names(ip)).allow:
                self._udp_close(key)
                cut += 1
        return cut

    # -- events -------------------------------------------------------------------------
    def _decide(
        self,
        proto: str,
        addr: str,
        port: int,
        v: Verdict,
        *,
        host: str | None = None,
        name: str | None = None,
    ) -> int:
        """One policy decision: into the net log and out as an event. Returns the
        net-log handle (for byte counts of an allowed flow)."""
        verdict = "allow" if v.allow else "deny"
        handle = self.netlog.conn(
            self._t_ms(), proto, verdict, addr, port, host, name, v.reason or None
        )
        self.on_event(
            {
                "layer": v.layer,
                "proto": proto,
                "verdict": verdict,
                "addr": addr,
                "port": port,
                "host": host,
                "sni": name,
                "reason": v.reason,
            }
        )
        return handle

    def _dns_event(self, event: Mapping[str, object]) -> None:
        ev = dict(event)
        name, addrs, denied = ev.get("name"), ev.get("addrs"), ev.get("denied")
        if ev.get("verdict") == "allow" and name and addrs and isinstance(addrs, list | tuple):
            self.netlog.resolution(str(name), [str(a) for a in addrs])
        gone = len(denied) if isinstance(denied, list | tuple) else 0  # answers removed
        if ev.get("verdict") == "deny" and name and gone and not addrs:
            self.netlog.removed(str(name), gone)  # every answer: the name is denied
        ev.setdefault("layer", "net.dns")
        self.on_event(ev)

    async def _sampler(self) -> None:
        while True:
            await asyncio.sleep(self.limits.sample_interval)
            self._sample()
            if self.bound is not None:
                self.bound.refresh(self.bindings.held_addresses())
            self.bindings.expire()
            self._udp_expire()

    def _sample(self) -> None:
        for flow, handle, _ in self._flows.values():
            with contextlib.suppress(KeyError, ValueError):
                self.netlog.update(handle, flow.counters.up, flow.counters.down)
        for udp in self._udp.values():
            with contextlib.suppress(KeyError, ValueError):
                self.netlog.update(udp.handle, udp.up, udp.down)

    # -- TCP ----------------------------------------------------------------------------
    async def _accept_loop(
        self, listener: socket.socket, handler: Callable[[socket.socket], Coroutine[Any, Any, None]]
    ) -> None:
        def take(client: socket.socket) -> None:
            if not self._accepts.take():
                relay.reset(client)
                self.rate_limited += 1  # counted, not logged one by one: it is a flood
                return
            self._spawn(handler(client))

        await relay.accept_forever(listener, take, "gateway")

    def _tcp_acceptable(self, listener: socket.socket, family: int, kind: int, proto: int) -> None:
        """The listener is readable: take what is queued (a burst at most per wake-up,
        so other flows get their turn), each connection decided without a task.
        FAMILY, KIND, PROTO: the listener's, asked once (socket.accept() in socket.py
        asks anew per connection, each an enum made in Python); the accept is the C
        one that socket.accept() itself calls."""
        for _ in range(ACCEPT_BATCH):
            try:
                fd, _ = listener._accept()  # type: ignore[attr-defined]
                client = _socket_of(fd, family, kind, proto)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and friends: back off rather than spin
                log.warning("gateway accept: %s", e.strerror)
                assert self.poller is not None
                self.poller.remove_reader(listener.fileno())
                asyncio.get_running_loop().call_later(0.1, self._listen, listener)
                return
            client.setblocking(False)
            if not self._accepts.take():
                relay.reset(client)
                self.rate_limited += 1  # counted, not logged one by one: it is a flood
                continue
            self._tcp_flow(client)

    def _listen(self, listener: socket.socket) -> None:
        if not self._closed and self.poller is not None:
            self.poller.add_reader(
                listener.fileno(),
                functools.partial(
                    self._tcp_acceptable, listener, listener.family, listener.type, listener.proto
                ),
            )

    def _tcp_flow(self, client: socket.socket) -> None:
        try:
            addr, port = client.getsockname()[:2]
        except OSError:
            client.close()
            return
        ip = _ip(addr)
        addr = str(ip)
        if len(self._flows) + len(self._conns) >= self.limits.flows:
            self._deny(
                client,
                "tcp",
                addr,
                port,
                Verdict(
                    False, "net.ip", f"too many connections in this session ({self.limits.flows})"
                ),
            )
            return
        v = self.policy.address(ip)
        if v.allow:
            v = _not_this_machine(ip)
        if v.allow:
            v = self.policy.tcp_connect(ip, port, self.bindings.names(ip))
        if not v.allow:
            self._deny(client, "tcp", addr, port, v)
            return
        if len(self._waiting) >= self.limits.pending:
            # The oldest waiter makes room: stalled clients (a ClientHello never
            # finished) cannot keep a session's real connections out for the timeout.
            why = (
                "the oldest of too many connections waiting for "
                f"their first record ({self.limits.pending})"
            )
            next(iter(self._waiting)).decided(Verdict(False, "net.sni", why), b"", None)
        names = self.bindings.hold(ip)
        opaque = self.policy.tcp_opaque(ip, port, names)
        _Conn(self, client, ip, addr, port, names, opaque).start()

    def _tcp_allowed(self, conn: _Conn, upstream: socket.socket) -> None:
        """Upstream connected and the first record allowed: relay."""
        assert conn.verdict is not None
        handle = self._decide(
            "tcp", conn.addr, conn.port, conn.verdict, host=conn.host, name=conn.name
        )
        flow: relay.Flow | SecretFlow | None = self._secret_flow(conn, upstream)
        if flow is not None:
            self._flows[id(flow)] = (flow, handle, conn)
            flow.start(functools.partial(self._relayed, flow, handle, conn))
            return
        # with secrets bound to hosts, every byte a flow sends on is looked at for a
        # placeholder, not its first record alone: a worm's body may come later
        scan = self.secrets[0] if self.secrets else None
        flow = relay.Flow(
            conn.client,
            upstream,
            idle_timeout=self.limits.idle_timeout,
            initial_a_to_b=conn.data,
            poller=self.poller,
            idle_checks=self._idle_checks,
            scan=scan.found if scan is not None else None,
            scan_keep=scan.longest - 1 if scan is not None else 0,
        )
        self._flows[id(flow)] = (flow, handle, conn)
        flow.start(functools.partial(self._relayed, flow, handle, conn))

    async def _asked(self, conn: _Conn, host: str) -> None:
        """CONN's first record named HOST, not on the allowlist: ask; once allowed, HOST
        is looked up through the session's DNS proxy (its answers bound as any lookup's),
        then the record is judged again. Allowed and bound to the address: relayed as
        any allowed flow; else refused as it would have been (boxyd.net.denial)."""
        assert self.ask is not None
        try:
            flow = Flow("tcp", conn.client.getpeername()[:2], (conn.addr, conn.port))
        except OSError:  # the client is gone: nobody to name
            flow = None
        try:
            if await self.ask(host, conn.port, flow) and not conn.over:
                kind = dns.rdatatype.AAAA if conn.ip.version == 6 else dns.rdatatype.A
                query = dns.message.make_query(host, kind).to_wire()
                await self.dns.answer(query, tcp=False, session=self.dns_session)
        finally:  # judged whatever happened: a question that failed leaves it refused
            if not conn.over:
                conn.names = self.bindings.names(conn.ip)
                conn._judge(bytes(conn.inspector.data))

    def _secret_flow(self, conn: _Conn, upstream: socket.socket) -> SecretFlow | None:
        """A TLS connection to a secret's host: terminated, its requests swapped."""
        if self.secrets is None or not isinstance(conn.result, sni.TLS) or not conn.name:
            return None
        host = conn.name.lower().rstrip(".")
        secrets, ca = self.secrets
        if host not in secrets.hosts:
            return None
        from boxyd.net import secretflow
        from boxyd.net.secretswap import Swap

        if self._verify is None:
            self._verify = secretflow.upstream_context()
        return secretflow.SecretFlow(
            conn.client, upstream, conn.data or b"", host, ca.server_context(host),
            self._verify,
            Swap(secrets.for_host(host), secrets.foreign(host), host=host, port=conn.port),
            idle_timeout=self.limits.idle_timeout,
        )  # fmt: skip

    def _relayed(
        self, flow: relay.Flow | SecretFlow, handle: int, conn: _Conn, reason: relay.CloseReason
    ) -> None:
        del self._flows[id(flow)]
        if not isinstance(flow, relay.Flow):
            self._secret_done(flow, conn)
        elif isinstance(flow.error, relay.Placeholder):  # a placeholder past the first record
            v = Verdict(False, "net.secret", f"a secret's placeholder ({flow.error})")
            self._decide("tcp", conn.addr, conn.port, v, host=conn.host, name=conn.name)
        self.bindings.release(conn.ip)
        self.netlog.update(handle, flow.counters.up, flow.counters.down, final=True)
        self.on_event(
            {
                "layer": "net.tcp",
                "proto": "tcp",
                "verdict": "close",
                "addr": conn.addr,
                "port": conn.port,
                "host": conn.host,
                "up": flow.counters.up,
                "down": flow.counters.down,
                "reason": reason.value,
            }
        )

    def _secret_done(self, flow: SecretFlow, conn: _Conn) -> None:
        """What a terminated connection's end says: a cut by the swap is a refusal of
        its own; a TLS failure (upstream's certificate) an error; requests swapped,
        by the secrets' names."""
        base = {"proto": "tcp", "addr": conn.addr, "port": conn.port, "host": conn.host,
                "sni": conn.name}  # fmt: skip
        if flow.swap.swapped:
            names = sorted(s.name for s in self.secrets[0].items
                           if s.placeholder in flow.swap.swapped) if self.secrets else []  # fmt: skip
            self.on_event({"layer": "net.secret", "verdict": "swap", "secrets": names,
                           "requests": flow.swap.requests, **base})  # fmt: skip
        if flow.refused is not None:
            v = Verdict(False, "net.secret", refusals.SWAP_CUT + flow.refused)
            self._decide("tcp", conn.addr, conn.port, v, host=conn.host, name=conn.name)
        elif flow.error is not None:
            self.on_event({"layer": "net.secret", "verdict": "error", "reason": flow.error, **base})

    def _judge(
        self,
        first: sni.Result,
        data: bytes | None,
        ip: Address,
        port: int,
        names: frozenset[str],
        opaque: Verdict,
    ) -> tuple[Verdict, str | None]:
        found = self.secrets[0].found(data) if self.secrets and data else None
        if found is not None:  # anywhere in a first record: SNI, request, opaque bytes
            name = first.sni if isinstance(first, sni.TLS) else None
            if isinstance(first, sni.HTTP):
                name = first.host
            return Verdict(False, "net.secret", f"a secret's placeholder ({found})"), name
        if isinstance(first, sni.TLS):
            if first.ech and self.policy.mode == "allowlist":
                return ECH_REFUSED, first.sni
            return self.policy.tcp_name(ip, port, first.sni or "", names, kind="sni"), first.sni
        if isinstance(first, sni.HTTP):
            return self.policy.tcp_name(ip, port, first.host or "", names, kind="host"), first.host
        if isinstance(first, sni.Malformed):
            return Verdict(False, "net.sni", f"malformed first record: {first.reason}"), None
        if isinstance(first, sni.Opaque) or opaque.allow:
            return opaque, None
        waited = self.limits.first_record_timeout
        return Verdict(
            False, "net.sni", f"no complete TLS or HTTP first record within {waited:g}s"
        ), None

    def _deny(
        self,
        client: socket.socket,
        proto: str,
        addr: str,
        port: int,
        v: Verdict,
        *,
        host: str | None = None,
        name: str | None = None,
        first: bytes = b"",
    ) -> None:
        """Refused: recorded, then told. After a first record that was TLS or HTTP, in
        words the program can read (boxyd.net.denial); otherwise a reset."""
        self._decide(proto, addr, port, v, host=host, name=name)
        said = denial.reply(first, v, name or host, port) if first else None
        if said is None:
            relay.reset(client)
            return
        with contextlib.suppress(OSError):  # gone already: close() is what is left
            client.send(said)  # small, into an empty send buffer
            client.shutdown(socket.SHUT_WR)
            for _ in range(DRAIN_READS):  # what it sent meanwhile: a close with it unread
                if not client.recv(65536):  # would reset the reply away
                    break
        client.close()

    async def _dns_tcp(self, client: socket.socket) -> None:
        if self._dns_tcp_open >= self.limits.dns_tcp:
            relay.reset(client)
            self.rate_limited += 1
            return
        self._dns_tcp_open += 1
        try:
            try:
                flow: Flow | None = Flow("tcp", client.getpeername()[:2], client.getsockname()[:2])
            except OSError:
                flow = None
            reader, writer = await asyncio.open_connection(sock=client)
            await self.dns.serve_tcp(reader, writer, self.dns_session, flow)
        finally:
            self._dns_tcp_open -= 1

    # -- refused at SYN time by the ruleset ------------------------------------------
    def _nflog_readable(self, sock: socket.socket) -> None:
        for _ in range(64):  # a burst at most per wake-up: other flows get their turn
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ENOBUFS: reports were lost in a flood; the refusals were not
                continue
            for r in nflog.parse(data):
                self._refused(r)

    def _refused(self, r: nflog.Refused) -> None:
        """Say why nftables refused it, in the same words boxyd's own checks use."""
        self._reported += r.proto in ("tcp", "udp")  # what the ruleset's counter counts
        ip = ipaddress.ip_address(r.addr)
        v = self.policy.early_refusal(ip, r.proto, r.port, self.bindings.names(ip))
        if r.proto in ("tcp", "udp"):
            self._decide(r.proto, str(ip), r.port, v)
        else:
            self.on_event(
                {
                    "layer": v.layer,
                    "proto": r.proto,
                    "verdict": "deny",
                    "addr": str(ip),
                    "reason": v.reason,
                }
            )

    # -- DNS over UDP -------------------------------------------------------------------
    @staticmethod
    def _datagram(sock: socket.socket, size: int, what: str) -> _Dgram | None:
        """One whole datagram with its original destination, or None (nothing there,
        or nothing to act on: truncated, or no destination reported)."""
        try:
            dgram = udpsock.recv_datagram(sock, size)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            log.warning("gateway %s: %s", what, e.strerror)
            return None
        if dgram.truncated or dgram.orig_dst is None:
            return None
        return _Dgram(dgram.data, dgram.src, dgram.orig_dst)

    def _dns_udp_readable(self, sock: socket.socket) -> None:
        dgram = self._datagram(sock, 4096, "dns")
        if dgram is None:
            return
        # What needs no upstream (the cache above all) is answered now, without a task.
        now = self.dns.answer_now(dgram.data, tcp=False, session=self.dns_session)
        if isinstance(now, AskUser):  # --ask: the question names who sent it
            now = dataclasses.replace(now, flow=Flow("udp", dgram.src, dgram.dst))
        if isinstance(now, AskUpstream):
            self._spawn(self._dns_udp_answer(sock, dgram, now))
        else:
            self._dns_udp_send(sock, dgram, now)

    async def _dns_udp_answer(self, sock: socket.socket, dgram: _Dgram, ask: AskUpstream) -> None:
        wire = await self.dns.answer_upstream(ask, self.dns_session)
        self._dns_udp_send(sock, dgram, wire)

    @staticmethod
    def _dns_udp_send(sock: socket.socket, dgram: _Dgram, wire: bytes | None) -> None:
        if wire is not None:
            with contextlib.suppress(OSError, ValueError):
                udpsock.send_from(sock, wire, dgram.dst, dgram.src)

    # -- other UDP ----------------------------------------------------------------------
    def _udp_readable(self, sock: socket.socket) -> None:
        dgram = self._datagram(sock, 65535, "udp")
        if dgram is None:
            return
        key = (dgram.src, dgram.dst)
        flow = self._udp.get(key)
        if flow is None:
            flow = self._udp_open(dgram)
            if flow is None:
                return
        try:
            flow.upstream.send(dgram.data)
        except OSError:
            return
        flow.up += len(dgram.data)
        flow.last = time.monotonic()

    def _udp_open(self, dgram: _Dgram) -> _UdpFlow | None:
        addr, port = dgram.dst[0], dgram.dst[1]
        ip = ipaddress.ip_address(addr)
        addr = str(ip)
        v = self.policy.address(ip)
        if v.allow:
            v = _not_this_machine(ip)
        if v.allow:
            v = self.policy.udp(ip, port, self.bindings.names(ip))
        if v.allow and len(self._udp) >= self.limits.udp_flows:
            v = Verdict(
                False, "net.ip", f"too many UDP flows in this session ({self.limits.udp_flows})"
            )
        if not v.allow:
            self._decide("udp", addr, port, v)
            if self._icmp_budget.take():  # the client learns at once, as from a closed port
                with contextlib.suppress(OSError, ValueError):
                    udpsock.send_port_unreachable(
                        self._icmp[ip.version], dgram.src, dgram.dst, dgram.data
                    )
            return None
        names = self.bindings.hold(ip)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        up = socket.socket(family, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            up.connect((addr, port))
        except OSError as e:
            up.close()
            self.bindings.release(ip)
            self.netlog.conn(
                self._t_ms(), "udp", "error", addr, port, None, None, f"upstream: {e.strerror}"
            )
            return None
        handle = self._decide("udp", addr, port, v, host=min(names) if names else None)
        flow = _UdpFlow(up, dgram.src, dgram.dst, handle)
        key = (dgram.src, dgram.dst)
        self._udp[key] = flow
        asyncio.get_running_loop().add_reader(
            up.fileno(), self._udp_reply, key, self._reply[ip.version]
        )
        return flow

    def _udp_reply(self, key: _UdpKey, sender: socket.socket) -> None:
        flow = self._udp.get(key)
        if flow is None:
            return
        try:
            data = flow.upstream.recv(65535)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # ICMP unreachable and the like: the flow is over
            self._udp_close(key)
            return
        flow.down += len(data)
        flow.last = time.monotonic()
        with contextlib.suppress(OSError, ValueError):
            udpsock.send_from(sender, data, flow.dst, flow.client)

    def _udp_expire(self) -> None:
        now = time.monotonic()
        for key, flow in list(self._udp.items()):
            if now - flow.last > self.limits.udp_idle_timeout:
                self._udp_close(key)

    def _udp_close(self, key: _UdpKey) -> None:
        flow = self._udp.pop(key, None)
        if flow is None:
            return
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(flow.upstream.fileno())
        flow.upstream.close()
        self.bindings.release(ipaddress.ip_address(flow.dst[0]))
        with contextlib.suppress(KeyError, ValueError):
            self.netlog.update(flow.handle, flow.up, flow.down, final=True)
