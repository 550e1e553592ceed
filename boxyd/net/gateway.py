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
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from boxyd.net import nflog, nftset, relay, sni, udpsock
from boxyd.net.bindings import Address, Bindings
from boxyd.net.dnsproxy import DnsProxy, DnsSession, TokenBucket
from boxyd.net.netlog import NetLog
from boxyd.net.policy import ECH_REFUSED, NetPolicy, Verdict
from boxyd.net.rtnl import LocalAddresses
from boxyd.net.ruleset import BOUND_SETS, GATEWAY_SOCKETS, NFLOG_GROUP, TABLE

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


async def first_record(client: socket.socket, wait: float) -> tuple[sni.Result, bytes | None]:
    """Read until the first record decides, the client goes quiet for WAIT, or it
    closes. Bounded in bytes (sni.MAX_INSPECT_BYTES), reads (sni.MAX_INSPECT_READS)
    and time; each byte is inspected once, however the client splits them."""
    loop = asyncio.get_running_loop()
    inspector = sni.Inspector()
    deadline = loop.time() + wait
    result: sni.Result = sni.NeedMore()
    while isinstance(result, sni.NeedMore):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            async with asyncio.timeout(remaining):  # no extra task, unlike wait_for
                chunk = await loop.sock_recv(client, 16384)
        except TimeoutError:
            break
        except OSError:
            return result, None
        if not chunk:
            return result, (bytes(inspector.data) or None)
        result = inspector.feed(chunk)
    return result, bytes(inspector.data)


