"""boxyctl (also installed as boxy): the client. Imports neither asyncio, D-Bus nor
dnspython to run a command: start-up time is part of every sandboxed run."""

from __future__ import annotations

import errno
import io
import os
import pwd
import sys
import time

from boxy import INTERFACE as IFACE
from boxy import VERSION
from boxy.errors import BoxyError, Busy, DaemonError, UsageError
from boxyctl import sig

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from boxy.outcome import Outcome, RunReply
    from boxy.request import RunRequest
    from boxy.varlink import Client
    from boxyctl.tty import Raw
    from boxyd.config.projectconfig import Project


def _prog() -> str:
    from boxyctl.cli import prog_name

    return prog_name(sys.argv[0] if sys.argv else "boxyctl")


def say(msg: str) -> None:
    """One line on stderr; \\r\\n when the terminal may be in raw mode. A control
    character in the message (a newline in a path, an escape sequence in a file name)
    is shown escaped: one line, and nothing that drives the terminal."""
    end = "\r\n" if os.isatty(2) else "\n"
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in msg)
    import contextlib  # here: not imported before a run is sent (docs/design.md)

    with contextlib.suppress(OSError):  # stderr closed or full: nowhere left to say it
        os.write(2, f"{_prog()}: {text}{end}".encode(errors="replace"))


class _ClosedStdout(io.TextIOBase):
    """sys.stdout when boxyctl was started with it closed: a write fails as it would."""

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "it is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "it is closed")


