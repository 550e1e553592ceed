"""ps, show, stop and watch as text (boxyctl.sessions): columns, states, escaping."""

from __future__ import annotations

import time
from collections.abc import Sequence

from boxy import values
from boxy.outcome import Destination, Outcome, Reason, SessionInfo, State
from boxyctl import sessions as text

# noon today: a start 65 s before it is the same day whenever the suite runs (at
# 00:00:30, NOW - 65 would be yesterday, shown as a date)
NOW = time.mktime((*time.localtime()[:3], 12, 0, 0, 0, 0, -1))


def info(
    state: State,
    outcome: Outcome | None = None,
    argv: Sequence[str] = ("npm", "ci"),
    ended: float | None = None,
) -> SessionInfo:
    return SessionInfo("0123abcd", state, list(argv), "/home/u/p", "node", NOW - 65, ended, outcome)


def test_ps_columns_and_states() -> None:
    rows = [
        info(State.RUNNING),
        info(State.KILLED, Outcome(143, Reason.SIGNAL, signal=15), ended=NOW),
        info(State.EXITED, Outcome(3, Reason.EXIT), ended=NOW),
        info(State.TIMED_OUT, Outcome(124, Reason.TIMEOUT), ended=NOW),
    ]
    lines = text.ps_lines(rows, NOW)
    assert lines[0].split() == ["ID", "STATE", "STARTED", "TIME", "PROFILE", "COMMAND"]
    assert [ln.split()[1:3] for ln in lines[1:]] == [
        ["running", time.strftime("%H:%M:%S", time.localtime(NOW - 65))],
        ["killed", "SIGTERM"],
        ["exited", "3"],
        ["timed-out", time.strftime("%H:%M:%S", time.localtime(NOW - 65))],
    ]
    assert all(ln.endswith("npm ci") for ln in lines[1:])
    assert lines[1].split()[3] == values.format_duration(65)


def test_a_hostile_argv_never_drives_the_terminal() -> None:
    evil = info(State.RUNNING, argv=["sh", "-c", "\x1b]0;pwned\x07\x1b[2J" + "x" * 100])
    line = text.ps_lines([evil], NOW)[1]
    assert "\x1b" not in line and "\x07" not in line and line.endswith("…")
    shown = "\n".join(text.show_lines(evil, NOW))
    assert "\x1b" not in shown and "x" * 100 in shown  # show prints the whole command


def test_show_everything_of_a_finished_session() -> None:
    out = Outcome(
        1,
        Reason.EXIT,
        "a message",
        findings=["git: .git/hooks/pre-commit quarantined"],
        notes=["a note"],
        destinations=[Destination("example.org", 1, 0, 1, 100, 2048)],
    )
    lines = text.show_lines(info(State.EXITED, out, ended=NOW), NOW)
    assert "state     exited 1" in lines and "exit      1 (exit)" in lines
    assert "message   a message" in lines and "findings:" in lines
    assert "  git: .git/hooks/pre-commit quarantined" in lines
    assert lines[-3:] == [
        "  network destinations (1)",
        "    DESTINATION  CONNS  DENIED  ADDRS  SENT  RECEIVED",
        "    example.org  1      0       1      100B  2.0KiB",
    ]
    assert (
        text.stop_line(info(State.KILLED, Outcome(137, Reason.SIGNAL, signal=9), ended=NOW))
        == "session 0123abcd: killed SIGKILL"
    )


def test_event_lines() -> None:
    deny = {
        "kind": "audit",
        "t": NOW,
        "record": {
            "t": NOW,
            "session": "x",
            "layer": "net",
            "verdict": "deny",
            "host": "evil.example",
        },
    }
    assert text.event_line(deny, color=False).endswith(" net verdict=deny host=evil.example")
    assert text.event_line(deny, color=True).startswith(text.RED)
    ok = {"kind": "audit", "t": NOW, "record": {"layer": "net", "verdict": "allow"}}
    assert not text.event_line(ok, color=True).startswith(text.RED)
    assert text.event_line({"kind": "lost", "t": NOW, "count": 7}, color=False).endswith(
        " lost 7 events (this watcher fell behind)"
    )
    assert text.event_line({"kind": "state", "t": NOW, "state": "running"}, color=False).endswith(
        " state state=running"
    )
    assert "\x1b" not in text.event_line(
        {"kind": "notice", "t": NOW, "text": "\x1b[31m"}, color=False
    )


def D(name: str, conns: int, denied: int, up: int, down: int) -> dict[str, str | int]:
    """A Destination as the IDL declares it."""
    return {
        "name": name,
        "connections": conns,
        "denied": denied,
        "bytes_up": up,
        "bytes_down": down,
    }


def test_the_board_totals_rates_destinations_and_recent() -> None:
    board = text.Board(info(State.RUNNING))
    snap = {"connections": 3, "denials": 1, "bytes_up": 1000, "bytes_down": 4000, "destinations": 2}
    board.event(
        {
            "kind": "counters",
            "t": NOW,
            "counters": snap,
            "destinations": [D("example.org", 2, 0, 1000, 4000), D("evil.example", 1, 1, 0, 0)],
        }
    )
    board.event(
        {
            "kind": "counters",
            "t": NOW + 2,
            "counters": {**snap, "bytes_down": 6048},
            "destinations": [D("example.org", 2, 0, 1000, 6048), D("evil.example", 1, 1, 0, 0)],
        }
    )
    for i in range(20):
        board.event({"kind": "audit", "t": NOW, "record": {"layer": "net", "n": i}})
    board.event({"kind": "state", "t": NOW, "state": "exited"})
    lines = board.render(NOW + 2)
    assert lines[0].startswith("session 0123abcd exited ")
    assert lines[1] == (
        "connections 3  denials 1  up 1000B (0B/s)  down 5.9KiB (1.0KiB/s)  destinations 2"
    )
    assert lines[3].split() == ["DESTINATION", "CONN", "DENIED", "UP", "DOWN"]
    assert lines[4].startswith("example.org") and not lines[4].startswith(text.RED)
    assert lines[5].startswith(text.RED + "evil.example")  # a refused destination in red
    recent = lines[lines.index("RECENT") + 1 :]
    assert len(recent) == text.Board.RECENT and recent[-1].endswith("state state=exited")


def test_show_says_1_connection_not_1_connections() -> None:
    from boxy.outcome import Counters

    running = info(State.RUNNING)
    running.counters = Counters(connections=1, destinations=1)
    (line,) = [ln for ln in text.show_lines(running, NOW) if ln.startswith("network")]
    assert line.startswith("network   1 connection, 0 denied") and line.endswith(" 1 destination")


def test_show_says_where_each_published_port_leads() -> None:
    running = info(State.RUNNING)
    running.ports = ["127.0.0.1:8080:3000", "[::1]:9090:90"]
    lines = text.show_lines(running, NOW)
    assert "port      127.0.0.1:8080 leads to 3000 inside" in lines
    assert "port      [::1]:9090 leads to 90 inside" in lines
    assert SessionInfo.from_wire(running.to_wire()) == running