class Gateway:
    def __init__(
        self,
        policy: NetPolicy,
        listeners: dict[str, socket.socket],
        dns: DnsProxy,
        *,
        on_event: Callable[[Event], None],
        limits: Limits | None = None,
    ) -> None:
        self.policy = policy
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
            policy=policy, bindings=self.bindings, on_event=self._dns_event
        )
        self.started = time.monotonic()
        self._accepts = TokenBucket(self.limits.accept_rate, 2 * self.limits.accept_rate)
        self._tasks: set[asyncio.Task[None]] = set()
        self._flows: dict[int, tuple[relay.Flow, int]] = {}  # id(flow) -> (flow, netlog handle)
        self._waiting: dict[
            asyncio.Task[None], None
        ] = {}  # first record not read yet, oldest first
        self._evicted: set[asyncio.Task[None]] = set()
        self._udp: dict[_UdpKey, _UdpFlow] = {}
        self.rate_limited = 0  # connections reset by the accept-rate or DNS-over-TCP cap
        self._dns_tcp_open = 0
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for name, sock in self.listeners.items():
            sock.setblocking(False)
            if name in ("tcp4", "tcp6"):
                self._spawn(self._accept_loop(sock, self._tcp_flow))
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
        for name, sock in self.listeners.items():
            if name.startswith(("udp", "dns_udp", "nflog")):
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(sock.fileno())
        for flow, _ in list(self._flows.values()):
            flow.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in list(self._udp):
            self._udp_close(key)
        for sock in self.listeners.values():
            sock.close()
        self._sample()
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

    def _t_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)

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
        if ev.get("verdict") == "deny" and name and denied and isinstance(denied, list | tuple):
            self.netlog.removed(str(name), len(denied))
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
        for flow, handle in self._flows.values():
            with contextlib.suppress(KeyError, ValueError):
                self.netlog.update(handle, flow.counters.up, flow.counters.down)
        for udp in self._udp.values():
            with contextlib.suppress(KeyError, ValueError):
                self.netlog.update(udp.handle, udp.up, udp.down)

    # -- TCP ----------------------------------------------------------------------------
    async def _accept_loop(
        self, listener: socket.socket, handler: Callable[[socket.socket], Coroutine[Any, Any, None]]
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(listener)
            except OSError as e:  # EMFILE and friends: back off rather than spin
                log.warning("gateway accept: %s", e.strerror)
                await asyncio.sleep(0.1)
                continue
            client.setblocking(False)
            if not self._accepts.take():
                relay.reset(client)
                self.rate_limited += 1  # counted, not logged one by one: it is a flood
                continue
            self._spawn(handler(client))

    async def _tcp_flow(self, client: socket.socket) -> None:
        try:
            addr, port = client.getsockname()[:2]
        except OSError:
            client.close()
            return
        ip = ipaddress.ip_address(addr)
        addr = str(ip)
        if len(self._flows) + len(self._waiting) >= self.limits.flows:
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
            names = self.bindings.names(ip)
            v = self.policy.tcp_connect(ip, port, names)
        if not v.allow:
            self._deny(client, "tcp", addr, port, v)
            return
        if len(self._waiting) >= self.limits.pending:
            # The oldest waiter makes room: stalled clients (a ClientHello never
            # finished) cannot keep a session's real connections out for the timeout.
            oldest = next(iter(self._waiting))
            self._evicted.add(oldest)
            oldest.cancel()
        names = self.bindings.hold(ip)
        try:
            await self._tcp_checked(client, ip, addr, port, names)
        finally:
            self.bindings.release(ip)

    async def _tcp_checked(
        self, client: socket.socket, ip: Address, addr: str, port: int, names: frozenset[str]
    ) -> None:
        host = min(names) if names else None
        opaque = self.policy.tcp_opaque(ip, port, names)
        # Server-first protocols (SSH, SMTP …) and public mode: dial as soon as the
        # address passes; client bytes are still held until their first record is read.
        dial = asyncio.create_task(self._dial(ip, port)) if opaque.allow else None
        v, data, name = await self._first_record(client, ip, port, names, opaque, dial)
        if not v.allow or data is None:
            if dial is not None:
                dial.cancel()
                with contextlib.suppress(BaseException):
                    (await dial).close()
            if data is None:  # the client closed without a byte
                client.close()
                return
            self._deny(client, "tcp", addr, port, v, host=host, name=name)
            return
        try:
            upstream = await (dial or self._dial(ip, port))
        except OSError as e:
            relay.reset(client)  # the sandbox learns at once, as from the real peer
            self.netlog.conn(
                self._t_ms(), "tcp", "error", addr, port, host, name, f"upstream: {e.strerror or e}"
            )
            return
        handle = self._decide("tcp", addr, port, v, host=host, name=name)
        await self._relay_tcp(client, upstream, data, handle, addr, port, host)

    async def _first_record(
        self,
        client: socket.socket,
        ip: Address,
        port: int,
        names: frozenset[str],
        opaque: Verdict,
        dial: asyncio.Task[socket.socket] | None,
    ) -> tuple[Verdict, bytes | None, str | None]:
        """The verdict on the client's first record, the bytes read, the name they
        carry. One of the oldest waiting when too many wait is evicted (refused)."""
        me = asyncio.current_task()
        assert me is not None
        self._waiting[me] = None
        try:
            first, data = await first_record(
                client, self.limits.server_first_wait if dial else self.limits.first_record_timeout
            )
            v, name = self._judge(first, data, ip, port, names, opaque)
            return v, data, name
        except asyncio.CancelledError:
            if me not in self._evicted:  # the gateway is closing
                relay.reset(client)
                if dial is not None:
                    dial.cancel()
                raise
            self._evicted.discard(me)
            me.uncancel()
            why = (
                "the oldest of too many connections waiting for "
                f"their first record ({self.limits.pending})"
            )
            return Verdict(False, "net.sni", why), b"", None
        finally:
            self._waiting.pop(me, None)

    async def _relay_tcp(
        self,
        client: socket.socket,
        upstream: socket.socket,
        data: bytes,
        handle: int,
        addr: str,
        port: int,
        host: str | None,
    ) -> None:
        flow = relay.Flow(
            client, upstream, idle_timeout=self.limits.idle_timeout, initial_a_to_b=data
        )
        self._flows[id(flow)] = (flow, handle)
        try:
            reason = await flow.run()
        finally:
            del self._flows[id(flow)]
            self.netlog.update(handle, flow.counters.up, flow.counters.down, final=True)
        self.on_event(
            {
                "layer": "net.tcp",
                "proto": "tcp",
                "verdict": "close",
                "addr": addr,
                "port": port,
                "host": host,
                "up": flow.counters.up,
                "down": flow.counters.down,
                "reason": reason.value,
            }
        )

    def _judge(
        self,
        first: sni.Result,
        data: bytes | None,
        ip: Address,
        port: int,
        names: frozenset[str],
        opaque: Verdict,
    ) -> tuple[Verdict, str | None]:
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

    async def _dial(self, ip: Address, port: int) -> socket.socket:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        sock = socket.socket(
            family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(self.limits.connect_timeout):
                await asyncio.get_running_loop().sock_connect(sock, (str(ip), port))
        except TimeoutError:
            sock.close()
            raise OSError(f"no answer within {self.limits.connect_timeout:g}s") from None
        except BaseException:
            sock.close()
            raise
        return sock

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
    ) -> None:
        self._decide(proto, addr, port, v, host=host, name=name)
        relay.reset(client)

    async def _dns_tcp(self, client: socket.socket) -> None:
        if self._dns_tcp_open >= self.limits.dns_tcp:
            relay.reset(client)
            self.rate_limited += 1
            return
        self._dns_tcp_open += 1
        try:
            reader, writer = await asyncio.open_connection(sock=client)
            await self.dns.serve_tcp(reader, writer, self.dns_session)
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
        if dgram is not None:
            self._spawn(self._dns_udp_answer(sock, dgram))

    async def _dns_udp_answer(self, sock: socket.socket, dgram: _Dgram) -> None:
        wire = await self.dns.answer(dgram.data, tcp=False, session=self.dns_session)
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
