"""`ps`, `show` and `stop` as text: pure formatting of boxy.outcome.SessionInfo.

Every value that came from a session (its argv, its messages) is shown with its
control characters escaped: a line of `ps` never drives the terminal.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import time
from typing import Any

from boxy import values
from boxy.outcome import SessionInfo, State, destinations_table
from boxy.values import plural

COMMAND_WIDTH = 60


def clean(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _command(argv: list[str], width: int | None = COMMAND_WIDTH) -> str:
    text = clean(shlex.join(argv))
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _when(t: float, now: float) -> str:
    """HH:MM:SS today, else the date too (local time)."""
    local, today = time.localtime(t), time.localtime(now)
    if local[:3] == today[:3]:
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%Y-%m-%d %H:%M", local)


def _elapsed(info: SessionInfo, now: float) -> str:
    end = info.ended_at if info.ended_at is not None else now
    return values.format_duration(max(0.0, end - info.started_at))


def _status(info: SessionInfo) -> str:
    """The state with what ended it: 'exited 0', 'killed SIGTERM', 'timed-out'."""
    out = info.outcome
    if out is None or not info.state.finished:
        return info.state.value
    if info.state is State.KILLED and out.signal:
        return f"killed {_signame(out.signal)}"
    if info.state is State.EXITED:
        return f"exited {out.exit_status}"
    return str(info.state.value)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _date(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else "-"


def ps_lines(infos: list[SessionInfo], now: float, *, dates: bool = False) -> list[str]:
    """DATES (`ps -a`): STARTED and ENDED as full local dates (a history spans days)."""
    head = ("STARTED", "ENDED") if dates else ("STARTED",)
    rows = [("ID", "STATE", *head, "TIME", "PROFILE", "COMMAND")]
    for i in infos:
        when = (_date(i.started_at), _date(i.ended_at)) if dates else (_when(i.started_at, now),)
        rows.append(
            (
                i.id,
                _status(i),
                *when,
                _elapsed(i, now),
                clean(i.profile or "generic"),
                _command(i.argv),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(r[c].ljust(widths[c]) for c in range(len(widths))), r[-1]]).rstrip()
        for r in rows
    ]


def show_lines(info: SessionInfo, now: float) -> list[str]:
    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    lines = [
        f"session   {info.id}",
        f"state     {_status(info)}",
        f"command   {_command(info.argv, None)}",
        f"workdir   {clean(info.workdir)}",
        f"profile   {clean(info.profile or 'generic')}",
        f"started   {when(info.started_at)}",
    ]
    if info.ended_at is not None:
        lines.append(f"ended     {when(info.ended_at)} (after {_elapsed(info, now)})")
    else:
        lines.append(f"running   for {_elapsed(info, now)}")
    c = info.counters
    if c.connections or c.denials or c.destinations:
        lines.append(
            f"network   {plural(c.connections, 'connection')}, {c.denials} denied, "
            f"up {values.format_size(c.bytes_up)}, down {values.format_size(c.bytes_down)}, "
            f"{plural(c.destinations, 'destination')}"
        )
    for m in info.ports:
        addr, _, port = m.rpartition(":")
        lines.append(f"port      {clean(addr)} leads to {clean(port)} inside")
    if info.limits:
        lines.append("limits:")
        lines += [f"  {clean(x)}" for x in info.limits]
    out = info.outcome
    if out is None:
        return lines
    lines.append(f"exit      {out.exit_status} ({out.reason.value})")
    if out.message:
        lines.append(f"message   {clean(out.message)}")
    for title, items in (
        ("warnings", out.warnings),
        ("findings", out.findings),
        ("notes", out.notes),
    ):
        if items:
            lines.append(f"{title}:")
            lines += [f"  {clean(x)}" for x in items]
    if out.destinations:
        lines.append("destinations:")
        lines += [f"  {clean(x)}" for x in destinations_table(out.destinations).splitlines()]
    return lines


def stop_line(info: SessionInfo) -> str:
    return f"session {info.id}: {_status(info)}"


RED, RESET = "\x1b[31m", "\x1b[0m"
_QUIET = ("t", "session", "layer")  # said by the line's own columns


def header_line(info: SessionInfo, now: float) -> str:
    return f"session {info.id} {info.state.value} {_elapsed(info, now)} {_command(info.argv)}"


def event_line(ev: dict[str, Any], *, color: bool) -> str:
    """One event: its time, its kind (an audit record: its layer) and its fields;
    a refusal in red on a terminal."""
    kind = str(ev.get("kind", "?"))
    stamp = time.strftime("%H:%M:%S", time.localtime(float(ev.get("t") or 0)))
    fields = ev
    if kind == "audit" and isinstance(ev.get("record"), dict):
        fields = ev["record"]
        kind = str(fields.get("layer", "audit"))
    if kind == "lost":
        text = f"lost {ev.get('count')} events (this watcher fell behind)"
    elif kind == "exited":
        text = "exited"
    else:
        text = " ".join(
            [kind] + [f"{k}={_field(v)}" for k, v in fields.items() if k not in (*_QUIET, "kind")]
        )
    line = clean(f"{stamp} {text}")
    denied = fields.get("verdict") == "deny" or fields.get("action") == "kill"
    return f"{RED}{line}{RESET}" if color and denied else line


def _field(v: object) -> str:
    if isinstance(v, str):
        return shlex.quote(v) if v else "''"
    if isinstance(v, list):
        return ",".join(_field(x) for x in v)
    return str(v)


class Board:
    """`watch` on a terminal: a header (session, state, elapsed, command; totals and
    rates), the busiest destinations and the RECENT events, repainted as they come."""

    RECENT = 12

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.counters: dict[str, Any] = info.counters.to_wire()
        self.destinations: list[dict[str, Any]] = []
        self.recent: list[str] = []
        self._last: tuple[float, int, int] | None = None  # (t, up, down) of the last snapshot
        self.rates = (0.0, 0.0)

    def event(self, ev: dict[str, Any]) -> None:
        if ev.get("kind") == "counters":
            got = ev.get("counters")
            c: dict[str, Any] = got if isinstance(got, dict) else {}
            t = float(ev.get("t") or 0)
            up, down = int(c.get("bytes_up", 0)), int(c.get("bytes_down", 0))
            if self._last is not None and t > self._last[0]:
                dt = t - self._last[0]
                self.rates = ((up - self._last[1]) / dt, (down - self._last[2]) / dt)
            self._last = (t, up, down)
            self.counters = c
            rows = ev.get("destinations")  # the IDL's Destination objects
            self.destinations = (
                [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
            )
            return
        if ev.get("kind") == "state" and isinstance(ev.get("state"), str):
            with contextlib.suppress(ValueError):
                self.info.state = State(ev["state"])
        self.recent = [*self.recent, event_line(ev, color=True)][-self.RECENT :]

    def render(self, now: float) -> list[str]:
        c = self.counters
        size = values.format_size
        lines = [
            header_line(self.info, now),
            f"connections {c.get('connections', 0)}  denials {c.get('denials', 0)}  "
            f"up {size(int(c.get('bytes_up', 0)))} ({size(int(self.rates[0]))}/s)  "
            f"down {size(int(c.get('bytes_down', 0)))} ({size(int(self.rates[1]))}/s)  "
            f"destinations {c.get('destinations', 0)}",
            "",
        ]
        if self.destinations:
            lines.append(f"{'DESTINATION':<40} {'CONN':>6} {'DENIED':>6} {'UP':>9} {'DOWN':>9}")
            for row in self.destinations:
                name, conns, denied = (
                    row.get("name", ""),
                    row.get("connections", 0),
                    row.get("denied", 0),
                )
                sent, received = row.get("bytes_up", 0), row.get("bytes_down", 0)
                line = (
                    f"{clean(str(name))[:40]:<40} {conns:>6} {denied:>6} "
                    f"{size(int(sent)):>9} {size(int(received)):>9}"
                )
                lines.append(f"{RED}{line}{RESET}" if denied else line)
            lines.append("")
        lines.append("RECENT")
        lines += self.recent
        return lines
