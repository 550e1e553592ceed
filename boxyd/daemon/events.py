"""A bounded event fan-out: one publisher (a session, the manager), any number of
watchers, each with its own queue.

Publishing never waits and never fails: a watcher whose queue is full loses the
event, and is told how many it lost (a "lost" event, where the gap was). So
nothing a watcher does — reading slowly, never reading — can slow the publisher
or another watcher; a watcher costs at most BOUND queued events.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from typing import Any

BOUND = 1024  # events queued per watcher before it starts losing them
LOST = "lost"


@dataclass(frozen=True)
class Event:
    kind: str  # started, notice, stopped, audit, state, exited, lost, session-new …
    fields: dict[str, Any] = field(default_factory=dict)
    t: float = field(default_factory=time.time)


class Subscription:
    """One watcher's queue. Iterate it (`async for event in sub`) until the
    publisher closes; `close()` ends the watching early."""

    def __init__(self, fanout: Fanout, kinds: Collection[str] | None, bound: int) -> None:
        self._fanout = fanout
        self.kinds = frozenset(kinds) if kinds is not None else None
        self._bound = bound
        self._queue: deque[Event] = deque()
        self._wake = asyncio.Event()
        self._lost = 0  # lost since the last event queued
        self.lost_total = 0
        self.closed = False

    def _offer(self, event: Event) -> None:
        if self.kinds is not None and event.kind not in self.kinds:
            return
        if len(self._queue) >= self._bound:
            self._lost += 1
            self.lost_total += 1
            return
        if self._lost:  # where the gap was: told in order, before what came after it
            self._queue.append(Event(LOST, {"count": self._lost}))
            self._lost = 0
        self._queue.append(event)
        self._wake.set()

    def _end(self) -> None:
        self.closed = True
        self._wake.set()

    def close(self) -> None:
        self._fanout._drop(self)
        self._end()
        self._queue.clear()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while True:
            if self._queue:
                yield self._queue.popleft()
            elif self._lost:  # lost at the very end
                n, self._lost = self._lost, 0
                yield Event(LOST, {"count": n})
            elif self.closed:
                return
            else:
                self._wake.clear()
                await self._wake.wait()


class Fanout:
    def __init__(self, bound: int = BOUND) -> None:
        self._bound = bound
        self._subs: list[Subscription] = []
        self.closed = False

    def subscribe(self, kinds: Collection[str] | None = None) -> Subscription:
        """A new watcher of KINDS (every kind when None). Subscribing to a closed
        fan-out gives a subscription that ends at once."""
        sub = Subscription(self, kinds, self._bound)
        if self.closed:
            sub._end()
        else:
            self._subs.append(sub)
        return sub

    def publish(self, kind: str, **fields: Any) -> None:
        if self.closed or not self._subs:
            return
        event = Event(kind, fields)
        for sub in self._subs:
            sub._offer(event)

    def close(self) -> None:
        """The end of the stream: every watcher drains what it has, then stops."""
        self.closed = True
        for sub in self._subs:
            sub._end()
        self._subs = []

    def _drop(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def wants(self, kind: str) -> bool:
        """Would anyone receive KIND (worth computing a snapshot for)?"""
        return any(sub.kinds is None or kind in sub.kinds for sub in self._subs)

    @property
    def watchers(self) -> int:
        return len(self._subs)