def _cwd() -> str:
    """The current directory, or "" when it was removed (cli.parse says so for `run`)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """Never a traceback, whatever state stdout or the current directory is in: one
    line on stderr and an exit status (BOXY_DEBUG=1 shows the traceback of a bug)."""
    from boxy import stdfds

    stdfds.ensure()  # no socket of ours may land on 0-2 (the launcher did it first)
    if sys.stdout is None:  # started with fd 1 closed: it holds /dev/null now
        sys.stdout = _ClosedStdout()
    try:
        status = _main(argv)
        sys.stdout.flush()
        return status
    except OSError as e:  # stdout closed, full (/dev/full) or a closed pipe
        if e.errno not in (errno.EBADF, errno.ENOSPC, errno.EPIPE, errno.EIO):
            raise
        say(f"cannot write to standard output: {e.strerror}")
        # the interpreter flushes stdout again at exit: let that one land nowhere
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        return 1
    except Exception as e:  # a bug: still one line
        if os.environ.get("BOXY_DEBUG"):
            raise
        say(f"internal error: {type(e).__name__}: {e} (BOXY_DEBUG=1 shows where)")
        return 1


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["hook"]:  # before cli.parse: `hook claude` runs before every command
            from boxyctl import hook

            return hook.main(argv[1:], _cwd(), say)
        from boxyctl import cli

        cmd = cli.parse(argv, environ=dict(os.environ), cwd=_cwd(), prog=_prog())
        if cmd.name == "help":
            sys.stdout.write(cmd.args["text"])
            return 0
        if cmd.name == "version":
            from boxy.buildid import build_id

            print(f"boxy {VERSION} (build {build_id()})")
            return 0
        if cmd.name == "run":
            return run(cmd.args)
        if cmd.name == "doctor":
            from boxyctl.doctor import run as doctor

            return doctor(as_json=cmd.args["json"])
        if cmd.name == "daemon":
            return daemon(cmd.args)
        if cmd.name == "profile":
            return profile(cmd.args)
        if cmd.name == "cache":
            return cache(cmd.args)
        if cmd.name == "setup":
            return setup()
        if cmd.name == "trust":
            return trust(cmd.args)
        if cmd.name == "completion":
            from boxyctl import completion

            sys.stdout.write(
                {"bash": completion.bash, "zsh": completion.zsh, "fish": completion.fish}[
                    cmd.args["shell"]
                ]()
            )
            return 0
        if cmd.name in ("ps", "show"):
            return sessions(cmd.name, cmd.args)
        if cmd.name == "stop":
            return stop(cmd.args)
        if cmd.name == "watch":
            return watch(cmd.args)
        if cmd.name == "logs":
            return logs(cmd.args)
        if cmd.name == "attach":
            return attach(cmd.args)
        raise AssertionError(f"unhandled command {cmd.name}")
    except BoxyError as e:
        say(str(e))
        return e.exit_status
    except KeyboardInterrupt:
        return 130


def _stdio() -> list[int]:
    """Our fds 0–2 for the payload: open, on /dev/null if they were closed (main made
    sure of that before anything was opened: boxy/stdfds.py)."""
    return [0, 1, 2]


def run(args: dict[str, Any]) -> int:
    """A run; with --report FILE its summary is written there as it ends."""
    summary = _Summary(counting=bool(args.get("report")))
    try:
        status = _run(args["request"], summary)
    except BoxyError as e:  # refused before it started: the report says so too
        if args.get("report"):
            summary.refused = (e.exit_status, str(e))
            _write_report(args["report"], summary)
        raise
    if args.get("report"):
        _write_report(args["report"], summary)
    return status


class _Summary:
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


def _write_report(path: str, summary: _Summary) -> None:
    """Written whole under a temporary name in FILE's directory, then renamed over
    FILE: a reader sees the old file or the new one, never half of one."""
    import json
    import tempfile

    out = summary.outcome
    doc: dict[str, Any] = {
        "id": summary.id or None,
        "exit_status": out.exit_status if out else None,
        "reason": out.reason.value if out else None,
        "state": out.state.value if out else None,
        "signal": out.signal if out else None,
        "message": (out.message or None) if out else None,
        "destinations": [d.to_wire() for d in out.destinations] if out else [],
        "refusals": [r.to_wire() for r in out.refusals] if out else [],
        "notices": summary.notices,
        "denials": summary.denials,
        "findings": list(out.findings) if out else [],
        "notes": list(out.notes) if out else [],
        "warnings": list(out.warnings) if out else [],
    }
    if summary.refused is not None:
        doc["exit_status"], doc["message"] = summary.refused
    directory = os.path.dirname(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".boxy-report.", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            import contextlib

            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise BoxyError(f"--report {path}: not written: {e.strerror}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _run(request: RunRequest, summary: _Summary) -> int:
    from boxy.buildid import build_id
    from boxy.client import with_retries

    request.build = build_id()
    # until a session follows (_follow): connecting, starting boxyd, `run -d`'s call
    for s in _ENDING:
        sig.signal(s, _end_now)

    def once(client: Client, req: RunRequest) -> int:
        status = _run_once(client, req, summary)
        if summary.counting and summary.id and summary.outcome is not None:
            summary.denials = _denials(client, summary.id)
        return status

    return with_retries(request, once, environ=os.environ, say=say)


ANSWER_WAIT = 5.0  # seconds after a forwarded signal before asking whether boxyd answers
# seconds after a SIGTERM, SIGHUP or SIGQUIT passed on to a running session before the
# client ends whatever boxyd does (its grace is 5 s; the checks after a run can take
# longer: `boxyctl show` has the outcome then)
END_WAIT = 12.0
_ENDING = (sig.SIGTERM, sig.SIGHUP, sig.SIGQUIT)


def _end_now(signum: int, _frame: object) -> None:
    """No session to pass it on to yet: the client ends (a session boxyd starts for a
    client already gone is stopped as it notices)."""
    raise DaemonError(f"{sig.name(signum)} before the session started: stopped waiting for boxyd")


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


def _denials(client: Client, sid: str) -> int | None:
    """The gateway's count of refused connections, for --report (None: not known)."""
    try:
        session = client.call(f"{IFACE}.Show", {"id": sid}).get("session") or {}
        return int(session.get("counters", {}).get("denials", 0))
    except (BoxyError, OSError, ValueError, AttributeError):
        return None


def _run_once(client: Client, request: RunRequest, summary: _Summary | None = None) -> int:
    if request.options.detach:
        return _run_detached(client, request)
    return _follow(client, "Run", request.to_wire(), [], summary)


