"""The core's events, typed, and a bounded fan-out: one publisher (a session, the
manager), any number of watchers, each with its own queue.

Every event is a frozen dataclass of the unions below (SessionEvent, ManagerEvent):
an adapter tells them apart by type (`match`), never by a string or by probing
its fields. KIND is the name the wire gives each one, and to_wire the one encoding both
wires carry (varlink's Watch, D-Bus's Event signal).

Publishing never waits and never fails: a watcher whose queue is full loses the
event, and is told how many it lost (a Lost event, where the gap was). So
nothing a watcher does — reading slowly, never reading — can slow the publisher
or another watcher; a watcher costs at most BOUND queued events.

An adapter renders an event for its wire once, however many watchers send it
(Event.memo): the publisher only queues references, each watcher's task renders
lazily, in batches (Subscription.ready, pop).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Self, TypeVar

from boxy.outcome import Counters, Destination, Outcome, State

BOUND = 1024  # events queued per watcher before it starts losing them


T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    """What every event has: when it happened."""

    kind: ClassVar[str] = ""
    t: float = field(default_factory=time.time, kw_only=True)

    def memo(self, key: str, make: Callable[[Self], T]) -> T:
        """MAKE(self), made once per KEY however many watchers ask: an adapter's wire
        form of the event, encoded once and shared by every watcher sending it. KEY
        is no identifier (say "varlink.watch"): it shares the instance's __dict__ with
        the fields, not being one (frozen, never compared)."""
        made: T | None = self.__dict__.get(key)
        if made is None:
            made = self.__dict__[key] = make(self)
        return made

    def to_wire(self) -> dict[str, Any]:
        """The one encoding both wires carry: {kind, t, ...its fields as plain JSON
        values} (varlink: the IDL's Event type; D-Bus: the Event signal's fields)."""
        return {"kind": self.kind, "t": round(self.t, 3), **self.fields()}

    def fields(self) -> dict[str, Any]:
        return {}  # detached, attached: nothing besides


@dataclass(frozen=True)
class Lost(Event):
    """This watcher fell behind and lost COUNT events here."""

    kind: ClassVar[str] = "lost"
    count: int

    def fields(self) -> dict[str, Any]:
        return {"count": self.count}


# -- a session's ----------------------------------------------------------------------
@dataclass(frozen=True)
class StateChanged(Event):
    kind: ClassVar[str] = "state"
    state: State

    def fields(self) -> dict[str, Any]:
        return {"state": self.state.value}


@dataclass(frozen=True)
class RunStarted(Event):
    """The payload runs; WARNINGS were said before it did."""

    kind: ClassVar[str] = "started"
    warnings: list[str]

    def fields(self) -> dict[str, Any]:
        return {"warnings": self.warnings}


@dataclass(frozen=True)
class Noticed(Event):
    """One line for the attached client now (-v: a denial as it happens)."""

    kind: ClassVar[str] = "notice"
    text: str

    def fields(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True)
class PayloadStopped(Event):
    """The payload stopped (^Z) with SIGNAL: an attached client stops too."""

    kind: ClassVar[str] = "stopped"
    signal: int

    def fields(self) -> dict[str, Any]:
        return {"signal": self.signal}


@dataclass(frozen=True)
class Audited(Event):
    """One audit record (its fields are plain JSON values)."""

    kind: ClassVar[str] = "audit"
    record: dict[str, Any]

    def fields(self) -> dict[str, Any]:
        return {"record": self.record}


@dataclass(frozen=True)
class CountersTick(Event):
    """Once a second while it runs: the totals and the busiest destinations
    ([name, conns, denied, sent, received] each)."""

    kind: ClassVar[str] = "counters"
    counters: Counters
    destinations: list[Destination]

    def fields(self) -> dict[str, Any]:
        return {
            "counters": self.counters.to_wire(),
            "destinations": [d.to_wire() for d in self.destinations],
        }


@dataclass(frozen=True)
class ClientDetached(Event):
    kind: ClassVar[str] = "detached"


@dataclass(frozen=True)
class ClientAttached(Event):
    kind: ClassVar[str] = "attached"


@dataclass(frozen=True)
class Exited(Event):
    """The last event of a session: how it ended (its record is written)."""

    kind: ClassVar[str] = "exited"
    outcome: Outcome

    def fields(self) -> dict[str, Any]:
        return {"outcome": self.outcome.to_wire()}


SessionEvent = (
    StateChanged
    | RunStarted
    | Noticed
    | PayloadStopped
    | Audited
    | CountersTick
    | ClientDetached
    | ClientAttached
    | Exited
    | Lost
)


# -- the manager's ----------------------------------------------------------------------
@dataclass(frozen=True)
class SessionNew(Event):
    kind: ClassVar[str] = "session-new"
    id: str


@dataclass(frozen=True)
class SessionEnded(Event):
    kind: ClassVar[str] = "session-ended"
    id: str


@dataclass(frozen=True)
class SessionRemoved(Event):
    """Forgotten by the daemon (its record remains)."""

    kind: ClassVar[str] = "session-removed"
    id: str


ManagerEvent = SessionNew | SessionEnded | SessionRemoved | Lost

E = TypeVar("E", bound=Event)


class Subscription(Generic[E]):
    """One watcher's queue. Iterate it (`async for event in sub`) until the
    publisher closes; `close()` ends the watching early. A Lost event may come
    between any two (E's unions include it)."""

    def __init__(
        self, fanout: Fanout[E], kinds: tuple[type[Event], ...] | None, bound: int
    ) -> None:
        self._fanout = fanout
        self.kinds = kinds
        self._bound = bound
        self._queue: deque[E | Lost] = deque()
        self._wake = asyncio.Event()
        self._asleep = False  # waiting on _wake
        self._lost = 0  # lost since the last event queued
        self._lost_before = 0  # lost in all, but for those while parked
        # Fanout.published when the queue was found full, or -1: a watcher of every
        # kind is then parked, offered nothing until it pops (what was published
        # meanwhile is what it lost), so a flood it is losing costs the publisher
        # no work per watcher
        self._parked = -1
        self._enough: asyncio.Event | None = None  # set once _gather are queued
        self._gather = 0
        self.closed = False

    @property
    def lost_total(self) -> int:
        parked = self._fanout.published - self._parked if self._parked >= 0 else 0
        return self._lost_before + parked

    def _offer(self, event: E) -> None:
        if self.kinds is not None and not isinstance(event, self.kinds):
            return
        if len(self._queue) >= self._bound:
            self._lose()
        else:
            self._put(event)

    def _lose(self) -> None:
        """The event being published found the queue full."""
        if self.kinds is None:
            self._parked = self._fanout.published - 1  # counting this one
            self._fanout._parking = True
        else:  # a watcher of some kinds counts its own: not every event was one
            self._lost += 1
            self._lost_before += 1

    def _unpark(self) -> None:
        n = self._fanout.published - self._parked
        self._lost += n
        self._lost_before += n
        self._parked = -1
        self._fanout._reopen(self)

    def _put(self, event: E) -> None:
        if self._lost:  # where the gap was: told in order, before what came after it
            self._queue.append(Lost(self._lost))
            self._lost = 0
        self._queue.append(event)
        if self._asleep:  # Event.set is a call per event for ten watchers: only if needed
            self._wake.set()
        if self._enough is not None and len(self._queue) >= self._gather:
            self._enough.set()

    def _end(self) -> None:
        self.closed = True
        self._wake.set()
        if self._enough is not None:
            self._enough.set()

    def close(self) -> None:
        self._fanout._drop(self)
        self._end()
        self._queue.clear()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def __aiter__(self) -> AsyncIterator[E | Lost]:
        return self._events()

    async def _events(self) -> AsyncIterator[E | Lost]:
        while await self.ready():
            event = self.pop()
            assert event is not None
            yield event

    async def ready(self) -> bool:
        """Wait until an event is there to pop (True), or the stream has ended with
        nothing left (False). A watcher then pops all it can send in one write."""
        while not (self._queue or self._lost):
            if self.closed:
                return False
            self._wake.clear()
            self._asleep = True
            try:
                await self._wake.wait()
            finally:
                self._asleep = False
        return True

    async def gather(self, n: int, timeout: float) -> None:
        """Wait until N events are queued, or the stream ends, for TIMEOUT seconds at
        most: a watcher writing a trickle in batches, and a burst at once."""
        if len(self._queue) >= n or self.closed:
            return
        enough = self._enough = asyncio.Event()
        self._gather = n
        timer = asyncio.get_running_loop().call_later(timeout, enough.set)
        try:
            await enough.wait()
        finally:
            timer.cancel()
            self._enough = None

    def pop(self) -> E | Lost | None:
        """The next event without waiting; None when none is there."""
        if self._queue:
            if self._parked >= 0:  # room again: offered events from here on
                self._unpark()
            return self._queue.popleft()
        if self._lost:  # lost at the very end
            n, self._lost = self._lost, 0
            return Lost(n)
        return None


class Fanout(Generic[E]):
    def __init__(self, bound: int = BOUND) -> None:
        self._bound = bound
        self._subs: list[Subscription[E]] = []
        self._open: list[Subscription[E]] = []  # those offered events: not parked
        self._parking = False  # a subscription parked during this publish
        self.published = 0  # events published: what a parked subscription loses
        self.closed = False

    def subscribe(self, kinds: tuple[type[Event], ...] | None = None) -> Subscription[E]:
        """A new watcher of the events of these types (every one when None).
        Subscribing to a closed fan-out gives a subscription that ends at once."""
        sub = Subscription(self, kinds, self._bound)
        if self.closed:
            sub._end()
        else:
            self._subs.append(sub)
            self._open.append(sub)
        return sub

    def publish(self, event: E) -> None:
        if self.closed:
            return
        self.published += 1
        for sub in self._open:
            sub._offer(event)
        if self._parking:
            self._park()

    def publish_lazy(self, kind: type[Event], make: Callable[[], E]) -> None:
        """Publish MAKE(), an event of type KIND, made only if a watcher has room for
        it: in a flood every watcher is losing, the publisher makes no event."""
        if self.closed:
            return
        self.published += 1
        event: E | None = None
        for sub in self._open:
            if sub.kinds is not None and not issubclass(kind, sub.kinds):
                continue
            if len(sub._queue) >= sub._bound:
                sub._lose()
                continue
            if event is None:
                event = make()
            sub._put(event)
        if self._parking:
            self._park()

    def _park(self) -> None:
        self._parking = False
        self._open = [sub for sub in self._open if sub._parked < 0]

    def _reopen(self, sub: Subscription[E]) -> None:
        if sub in self._subs:  # not closed meanwhile
            self._open.append(sub)

    def close(self) -> None:
        """The end of the stream: every watcher drains what it has, then stops."""
        self.closed = True
        for sub in self._subs:
            sub._end()
        self._subs = []
        self._open = []

    def _drop(self, sub: Subscription[E]) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
        if sub in self._open:
            self._open.remove(sub)

    def wants(self, kind: type[Event]) -> bool:
        """Would anyone receive an event of this type (worth computing a snapshot for)?"""
        return any(sub.kinds is None or issubclass(kind, sub.kinds) for sub in self._subs)

    @property
    def watchers(self) -> int:
        return len(self._subs)
