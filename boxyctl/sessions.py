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
from boxy.outcome import Counters, SessionInfo, State, destinations_table
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
    """The state with what ended it: 'exited 0', 'killed SIGTERM', 'timed-out'; a
    session held for review says so ('review (exited 0)')."""
    if info.review and info.state.finished:
        return f"review ({_ended(info)})"
    return _ended(info)


def _ended(info: SessionInfo) -> str:
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
    rows = [("ID", "STATE", *head, "TIME", "PROFILE", "PORTS", "COMMAND")]
    for i in infos:
        when = (_date(i.started_at), _date(i.ended_at)) if dates else (_when(i.started_at, now),)
        rows.append(
            (
                i.id,
                _status(i),
                *when,
                _elapsed(i, now),
                clean(i.profile or "generic"),
                _ports(i.ports),
                _command(i.argv),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(r[c].ljust(widths[c]) for c in range(len(widths))), r[-1]]).rstrip()
        for r in rows
    ]


def _ports(ports: list[str]) -> str:
    """Published ports as docker's ps writes them: 127.0.0.1:8080->3000 (the host's
    address and port, then the sandbox's), comma-separated; "-" for none."""
    shown = []
    for m in ports:
        host, _, port = m.rpartition(":")
        shown.append(f"{clean(host)}->{clean(port)}")
    return ",".join(shown) or "-"


def network_line(c: Counters) -> str:
    """Connections and names apart: '15 connections (1 denied), 1 name denied, up …'.
    Counts that may be short (c.exact) say "at least"."""
    conns = c.at_least(c.connections) + (" connection" if c.connections == 1 else " connections")
    names = f", {c.at_least(c.names_denied)} {'name' if c.names_denied == 1 else 'names'} denied"
    return (
        f"{conns} ({c.at_least(c.denials)} denied){names if c.names_denied else ''}, "
        f"up {values.format_size(c.bytes_up)}, down {values.format_size(c.bytes_down)}, "
        f"{plural(c.destinations, 'destination')}"
    )


