"""boxyd/net/poller.py over real sockets and the real event loop: the gateway's own
epoll set (readiness as asyncio gives it, one epoll_ctl per change) and its
deadline queues (one timer per length)."""

from __future__ import annotations

import asyncio
import functools
import gc
import socket
import time
from collections.abc import Callable
from typing import cast

from boxyd.net.poller import Deadlines, Poller, clock


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _loop_registrations(loop: asyncio.AbstractEventLoop) -> int:
    selector = getattr(loop, "_selector", None)
    assert selector is not None, "test needs the selector event loop"
    return len(selector.get_map())


async def test_reader_is_level_triggered_and_removal_stops_it() -> None:
    loop = asyncio.get_running_loop()
    poller = Poller(loop)
    a, b = socket.socketpair()
    try:
        calls: list[int] = []
        poller.add_reader(a.fileno(), lambda: calls.append(1))
        await _turns()
        assert calls == [], "nothing to read: no call"
        b.send(b"x")
        await _turns(3)
        assert len(calls) >= 2, "bytes left unread: called again (level-triggered)"
        assert poller.remove_reader(a.fileno()) is True
        assert poller.remove_reader(a.fileno()) is False
        n = len(calls)
        await _turns()
        assert len(calls) == n
        assert len(poller) == 0
    finally:
        poller.close()
        a.close()
        b.close()


async def test_writer_sees_a_connect_complete_and_both_sides_share_one_fd() -> None:
    loop = asyncio.get_running_loop()
    poller = Poller(loop)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            c.connect_ex(listener.getsockname())
            done: asyncio.Future[None] = loop.create_future()

            def connected() -> None:
                if not done.done():
                    done.set_result(None)

            poller.add_writer(c.fileno(), connected)
            poller.add_reader(c.fileno(), lambda: None)
            await asyncio.wait_for(done, 5)
            assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            assert len(poller) == 1, "reader and writer of one fd: one registration"
            poller.remove_writer(c.fileno())
            poller.remove_reader(c.fileno())
            assert len(poller) == 0
        finally:
            poller.close()
            c.close()


async def test_an_fd_dropped_in_a_batch_is_not_called_for_its_old_readiness() -> None:
    """Two readable sockets; whichever callback runs first closes the other and
    reuses its fd number for a quiet socket: the stale event of the batch must not
    reach the new socket's callback."""
    loop = asyncio.get_running_loop()
    poller = Poller(loop)
    pairs = [socket.socketpair(), socket.socketpair()]
    fresh: list[socket.socket] = []
    spurious: list[int] = []

    def swap(me: int) -> None:
        other = pairs[1 - me][0]
        if other.fileno() < 0 or fresh:
            pairs[me][0].recv(10)
            return
        fd = other.fileno()
        poller.remove_reader(fd)
        other.close()
        x, y = socket.socketpair()
        fresh.extend((x, y))
        new = x if x.fileno() == fd else y
        assert new.fileno() == fd, "the kernel reuses the lowest free number"
        poller.add_reader(fd, lambda: spurious.append(fd))

    try:
        for i, (a, b) in enumerate(pairs):
            b.send(b"x")
            poller.add_reader(a.fileno(), functools.partial(swap, i))
        await _turns()
        assert fresh, "one callback ran"
        assert spurious == []
    finally:
        poller.close()
        for s in [s for p in pairs for s in p] + fresh:
            s.close()


async def test_a_failing_callback_does_not_stop_the_others() -> None:
    loop = asyncio.get_running_loop()
    seen: list[object] = []
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx.get("exception")))
    poller = Poller(loop)
    pairs = [socket.socketpair(), socket.socketpair()]
    called: list[int] = []

    def boom() -> None:
        pairs[0][0].recv(10)
        raise RuntimeError("boom")

    def fine() -> None:
        pairs[1][0].recv(10)
        called.append(1)

    try:
        poller.add_reader(pairs[0][0].fileno(), boom)
        poller.add_reader(pairs[1][0].fileno(), fine)
        for _, b in pairs:
            b.send(b"x")
        await _turns()
        assert called == [1]
        assert len(seen) == 1 and isinstance(seen[0], RuntimeError)
    finally:
        loop.set_exception_handler(None)
        poller.close()
        for s in [s for p in pairs for s in p]:
            s.close()


async def test_close_leaves_the_loop_as_it_was() -> None:
    loop = asyncio.get_running_loop()
    before = _loop_registrations(loop)
    poller = Poller(loop)
    assert _loop_registrations(loop) == before + 1
    a, b = socket.socketpair()
    poller.add_reader(a.fileno(), lambda: None)
    poller.close()
    poller.close()  # twice is fine
    assert _loop_registrations(loop) == before
    a.close()
    b.close()


class Owner:
    def __init__(self, name: str) -> None:
        self.name = name


