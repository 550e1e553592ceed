"""How a session stands and ends: its State, its Outcome, and the SessionInfo that
List and Show report, as the daemon sends them and every client reads them (the
final Run reply, `ps`, `show`, the D-Bus properties)."""

from __future__ import annotations

import enum

from boxy.request import Value

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    _T = TypeVar("_T")


# what a reply and a record hold of each list of an outcome (findings, notes, warnings):
# the first MAX_LINES, each cut at MAX_LINE characters, then the count (100,000 planted
# hooks made one Run reply 45.9 MB, over the wire's 16 MiB: the client never returned)
MAX_LINES = 50
MAX_LINE = 4096


def clipped(lines: list[str]) -> bool:
    """Would clip() change LINES?"""
    return len(lines) > MAX_LINES or any(len(x) > MAX_LINE for x in lines)


def clip(lines: list[str], what: str, where: str) -> list[str]:
    """Pure: the first lines of LINES (each cut short), then one line with how many
    there are and WHERE the whole list is: MAX_LINES in all, so clipping again changes
    nothing. LINES itself when it is within bounds."""
    if not clipped(lines):
        return lines
    head = [
        x if len(x) <= MAX_LINE else x[:MAX_LINE] + f"… ({len(x):,} characters)"
        for x in lines[: MAX_LINES - 1]
    ]
    rest = len(lines) - len(head)
    more = f"and {rest:,} more {what}" if rest else f"{what} cut short"
    return [*head, f"… {more} ({len(lines):,} in all; {where})"]