def _run_detached(client: Client, request: RunRequest) -> int:
    """run -d: the session gets a terminal of its own (this one's settings, when
    there is one) and none of our fds; its id on stdout."""
    if os.isatty(0):
        from boxy import termsettings
        from boxy.request import Terminal

        request.terminal = Terminal.from_wire(termsettings.capture(0))
    from boxy.outcome import Ended, Running

    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        reply = _decode(client.call(f"{IFACE}.Run", request.to_wire(), fds=[null, null, null]))
    finally:
        os.close(null)
    if isinstance(reply, Ended):  # it never started: how it ended
        return _report(reply.outcome)
    if not isinstance(reply, Running):
        raise DaemonError(f"run -d: boxyd answered {reply.kind} instead of the session's id")
    for w in reply.warnings:
        say(w)
    print(reply.id)
    return 0


def _decode(params: dict[str, Any]) -> RunReply:
    from boxy.client import read_reply

    return read_reply(params)


class _Waiting:
    """The signals a following client passes on (SIGINT, SIGTERM, SIGHUP, SIGQUIT)
    and the watchdog after one: a second one, or a daemon that stops answering
    after the first, ends the wait (never a client that ignores ^C forever)."""

    def __init__(self, sid: list[str]) -> None:
        from boxy.client import Controls

        self.sid = sid
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
        self.got.append(signum)
        name = sig.name(signum)
        if len(self.got) > 1:
            raise self.stop_waiting(f"{name} again")
        if not self.sid:  # nothing runs yet to pass it on to
            raise self.stop_waiting(f"{name} before the session started")
        self.controls.send(f"{IFACE}.Signal", {"id": self.sid[0], "signal": signum})
        if signum in _ENDING:
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


def _follow(
    client: Client,
    method: str,
    params: dict[str, Any],
    sid: list[str],
    summary: _Summary | None = None,
) -> int:
    """Run or Attach: our stdio (a terminal in raw mode) is the session's until it
    ends or we detach (Ctrl-]); signals and window sizes are passed on."""
    waiting = _Waiting(sid)
    waiting.install()
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
        return _report(final.outcome)
    raise DaemonError(f"{method}: boxyd ended the call without saying how the session ended")


def _send_and_relay(
    client: Client,
    method: str,
    params: dict[str, Any],
    waiting: _Waiting,
    term: Raw | None,
    summary: _Summary | None,
) -> RunReply | None:
    """Send the call (stream() sends at once), then relay until its last reply: the
    replies' types are imported in _relay, while boxyd starts the sandbox; what the
    client imports before the send is on every run's critical path (docs/design.md,
    "Processes")."""
    return _relay(waiting, client.stream(f"{IFACE}.{method}", params, fds=_stdio()), term, summary)


def _relay(
    waiting: _Waiting,
    replies: Iterator[dict[str, Any]],
    term: Raw | None,
    summary: _Summary | None = None,
) -> RunReply | None:
    """Act on each streamed reply; the last one (Detached or Ended) is returned."""
    from boxy.outcome import Notice, Running, Stopped

    sid = waiting.sid
    for params in replies:
        reply = _decode(params)
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


