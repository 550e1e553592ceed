"""The daemon's side of a session terminal: the master of a PTY whose slave lives in
the sandbox, relayed to the client's terminal fds, so no host terminal fd ever
enters the sandbox.

The pair is made by the sandbox's PID 1 in the sandbox's own devpts instance (so
ttyname() and /dev/tty work inside), with the client terminal's settings captured
here; the master comes back on a socket PID 1 was given, and is attached. Until then
nothing is relayed (keystrokes wait in the client's terminal).

Client side through threads, by choice. The client's fds share their open file
description with the user's shell, so O_NONBLOCK on them would leak into the shell
after we exit; and a blocking write to a flow-controlled terminal (Ctrl-S) can wait
forever. So each direction is a small thread doing blocking I/O on the client fd,
and the event loop never touches a client fd:

- output thread: poll(master) -> read -> write the whole chunk to out_fd. It
  holds at most one chunk, so a slow terminal back-pressures the master (the PTY
  buffer fills and the payload's writes block) instead of growing a buffer;
- input thread: poll(in_fd) -> read -> write to the master (non-blocking, waiting
  with poll when the payload is not reading its input).

The client can change while the session runs (detach with Ctrl-], `boxyctl
attach`): the output thread takes each new client fd from a hand-over slot, first
writes it the last RING bytes of output, and keeps those bytes, and the output log
of a detached session (bounded), itself. Each client's input has its own thread.

The output is filtered (termfilter) on its way to every client, unless the run
asked for --tty-raw (``raw``): what would set the clipboard or make the terminal
answer into the user's shell never reaches it. The ring and the output log keep
the filtered output (the log may be `cat`-ed to a terminal later), and a replay is
filtered again from a fresh state, since the ring's cut can fall inside a sequence.

Each thread owns its own dup of the master, its client fd and the read end of a
wake-up pipe, and closes them itself on exit, so close() never closes an fd under
a thread that still uses it (a reused fd number could otherwise receive the
payload's output). close() only closes the wake-up pipes' write ends. A thread
blocked in a write to a terminal stopped with Ctrl-S cannot be interrupted; it
ends when the terminal resumes or hangs up.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from boxy import termsettings
from boxyd.daemon.termfilter import Pace, TermFilter, filter_once

CHUNK = 64 * 1024
RING = 64 * 1024  # output replayed to a client that attaches (about a screenful, redrawn)
MAX_LOG = 64 << 20  # bytes of a detached session's output kept in its log file
DETACH_KEY = b"\x1d"  # Ctrl-]
# --ask: a key answers a question only after the terminal was quiet this long with the
# question on it; what is typed sooner (typed ahead, or mid-word when the payload,
# which sees each key, opened the question then) is dropped, and the wait starts again
ASK_GRACE = 1.0
# written before a question: whatever the payload left the terminal in (concealed or
# same-colour text, another charset, insert mode, no autowrap so a long name is cut,
# a double-width line), the question reads as boxyd wrote it
QUESTION_RESET = b"\x1b[0m\x0f\x1b(B\x1b[4l\x1b[?7h\x1b]110\x1b\\\x1b]111\x1b\\\r\n\x1b#5"
_WINSIZE = struct.Struct("HHHH")


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


class PtyRelay:
    """Relay between a PTY master (attached later) and the client's terminal.

    Takes ownership of IN_FD (the client's stdin, a tty) and OUT_FD (the client's
    first terminal fd for output), also when it raises; either may be None, and
    they may be the same fd. ValueError when neither is a terminal. ``settings``
    holds the client terminal's termios and window size for the sandbox's PTY, so
    create the relay before the client switches its terminal to raw mode.
    """

    def __init__(
        self, in_fd: int | None, out_fd: int | None, settings: dict[str, Any] | None = None
    ) -> None:
        """SETTINGS: for a relay with no client terminal (run -d): the PTY's own."""
        self._lock = threading.Lock()
        self._drained = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._wakes: list[int] = []  # write ends; closing one wakes its thread
        self._threads: list[threading.Thread] = []
        self._closed = False
        # cleared while the payload is stopped (^Z): the client's shell owns the terminal
        # then, and what is typed is the shell's, not the payload's
        self._input_open = threading.Event()
        self._input_open.set()
        self._nudge_r, self._nudge_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.master_fd: int | None = None
        self.raw = False  # --tty-raw: the output unfiltered (set before attach)
        self._pending_size: tuple[int, int] | None = None
        self._ring = bytearray()
        self._log_fd: int | None = None  # a detached session's output log (ours)
        self._logged = 0
        self.log_cut = False  # output past MAX_LOG was not kept in the log
        # the hand-over slot: the output fd of the next client, and its generation
        self._next_out: int | None = None
        self._out_gen = 0
        self._replay = False
        self._swap_r, self._swap_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._in_wake: int | None = None  # closing it ends the current input thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self.on_detach: Callable[[], None] | None = None  # Ctrl-] typed (on the loop)
        # --ask: a question on the client's terminal (ask()); its answer is the next key
        # typed, which never reaches the payload; what to say is written by the output
        # thread, which owns the client's output fd. From ask() until end_question() the
        # payload's output is held (the master is not read): nothing it writes can
        # redraw the question, or the line that says what came of it
        self._question: _Question | None = None
        self._holding = False
        self._to_say = bytearray()
        try:
            src = in_fd if in_fd is not None and os.isatty(in_fd) else out_fd
            if settings is not None and in_fd is None and out_fd is None:
                self.settings = settings
            elif src is None or not os.isatty(src):
                raise ValueError("PtyRelay needs a client fd that is a terminal")
            else:
                self.settings = termsettings.capture(src)
            # Separate fds per thread: each thread closes exactly what it owns.
            if in_fd is not None and out_fd == in_fd:
                out_fd = os.dup(out_fd)
        except BaseException:
            _close(in_fd)
            _close(out_fd)
            raise
        self._in_fd, self._out_fd = in_fd, out_fd

    def attach(self, master: int) -> None:
        """Start relaying through MASTER (the sandbox's PTY master; now ours)."""
        with self._lock:
            if self._closed or self.master_fd is not None:
                _close(master)
                return
            self.master_fd = master
        # O_NONBLOCK on our own master only (its description is ours alone).
        os.set_blocking(master, False)
        self._loop = asyncio.get_running_loop()
        if self._pending_size is not None:
            self.resize(*self._pending_size)
        out_fd, self._out_fd = self._out_fd, None
        in_fd, self._in_fd = self._in_fd, None
        with self._lock:  # the first client is in the slot before any output is read
            self._next_out, self._out_gen, self._replay = out_fd, self._out_gen + 1, False
        self._start(self._pump_output, None, name="pty-out")
        if in_fd is not None:
            self._in_wake = self._start(self._pump_input, in_fd, name="pty-in")

    def connect(self, in_fd: int | None, out_fd: int | None, *, replay: bool = True) -> None:
        """A (new) client: its output fd goes through the hand-over slot (REPLAY: the
        ring first), its input gets a thread of its own. Takes ownership of both."""
        if self.master_fd is None:  # not attached yet: the first client waits
            _close(self._in_fd)
            _close(self._out_fd)
            self._in_fd, self._out_fd = in_fd, out_fd
            return
        self._stop_input()
        with self._lock:  # one step: the output thread never sees a gap between clients
            _close(self._next_out)
            self._next_out, self._out_gen, self._replay = out_fd, self._out_gen + 1, replay
            if self._question is not None:  # an open question is said to the new client
                self._question.shown = None
                self._to_say += self._question.text
        self._swap()
        if in_fd is not None:
            self._in_wake = self._start(self._pump_input, in_fd, name="pty-in")

    def disconnect(self) -> None:
        """The client goes (detached): its input thread ends, its output fd is
        dropped by the output thread; the payload's output goes on into the ring."""
        with self._lock:
            _close(self._next_out)
            self._next_out, self._out_gen = None, self._out_gen + 1
        self._swap()
        self._stop_input()

    def _stop_input(self) -> None:
        """The current client's input thread ends (it closes its fd itself)."""
        if self._in_wake is not None:
            _close(self._in_wake)
            self._wakes.remove(self._in_wake)
            self._in_wake = None
        self._input_open.set()

    def log_to(self, fd: int) -> None:
        """Keep the output in FD (ours from now on), up to MAX_LOG bytes."""
        with self._lock:
            _close(self._log_fd)
            self._log_fd = fd

    def _swap(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._swap_w, b"!")

    @property
    def attached(self) -> bool:
        return self.master_fd is not None

    def _start(
        self, target: Callable[[int, int | None, int], None], client_fd: int | None, name: str
    ) -> int:
        """A thread on a dup of the master; returns the write end that ends it."""
        assert self.master_fd is not None
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
        master = os.dup(self.master_fd)
        self._wakes.append(wake_w)
        thread = threading.Thread(
            target=target, args=(master, client_fd, wake_r), name=name, daemon=True
        )
        self._threads.append(thread)
        thread.start()
        return wake_w

    # public API

    def pause_input(self) -> None:
        """Stop reading the client's terminal (the payload stopped; the user's shell
        has the terminal back and its input must not be taken)."""
        self._input_open.clear()
        self._nudge()

    def resume_input(self) -> None:
        self._input_open.set()
        self._nudge()

    def can_ask(self) -> bool:
        """A client with a terminal is here to answer (attached, reading its input)."""
        return self.master_fd is not None and self._in_wake is not None

    def ask(self, text: str, keys: dict[str, str]) -> asyncio.Future[str]:
        """Say TEXT on the client's terminal; the future is the value KEYS gives the
        first of its keys typed once the terminal was quiet ASK_GRACE with TEXT on it
        (case-insensitive; other keys are dropped, never the payload's). The payload's
        output is held until end_question(). One question at a time: ValueError while
        one is open, or with no client to answer (can_ask)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str] = loop.create_future()
        with self._lock:
            if self._holding or not self.can_ask():
                raise ValueError("the terminal cannot take a question now")
            said = QUESTION_RESET + text.encode()
            self._question = _Question({k.lower(): v for k, v in keys.items()}, fut, loop, said)
            self._holding = True
            self._to_say += said
        self._swap()
        return fut

    def end_question(self, said: str) -> None:
        """The question is over: SAID (when not empty) closes its line, an open one is
        left unanswered (a timeout), and the payload's output flows again."""
        with self._lock:
            q, self._question = self._question, None
            if said:
                self._to_say += (said + "\r\n").encode()
            self._holding = False
        self._swap()
        if q is not None and not q.fut.done():
            q.fut.cancel()

    def _answered(self, data: bytes) -> bool:
        """Input thread: DATA answers the open question (True: it was the question's,
        all of it, whether or not a key of it was typed)."""
        with self._lock:
            q = self._question
            if q is None:
                return False
            now = time.monotonic()
            if q.shown is None or now - q.shown < ASK_GRACE:  # before it could be read
                if q.shown is not None:
                    q.shown = now  # the quiet it needs starts again
                return True
            key = next((chr(b).lower() for b in data if chr(b).lower() in q.keys), None)
            if key is None:
                return True  # not an answer, and not the payload's either
            self._question = None
            self._to_say += (key + "\r\n").encode()
        self._swap()
        with contextlib.suppress(RuntimeError):  # that loop is gone
            q.loop.call_soon_threadsafe(_settle, q.fut, q.keys[key])
        return True

    def _said(self, out_fd: int | None, wake: int) -> None:
        """Output thread: what ask() and end_question() left to say, on OUT_FD."""
        with self._lock:
            text, self._to_say = bytes(self._to_say), bytearray()
            q = self._question
        if text and out_fd is not None:
            _write_all(out_fd, text, wake)
        if q is not None and out_fd is not None:
            with self._lock:
                if q.shown is None:  # on the terminal from now: ASK_GRACE counts from here
                    q.shown = time.monotonic()

    def _nudge(self) -> None:
        with contextlib.suppress(OSError):  # full: a nudge is pending anyway
            os.write(self._nudge_w, b"!")

    def resize(self, rows: int, cols: int) -> None:
        """Set the PTY's window size (the payload's foreground group gets SIGWINCH)."""
        if not (0 <= rows <= 0xFFFF and 0 <= cols <= 0xFFFF):
            raise ValueError(f"window size {rows}x{cols} out of range")
        if self.master_fd is None:
            self._pending_size = (rows, cols)
            return
        # On a master, TIOCSWINSZ sets the slave's size: the payload's group gets SIGWINCH.
        fcntl.ioctl(self.master_fd, termios.TIOCSWINSZ, _WINSIZE.pack(rows, cols, 0, 0))

    @property
    def drained(self) -> bool:
        return self._drained.is_set()

    async def wait_drained(self) -> None:
        """Wait until every byte the payload wrote is written to the client terminal
        (the master reported EOF/EIO, i.e. every slave holder is gone), or close()."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._drained.is_set():
                return
            self._waiters.append((loop, fut))
        await fut

    def close(self) -> None:
        """Stop relaying and release everything (threads close their own fds)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for fd in self._wakes:
            _close(fd)
        self._wakes = []
        for fd in (self._nudge_r, self._nudge_w, self._swap_w):
            _close(fd)
        _close(self._in_fd)  # never attached: the client fds are still ours
        _close(self._out_fd)
        self._in_fd = self._out_fd = None
        with self._lock:  # the output thread closes what it holds itself
            _close(self._next_out)
            self._next_out = None
            if self.master_fd is None:  # no output thread ever ran: ours to close
                _close(self._swap_r)
                _close(self._log_fd)
                self._log_fd = None
        master, self.master_fd = self.master_fd, None
        _close(master)
        # Nothing more will be relayed; don't make waiters depend on a thread that
        # may be stuck writing to a stopped terminal.
        self._set_drained()

    # threads

    def _set_drained(self) -> None:
        with self._lock:
            self._drained.set()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is gone
                loop.call_soon_threadsafe(_resolve, fut)

    def _take_client(self, gen: int, out_fd: int | None, wake: int) -> tuple[int, int | None]:
        """The hand-over: a newer client's output fd replaces OUT_FD (closed here),
        and gets the ring first when it asked for a replay."""
        with self._lock:
            if gen == self._out_gen:
                return gen, out_fd
            gen, new, self._next_out = self._out_gen, self._next_out, None
            replay = bytes(self._ring) if self._replay else b""
        if not self.raw:
            replay = filter_once(replay)  # the ring's cut may fall inside a sequence
        _close(out_fd)
        if new is not None and replay and not _write_all(new, replay, wake):
            _close(new)
            new = None
        return gen, new

    def _keep(self, data: bytes) -> None:
        """The ring, and the log of a detached session (bounded)."""
        with self._lock:
            self._ring += data
            del self._ring[:-RING]
            log = self._log_fd
            room = MAX_LOG - self._logged
        if log is not None and room > 0:
            with contextlib.suppress(OSError):
                self._logged += os.write(log, data[:room])
        if log is not None and len(data) > room:
            self.log_cut = True  # said with the outcome (sandbox.finish)

    def _pump_output(self, master: int, _unused: int | None, wake: int) -> None:
        """PTY master -> the client of the moment, until the slave side is gone
        (EIO/EOF). Without a client the output still drains (the payload never
        blocks on a full PTY) into the ring and the log."""
        gen, out_fd = -1, None
        screen = None if self.raw else TermFilter()
        pace = Pace(time.monotonic())
        held = True
        try:
            poller = select.poll()
            poller.register(wake, select.POLLIN)
            poller.register(self._swap_r, select.POLLIN)
            while True:
                held = self._hold(poller, master, held)
                events = dict(poller.poll())
                if wake in events:
                    return
                if self._swap_r in events:
                    with contextlib.suppress(OSError):
                        os.read(self._swap_r, 64)
                gen, out_fd = self._take_client(gen, out_fd, wake)
                self._said(out_fd, wake)
                if master not in events or self._holding:  # (a question said just now)
                    continue
                try:
                    data = os.read(master, CHUNK)
                except BlockingIOError:
                    continue
                except OSError as e:
                    if e.errno == errno.EIO:  # every slave fd is closed
                        return
                    raise
                if not data:
                    return
                if screen is not None:
                    start = time.thread_time()
                    data = screen.feed(data)
                    wait = pace.spent(time.thread_time() - start, time.monotonic())
                    if wait > 0 and _paced(wake, wait):
                        return  # closed while it waited
                    if not data:  # all of it dropped, or the start of a sequence held
                        continue
                self._keep(data)
                if out_fd is not None and not _write_all(out_fd, data, wake):
                    # The client terminal is gone: keep draining, but discard.
                    _close(out_fd)
                    out_fd = None
        finally:
            _close(master)
            _close(out_fd)
            _close(wake)
            with self._lock:
                _close(self._swap_r)
                _close(self._log_fd)
                self._log_fd = None
            self._set_drained()

    def _hold(self, poller: select.poll, master: int, held: bool) -> bool:
        """Output thread: the master read (POLLER asked of it) only while no question
        is open; returns whether it is held now (HELD: it was)."""
        if held != self._holding:  # a question opened or ended: stop or go on reading
            held = not held
            if held:
                poller.unregister(master)
            else:
                poller.register(master, select.POLLIN)
        return held

    def _detach_requested(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # that loop is gone
                self._loop.call_soon_threadsafe(_call, self.on_detach)

    def _pump_input(self, master: int, in_fd: int | None, wake: int) -> None:
        """Client terminal -> PTY master until either side is gone or close()."""
        assert in_fd is not None  # an input thread is only started for a client's input
        try:
            detachable = os.isatty(in_fd) and self.on_detach is not None
            poller = select.poll()
            poller.register(wake, select.POLLIN)
            poller.register(self._nudge_r, select.POLLIN)
            reading = False
            while True:
                if self._input_open.is_set() != reading:  # paused or resumed
                    reading = not reading
                    if reading:
                        poller.register(in_fd, select.POLLIN)
                    else:
                        poller.unregister(in_fd)
                events = dict(poller.poll())
                if wake in events:
                    return
                if self._nudge_r in events:
                    with contextlib.suppress(OSError):
                        os.read(self._nudge_r, 64)
                    continue
                try:
                    data = os.read(in_fd, CHUNK)
                except BlockingIOError:  # the fd was already non-blocking; keep it so
                    continue
                except OSError:  # EIO: the client's terminal hung up
                    return
                if data and self._answered(data):
                    continue
                typed, key, _ = data.partition(DETACH_KEY) if detachable else (data, b"", b"")
                if typed and not _write_all(master, typed, wake):
                    return
                if key:  # Ctrl-]: the client leaves, the session goes on
                    self._detach_requested()
                    return
                if not data:
                    return
        finally:
            _close(master)
            _close(in_fd)
            _close(wake)


class _Question:
    __slots__ = ("keys", "fut", "loop", "text", "shown")

    def __init__(
        self,
        keys: dict[str, str],
        fut: asyncio.Future[str],
        loop: asyncio.AbstractEventLoop,
        text: bytes,
    ) -> None:
        self.keys, self.fut, self.loop, self.text = keys, fut, loop, text
        # when the terminal last had it unanswered with nothing typed (None: not yet said)
        self.shown: float | None = None


def _settle(fut: asyncio.Future[str], value: str) -> None:
    if not fut.done():
        fut.set_result(value)


def _paced(wake: int, seconds: float) -> bool:
    """Wait SECONDS (the filter's pace) unless WAKE is readable first: True then."""
    poller = select.poll()  # not select(): boxyd's fds may be past FD_SETSIZE
    poller.register(wake, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


def _call(fn: Callable[[], None] | None) -> None:
    if fn is not None:
        fn()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _write_all(fd: int, data: bytes, wake: int) -> bool:
    """Write all of DATA to FD, blocking if FD is blocking and waiting with poll when
    it is not. False when FD failed or the relay was closed."""
    view = memoryview(data)
    poller: select.poll | None = None
    while view:
        try:
            view = view[os.write(fd, view) :]
            continue
        except BlockingIOError:
            pass
        except OSError:
            return False
        if poller is None:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.register(wake, select.POLLIN)
        events = dict(poller.poll())
        if wake in events:
            return False
        if events.get(fd, 0) & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
            return False
    return True