class _Timer:
    """The one thing Deadlines does with its loop timer: cancel it."""

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _ManualLoop:
    """What Deadlines uses of a loop, on a clock the test moves: a deadline's time
    is checked exactly, not against how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> _Timer:
        timer = _Timer(when, callback)
        self.timers.append(timer)
        return timer

    def call_exception_handler(self, context: dict[str, object]) -> None:
        raise AssertionError(context)

    def pending(self) -> list[_Timer]:
        return [t for t in self.timers if not t.cancelled]

    def advance(self, to: float) -> None:
        """Move the clock to TO, running each timer due by then at its own time."""
        while due := [t for t in self.pending() if t.when <= to]:
            first = min(due, key=lambda t: t.when)
            self.timers.remove(first)
            self.now = first.when
            first.callback()
        self.now = to


def _manual_deadlines(delay: float, due: list[str]) -> tuple[_ManualLoop, Deadlines[Owner]]:
    loop = _ManualLoop()
    fake = cast(asyncio.AbstractEventLoop, loop)
    return loop, Deadlines(fake, delay, lambda o: due.append(f"{o.name}@{loop.now:g}"))


def test_deadlines_come_in_order_after_their_delay() -> None:
    due: list[str] = []
    loop, queue = _manual_deadlines(0.05, due)
    owners = [Owner("a"), Owner("b")]
    queue.add(owners[0])
    loop.advance(0.02)
    queue.add(owners[1])
    loop.advance(0.0499)
    assert due == [], "not due before its delay"
    loop.advance(0.0699)
    assert due == ["a@0.05"]
    loop.advance(1.0)
    assert due == ["a@0.05", "b@0.07"], "each at its own time: the timer is re-armed for b"
    assert loop.pending() == [], "nothing left to fire"
    queue.close()


async def test_deadlines_on_the_real_loop() -> None:
    """The same on asyncio's own loop and clock (time.monotonic read directly)."""
    loop = asyncio.get_running_loop()
    due: list[tuple[str, float]] = []
    both = asyncio.Event()

    def on_due(o: Owner) -> None:
        due.append((o.name, loop.time()))
        if len(due) == 2:
            both.set()

    queue = Deadlines(loop, 0.05, on_due)
    owners = [Owner("a"), Owner("b")]
    added = [loop.time()]
    queue.add(owners[0])
    await asyncio.sleep(0.02)
    added.append(loop.time())
    queue.add(owners[1])
    await asyncio.wait_for(both.wait(), 30)  # a timer never armed: fails, not hangs
    assert [n for n, _ in due] == ["a", "b"]
    assert all(t >= a + 0.049 for (_, t), a in zip(due, added, strict=True)), (due, added)
    queue.close()


def test_deadlines_hold_their_owners_weakly_and_close_cancels() -> None:
    due: list[str] = []
    loop, queue = _manual_deadlines(0.02, due)
    queue.add(Owner("gone"))  # nothing else holds it
    gc.collect()
    kept = Owner("kept")
    queue.add(kept)
    loop.advance(1.0)
    assert due == ["kept@0.02"]
    queue.add(kept)
    queue.close()
    loop.advance(2.0)
    assert due == ["kept@0.02"], "closed: nothing more is called"


class _LaterLoop(asyncio.SelectorEventLoop):
    """A loop whose clock is its own: an hour ahead of time.monotonic()."""

    def time(self) -> float:
        return time.monotonic() + 3600.0


def test_deadlines_keep_to_a_loop_clock_of_its_own() -> None:
    """Deadlines read time.monotonic() directly only where the loop's time() is
    the stdlib's; on a loop with a clock of its own, a deadline taken from the wrong
    clock would be an hour overdue and come at once."""
    assert clock(asyncio.new_event_loop()) is time.monotonic
    loop = _LaterLoop()
    try:
        assert clock(loop) == loop.time

        async def run() -> tuple[float, float]:
            fired = asyncio.Event()
            at: list[float] = []

            def due(_: Owner) -> None:
                at.append(loop.time())
                fired.set()

            queue: Deadlines[Owner] = Deadlines(loop, 0.2, due)
            owner = Owner("x")
            added = loop.time()
            queue.add(owner)
            await asyncio.wait_for(fired.wait(), 30)
            queue.close()
            return added, at[0]

        added, at = loop.run_until_complete(run())
        assert at >= added + 0.199, "not due before its delay on the loop's own clock"
    finally:
        loop.close()


async def test_many_registrations_cost_one_loop_registration() -> None:
    loop = asyncio.get_running_loop()
    before = _loop_registrations(loop)
    poller = Poller(loop)
    pairs = [socket.socketpair() for _ in range(100)]
    try:
        for a, _ in pairs:
            poller.add_reader(a.fileno(), lambda: None)
        assert _loop_registrations(loop) == before + 1
        assert len(poller) == len(pairs)
    finally:
        poller.close()
        for s in [s for p in pairs for s in p]:
            s.close()
