"""Following a session from its client (run, attach): the client's stdio is the
session's until it ends or the client detaches (Ctrl-]); signals and window sizes
are passed on, and a daemon that stops answering ends the wait. Nothing here is
imported before a run is sent but what the send needs (docs/design.md, "Processes")."""

from __future__ import annotations

import os
import time

from boxy import INTERFACE as IFACE
from boxy.errors import DaemonError
from boxyctl import sig
from boxyctl.output import say

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from boxy.outcome import Outcome, RunReply
    from boxy.varlink import Client
    from boxyctl.tty import Raw


class Summary:
    """What --report writes: the session's id, the denials said as they happened
    (-v), and how it ended. COUNTING: ask boxyd for the gateway's count at the end
    (a round trip only --report needs)."""

    def __init__(self, counting: bool = False) -> None:
        self.counting = counting
        self.id = ""
        self.notices: list[str] = []
        self.outcome: Outcome | None = None
        self.denials: int | None = None
        self.refused: tuple[int, str] | None = None  # boxyd's refusal: exit status, message


ANSWER_WAIT = 5.0  # seconds after a forwarded signal before asking whether boxyd answers
# seconds after a SIGTERM, SIGHUP or SIGQUIT passed on to a running session before the
# client ends whatever boxyd does (its grace is 5 s; the checks after a run can take
# longer: `boxyctl show` has the outcome then)
END_WAIT = 12.0
ENDING = (sig.SIGTERM, sig.SIGHUP, sig.SIGQUIT)


def stdio() -> list[int]:
    """Our fds 0–2 for the payload: open, on /dev/null if they were closed (main made
    sure of that before anything was opened: boxy/stdfds.py)."""
    return [0, 1, 2]


def _daemon_answers(timeout: float = 2.0) -> bool:
    """Does boxyd answer a Version call on a fresh connection (from a signal handler,
    while the run's own connection is blocked in recv)?"""
    import socket

    from boxy.paths import socket_path_str
    from boxy.varlink import encode

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_path_str())
        sock.sendall(encode({"method": f"{IFACE}.Version", "parameters": {}}))
        return bool(sock.recv(4096))
    except OSError:
        return False
    finally:
        sock.close()


def decode(params: dict[str, Any]) -> RunReply:
    from boxy.client import read_reply

    return read_reply(params)


class HungUp(Exception):
    """The terminal of an `attach` hung up (an ssh drop): the client leaves."""


class _Waiting:
    """The signals a following client passes on (SIGINT, SIGTERM, SIGHUP, SIGQUIT)
    and the watchdog after one: a second one, or a daemon that stops answering
    after the first, ends the wait (never a client that ignores ^C forever).
    HANGUP_LEAVES (attach): a SIGHUP is our own terminal gone, not the session's
    business: the client leaves, and boxyd detaches the session (docker, tmux)."""

    def __init__(self, sid: list[str], hangup_leaves: bool = False) -> None:
        from boxy.client import Controls

        self.sid = sid
        self.hangup_leaves = hangup_leaves
        self.controls = Controls()  # Signal, Resize: never on the stream's connection
        self.got: list[int] = []
        self.end_by: list[float] = []  # when a SIGTERM (HUP, QUIT) ends the wait

    def install(self) -> None:
        sig.signal(sig.SIGALRM, self.still_there)
        for s in (sig.SIGINT, sig.SIGTERM, sig.SIGHUP, sig.SIGQUIT):
            sig.signal(s, self.forward)

    def stop_waiting(self, why: str) -> DaemonError:
        sig.setitimer(sig.ITIMER_REAL, 0)
        # the connection closes as we go: boxyd hangs the session up (SIGHUP, then a stop)
        sid = self.sid
        tail = f"; boxyd stops session {sid[0]} when it sees this client gone" if sid else ""
        return DaemonError(f"{why}: stopped waiting for boxyd{tail}")

    def forward(self, signum: int, _frame: object) -> None:
        if signum == sig.SIGHUP and self.hangup_leaves:
            raise HungUp
        self.got.append(signum)
        name = sig.name(signum)
        if len(self.got) > 1:
            raise self.stop_waiting(f"{name} again")
        if not self.sid:  # nothing runs yet to pass it on to
            raise self.stop_waiting(f"{name} before the session started")
        self.controls.send(f"{IFACE}.Signal", {"id": self.sid[0], "signal": signum})
        if signum in ENDING:
            self.end_by.append(time.monotonic() + END_WAIT)
        sig.setitimer(sig.ITIMER_REAL, ANSWER_WAIT)

    def still_there(self, _signum: int, _frame: object) -> None:
        name = sig.name(self.got[0])
        if self.end_by and time.monotonic() >= self.end_by[0]:
            raise self.stop_waiting(
                f"no outcome within {END_WAIT:g}s of the "
                f"{name} (`boxyctl show {self.sid[0]}` will have it)"
            )
        if not _daemon_answers():
            raise self.stop_waiting(f"boxyd did not answer within {ANSWER_WAIT:g}s of the {name}")
        left = self.end_by[0] - time.monotonic() if self.end_by else ANSWER_WAIT
        sig.setitimer(sig.ITIMER_REAL, max(0.05, min(ANSWER_WAIT, left)))

    def winch(self, rows: int, cols: int) -> None:
        if self.sid:
            self.controls.send(f"{IFACE}.Resize", {"id": self.sid[0], "rows": rows, "cols": cols})


