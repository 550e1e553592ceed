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
    assert lines[0].split() == ["ID", "STATE", "STARTED", "TIME", "PROFILE", "PORTS", "COMMAND"]
    assert [ln.split()[1:3] for ln in lines[1:]] == [
        ["running", time.strftime("%H:%M:%S", time.localtime(NOW - 65))],
        ["killed", "SIGTERM"],
        ["exited", "3"],
        ["timed-out", time.strftime("%H:%M:%S", time.localtime(NOW - 65))],
    ]
    assert all(ln.endswith("npm ci") for ln in lines[1:])
    assert lines[1].split()[3] == values.format_duration(65)


def test_ps_shows_the_published_ports() -> None:
    """`ps` left out what --publish opened (issue 33 §2); docker's ps shows it so."""
    served = info(State.RUNNING)
    served.ports = ["127.0.0.1:8080:3000", "[::1]:9090:80"]
    lines = text.ps_lines([served, info(State.RUNNING)], NOW)
    assert lines[1].split()[5] == "127.0.0.1:8080->3000,[::1]:9090->80"
    assert lines[2].split()[5] == "-"
    assert all(ln.endswith("npm ci") for ln in lines[1:])
    assert text.ps_lines([served], NOW, dates=True)[1].split()[-3] == (
        "127.0.0.1:8080->3000,[::1]:9090->80"
    )


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


START = NOW - 65  # info()'s session started then


def audit(after: float, **record: object) -> dict[str, object]:
    return {"kind": "audit", "t": START + after, "record": {"t": START + after, **record}}


def test_a_policy_change_and_the_flow_it_cut_are_recent_lines() -> None:
    """`boxyctl allow` / `deny` (issue 34 §1) as watch shows them: who asked, plainly;
    the connection a denial cut, in red."""
    change = audit(12.5, layer="net.policy", verdict="deny", hosts=["api.example"], uid=1000,
                   pid=4242, via="varlink", cut=1)  # fmt: skip
    line = text.event_line(change, start=START, color=True)
    assert line == (
        "00:12.500 policy   deny    api.example                    uid 1000, pid 4242, varlink"
    )
    cut = audit(12.5, layer="net.policy", proto="tcp", verdict="cut", addr="11.0.0.10", port=443,
                host="api.example", reason="denied while it was open (boxyctl deny)")  # fmt: skip
    line = text.event_line(cut, start=START, color=True)
    assert line.startswith(text.RED) and " cut     api.example:443 " in line, line
    assert "denied while it was open (boxyctl deny)" in line, line


def test_event_lines_are_the_specifications_recent_lines() -> None:
    """The specification's RECENT lines, column for column: session-relative time, the
    layer (an allowed flow's protocol, a refusal's layer), the verdict, the
    destination, the detail."""
    cases = [
        (audit(0.104, layer="net.dns", verdict="allow", name="registry.example",
               addrs=["104.16.0.35", "104.16.1.35"]),
         "00:00.104 dns      resolve registry.example               104.16.0.35 104.16.1.35"),
        (audit(0.118, layer="net.ip", proto="tcp", verdict="allow", addr="104.16.0.35",
               port=443, host="registry.example"),
         "00:00.118 tcp      allow   registry.example:443"),
        (audit(0.166, layer="net.sni", proto="tcp", verdict="allow", addr="104.16.0.35",
               port=443, host="registry.example", sni="registry.example"),
         "00:00.166 tcp      sni     registry.example"),
        (audit(2.905, layer="net.tcp", proto="tcp", verdict="close", addr="104.16.0.35",
               port=443, host="registry.example", up=1434, down=2202009),
         "00:02.905 tcp      close   registry.example:443           up 1.4KiB  down 2.1MiB"),
        (audit(7.914, layer="net.dns", verdict="deny", name="c2.5f3a1.example.net",
               reason="hostname not on the allowlist"),
         "00:07.914 net.dns  deny    c2.5f3a1.example.net           hostname not on the allowlist"),
        (audit(8.002, layer="net.ip", proto="tcp", verdict="deny", addr="169.254.169.254",
               port=80, reason="link-local / cloud metadata"),
         "00:08.002 net.ip   deny    169.254.169.254:80             link-local / cloud metadata"),
    ]  # fmt: skip
    for ev, want in cases:
        assert text.event_line(ev, start=START, color=False) == want
    deny = cases[-1][0]
    assert text.event_line(deny, start=START, color=True) == f"{text.RED}{cases[-1][1]}{text.RESET}"
    assert not text.event_line(cases[0][0], start=START, color=True).startswith(text.RED)
    lost = {"kind": "lost", "t": START + 61.5, "count": 7}
    assert text.event_line(lost, start=START, color=False) == (
        "01:01.500 watch    lost    7 events                       this watcher fell behind"
    )
    state = {"kind": "state", "t": START, "state": "running"}
    assert text.event_line(state, start=START, color=False) == "00:00.000 session  running"
    notice = {"kind": "notice", "t": START, "text": "\x1b[31m"}
    assert "\x1b" not in text.event_line(notice, start=START, color=False)