class Destination(Value):
    """Where a run's network went, one name (or address) with its CONNECTIONS, how
    many of them were DENIED, the distinct ADDRESSES it resolved to, and the bytes
    sent (BYTES_UP) and received (BYTES_DOWN): a row of the destinations table, and of
    a counters event's busiest (whose ADDRESSES is 0: not counted there)."""

    __slots__ = ("name", "connections", "denied", "addresses", "bytes_up", "bytes_down")

    def __init__(
        self,
        name: str,
        connections: int = 0,
        denied: int = 0,
        addresses: int = 0,
        bytes_up: int = 0,
        bytes_down: int = 0,
    ) -> None:
        self.name, self.connections, self.denied = name, connections, denied
        self.addresses, self.bytes_up, self.bytes_down = addresses, bytes_up, bytes_down

    def to_wire(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_wire(cls, d: object) -> Destination | None:
        """Lenient: a row of a reply or a record; None for one that is not an object."""
        if not isinstance(d, dict):
            return None
        counts = [d.get(k) for k in cls.__slots__[1:]]
        return cls(str(d.get("name", "")), *(c if type(c) is int else 0 for c in counts))


class Refusal(Value):
    """One kind of refusal of a run's network and how often it happened (COUNT):
    the LAYER that refused it (net.ip, net.dns, net.sni, net.port, net.rate…), PROTO
    (tcp, udp, dns, …), the ADDR and PORT it was for (None for a name that DNS
    refused), HOST (the name involved: the TLS SNI or HTTP Host, or the DNS
    question), REASON in words."""

    __slots__ = ("layer", "proto", "addr", "port", "host", "reason", "count")

    def __init__(
        self,
        layer: str,
        proto: str,
        addr: str | None,
        port: int | None,
        host: str | None,
        reason: str,
        count: int = 1,
    ) -> None:
        self.layer, self.proto, self.addr, self.port = layer, proto, addr, port
        self.host, self.reason, self.count = host, reason, count

    def to_wire(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_wire(cls, d: object) -> Refusal | None:
        """Lenient: a row of a reply or a record; None for one that is not an object."""
        if not isinstance(d, dict):
            return None

        def text(k: str) -> str | None:
            v = d.get(k)
            return v if isinstance(v, str) else None

        port, count = d.get("port"), d.get("count")
        return cls(
            text("layer") or "",
            text("proto") or "",
            text("addr"),
            port if type(port) is int else None,
            text("host"),
            text("reason") or "",
            count if type(count) is int else 1,
        )


def destinations_table(rows: list[Destination]) -> str:
    """The table printed after a run with network (rows sorted as the daemon sent
    them), columns fitted; it ends with a newline, and is empty when the run went
    nowhere."""
    if not rows:
        return ""
    from boxy.values import format_size

    table = [["DESTINATION", "CONNS", "DENIED", "ADDRS", "SENT", "RECEIVED"]]
    for r in rows:
        counts = [str(r.connections), str(r.denied), str(r.addresses)]
        table.append([r.name, *counts, format_size(r.bytes_up), format_size(r.bytes_down)])
    widths = [max(len(cells[i]) for cells in table) for i in range(len(table[0]))]
    lines = [f"network destinations ({len(rows)})"]
    for cells in table:
        padded = [cell.ljust(width) for cell, width in zip(cells, widths, strict=True)]
        lines.append(("  " + "  ".join(padded)).rstrip())
    return "\n".join(lines) + "\n"


# seconds between SIGTERM and SIGKILL when a session is stopped (stop, --timeout, a
# client gone): boxyd waits it out, boxyctl says it
STOP_GRACE = 5.0


class State(enum.Enum):
    STARTING = "starting"  # checked, being set up: the walk, the plan, stage 2
    RUNNING = "running"  # the payload runs
    EXITED = "exited"  # the payload exited by itself (any status)
    KILLED = "killed"  # a signal ended it (stop, the payload's own, seccomp)
    TIMED_OUT = "timed-out"  # --timeout ended it
    FAILED = "failed"  # it never ran: a layer could not be applied, or exec failed

    @property
    def finished(self) -> bool:
        return self not in (State.STARTING, State.RUNNING)


class Reason(enum.Enum):
    """Why the exit status is what it is."""

    EXIT = "exit"
    SIGNAL = "signal"
    SECCOMP = "seccomp"  # killed by SIGSYS: a forbidden system call
    TIMEOUT = "timeout"
    SETUP = "setup"  # the sandbox could not be built (125, or 2 for bad input found late)
    EXEC = "exec"  # the command could not be executed (126, 127)


_STATE_OF = {
    Reason.EXIT: State.EXITED,
    Reason.SIGNAL: State.KILLED,
    Reason.SECCOMP: State.KILLED,
    Reason.TIMEOUT: State.TIMED_OUT,
    Reason.SETUP: State.FAILED,
    Reason.EXEC: State.FAILED,
}


class Outcome(Value):
    """EXIT_STATUS as a shell would report it; SIGNAL when one ended the payload;
    MESSAGE one line for the user; FINDINGS what the guard found after the run;
    NOTES other lines said at the end; DESTINATIONS the table of where the network
    went (Destination rows, busiest first); REFUSALS what it refused (Refusal rows,
    most frequent first); WARNINGS what was said at the start (kept for a run that
    never started)."""

    __slots__ = (
        "exit_status",
        "reason",
        "message",
        "signal",
        "findings",
        "notes",
        "destinations",
        "refusals",
        "warnings",
    )

    def __init__(
        self,
        exit_status: int,
        reason: Reason,
        message: str = "",
        signal: int | None = None,
        findings: list[str] | None = None,
        notes: list[str] | None = None,
        destinations: list[Destination] | None = None,
        warnings: list[str] | None = None,
        refusals: list[Refusal] | None = None,
    ) -> None:
        self.exit_status, self.reason, self.message, self.signal = (
            exit_status,
            reason,
            message,
            signal,
        )
        self.findings = findings if findings is not None else []
        self.notes = notes if notes is not None else []
        self.destinations = destinations if destinations is not None else []
        self.warnings = warnings if warnings is not None else []
        self.refusals = refusals if refusals is not None else []

    @property
    def state(self) -> State:
        return _STATE_OF[self.reason]

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exit_status": self.exit_status,
            "reason": self.reason.value,
            "state": self.state.value,
        }
        for key in ("message", "signal", "findings", "notes", "warnings"):
            value = getattr(self, key)
            if value:
                out[key] = value
        if self.destinations:
            out["destinations"] = [d.to_wire() for d in self.destinations]
        if self.refusals:
            out["refusals"] = [r.to_wire() for r in self.refusals]
        return out

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Outcome:
        """Lenient: a reply from a daemon of this build; a missing field is empty."""
        try:
            reason = Reason(d.get("reason"))
        except ValueError:
            reason = Reason.SETUP
        status = d.get("exit_status")
        return cls(
            status if type(status) is int else 1,
            reason,
            str(d.get("message") or ""),
            d.get("signal") if type(d.get("signal")) is int else None,
            [str(x) for x in d.get("findings") or []],
            [str(x) for x in d.get("notes") or []],
            _destinations(d.get("destinations")),
            [str(x) for x in d.get("warnings") or []],
            _rows(d.get("refusals"), Refusal.from_wire),
        )


def _destinations(rows: object) -> list[Destination]:
    """A reply's or a record's rows (a record of an older build held the table's text
    instead: it has none to give)."""
    return _rows(rows, Destination.from_wire)


def _rows(rows: object, decode: Callable[[object], _T | None]) -> list[_T]:
    if not isinstance(rows, list):
        return []
    return [r for r in map(decode, rows) if r is not None]


class Counters(Value):
    """What a session's network did so far (the gateway's totals). Connections and
    names are counted apart: DENIALS are refused connections (a subset of
    CONNECTIONS), NAMES_DENIED the names refused before any connection was made.
    EXACT is False when a count may be short: each is then a lower bound."""

    __slots__ = (
        "connections",
        "denials",
        "bytes_up",
        "bytes_down",
        "destinations",
        "names_denied",
        "exact",
    )

    def __init__(
        self,
        connections: int = 0,
        denials: int = 0,
        bytes_up: int = 0,
        bytes_down: int = 0,
        destinations: int = 0,
        names_denied: int = 0,
        exact: bool = True,
    ) -> None:
        self.connections, self.denials = connections, denials
        self.bytes_up, self.bytes_down, self.destinations = bytes_up, bytes_down, destinations
        self.names_denied, self.exact = names_denied, exact

    def to_wire(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_wire(cls, d: object) -> Counters:
        if not isinstance(d, dict):
            return cls()

        def count(k: str) -> int:
            v = d.get(k)
            return v if type(v) is int else 0

        exact = d.get("exact")  # a record of an older build has none: it counted as exact
        return cls(
            count("connections"),
            count("denials"),
            count("bytes_up"),
            count("bytes_down"),
            count("destinations"),
            count("names_denied"),
            exact if type(exact) is bool else True,
        )

    def at_least(self, n: int) -> str:
        """N as a count says it: "at least N" when the counts may be short."""
        return f"{n}" if self.exact else f"at least {n}"


class SessionInfo(Value):
    """One session as List and Show report it, running or from its record. Times
    are seconds since the epoch; OUTCOME is None while it runs."""

    __slots__ = (
        "id",
        "state",
        "argv",
        "workdir",
        "profile",
        "started_at",
        "ended_at",
        "outcome",
        "counters",
        "attached",
        "limits",
        "ports",
        "policy",
        "review",
    )

    def __init__(
        self,
        id: str,
        state: State,
        argv: list[str],
        workdir: str,
        profile: str | None,
        started_at: float,
        ended_at: float | None = None,
        outcome: Outcome | None = None,
        counters: Counters | None = None,
        attached: bool = False,
        limits: list[str] | None = None,
        ports: list[str] | None = None,
        policy: list[str] | None = None,
        review: str | None = None,
    ) -> None:
        self.id, self.state, self.argv, self.workdir = id, state, argv, workdir
        self.profile, self.started_at, self.ended_at = profile, started_at, ended_at
        self.outcome = outcome
        self.counters = counters if counters is not None else Counters()
        self.attached = attached
        self.limits = limits if limits is not None else []  # what each limit amounts to
        self.ports = ports if ports is not None else []  # published: [ADDR:]HOST_PORT:PORT
        # the network policy changed while it ran (`boxyctl allow` / `deny`), one line each
        self.policy = policy if policy is not None else []
        # --review: "held" while its changes wait for `apply` or `discard` (boxyd's, live)
        self.review = review

    def summary(self) -> SessionInfo:
        """What a listing needs: the argv cut short (a 2 MiB one exists), the outcome
        without its findings, notes and table, no limits (`show` has them all)."""
        argv, room = [], 1024
        for a in self.argv[:32]:
            argv.append(a[:room])
            room -= len(argv[-1])
            if room <= 0:
                break
        out = self.outcome
        brief = Outcome(out.exit_status, out.reason, signal=out.signal) if out is not None else None
        return SessionInfo(
            self.id,
            self.state,
            argv,
            self.workdir,
            self.profile,
            self.started_at,
            self.ended_at,
            brief,
            self.counters,
            self.attached,
            ports=self.ports,
            review=self.review,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state.value,
            "argv": self.argv,
            "workdir": self.workdir,
            "profile": self.profile,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome.to_wire() if self.outcome is not None else None,
            "counters": self.counters.to_wire(),
            "attached": self.attached,
            "limits": self.limits,
            "ports": self.ports,
            "policy": self.policy,
            "review": self.review,
        }

    @classmethod
    def from_wire(cls, d: object) -> SessionInfo | None:
        """None for a record that is not one (a truncated file, another version's)."""
        if not isinstance(d, dict):
            return None
        try:
            state = State(d.get("state"))
        except ValueError:
            return None
        argv, started = d.get("argv"), d.get("started_at")
        if (
            not isinstance(d.get("id"), str)
            or not isinstance(argv, list)
            or not isinstance(started, (int, float))
            or isinstance(started, bool)
        ):
            return None
        ended = d.get("ended_at")
        out = d.get("outcome")
        return cls(
            d["id"],
            state,
            [str(a) for a in argv],
            str(d.get("workdir", "")),
            d.get("profile") if isinstance(d.get("profile"), str) else None,
            float(started),
            float(ended)
            if isinstance(ended, (int, float)) and not isinstance(ended, bool)
            else None,
            Outcome.from_wire(out) if isinstance(out, dict) else None,
            Counters.from_wire(d.get("counters")),
            d.get("attached") is True,
            [str(x) for x in d.get("limits") or []],
            [str(x) for x in d.get("ports") or []],
            [str(x) for x in d.get("policy") or []],
            d.get("review") if isinstance(d.get("review"), str) else None,
        )


# -- the Run reply stream (Run and Attach): what the client following a session hears --
# Each reply carries KIND, so the client decodes it into one of these by name, never
# by which keys happen to be present. Running, Notice… and Stopped… stream; Detached
# and Ended are last (and Running is, for a run started with -d).


class Running(Value):
    """The payload runs: its session ID, and the WARNINGS said before it did."""

    kind = "running"
    __slots__ = ("id", "warnings")

    def __init__(self, id: str, warnings: list[str] | None = None) -> None:
        self.id, self.warnings = id, list(warnings or [])

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "state": "running", "warnings": self.warnings}


class Notice(Value):
    """One line for the client now (-v: a denial as it happens)."""

    kind = "notice"
    __slots__ = ("id", "text")

    def __init__(self, id: str, text: str) -> None:
        self.id, self.text = id, text

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "notice": self.text}