def follow(
    client: Client,
    method: str,
    params: dict[str, Any],
    sid: list[str],
    summary: Summary | None = None,
) -> int:
    """Run or Attach: our stdio (a terminal in raw mode) is the session's until it
    ends or we detach (Ctrl-]; for Attach also a hangup: 128+SIGHUP); signals and
    window sizes are passed on."""
    waiting = _Waiting(sid, hangup_leaves=method == "Attach")
    waiting.install()
    try:
        return _follow(client, method, params, waiting, summary)
    except HungUp:
        say(f"the terminal hung up; session {sid[0]} goes on, detached")
        return 128 + sig.SIGHUP


def _follow(
    client: Client,
    method: str,
    params: dict[str, Any],
    waiting: _Waiting,
    summary: Summary | None,
) -> int:
    """follow's relay, raw mode around it on a terminal, and how it ended."""
    sid = waiting.sid
    try:
        if not os.isatty(0):
            final = _send_and_relay(client, method, params, waiting, None, summary)
        else:
            from boxy import termsettings
            from boxyctl import tty  # threading and termios: only for a terminal

            # Raw before the payload can write a byte (its first lines came out as
            # \r\r\n otherwise); the sandbox's PTY gets the settings from before.
            params = {**params, "terminal": termsettings.capture(0)}
            with tty.raw_mode(0) as term:
                final = _send_and_relay(client, method, params, waiting, term, summary)
    finally:
        sig.setitimer(sig.ITIMER_REAL, 0)  # no liveness ping past the run
        waiting.controls.close()
    from boxy.outcome import Detached, Ended

    if summary is not None:
        summary.id = sid[0] if sid else getattr(final, "id", "")
        summary.outcome = final.outcome if isinstance(final, Ended) else None
    if isinstance(final, Detached):
        say(f"detached from session {final.id}; `boxyctl attach {final.id}` takes it back")
        return 0
    if isinstance(final, Ended):
        return report(final.outcome)
    raise DaemonError(f"{method}: boxyd ended the call without saying how the session ended")


def _send_and_relay(
    client: Client,
    method: str,
    params: dict[str, Any],
    waiting: _Waiting,
    term: Raw | None,
    summary: Summary | None,
) -> RunReply | None:
    """Send the call (stream() sends at once), then relay until its last reply: the
    replies' types are imported in _relay, while boxyd starts the sandbox; what the
    client imports before the send is on every run's critical path (docs/design.md,
    "Processes")."""
    return _relay(waiting, client.stream(f"{IFACE}.{method}", params, fds=stdio()), term, summary)


def _relay(
    waiting: _Waiting,
    replies: Iterator[dict[str, Any]],
    term: Raw | None,
    summary: Summary | None = None,
) -> RunReply | None:
    """Act on each streamed reply; the last one (Detached or Ended) is returned."""
    from boxy.outcome import Notice, Running, Stopped

    sid = waiting.sid
    for params in replies:
        reply = decode(params)
        if isinstance(reply, Notice):  # -v: a denial, as it happens
            say(reply.text)
            if summary is not None:
                summary.notices.append(reply.text)
        elif isinstance(reply, Stopped):  # ^Z: stop with the payload
            if term is not None:
                term.suspend()
                if sid:  # `fg`: the payload goes on too
                    waiting.controls.send(f"{IFACE}.Signal", {"id": sid[0], "signal": sig.SIGCONT})
        elif isinstance(reply, Running):
            sid[:] = [reply.id]
            for w in reply.warnings:
                say(w)
            if term is not None:
                from boxyctl import tty

                tty.on_winch(waiting.winch)
        else:
            return reply
    return None


def report(outcome: Outcome) -> int:
    """The end of a run, on stderr; the payload's exit status."""
    for w in outcome.warnings:  # a run that never started: not said yet
        say(w)
    if outcome.destinations:  # a run with network that went somewhere: where
        from boxy.outcome import destinations_table

        head, _, table = destinations_table(outcome.destinations).partition("\n")
        say(head)
        import contextlib

        with contextlib.suppress(OSError):
            os.write(2, table.encode(errors="replace"))
    for note in outcome.notes:
        say(note)
    if outcome.message:
        say(outcome.message)
    for line in outcome.findings:
        say(line)
    return outcome.exit_status
