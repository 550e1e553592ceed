"""`ps`, `show` and `stop` as text: pure formatting of boxy.outcome.SessionInfo.

Every value that came from a session (its argv, its messages) is shown with its
control characters escaped: a line of `ps` never drives the terminal.
"""

from __future__ import annotations

import shlex
import signal
import time

from boxy import values
from boxy.outcome import SessionInfo, State

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
    return info.state.value


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def ps_lines(infos: list[SessionInfo], now: float) -> list[str]:
    rows = [("ID", "STATE", "STARTED", "TIME", "PROFILE", "COMMAND")]
    for i in infos:
        rows.append((i.id, _status(i), _when(i.started_at, now), _elapsed(i, now),
                     clean(i.profile or "generic"), _command(i.argv)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return ["  ".join([*(r[c].ljust(widths[c]) for c in range(len(widths))), r[-1]]).rstrip()
            for r in rows]


def show_lines(info: SessionInfo, now: float) -> list[str]:
    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    lines = [f"session   {info.id}", f"state     {_status(info)}",
             f"command   {_command(info.argv, None)}", f"workdir   {clean(info.workdir)}",
             f"profile   {clean(info.profile or 'generic')}", f"started   {when(info.started_at)}"]
    if info.ended_at is not None:
        lines.append(f"ended     {when(info.ended_at)} (after {_elapsed(info, now)})")
    else:
        lines.append(f"running   for {_elapsed(info, now)}")
    out = info.outcome
    if out is None:
        return lines
    lines.append(f"exit      {out.exit_status} ({out.reason.value})")
    if out.message:
        lines.append(f"message   {clean(out.message)}")
    for title, items in (("warnings", out.warnings), ("findings", out.findings),
                         ("notes", out.notes)):
        if items:
            lines.append(f"{title}:")
            lines += [f"  {clean(x)}" for x in items]
    if out.destinations:
        lines.append("destinations:")
        lines += [f"  {clean(x)}" for x in out.destinations.splitlines()]
    return lines


def stop_line(info: SessionInfo) -> str:
    return f"session {info.id}: {_status(info)}"


RED, RESET = "\x1b[31m", "\x1b[0m"
_QUIET = ("t", "session", "layer")  # said by the line's own columns


def header_line(info: SessionInfo, now: float) -> str:
    return f"session {info.id} {info.state.value} {_elapsed(info, now)} {_command(info.argv)}"


def event_line(ev: dict, *, color: bool) -> str:
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
        text = " ".join([kind] + [f"{k}={_field(v)}" for k, v in fields.items()
                                  if k not in (*_QUIET, "kind")])
    line = clean(f"{stamp} {text}")
    denied = fields.get("verdict") == "deny" or fields.get("action") == "kill"
    return f"{RED}{line}{RESET}" if color and denied else line


def _field(v: object) -> str:
    if isinstance(v, str):
        return shlex.quote(v) if v else "''"
    if isinstance(v, list):
        return ",".join(_field(x) for x in v)
    return str(v)
