"""boxyd/net/poller.py over real sockets and the real event loop: the gateway's own
epoll set (readiness as asyncio gives it, one epoll_ctl per change) and its
deadline queues (one timer per length)."""

from __future__ import annotations

import asyncio
import functools
import gc
import socket
import time

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


async def test_deadlines_come_in_order_after_their_delay() -> None:
    loop = asyncio.get_running_loop()
    due: list[tuple[str, float]] = []
    t0 = time.monotonic()
    queue: Deadlines[Owner] = Deadlines(
        loop, 0.05, lambda o: due.append((o.name, time.monotonic() - t0))
    )
    owners = [Owner("a"), Owner("b")]
    queue.add(owners[0])
    await asyncio.sleep(0.02)
    queue.add(owners[1])
    await asyncio.sleep(0.15)
    assert [n for n, _ in due] == ["a", "b"]
    assert 0.049 <= due[0][1] < 0.15 and 0.069 <= due[1][1] < 0.2
    queue.close()


async def test_deadlines_hold_their_owners_weakly_and_close_cancels() -> None:
    loop = asyncio.get_running_loop()
    due: list[str] = []
    queue: Deadlines[Owner] = Deadlines(loop, 0.02, lambda o: due.append(o.name))
    queue.add(Owner("gone"))  # nothing else holds it
    gc.collect()
    kept = Owner("kept")
    queue.add(kept)
    await asyncio.sleep(0.08)
    assert due == ["kept"]
    queue.add(kept)
    queue.close()
    await asyncio.sleep(0.05)
    assert due == ["kept"], "closed: nothing more is called"


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

        async def run() -> tuple[list[str], list[str]]:
            due: list[str] = []
            queue: Deadlines[Owner] = Deadlines(loop, 0.2, lambda o: due.append(o.name))
            owner = Owner("x")
            queue.add(owner)
            await _turns(20)
            early = list(due)
            await asyncio.sleep(0.3)
            queue.close()
            return early, due

        early, due = loop.run_until_complete(run())
        assert early == [], "not due before its delay"
        assert due == ["x"]
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