def attach(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect

    client = connect()
    try:
        return _follow(client, "Attach", {"id": args["id"]}, [args["id"]])
    finally:
        client.close()


def _report(outcome: Outcome) -> int:
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


def _stopping_line(session_id: str, kill: bool) -> str:
    from boxyd.daemon.session import GRACE

    if kill:
        return f"stopping session {session_id}: SIGKILL"
    return (
        f"stopping session {session_id}: SIGTERM, then SIGKILL after {GRACE:g}s "
        "if it is still running (-k: at once)"
    )


def print_json(doc: object) -> None:
    """--json: one document on stdout, its keys in a stable order."""
    import json

    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def sessions(name: str, args: dict[str, Any]) -> int:
    """ps [-a] [-q], show ID: questions for a running boxyd (none running: no
    session runs, and `ps -a`/`show` read the records it left). --json: the IDL's
    Session objects as List and Show send them."""
    from boxy.outcome import SessionInfo
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    client = connect()
    try:
        if name == "ps":
            reply = client.call(f"{IFACE}.List", {"all": bool(args.get("all"))})
            infos = [i for d in reply.get("sessions", []) if (i := SessionInfo.from_wire(d))]
            if args.get("json"):
                print_json({"sessions": [i.to_wire() for i in infos]})
                return 0
            if args.get("quiet"):
                lines = [i.id for i in infos]
            else:
                lines = text.ps_lines(infos, time.time(), dates=bool(args.get("all")))
        else:
            info = SessionInfo.from_wire(
                client.call(f"{IFACE}.Show", {"id": args["id"]}).get("session")
            )
            if info is None:
                raise DaemonError(f"{name}: boxyd sent no session")
            if args.get("json"):
                print_json(info.to_wire())
                return 0
            lines = text.show_lines(info, time.time())
    finally:
        client.close()
    for line in lines:
        print(line)
    return 0


def stop(args: dict[str, Any]) -> int:
    """stop [-k] ID...: each in turn (an unknown one is said, the others still
    stopped); the status of the worst."""
    from boxy.outcome import SessionInfo
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    status = 0
    client = connect()
    try:
        for sid in args["ids"]:
            say(_stopping_line(sid, bool(args["kill"])))  # the grace is waited out: say so
            try:
                got = client.call(f"{IFACE}.Stop", {"id": sid, "kill": bool(args["kill"])})
            except BoxyError as e:
                say(str(e))
                status = max(status, e.exit_status)
                continue
            info = SessionInfo.from_wire(got.get("session"))
            if info is None:
                raise DaemonError("stop: boxyd sent no session")
            print(text.stop_line(info), flush=True)
    finally:
        client.close()
    return status


LOGS_POLL = 0.3  # seconds between asking for more of a followed session's output


def logs(args: dict[str, Any]) -> int:
    """logs [-f] ID: the output boxyd keeps of a detached session (its record's
    output.log, bounded), as written; -f follows it until the session ends. Read
    through boxyd (Output): its state directory is the one that counts."""
    import base64

    from boxyctl.connect import connect

    client = connect()
    sid, offset = args["id"], 0
    try:
        while True:
            got = client.call(f"{IFACE}.Output", {"id": sid, "offset": offset})
            if not got.get("kept"):
                raise BoxyError(
                    f"logs: session {sid} kept no output (only a detached one's is: "
                    "run -d, or Ctrl-] in a run)"
                )
            sid = str(got.get("id") or sid)  # a prefix once: the id from then on
            data = base64.b64decode(str(got.get("data", "")))
            offset = int(got.get("offset", offset + len(data)))
            _write_out(data)
            if not data and (got.get("ended") or not args.get("follow")):
                return 0
            if not data:
                time.sleep(LOGS_POLL)
    finally:
        client.close()


def _write_out(data: bytes) -> None:
    """DATA to stdout as it is (a terminal's output: bytes, not text)."""
    sys.stdout.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def watch(args: dict[str, Any]) -> int:
    """One line per event as it happens (a pipe: `boxyctl watch ID | grep deny`); a
    finished session prints its summary. ^C ends the watching, not the session."""
    import time

    from boxy.outcome import SessionInfo
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    # ^C ends the watching (exit 130), even when started with SIGINT ignored (a
    # background job of a script): the session is not ours to stop
    sig.signal(sig.SIGINT, sig.default_int_handler())
    client = connect()
    screen = os.isatty(1)  # a terminal: repainted; a pipe: one line per event, no repaint
    last: SessionInfo | None = None
    board: text.Board | None = None
    painted = 0.0
    try:
        params = {"id": args["id"]} if args.get("id") else {}
        for reply in client.stream(f"{IFACE}.Watch", params):
            ev = reply.get("event")
            if isinstance(ev, dict):
                if board is not None:
                    board.event(ev)
                    # a flood repaints ten times a second, not once an event
                    if ev.get("kind") in ("counters", "state") or time.monotonic() - painted > 0.1:
                        _paint(board.render(time.time()))
                        painted = time.monotonic()
                elif ev.get("kind") != "counters":  # snapshots, not events
                    print(text.event_line(ev, color=False), flush=True)
            elif (info := SessionInfo.from_wire(reply.get("session"))) is not None:
                if last is None and not info.state.finished:
                    if screen:
                        board = text.Board(info)
                        _paint(board.render(time.time()))
                    else:
                        print(text.header_line(info, time.time()), flush=True)
                last = info
    finally:
        client.close()
    if last is not None and last.state.finished:
        for line in text.show_lines(last, time.time()):
            print(line)
    return 0


def _paint(lines: list[str]) -> None:
    """Home, clear, the board: one write, so a frame never shows half drawn."""
    sys.stdout.write("\x1b[H\x1b[J" + "\n".join(lines) + "\n")
    sys.stdout.flush()


def trust(args: dict[str, Any]) -> int:
    """`trust`: approve this directory's .boxy.yaml as it is now (printed: what is
    approved is what you see); --list, --revoke. No daemon needed."""
    from boxy.paths import config_home
    from boxyctl.sessions import clean
    from boxyd.config import projectconfig

    home = config_home(os.environ.get("HOME"))
    me = pwd.getpwuid(os.getuid())
    if args["list"]:
        if args.get("json"):
            print_json({"approvals": _approvals(home)})
            return 0
        for line in _approval_lines(home):
            print(line)
        return 0
    if not args.get("cwd"):
        raise UsageError("trust: the current directory was removed; cd to the project")
    workdir = os.path.realpath(args["cwd"])
    if args["revoke"]:
        n = projectconfig.revoke(workdir, home)
        say(f"revoked {n} approval{'s' if n != 1 else ''} for {workdir}")
        return 0
    # read as a run reads it: the same files, the same environment (projectconfig.run_env);
    # parsed here, in this command's own process (boxyd parses them apart: parsedoor.py)
    from boxyd.config import parsedoor

    parsedoor.allow_local()
    project = projectconfig.read(workdir, projectconfig.run_env(me.pw_dir, me.pw_name, os.environ))
    if project.empty:
        raise UsageError(
            f"trust: {workdir} has no {projectconfig.NAME}, and no .npmrc or "
            "pip.conf of its own naming a registry"
        )
    wider = _check_project(project, me.pw_dir)
    if project.config is not None:
        print(f"{project.path}:")
        for line in project.text.splitlines():
            print(f"  {clean(line)}")
    for reg in project.registries:
        print(f"{clean(reg.source)}: {clean(reg.key)} = {clean(reg.shown)}")
    if wider:
        say(f"beyond the default profile this allows: {clean('; '.join(wider))}")
    projectconfig.approve(project, home)
    say(
        f"approved {workdir}'s configuration as shown; a change to what widens the sandbox "
        "needs `boxyctl trust` again"
    )
    return 0


def _approvals(home: str) -> list[dict[str, Any]]:
    """`trust --list --json`: each approval's work directory, when, digest, what."""
    from boxyd.config import projectconfig

    return [
        {
            "workdir": r["workdir"],
            "approved_at": r.get("approved_at"),
            "digest": r.get("digest"),
            "boxy_yaml": bool(r.get("boxy_yaml")),
            "registries": [
                {"key": x.get("key"), "url": x.get("url")}
                for x in r.get("registries", [])
                if isinstance(x, dict)
            ],
        }
        for r in projectconfig.approvals(home)
    ]


def _approval_lines(home: str) -> list[str]:
    """`trust --list`: one line per approval (when, digest, work directory, what)."""
    from boxyctl.sessions import clean
    from boxyd.config import projectconfig

    out = []
    for r in projectconfig.approvals(home):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("approved_at", 0)))
        what = [projectconfig.NAME] if r.get("boxy_yaml") else []
        what += [
            f"{x.get('key')} {x.get('url')}" for x in r.get("registries", []) if isinstance(x, dict)
        ]
        out.append(
            f"{when}  {str(r.get('digest', ''))[:12]}  {clean(r['workdir'])}  "
            f"{clean(', '.join(map(str, what)))}".rstrip()
        )
    return out