def show_lines(info: SessionInfo, now: float) -> list[str]:
    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    lines = [
        f"session   {info.id}",
        f"state     {_status(info)}",
        *(
            [f"review    {info.review}: `boxyctl diff {info.id}`, then apply or discard"]
            if info.review
            else []
        ),
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
    if c.connections or c.denials or c.destinations or c.names_denied:
        lines.append(f"network   {network_line(c)}")
    for m in info.ports:
        addr, _, port = m.rpartition(":")
        lines.append(f"port      {clean(addr)} leads to {clean(port)} inside")
    lines += [f"policy    {clean(x)}" for x in info.policy]  # boxyctl allow / deny
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
    """`session 9f3c1ba2  running  9s  npm ci` (the specification's board)."""
    return f"session {info.id}  {info.state.value}  {_elapsed(info, now)}  {_command(info.argv)}"


def event_line(ev: dict[str, Any], *, start: float, color: bool) -> str:
    """One event in the board's columns: its time since the session started
    (mm:ss.mmm), the layer, the verdict, the destination and the detail; a refusal in
    red on a terminal. The same line in a pipe, one per event."""
    stamp = values.run_clock(float(ev.get("t") or 0) - start)
    layer, verdict, where, detail = _columns(ev)
    line = clean(f"{stamp} {layer:<8} {verdict:<7} {where:<30} {detail}".rstrip())
    got = ev.get("record")
    record: dict[str, Any] = got if isinstance(got, dict) else ev
    said = record.get("verdict")
    # a refusal, or a flow cut by a denial; never the user's own allow / deny
    refused = said == "cut" or said == "deny" and record.get("layer") != "net.policy"
    denied = refused or record.get("action") == "kill"
    return f"{RED}{line}{RESET}" if color and denied else line


def _columns(ev: dict[str, Any]) -> tuple[str, str, str, str]:
    """(layer, verdict, destination, detail) of one event."""
    kind = str(ev.get("kind", "?"))
    if kind == "audit" and isinstance(ev.get("record"), dict):
        return _audit_columns(ev["record"])
    if kind == "lost":
        return "watch", "lost", f"{ev.get('count')} events", "this watcher fell behind"
    if kind == "state":
        return "session", str(ev.get("state", "")), "", ""
    if kind == "started":
        return "session", "started", "", "; ".join(map(str, ev.get("warnings") or []))
    if kind == "notice":
        return "session", "notice", "", str(ev.get("text", ""))
    if kind == "exited":
        got = ev.get("outcome")
        status = got.get("exit_status", "?") if isinstance(got, dict) else "?"
        return "session", "exited", f"status {status}", ""
    if kind == "stopped":
        return "session", "stopped", _signame(int(ev.get("signal") or 0)), ""
    return "session", kind, "", ""  # detached, attached


def _audit_columns(r: dict[str, Any]) -> tuple[str, str, str, str]:
    """A policy decision: an allowed flow under its protocol (dns, tcp, udp), a refusal
    under the layer that made it (net.dns, net.ip, net.sni, landlock, seccomp...)."""
    layer, verdict = str(r.get("layer", "audit")), str(r.get("verdict", ""))
    denied = verdict == "deny"
    name, addr, port = r.get("name") or r.get("host"), r.get("addr"), r.get("port")
    where = str(name or addr or "")
    if port is not None and where:
        where = f"{where}:{port}"
    if layer == "net.policy" and isinstance(r.get("hosts"), list):  # boxyctl allow / deny
        who = f"uid {r.get('uid')}, pid {r.get('pid')}, {r.get('via')}"
        return "policy", verdict, " ".join(map(str, r["hosts"])), who
    if layer == "seccomp" and r.get("call"):  # named by PID 1: the call, who, how
        return layer, str(r.get("action", verdict)), str(r["call"]), str(r.get("reason", ""))
    if layer == "net.dns" and not denied:
        addrs = r.get("addrs")
        shown = " ".join(map(str, addrs)) if isinstance(addrs, list) else ""
        return "dns", "resolve", str(name or ""), shown
    if verdict == "close":
        size = values.format_size
        detail = f"up {size(int(r.get('up') or 0))}  down {size(int(r.get('down') or 0))}"
        return str(r.get("proto", "tcp")), "close", where, detail
    if layer.startswith("net.") and not denied and verdict != "cut":
        sni = r.get("sni")
        return str(r.get("proto", "tcp")), "sni" if sni else verdict, str(sni or where), ""
    detail = r.get("reason") or " ".join(
        f"{k}={_field(v)}" for k, v in r.items() if k not in (*_QUIET, "verdict", "reason")
    )
    return layer, verdict, where, str(detail)


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
        self.counters = info.counters
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
            self.counters = Counters.from_wire(c)
            rows = ev.get("destinations")  # the IDL's Destination objects
            self.destinations = (
                [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
            )
            return
        if ev.get("kind") == "state" and isinstance(ev.get("state"), str):
            with contextlib.suppress(ValueError):
                self.info.state = State(ev["state"])
        line = event_line(ev, start=self.info.started_at, color=True)
        self.recent = [*self.recent, line][-self.RECENT :]

    def render(self, now: float) -> list[str]:
        c, size = self.counters, values.format_size
        # the specification's totals line: "denied" counts refusals of both kinds,
        # connections and names (its example: one of each is "2 denied")
        lines = [
            header_line(self.info, now),
            f"{c.destinations} destination(s)  {c.at_least(c.connections)} connection(s)  "
            f"{c.at_least(c.denials + c.names_denied)} denied   "
            f"up {size(c.bytes_up)} ({size(int(self.rates[0]))}/s)  "
            f"down {size(c.bytes_down)} ({size(int(self.rates[1]))}/s)",
            "",
        ]
        if self.destinations:
            lines += self._table()
            lines.append("")
        lines.append("RECENT")
        lines += self.recent
        return lines

    def _table(self) -> list[str]:
        """DESTINATION CONNS DENIED ADDRS SENT RECEIVED; a refused destination red."""
        size = values.format_size
        width = min(40, max([20, *(len(clean(str(r.get("name", "")))) for r in self.destinations)]))
        head = f"{'DESTINATION':<{width}} {'CONNS':>5}  {'DENIED':>6}  {'ADDRS':>5}  "
        out = [head + f"{'SENT':>9}  {'RECEIVED':>9}"]
        for r in self.destinations:
            name = clean(str(r.get("name", "")))[:width]
            line = (
                f"{name:<{width}} {r.get('connections', 0):>5}  {r.get('denied', 0):>6}  "
                f"{r.get('addresses', 0):>5}  {size(int(r.get('bytes_up', 0))):>9}  "
                f"{size(int(r.get('bytes_down', 0))):>9}"
            )
            out.append(f"{RED}{line}{RESET}" if r.get("denied") else line)
        return out