def D(name: str, conns: int, denied: int, addrs: int, up: int, down: int) -> dict[str, str | int]:
    """A Destination as the IDL declares it."""
    return {
        "name": name,
        "connections": conns,
        "denied": denied,
        "addresses": addrs,
        "bytes_up": up,
        "bytes_down": down,
    }


def test_the_board_is_the_specifications_field_by_field() -> None:
    """`boxy watch` in the specification: the header, the totals with rates, the
    destinations table and RECENT (issue 33 §1)."""
    started = info(State.RUNNING)
    started.started_at = NOW - 9
    board = text.Board(started)
    # the specification's "2 denied": a name (c2...) and a connection (169.254.169.254)
    snap = {"connections": 15, "denials": 1, "names_denied": 1, "bytes_up": 38400,
            "bytes_down": 4 << 20, "destinations": 2}  # fmt: skip
    rows = [D("registry.example", 14, 0, 3, 39322, 6396314), D("169.254.169.254", 1, 1, 1, 0, 0)]
    board.event({"kind": "counters", "t": NOW - 1, "counters": snap, "destinations": rows})
    later = {**snap, "bytes_up": 39322, "bytes_down": 6396314}
    board.event({"kind": "counters", "t": NOW, "counters": later, "destinations": rows})
    for i in range(20):
        board.event(audit(65 - 9 + i / 100, layer="net.ip", proto="tcp", verdict="allow",
                          addr="104.16.0.35", port=443, host="registry.example"))  # fmt: skip
    lines = board.render(NOW)
    assert lines[0] == "session 0123abcd  running  9s  npm ci"
    assert lines[1] == (
        "2 destination(s)  15 connection(s)  2 denied   up 38.4KiB (922B/s)  down 6.1MiB (2.1MiB/s)"
    )
    assert lines[2] == ""
    assert lines[3] == "DESTINATION          CONNS  DENIED  ADDRS       SENT   RECEIVED"
    assert lines[4] == "registry.example        14       0      3    38.4KiB     6.1MiB"
    assert lines[5] == (
        f"{text.RED}169.254.169.254          1       1      1         0B         0B{text.RESET}"
    )
    recent = lines[lines.index("RECENT") + 1 :]
    assert len(recent) == text.Board.RECENT
    assert recent[-1] == "00:00.190 tcp      allow   registry.example:443"


def test_show_says_1_connection_not_1_connections() -> None:
    from boxy.outcome import Counters

    running = info(State.RUNNING)
    running.counters = Counters(connections=1, destinations=1)
    (line,) = [ln for ln in text.show_lines(running, NOW) if ln.startswith("network")]
    assert line.startswith("network   1 connection (0 denied), up") and line.endswith(
        " 1 destination"
    )


def test_show_keeps_names_and_connections_apart() -> None:
    """`show` said '45 connections, 45 denied' where the 45 denied were names."""
    from boxy.outcome import Counters

    running = info(State.RUNNING)
    running.counters = Counters(connections=45, names_denied=45, destinations=3)
    (line,) = [ln for ln in text.show_lines(running, NOW) if ln.startswith("network")]
    assert line.startswith("network   45 connections (0 denied), 45 names denied, up 0B")
    running.counters = Counters(names_denied=1)
    (line,) = [ln for ln in text.show_lines(running, NOW) if ln.startswith("network")]
    assert line.startswith("network   0 connections (0 denied), 1 name denied, up 0B")


def test_counts_that_may_be_short_say_at_least() -> None:
    from boxy.outcome import Counters

    running = info(State.RUNNING)
    running.counters = Counters(connections=6999, denials=6999, destinations=1, exact=False)
    (line,) = [ln for ln in text.show_lines(running, NOW) if ln.startswith("network")]
    assert line.startswith("network   at least 6999 connections (at least 6999 denied), up")
    board = text.Board(running)
    assert " at least 6999 connection(s)  at least 6999 denied " in board.render(NOW)[1]
    assert Counters.from_wire(running.counters.to_wire()) == running.counters
    assert Counters.from_wire({"connections": 3}).exact  # an older build's record


def test_show_says_where_each_published_port_leads() -> None:
    running = info(State.RUNNING)
    running.ports = ["127.0.0.1:8080:3000", "[::1]:9090:90"]
    lines = text.show_lines(running, NOW)
    assert "port      127.0.0.1:8080 leads to 3000 inside" in lines
    assert "port      [::1]:9090 leads to 90 inside" in lines
    assert SessionInfo.from_wire(running.to_wire()) == running