def _check_project(project: Project, home: str) -> list[str]:
    """What is approved must load: its profile and keys, as a run would take them.
    Returns what of it is wider than the default profile (said before approving)."""
    from boxyd.config import layering

    return [str(k) for k in layering.project_widening(project, home)]


def setup() -> int:
    """Install the user units; an idle boxyd started on demand makes way for the
    socket (one with sessions keeps them, and nobody reaches it once they end)."""
    from boxyctl import userunits
    from boxyctl.connect import connect, wait_gone

    environ = dict(os.environ)
    if (
        userunits.user_manager(environ)
        and userunits.systemctl("is-active", "boxyd.socket").stdout.strip() != "active"
    ):
        try:
            client = connect(start=False)
        except DaemonError:
            client = None
        if client is not None:
            try:
                client.call(f"{IFACE}.Shutdown", {})
                wait_gone()
            except Busy as e:
                say(f"setup: the running boxyd keeps its sessions ({e}); new runs go to the socket")
            finally:
                client.close()
    return userunits.setup(environ, print)


def daemon(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect, wait_gone

    action = args.get("action", "status")
    if action == "status":
        try:
            client = connect(start=False)
        except DaemonError:
            print("boxyd: not running")
            return 3  # as `systemctl is-active`: scripts test the status
        st = client.call(f"{IFACE}.DaemonStatus", {})
        print(
            f"boxyd: running  pid {st.get('pid')}  build {st.get('build')}  "
            f"sessions running {st.get('sessions_running')}  up {st.get('uptime')}s"
        )
        return 0
    try:
        client = connect(start=False)
        try:
            client.call(f"{IFACE}.Shutdown", {"force": bool(args.get("force"))})
        except Busy as e:
            say(f"daemon {action}: {e}")
            return 1
        wait_gone(timeout=15.0 if args.get("force") else 5.0)  # forced: sessions get a grace
    except DaemonError:
        pass
    if action == "restart":
        connect().close()
        print("boxyd: restarted")
    return 0


def cache(args: dict[str, Any]) -> int:
    """`cache list` / `cache clean [--all]`: boxy's own directories, no daemon needed."""
    from boxy import values
    from boxyd.config import caches

    found = caches.entries()
    if args["action"] == "list" and args.get("json"):
        print_json(
            {
                "caches": [
                    {
                        "profile": e.profile,
                        "size": e.size,
                        "last_used": e.last_used,
                        "workdir": e.workdir,
                        "path": e.path,
                    }
                    for e in found
                ]
            }
        )
        return 0
    if args["action"] == "list":
        for e in found:
            age = values.format_duration(max(0.0, time.time() - e.last_used))
            print(f"{e.profile:<8}  {values.format_size(e.size):>9}  used {age} ago  {e.workdir}")
        return 0
    here = os.path.realpath(args["cwd"]) if args.get("cwd") else None
    gone = [e for e in found if args["all"] or e.workdir == here]
    for e in gone:
        caches.remove(e)
    say(
        f"removed {len(gone)} package cache{'s' if len(gone) != 1 else ''} "
        f"({values.format_size(sum(e.size for e in gone))})"
    )
    return 0


def profile(args: dict[str, Any]) -> int:
    """`profile list` / `profile show NAME`: as a run in this directory would load it."""
    from boxyd.config import layering, profiles, profileview
    from boxyd.config.registries import Registries
    from boxyd.daemon.stage2proc import Template
    from boxyd.daemon.toolbox import Toolshed

    home = os.environ.get("HOME") or os.path.expanduser("~")
    if args.get("action") == "list" and args.get("json"):
        print_json({"profiles": profileview.list_rows(home)})
        return 0
    if args.get("action") == "list":
        for line in profileview.list_lines(home):
            print(line)
        return 0
    name = args["name"]
    if profiles.is_path(name):
        name = os.path.abspath(os.path.expanduser(name))
    kind, location = profiles.where(name, home)
    workdir = _cwd() or home
    # the templates filled as a run here fills them ({cache} is per profile)
    context = layering.profile_context(workdir, home, name)
    prof = profiles.load_profile(name, context=context)  # a file that is no profile: refused
    # npm and pip are asked as boxyd asks them: in a tool sandbox, never from this tree
    template = Template()
    template.start()
    registry = Registries(
        dict(os.environ), tools=Toolshed(template.spawn, 30.0), writable=[workdir]
    )
    try:
        if args.get("json"):
            print_json(profileview.show_doc(prof, registry, kind, location))
        else:
            for line in profileview.show_lines(prof, registry, kind, location):
                print(line)
    finally:
        registry.close()
        template.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
