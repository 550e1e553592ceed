"""A TLS connection to a secret's host (`--secret NAME@HOST`), terminated in boxyd: the
payload's TLS ends here with the session CA's certificate for the host
(boxyd/net/sessionca.py), a new TLS connection goes upstream verified against the
host's trust store, and the requests between pass through the swap
(boxyd/net/secretswap.py). Responses are relayed as they come, unchanged.

The TLS of both sides runs in memory (ssl.MemoryBIO) on boxyd's loop, one task per
connection (these are few: the secrets' hosts alone), each step bounded: one read of
at most CHUNK bytes, decrypted, swapped, encrypted and sent before the next is read,
so a slow side back-pressures the other and nothing grows. What the swap cannot read
cuts both sides (`refused` says why), never passes unswapped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import Callable

from boxyd.net import relay
from boxyd.net.secretswap import Swap, Unswappable

CHUNK = 64 * 1024
UPSTREAM_CA_ENV = "BOXY_UPSTREAM_CA"
HANDSHAKE_TIMEOUT = 15.0


class _Side:
    """One TLS connection over a nonblocking socket, its records through memory."""

    def __init__(self, sock: socket.socket, obj: ssl.SSLObject, inc: ssl.MemoryBIO,
                 out: ssl.MemoryBIO, count: Callable[[int], None]) -> None:  # fmt: skip
        self.sock, self.obj, self.inc, self.out, self.count = sock, obj, inc, out, count
        self.loop = asyncio.get_running_loop()

    async def flush(self) -> None:
        data = self.out.read()
        if data:
            await self.loop.sock_sendall(self.sock, data)

    async def fill(self) -> bool:
        """More of the peer's records into the BIO; False at its EOF."""
        await self.flush()
        data = await self.loop.sock_recv(self.sock, CHUNK)
        if not data:
            self.inc.write_eof()
            return False
        self.count(len(data))
        self.inc.write(data)
        return True

    async def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
            except ssl.SSLWantReadError:
                if not await self.fill():
                    raise ConnectionError("the peer closed during the handshake") from None
                continue
            await self.flush()
            return

    async def read(self) -> bytes:
        """Decrypted bytes, at most CHUNK; b"" at the peer's end (clean or not)."""
        while True:
            try:
                return self.obj.read(CHUNK)
            except ssl.SSLWantReadError:
                if not await self.fill():
                    continue  # the BIO's EOF: the next read says how it ended
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def write(self, data: bytes) -> None:
        self.obj.write(data)  # into memory: whole at once (no renegotiation in TLS 1.3)
        await self.flush()

    async def close_write(self) -> None:
        """close_notify, then FIN: the peer sees a clean end of this direction."""
        with contextlib.suppress(ssl.SSLError):
            self.obj.unwrap()
        with contextlib.suppress(OSError):
            await self.flush()
            self.sock.shutdown(socket.SHUT_WR)


def upstream_context() -> ssl.SSLContext:
    """TLS to the real host: verified against the host's store, HTTP/1.1 alone
    offered."""
    # BOXY_UPSTREAM_CA: the test internet's CA alone (as BOXY_UPSTREAM_DNS is its DNS)
    ctx = ssl.create_default_context(cafile=os.environ.get(UPSTREAM_CA_ENV) or None)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class SecretFlow:
    """One terminated connection: the interface of relay.Flow the gateway uses."""

    def __init__(self, client: socket.socket, upstream: socket.socket, first: bytes, host: str,
                 server: ssl.SSLContext, verify: ssl.SSLContext, swap: Swap,
                 idle_timeout: float) -> None:  # fmt: skip
        self.client, self.upstream, self.host, self.swap = client, upstream, host, swap
        self.counters = relay.Counters()
        self.idle_timeout = idle_timeout
        self.refused: str | None = None  # why the swap cut it (a denial)
        self.error: str | None = None  # why TLS failed (upstream's certificate …)
        self._first, self._server, self._verify = first, server, verify
        self._last = time.monotonic()
        self._task: asyncio.Task[relay.CloseReason] | None = None

    def _up(self, n: int) -> None:
        self.counters.up += n
        self._last = time.monotonic()

    def _down(self, n: int) -> None:
        self.counters.down += n
        self._last = time.monotonic()

    def start(self, on_done: Callable[[relay.CloseReason], None]) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(
            lambda t: on_done(
                self._close(relay.CloseReason.ABORTED) if t.cancelled() else t.result()
            )
        )

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _sides(self) -> tuple[_Side, _Side]:
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        inc.write(self._first)  # the ClientHello the gateway judged
        self._up(len(self._first))
        sandbox = _Side(self.client, self._server.wrap_bio(inc, out, server_side=True),
                        inc, out, self._up)  # fmt: skip
        uinc, uout = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = self._verify.wrap_bio(uinc, uout, server_hostname=self.host)
        return sandbox, _Side(self.upstream, obj, uinc, uout, self._down)

    async def _run(self) -> relay.CloseReason:
        sandbox, real = self._sides()
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                await sandbox.handshake()
                await real.handshake()
            work = asyncio.ensure_future(self._both(sandbox, real))
            try:
                while not (await asyncio.wait({work}, timeout=relay.idle_tick(self.idle_timeout)))[
                    0
                ]:
                    if time.monotonic() - self._last > self.idle_timeout:
                        return self._close(relay.CloseReason.IDLE)
            finally:
                work.cancel()
            work.result()
        except* Unswappable as group:
            self.refused = str(group.exceptions[0])
        except* ssl.SSLCertVerificationError as group:
            err = group.exceptions[0]
            self.error = f"{self.host}'s certificate: {getattr(err, 'verify_message', err)}"
        except* (ssl.SSLError, OSError, TimeoutError) as group:
            self.error = f"TLS: {group.exceptions[0]}"
        if self.refused or self.error:
            return self._close(relay.CloseReason.ABORTED)
        return self._close(relay.CloseReason.DONE)

    async def _both(self, sandbox: _Side, real: _Side) -> None:
        async with asyncio.TaskGroup() as tg:  # one failing cancels the other
            tg.create_task(self._requests(sandbox, real))
            tg.create_task(self._responses(real, sandbox))

    async def _requests(self, sandbox: _Side, real: _Side) -> None:
        while data := await sandbox.read():
            out = self.swap.feed(data)
            if out:
                await real.write(out)
        await real.close_write()

    async def _responses(self, real: _Side, sandbox: _Side) -> None:
        while data := await real.read():
            await sandbox.write(data)
        await sandbox.close_write()

    def _close(self, reason: relay.CloseReason) -> relay.CloseReason:
        reset = reason is not relay.CloseReason.DONE
        for sock in (self.client, self.upstream):
            if reset:
                relay.reset(sock)
            else:
                sock.close()
        return reason
