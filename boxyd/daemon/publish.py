"""Published ports (--publish, a profile's `ports`): the host's listeners, bound
before the sandbox starts, and each connection relayed into the sandbox's loopback.

boxyd cannot enter the sandbox's network namespace (it is threaded, and setns into
the user namespace that owns it needs a single-threaded caller). A joiner enters it
(boxyd/stage2/joiner.py): for each connection it makes one unconnected socket on
request (OpenSocket, answered by SocketMade), and boxyd connects that socket itself to 127.0.0.1:PORT there, or to
[::1]:PORT when nothing listens on the IPv4 one (servers that bind `localhost` to
::1). The connection is inbound only: the payload never gets a socket of the host's,
so a published port is no way out, and --net none stays without a network
(docs/design.md, "Network").

Who can reach a published port is whoever can reach its host address: on
127.0.0.1 (the default), every process of this machine, of every user.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from boxy.errors import UsageError
from boxy.values import PortMapping
from boxyd.net import relay
from boxyd.stage2 import protocol

MAX_CONNECTIONS = 256  # at once, per session: past it a new one is reset at accept
OPEN_WAIT = 5.0  # seconds for stage 2 to make a connection's socket
# A dev server's live-reload socket may sit quiet for long; the session's end closes
# every connection anyway, so this only bounds a peer that vanished without a word.
IDLE_TIMEOUT = 2 * 3600.0
_LOOPBACK = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))

_BIND_ERRORS = {
    errno.EADDRINUSE: "is taken (another program listens there; choose another host port)",
    errno.EACCES: "is not yours to bind (ports below 1024 need privilege; choose a higher one)",
    errno.EADDRNOTAVAIL: "is not an address of this machine",
}


def exposure(m: PortMapping) -> str:
    """The line said before the payload starts: where, and who can reach it."""
    ip = ipaddress.ip_address(m.addr)
    who = (
        "every process of this machine can reach it"
        if ip.is_loopback
        else "every machine that can reach this one can reach it"
        if ip.is_unspecified
        else f"whoever can reach {m.addr} can reach it"
    )
    return f"--publish: {m.host} leads to port {m.port} inside; {who}"


def bind(mappings: list[PortMapping]) -> list[socket.socket]:
    """A listening socket for each mapping, before anything starts: a host port that
    is taken, privileged or not on this machine is a UsageError naming it, and
    nothing stays bound."""
    bound: list[socket.socket] = []
    try:
        for m in mappings:
            bound.append(_listen(m))
    except BaseException:
        for s in bound:
            s.close()
        raise
    return bound


def _listen(m: PortMapping) -> socket.socket:
    family = socket.AF_INET6 if ":" in m.addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        # a port in TIME_WAIT from the last run is free; one with a listener is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # [::]:8080 means IPv6 only, as written
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((m.addr, m.host_port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        why = _BIND_ERRORS.get(e.errno or 0, f"cannot be bound: {e.strerror}")
        raise UsageError(f"--publish {m}: {m.host} {why}") from None
    return sock


class Publisher:
    """One session's published ports once its payload runs. ASK sends a request to
    the session's joiner; made() is how its SocketMade answers come back."""

    def __init__(
        self,
        mappings: list[PortMapping],
        listeners: list[socket.socket],
        record: Callable[..., None],
    ) -> None:
        self.mappings, self.listeners = mappings, listeners
        self._record = record
        self._ask: Callable[[protocol.Request], None] | None = None
        self._waiting: dict[int, asyncio.Future[socket.socket]] = {}
        self._next_id = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._flows: set[relay.Flow] = set()
        self.connections = 0  # relayed, for the record at the end
        # accepted and not yet over (counted at the accept: a burst of accepts runs
        # before any of their tasks, and got past a count of the tasks' own state)
        self._active = 0
        self.reset_full = 0  # reset at the accept, the table full: said at the end

    def start(self, ask: Callable[[protocol.Request], None]) -> None:
        """Accept on every listener (the payload runs: stage 2 answers requests now)."""
        self._ask = ask
        for m, listener in zip(self.mappings, self.listeners, strict=True):
            self._record("publish", host=m.host, port=m.port)
            self._spawn(self._accept_loop(listener, m.port))

    def made(self, ident: int, sock: socket.socket | None, error: str | None) -> None:
        """Stage 2's answer to OpenSocket(IDENT): the socket, or why there is none."""
        waiting = self._waiting.pop(ident, None)
        if waiting is None or waiting.done():
            if sock is not None:
                sock.close()
            return
        if sock is None:
            waiting.set_exception(OSError(errno.EIO, error or "no socket"))
        else:
            waiting.set_result(sock)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self, listener: socket.socket, port: int) -> None:
        def take(client: socket.socket) -> None:
            if self._active >= MAX_CONNECTIONS:
                self.reset_full += 1
                relay.reset(client)
                return
            self._active += 1
            self._spawn(self._connection(client, port))

        await relay.accept_forever(listener, take, "publish")

    async def _connection(self, client: socket.socket, port: int) -> None:
        """CLIENT (the host's side) relayed to PORT on the sandbox's loopback; when
        nothing listens there, the client gets a reset, as it would from the port."""
        try:
            try:
                inner = await self._dial(port)
            except (OSError, TimeoutError):
                relay.reset(client)
                return
            flow = relay.Flow(client, inner, idle_timeout=IDLE_TIMEOUT)
            self._flows.add(flow)
            self.connections += 1
            try:
                await flow.run()
            finally:
                self._flows.discard(flow)
        finally:
            self._active -= 1

    async def _dial(self, port: int) -> socket.socket:
        """A socket of the sandbox's network namespace, connected to its loopback."""
        loop = asyncio.get_running_loop()
        last: OSError = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
        for family, addr in _LOOPBACK:
            sock = await self._open(family)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (addr, port))
            except OSError as e:  # refused, or no ::1 in there: the next one
                sock.close()
                last = e
                continue
            return sock
        raise last

    async def _open(self, family: int) -> socket.socket:
        if self._ask is None:
            raise OSError(errno.ENOTCONN, "the sandbox is not running")
        self._next_id += 1
        ident = self._next_id
        waiting: asyncio.Future[socket.socket] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = waiting
        self._ask(protocol.OpenSocket(ident, family))
        try:
            return await asyncio.wait_for(waiting, OPEN_WAIT)
        finally:
            self._waiting.pop(ident, None)

    def close(self) -> None:
        """The session ended: no more accepts; every open connection is reset."""
        for task in list(self._tasks):
            task.cancel()
        for flow in list(self._flows):
            flow.abort()
        for waiting in self._waiting.values():
            waiting.cancel()
        self._waiting.clear()
        for listener in self.listeners:
            with contextlib.suppress(OSError):
                listener.close()
        self.listeners = []
