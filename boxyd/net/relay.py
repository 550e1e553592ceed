"""The gateway's byte pump: moves bytes both ways between two connected TCP sockets.

The kernel does TCP on both sides, so relaying is only moving bytes, driven by
readiness callbacks on the event loop (no thread per flow, no busy loop). Each
direction holds at most one bounded intermediate, so a slow reader back-pressures
the writer's TCP window instead of growing a buffer in Python:

- *copy*: ``recv_into`` / ``send`` through a fixed buffer (one memoryview);
- *splice*: ``os.splice`` socket → pipe → socket; the pipe is the buffer and the
  payload never enters user space.

A direction starts in copy mode and switches to splice once it has carried
``SPLICE_AFTER`` bytes (bulk). Short flows, the vast majority, then cost no pipes
(pipe pages are accounted per user, and past ``fs.pipe-user-pages-soft`` new pipes
shrink to two pages) and no pipe-setup syscalls; bulk flows get the cheaper path.
``bench/relay.py`` measures both.

Semantics: EOF on one side is passed on as ``shutdown(SHUT_WR)`` on the other while
the reverse direction keeps running; an error on either side (ECONNRESET, EPIPE, …),
an idle timeout or :meth:`Flow.abort` closes *both* sockets with ``SO_LINGER {1, 0}``
so each peer sees a reset, never a clean FIN that would pass a truncated stream off
as complete. The flow owns both sockets and closes them when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import functools
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from boxyd.net.poller import Deadlines, Poller

Mode = Literal["auto", "copy", "splice"]

COPY_BUFFER = 64 * 1024
# Requested pipe size for splice; the kernel may refuse (per-user pipe accounting),
# in which case the default (64 KiB) is used.
PIPE_SIZE = 1024 * 1024
# Pipe pages count against a per-user kernel budget (fs.pipe-user-pages-soft, 64 MiB
# by default) shared with the user's other programs; past it, every new pipe the
# user makes shrinks to two pages. The relay keeps to half of it; beyond that,
# flows stay on the copy buffer.
PIPE_BUDGET = 32 * 1024 * 1024
_MIN_PIPE = 64 * 1024
SPLICE_AFTER = 256 * 1024
# Callbacks a direction may chain before yielding to other flows: each round
# is one drain and one fill, so a fast flow cannot starve the loop.
_ROUNDS = 4
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_NEVER = 1 << 62  # (splice_at of a copy-only direction)
_SPLICE_AT: dict[str, int] = {"auto": SPLICE_AFTER, "copy": _NEVER, "splice": 0}
_LINGER_RESET = struct.pack("ii", 1, 0)


class Placeholder(OSError):
    """A secret's placeholder seen in what a flow's a side sent (its name, never the
    value: a placeholder is not the secret)."""


@dataclass(slots=True)
class Counters:
    """Bytes moved a→b (``up``) and b→a (``down``); read them at any time.

    One instance may be shared by many flows (e.g. a session's totals).
    """

    up: int = 0
    down: int = 0


class CloseReason(enum.Enum):
    DONE = "done"  # both sides sent EOF and everything was delivered
    RESET_BY_A = "reset_by_a"  # a failed (reset, broken pipe, …): b was reset too
    RESET_BY_B = "reset_by_b"
    IDLE = "idle"  # no byte either way for idle_timeout: both reset
    ABORTED = "aborted"  # Flow.abort() or the run() task was cancelled: both reset


async def accept_forever(
    listener: socket.socket, take: Callable[[socket.socket], None], what: str
) -> None:
    """Each connection LISTENER accepts, non-blocking, to TAKE (which owns it), until
    cancelled. A failed accept (EMFILE and friends) is logged under WHAT and backed
    off from rather than spun on."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            client, _ = await loop.sock_accept(listener)
        except OSError as e:
            logging.getLogger("boxyd").warning("%s accept: %s", what, e.strerror)
            await asyncio.sleep(0.1)
            continue
        client.setblocking(False)
        take(client)


def reset(sock: socket.socket) -> None:
    """Close SOCK so that its peer gets an RST rather than a FIN (SO_LINGER 0)."""
    if sock.fileno() < 0:
        return
    with contextlib.suppress(OSError):  # already dead: close() is all that is left to do
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.close()


class Readiness(Protocol):
    """The readiness calls of an asyncio loop that a flow uses (a Poller has them too)."""

    def add_reader(self, fd: int, callback: Callable[[], object], /) -> object: ...
    def remove_reader(self, fd: int, /) -> bool: ...
    def add_writer(self, fd: int, callback: Callable[[], object], /) -> object: ...
    def remove_writer(self, fd: int, /) -> bool: ...


class _Pipes:
    in_use = 0  # bytes of pipe this process holds for splicing


class _Direction:
    """One way of a flow: reads SRC, writes DST, holding at most one bounded intermediate."""

    __slots__ = (
        "flow",
        "ready",
        "src",
        "dst",
        "src_fd",
        "dst_fd",
        "up",
        "mode",
        "moved",
        "splice_at",
        "initial",
        "buf",
        "view",
        "start",
        "end",
        "pipe_r",
        "pipe_w",
        "cap",
        "held",
        "eof",
        "stalled",
        "dst_blocked",
        "reading",
        "writing",
        "done",
        "scan",
        "tail",
    )

    def __init__(
        self,
        flow: Flow,
        src: socket.socket,
        dst: socket.socket,
        up: bool,
        mode: Mode,
        initial: bytes,
    ) -> None:
        self.flow = flow
        self.ready: Readiness = flow.ready  # type: ignore[assignment]
        self.src, self.dst = src, dst
        self.src_fd, self.dst_fd = src.fileno(), dst.fileno()
        self.up = up
        self.mode = mode
        self.moved = 0
        # bytes carried before splicing is tried: one comparison per fill, not the mode's
        self.splice_at = _SPLICE_AT[mode]
        self.initial = memoryview(initial) if initial else None
        self.buf: bytearray | None = None  # copy mode, allocated on first use
        self.view: memoryview | None = None
        self.start = self.end = 0
        self.pipe_r = self.pipe_w = -1  # splice mode
        self.cap = 0
        self.held = 0  # bytes read from src and not yet written to dst
        self.eof = False
        self.stalled = False  # splice in said EAGAIN with bytes held: the pipe may be full
        self.dst_blocked = False
        self.reading = self.writing = False
        self.done = False
        # a→b looked at for a secret's placeholder (Flow's SCAN): copied, never spliced,
        # and the last bytes kept, so one split between two reads is found too
        self.scan = flow.scan if up else None
        # (the first record, judged whole already, is what comes before the first read)
        self.tail = bytes(initial[-flow.scan_keep :]) if flow.scan_keep and initial else b""
        if self.scan is not None:
            self.splice_at = _NEVER

    # -- the two intermediates -------------------------------------------------

    def _use_splice(self) -> bool:
        """Whether to fill the pipe (made now if it is time): called once
        ``moved`` has reached ``splice_at``."""
        if self.pipe_r >= 0:
            return True
        if self.held:
            return False
        if _Pipes.in_use + _MIN_PIPE > PIPE_BUDGET:
            self._copy_only()
            return False
        try:
            self.pipe_r, self.pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._copy_only()  # out of fds: keep relaying through the buffer
            return False
        if _Pipes.in_use + PIPE_SIZE <= PIPE_BUDGET:
            with contextlib.suppress(OSError):  # refused by the kernel: keep the default
                fcntl.fcntl(self.pipe_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.cap = fcntl.fcntl(self.pipe_w, fcntl.F_GETPIPE_SZ)
        _Pipes.in_use += self.cap
        if self.cap < _MIN_PIPE:
            # The user is past the kernel's soft limit and got a two-page pipe, on
            # which splice crawls: the copy buffer is faster.
            self._close_pipe()
            self._copy_only()
            return False
        self.buf = self.view = None  # the copy buffer is empty here; let it go
        return True

    def _copy_only(self) -> None:
        self.mode = "copy"
        self.splice_at = _NEVER

    def _close_pipe(self) -> None:
        if self.pipe_r >= 0:
            os.close(self.pipe_r)
            os.close(self.pipe_w)
            self.pipe_r = self.pipe_w = -1
            _Pipes.in_use -= self.cap
            self.cap = 0

    def _fill(self) -> int:
        """Read what fits from src: >0 bytes, 0 at EOF, -1 when nothing (or no room)."""
        try:
            if self.moved >= self.splice_at and self._use_splice():
                room = self.cap - self.held
                if room <= 0:
                    return -1
                n = os.splice(self.src_fd, self.pipe_w, room, flags=_SPLICE_FLAGS)
            else:
                if self.view is None:
                    self.buf = bytearray(COPY_BUFFER)
                    self.view = memoryview(self.buf)
                if self.end == COPY_BUFFER:
                    return -1
                n = self.src.recv_into(self.view[self.end :])
                self.end += n
                if self.scan is not None and n:
                    self._scan(n)
        except BlockingIOError:
            # In splice mode EAGAIN also means "pipe full" (a TCP splice may fill
            # pipe slots with partial pages); only a drain can tell, so wait for one.
            self.stalled = self.pipe_r >= 0 and self.held > 0
            return -1
        except InterruptedError:
            return -1
        self.held += n
        return n

    def _scan(self, n: int) -> None:
        """The N bytes just read, with the tail of those before: a placeholder among
        them ends the flow before they are sent (Placeholder: an OSError, so step()
        fails the flow and resets both sides)."""
        assert self.scan is not None and self.view is not None
        seen = self.tail + bytes(self.view[self.end - n : self.end])
        found = self.scan(seen)
        if found is not None:
            raise Placeholder(found)
        self.tail = seen[-self.flow.scan_keep :] if self.flow.scan_keep else b""

    def _drain(self) -> None:
        """Write what dst takes: the initial bytes first, then what is held."""
        try:
            if self.initial is not None:
                n = self.dst.send(self.initial)
                self._count(n)  # (once per flow: no need to inline it)
                if n < len(self.initial):
                    self.initial = self.initial[n:]
                    self.dst_blocked = True
                    return
                self.initial = None
            if not self.held:
                return
            if self.pipe_r >= 0:
                n = os.splice(self.pipe_r, self.dst_fd, self.held, flags=_SPLICE_FLAGS)
            else:
                # At EOF, MSG_MORE: the shutdown that follows once this is all written
                # sends the FIN in the same segment (one packet less for the peer).
                n = self.dst.send(
                    self.view[self.start : self.end],  # type: ignore[index]
                    socket.MSG_MORE if self.eof else 0,
                )
                self.start += n
                if self.start == self.end:
                    self.start = self.end = 0
        except (BlockingIOError, InterruptedError):
            self.dst_blocked = True
            return
        self.held -= n
        self.moved += n  # (_count inline: this is the path of every chunk)
        if self.up:
            self.flow.counters.up += n
        else:
            self.flow.counters.down += n
        if n:
            self.stalled = False
        if self.held:
            self.dst_blocked = True  # a short write: the send buffer is full

    def _count(self, n: int) -> None:
        self.moved += n
        if self.up:
            self.flow.counters.up += n
        else:
            self.flow.counters.down += n

    # -- driving ---------------------------------------------------------------

    def begin(self) -> None:
        """The first step: pass the initial bytes on, then wait for readiness. A read
        now would mostly find nothing (the client waits for an answer, the server has
        not sent one yet) and cost a syscall and an exception per direction."""
        if self.flow.finished:
            return
        try:
            if self.initial is not None:  # (the other way has nothing to pass on yet)
                self._drain()
        except OSError as e:
            self.flow._fail(self.dst, e)
            return
        self._interest()

    def on_writable(self) -> None:
        self.dst_blocked = False
        self.step()

    def step(self) -> None:
        flow = self.flow
        if flow.finished:
            return
        failing = self.dst
        try:
            if not self.dst_blocked and (self.held or self.initial is not None):
                self._drain()
            # Every fill is followed by a drain unless dst is known to be blocked,
            # so on exit either nothing is held or a writer callback is due. A copy
            # with room left reads on first: an EOF right behind the last bytes is
            # then known before they are sent, and leaves with them (_drain).
            for _ in range(_ROUNDS):
                if self.eof or self.stalled:
                    break
                failing = self.src
                n = self._fill()
                failing = self.dst
                if n < 0:
                    break
                if n == 0:
                    self.eof = True
                elif self.pipe_r < 0 and self.end < COPY_BUFFER:
                    continue
                if not self.dst_blocked and (self.held or self.initial is not None):
                    self._drain()
            if not self.dst_blocked and (self.held or self.initial is not None):
                self._drain()  # what the last read took
            if self.eof and not self.held and self.initial is None:
                self.done = True
                self.dst.shutdown(socket.SHUT_WR)  # pass the EOF on
        except OSError as e:
            flow._fail(failing, e)
            return
        self._interest()
        if self.done:
            flow._direction_done()

    def _interest(self) -> None:
        want_read = not (self.done or self.eof or self.stalled) and (
            self.cap > self.held if self.pipe_r >= 0 else self.end < COPY_BUFFER
        )
        want_write = self.dst_blocked and not self.done
        if want_read != self.reading:
            if want_read:
                self.ready.add_reader(self.src_fd, self.step)
            else:
                self.ready.remove_reader(self.src_fd)
            self.reading = want_read
        if want_write != self.writing:
            if want_write:
                self.ready.add_writer(self.dst_fd, self.on_writable)
            else:
                self.ready.remove_writer(self.dst_fd)
            self.writing = want_write

    def close(self) -> None:
        """Unregister and close the pipe; safe to call more than once."""
        if self.reading:
            self.ready.remove_reader(self.src_fd)
            self.reading = False
        if self.writing:
            self.ready.remove_writer(self.dst_fd)
            self.writing = False
        if self.pipe_r >= 0:
            self._close_pipe()
        self.buf = self.view = None


class Flow:
    """A relayed TCP flow between A (e.g. the sandbox's side) and B (the real peer).

    Create it, then ``await flow.run()``; ``counters`` move as bytes do, and
    ``abort()`` ends it at once with a reset on both sides. The flow takes
    ownership of both sockets and closes them when it ends.
    """

    def __init__(
        self,
        a: socket.socket,
        b: socket.socket,
        *,
        counters: Counters | None = None,
        idle_timeout: float,
        initial_a_to_b: bytes = b"",
        mode: Mode = "auto",
        poller: Poller | None = None,
        idle_checks: Deadlines[Flow] | None = None,
        scan: Callable[[bytes], str | None] | None = None,
        scan_keep: int = 0,
    ) -> None:
        """POLLER: where readiness is asked for (boxyd.net.poller; the loop's own
        add_reader and friends by default). IDLE_CHECKS: a queue of idle checks
        shared by flows of this idle timeout, its delay a quarter of it (one timer
        for all of them instead of one each). SCAN: what a→b sends is given to it, the
        last SCAN_KEEP bytes again with the next read; a name it returns ends the flow
        (``error`` a Placeholder) before those bytes are sent."""
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout!r}")
        if idle_checks is not None and idle_checks.delay != idle_tick(idle_timeout):
            raise ValueError(
                f"idle_checks: delay {idle_checks.delay!r} is not a quarter of the idle timeout"
            )
        if a.fileno() == b.fileno():
            raise ValueError("a flow needs two different sockets")
        self.a, self.b = a, b
        self.counters = counters if counters is not None else Counters()
        self.idle_timeout = idle_timeout
        self.reason: CloseReason | None = None
        self.error: OSError | None = None  # what ended a RESET_BY_* flow
        self.finished = False
        self._initial = bytes(initial_a_to_b)
        self._mode: Mode = mode
        self.scan, self.scan_keep = scan, scan_keep
        self.loop: asyncio.AbstractEventLoop | None = None
        self._poller = poller
        self._idle_checks = idle_checks
        self.ready: Readiness | None = None
        self._dirs: tuple[_Direction, _Direction] | None = None
        self._started = False
        self._on_done: Callable[[CloseReason], None] | None = None
        self._idle_handle: asyncio.TimerHandle | None = None
        self._idle_seen = -1
        self._idle_since = 0.0

    async def run(self) -> CloseReason:
        """Relay until both directions are done or the flow fails; returns why it ended."""
        if self._started:
            raise RuntimeError("Flow.run() may be awaited only once")
        future: asyncio.Future[CloseReason] = asyncio.get_running_loop().create_future()
        self.start(functools.partial(_settle, future))
        try:
            return await future
        except asyncio.CancelledError:
            self.abort()
            raise

    def start(self, on_done: Callable[[CloseReason], None]) -> None:
        """Relay from now on and call ON_DONE(reason) once, when the flow ends: the
        callback form of :meth:`run`, for a caller that keeps no task per flow. ON_DONE
        may be called before this returns (a flow aborted already, a peer gone)."""
        if self._started:
            raise RuntimeError("a Flow is started only once")
        self._started = True
        self._on_done = on_done
        if self._poller is not None:  # (its loop: asking asyncio costs a getpid())
            self.loop, self.ready = self._poller.loop, self._poller
        else:
            self.loop = asyncio.get_running_loop()
            self.ready = self.loop
        if self.finished:  # aborted before it started
            self._close_sockets(reset_them=True)
            self._done()
            return
        for s in (self.a, self.b):
            if s.gettimeout() != 0.0:  # (a syscall each, so only when not already)
                s.setblocking(False)
        ab = _Direction(self, self.a, self.b, True, self._mode, self._initial)
        ba = _Direction(self, self.b, self.a, False, self._mode, b"")
        self._dirs = (ab, ba)
        self._idle_since = self.loop.time()
        if self._idle_checks is not None:
            self._idle_checks.add(self)
        else:
            self._idle_handle = self.loop.call_later(self._idle_tick(), self._check_idle)
        ab.begin()
        ba.begin()

    def abort(self) -> None:
        """End the flow now with a reset on both sides (e.g. the session stopped)."""
        self._finish(CloseReason.ABORTED, reset_them=True)

    # -- endings -----------------------------------------------------------------

    def _idle_tick(self) -> float:
        return idle_tick(self.idle_timeout)

    def _check_idle(self) -> None:
        if self.finished:
            return
        assert self.loop is not None and self._dirs is not None
        now = self.loop.time()
        seen = self._dirs[0].moved + self._dirs[1].moved
        if seen != self._idle_seen:
            self._idle_seen = seen
            self._idle_since = now
        # (a timer may fire a hair early; do not let that cost a whole tick)
        elif now - self._idle_since >= self.idle_timeout - 0.001:
            self._finish(CloseReason.IDLE, reset_them=True)
            return
        if self._idle_checks is not None:  # a tick late at most, as said
            self._idle_checks.add(self)
            return
        due = min(now + self._idle_tick(), self._idle_since + self.idle_timeout)
        self._idle_handle = self.loop.call_at(due, self._check_idle)

    def _fail(self, sock: socket.socket, err: OSError) -> None:
        self.error = err
        reason = CloseReason.RESET_BY_A if sock is self.a else CloseReason.RESET_BY_B
        self._finish(reason, reset_them=True)

    def _direction_done(self) -> None:
        if self._dirs is not None and self._dirs[0].done and self._dirs[1].done:
            self._finish(CloseReason.DONE, reset_them=False)

    def _finish(self, reason: CloseReason, *, reset_them: bool) -> None:
        if self.finished:
            return
        self.finished = True
        self.reason = reason
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        if self._dirs is not None:
            for d in self._dirs:
                d.close()
        if not self._started:
            return  # start() closes the sockets when it is called
        self._close_sockets(reset_them)
        self._done()

    def _done(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done(self.reason)  # type: ignore[arg-type]

    def _close_sockets(self, reset_them: bool) -> None:
        for s in (self.a, self.b):
            if reset_them:
                reset(s)
            else:
                s.close()


def idle_tick(idle_timeout: float) -> float:
    """How often a flow checks for idleness. A few times per timeout bounds the
    overshoot to a quarter of it, at no cost per byte moved (the counters are only
    compared then)."""
    return max(idle_timeout / 4, 0.01)


def _settle(future: asyncio.Future[CloseReason], reason: CloseReason) -> None:
    if not future.done():  # (cancelled: run() is aborting the flow)
        future.set_result(reason)


async def pump(
    a: socket.socket,
    b: socket.socket,
    *,
    counters: Counters,
    idle_timeout: float,
    initial_a_to_b: bytes = b"",
    mode: Mode = "auto",
) -> CloseReason:
    """Relay between A and B until done (see :class:`Flow`); closes both sockets."""
    return await Flow(
        a, b, counters=counters, idle_timeout=idle_timeout, initial_a_to_b=initial_a_to_b, mode=mode
    ).run()
