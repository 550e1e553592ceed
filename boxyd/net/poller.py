"""Readiness of many sockets through one epoll set of the gateway's own, and
deadlines of one length through one timer.

The set's fd is registered once with the event loop; adding or dropping interest in
a socket is then one ``epoll_ctl``, without asyncio's per-call handle, debug checks
and selector bookkeeping (about five times cheaper per call, and a TCP flow makes
six such calls). Callbacks run from the loop's thread, as asyncio's would.

Level-triggered, like asyncio's: a callback that leaves bytes unread is called
again. An fd dropped during a batch of events is not called back again in that
batch, so a socket closed and its number reused by a new one within one batch never
receives the old socket's readiness.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import select
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_BATCH = 256  # events taken per wake-up: the loop's other callbacks get their turn

Callback = Callable[[], object]
T = TypeVar("T")


class Poller:
    """add_reader/remove_reader/add_writer/remove_writer, as on an asyncio loop
    (without the extra arguments); ``close`` leaves the loop as it was."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._ep = select.epoll()
        self._readers: dict[int, Callback] = {}
        self._writers: dict[int, Callback] = {}
        self._masks: dict[int, int] = {}
        self._dropped: set[int] = set()  # fds dropped during the current batch
        loop.add_reader(self._ep.fileno(), self._ready)

    def close(self) -> None:
        if self._ep.closed:
            return
        self.loop.remove_reader(self._ep.fileno())
        self._ep.close()
        self._readers.clear()
        self._writers.clear()
        self._masks.clear()

    def __len__(self) -> int:
        """How many fds have interest registered."""
        return len(self._masks)

    def add_reader(self, fd: int, callback: Callback) -> None:
        self._readers[fd] = callback
        self._want(fd, self._masks.get(fd, 0) | _IN)

    def remove_reader(self, fd: int) -> bool:
        if self._readers.pop(fd, None) is None:
            return False
        self._want(fd, self._masks.get(fd, 0) & ~_IN)
        return True

    def add_writer(self, fd: int, callback: Callback) -> None:
        self._writers[fd] = callback
        self._want(fd, self._masks.get(fd, 0) | _OUT)

    def remove_writer(self, fd: int) -> bool:
        if self._writers.pop(fd, None) is None:
            return False
        self._want(fd, self._masks.get(fd, 0) & ~_OUT)
        return True

    def _want(self, fd: int, mask: int) -> None:
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if not mask:
            del self._masks[fd]
            self._dropped.add(fd)
            try:
                self._ep.unregister(fd)
            except OSError as e:  # closed already: the kernel dropped it itself
                if e.errno not in (errno.EBADF, errno.ENOENT):
                    raise
            return
        self._masks[fd] = mask
        if old:
            try:
                self._ep.modify(fd, mask)
                return
            except FileNotFoundError:  # closed and reused without a remove: start anew
                pass
        try:
            self._ep.register(fd, mask)
        except FileExistsError:  # reused fd the kernel still holds (a dup lives on)
            self._ep.modify(fd, mask)

    def _ready(self) -> None:
        try:
            events = self._ep.poll(0, _BATCH)
        except InterruptedError:
            return
        dropped = self._dropped
        dropped.clear()
        readers, writers = self._readers, self._writers
        # (the calls inline, not through a helper: a wake-up of a bulk flow or a new
        # connection is a few callbacks, and a try costs nothing until it raises)
        for fd, mask in events:
            # EPOLLERR and EPOLLHUP wake both sides, as in selectors.EpollSelector
            if mask & ~_OUT and fd not in dropped:
                cb = readers.get(fd)
                if cb is not None:
                    try:
                        cb()
                    except Exception as e:
                        self._failed(cb, e)
            if mask & ~_IN and fd not in dropped:
                cb = writers.get(fd)
                if cb is not None:
                    try:
                        cb()
                    except Exception as e:
                        self._failed(cb, e)

    def _failed(self, cb: Callback, e: Exception) -> None:
        """As asyncio does: said, and the other callbacks still run."""
        self.loop.call_exception_handler(
            {"message": f"Exception in poller callback {cb!r}", "exception": e}
        )


def clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """LOOP's time(), as a function: time.monotonic itself where the loop's is the
    stdlib's (which is only that), so that asking costs no Python call."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class Deadlines(Generic[T]):
    """Owners called back DELAY seconds after they were added, in the order they
    were: one loop timer for the earliest, not one per entry (a TCP flow sets two,
    and most are never due). Entries hold their owner weakly and cannot be
    cancelled: ON_DUE(owner) is called for every owner still alive at its time, and
    it checks whether the deadline still matters."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, delay: float, on_due: Callable[[T], object]
    ) -> None:
        self.loop, self.delay, self.on_due = loop, delay, on_due
        self._now = clock(loop)
        self._queue: collections.deque[tuple[float, weakref.ref[T]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, owner: T) -> None:
        due = self._now() + self.delay
        self._queue.append((due, weakref.ref(owner)))
        if self._timer is None:
            self._timer = self.loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer = None
        queue, now = self._queue, self._now()
        # (a timer may fire a hair early: what is due within a millisecond is taken)
        while queue and queue[0][0] <= now + 0.001:
            owner = queue.popleft()[1]()
            if owner is not None:
                try:
                    self.on_due(owner)
                except Exception as e:
                    self.loop.call_exception_handler(
                        {
                            "message": f"Exception in deadline callback {self.on_due!r}",
                            "exception": e,
                        }
                    )
        if queue:
            self._timer = self.loop.call_at(queue[0][0], self._fire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()
