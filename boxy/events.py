"""A session's events as the library yields them (`boxy.watch`): one typed value per
Watch reply, by its kind (the IDL's Event type), never by which keys are present.
An event of a kind this build does not know is an UnknownEvent, not an error."""

from __future__ import annotations

from boxy.outcome import Counters, Destination, Outcome, SessionInfo, State
from boxy.request import Value

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import Any


class Snapshot(Value):
    """The session as it stands: the first item of a watch, and the last (then
    its state is finished and its outcome set)."""

    kind = "session"
    __slots__ = ("session",)

    def __init__(self, session: SessionInfo) -> None:
        self.session = session


class Event(Value):
    """Base of a session's events: KIND as the wire names it, T seconds since the epoch."""

    kind = ""
    __slots__: tuple[str, ...] = ("t",)

    def __init__(self, t: float) -> None:
        self.t = t


class StateChanged(Event):
    kind = "state"
    __slots__ = ("t", "state")

    def __init__(self, t: float, state: State) -> None:
        self.t, self.state = t, state


class Started(Event):
    """The payload runs; WARNINGS what was said before it did."""

    kind = "started"
    __slots__ = ("t", "warnings")

    def __init__(self, t: float, warnings: list[str]) -> None:
        self.t, self.warnings = t, warnings


class Noticed(Event):
    """One line said now (verbose: a denial as it happens)."""

    kind = "notice"
    __slots__ = ("t", "text")

    def __init__(self, t: float, text: str) -> None:
        self.t, self.text = t, text


class PayloadStopped(Event):
    kind = "stopped"
    __slots__ = ("t", "signal")

    def __init__(self, t: float, signal: int) -> None:
        self.t, self.signal = t, signal


class Audited(Event):
    """One policy decision (RECORD as --audit-log writes it: layer, verdict …)."""

    kind = "audit"
    __slots__ = ("t", "record")

    def __init__(self, t: float, record: dict[str, Any]) -> None:
        self.t, self.record = t, record

    @property
    def denied(self) -> bool:
        return self.record.get("verdict") == "deny" or self.record.get("action") == "kill"


class CountersTick(Event):
    """The network's totals so far and the busiest DESTINATIONS (once a second)."""

    kind = "counters"
    __slots__ = ("t", "counters", "destinations")

    def __init__(self, t: float, counters: Counters, destinations: list[Destination]) -> None:
        self.t, self.counters, self.destinations = t, counters, destinations


class Detached(Event):
    kind = "detached"


class Attached(Event):
    kind = "attached"


class Lost(Event):
    """This watcher fell behind: COUNT events were dropped for it."""

    kind = "lost"
    __slots__ = ("t", "count")

    def __init__(self, t: float, count: int) -> None:
        self.t, self.count = t, count


class Exited(Event):
    kind = "exited"
    __slots__ = ("t", "outcome")

    def __init__(self, t: float, outcome: Outcome) -> None:
        self.t, self.outcome = t, outcome


class UnknownEvent(Event):
    """A kind this build does not know (a newer daemon's): its FIELDS as sent."""

    __slots__ = ("t", "name", "fields")

    def __init__(self, t: float, name: str, fields: dict[str, Any]) -> None:
        self.t, self.name, self.fields = t, name, fields


def _int(v: object) -> int:
    return v if type(v) is int else 0


def _destinations(rows: object) -> list[Destination]:
    if not isinstance(rows, list):
        return []
    return [d for d in map(Destination.from_wire, rows) if d is not None]


def decode(ev: dict[str, Any]) -> Event:
    """One Watch event (the IDL's Event) as its type."""
    kind, t = str(ev.get("kind", "")), ev.get("t")
    when = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0
    if kind == "state":
        try:
            return StateChanged(when, State(ev.get("state")))
        except ValueError:
            pass
    elif kind == "started":
        return Started(when, [str(w) for w in ev.get("warnings") or []])
    elif kind == "notice":
        return Noticed(when, str(ev.get("text", "")))
    elif kind == "stopped":
        return PayloadStopped(when, _int(ev.get("signal")))
    elif kind == "audit" and isinstance(ev.get("record"), dict):
        return Audited(when, ev["record"])
    elif kind == "counters":
        counters = Counters.from_wire(ev.get("counters"))
        return CountersTick(when, counters, _destinations(ev.get("destinations")))
    elif kind in ("detached", "attached"):
        return Detached(when) if kind == "detached" else Attached(when)
    elif kind == "lost":
        return Lost(when, _int(ev.get("count")))
    elif kind == "exited" and isinstance(ev.get("outcome"), dict):
        return Exited(when, Outcome.from_wire(ev["outcome"]))
    return UnknownEvent(when, kind, ev)