class Stopped(Value):
    """The payload stopped (^Z) with SIGNAL: the client stops too, and sends
    Signal(SIGCONT) once it is continued."""

    kind = "stopped"
    __slots__ = ("id", "signal")

    def __init__(self, id: str, signal: int) -> None:
        self.id, self.signal = id, int(signal)

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "stopped": self.signal}


class Detached(Value):
    """Last: the client detached (Ctrl-]); the session goes on."""

    kind = "detached"
    __slots__ = ("id",)

    def __init__(self, id: str) -> None:
        self.id = id

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "detached": True}


class Ended(Value):
    """Last: how the session ended."""

    kind = "ended"
    __slots__ = ("id", "outcome")

    def __init__(self, id: str, outcome: Outcome) -> None:
        self.id, self.outcome = id, outcome

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, **self.outcome.to_wire()}


RunReply = Running | Notice | Stopped | Detached | Ended


def run_reply(d: dict[str, Any]) -> RunReply:
    """A Run or Attach reply as its type; ValueError for one that is none of them."""
    kind, sid = d.get("kind"), d.get("id")
    if not isinstance(sid, str):
        raise ValueError(f"a {kind} reply without a session id")
    if kind == Running.kind:
        warnings = d.get("warnings")
        return Running(sid, [str(w) for w in warnings] if isinstance(warnings, list) else [])
    if kind == Notice.kind:
        return Notice(sid, str(d.get("notice", "")))
    if kind == Stopped.kind and type(d.get("stopped")) is int:
        return Stopped(sid, d["stopped"])
    if kind == Detached.kind:
        return Detached(sid)
    if kind == Ended.kind:
        return Ended(sid, Outcome.from_wire(d))
    raise ValueError(f"an unknown Run reply {kind!r}")
