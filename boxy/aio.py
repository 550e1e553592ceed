"""The library for asyncio (`import boxy.aio`): the same calls as boxy.library, as
coroutines. A terminal's output is read by the event loop (add_reader on the PTY's
master); what blocks without a loop to wait on (connecting to boxyd, which may start
it; a call's reply) runs in a thread of the default executor, so the loop never
waits on the daemon."""

from __future__ import annotations

import asyncio
import os

from boxy import library
from boxy.library import Result, SandboxedPTY, Session

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable
    from typing import Any

    from boxy.events import Event, Snapshot
    from boxy.outcome import SessionInfo


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


class AsyncSandboxedPTY:
    """SandboxedPTY for asyncio: `await read()`, `await write()`, `resize()`, `await
    wait()`, `close()`; `sync` is the SandboxedPTY underneath."""

    def __init__(self, pty: SandboxedPTY) -> None:
        self.sync = pty
        self.id = pty.id
        os.set_blocking(pty.fileno(), False)  # the loop waits; a read never blocks it

    async def read(self, timeout: float | None = None) -> bytes:
        """As SandboxedPTY.read: b"" once the terminal has closed; TimeoutError."""
        fd = self.sync.fileno()
        if fd < 0:
            return b""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return os.read(fd, 65536)
            except BlockingIOError:
                pass
            except OSError:  # EIO: the session's end
                return b""
            ready = loop.create_future()
            loop.add_reader(fd, _wake, ready)
            try:
                await asyncio.wait_for(ready, timeout)
            finally:
                loop.remove_reader(fd)

    async def write(self, data: bytes) -> int:
        fd, loop = self.sync.fileno(), asyncio.get_running_loop()
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, _wake, ready)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)
        return len(data)

    def resize(self, cols: int, rows: int) -> None:
        self.sync.resize(cols, rows)  # a oneway send of a few bytes

    async def wait(self, timeout: float | None = None) -> int:
        return await asyncio.to_thread(self.sync.wait, timeout)

    async def result(self) -> Result:
        return await asyncio.to_thread(lambda: self.sync.result)

    async def detach(self) -> None:
        """Leave the session running (Ctrl-]), then close."""
        await asyncio.to_thread(self.sync.detach)

    def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncSandboxedPTY:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


async def spawn_pty(
    argv: Iterable[str] | str | None = None, *, cols: int, rows: int, **options: Any
) -> AsyncSandboxedPTY:
    """boxy.spawn_pty for asyncio (an unknown keyword or bad value raises as there)."""
    pty = await asyncio.to_thread(library.spawn_pty, argv, cols=cols, rows=rows, **options)
    return AsyncSandboxedPTY(pty)


async def attach(id: str, *, cols: int = 80, rows: int = 24) -> AsyncSandboxedPTY:
    return AsyncSandboxedPTY(await asyncio.to_thread(library.attach, id, cols=cols, rows=rows))


async def run(argv: Iterable[str] | str, **kw: Any) -> Result:
    """boxy.run; the run is followed in a thread (its pipes are drained there too)."""
    return await asyncio.to_thread(library.run, argv, **kw)


async def start(argv: Iterable[str] | str, **options: Any) -> Session:
    return await asyncio.to_thread(library.start, argv, **options)


async def sessions(all: bool = False) -> list[SessionInfo]:
    return await asyncio.to_thread(library.sessions, all)


async def show(id: str) -> SessionInfo:
    return await asyncio.to_thread(library.show, id)


async def stop(id: str, kill: bool = False) -> SessionInfo:
    return await asyncio.to_thread(library.stop, id, kill)


async def watch(id: str | None = None) -> AsyncIterator[Snapshot | Event]:
    """boxy.watch as an async iterator (each reply waited for in a thread)."""
    events = library.watch(id)
    end = object()
    try:
        while (item := await asyncio.to_thread(next, events, end)) is not end:
            yield item  # type: ignore[misc]
    finally:
        await asyncio.to_thread(events.close)
