"""The Python library (`import boxy`): runs in boxyd's sandboxes, as boxyctl makes
them, over the same varlink connection (boxy.client finds and starts boxyd).

Keywords are the option table's fields (boxy.options; `allow_hosts` and the like
are the plural names of the repeatable ones). Values are Python's (a size in bytes,
a duration in seconds, a list of hosts) or the text the flag takes ("2GiB", "10m");
either is read by the functions the command line uses, so a bad one is the same
UsageError, and a refused combination too, raised before anything starts. An
unknown keyword is a TypeError. The library never prints: what boxyctl says on
stderr is in the Result.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time

from boxy import stdfds, termsettings, values
from boxy.buildid import build_id
from boxy.client import Controls, client_env, connect, read_reply, with_retries
from boxy.errors import DaemonError, UsageError
from boxy.events import Event, Snapshot, decode
from boxy.ident import INTERFACE
from boxy.options import BY_FIELD, Option, check_combinations
from boxy.outcome import Detached, Ended, Notice, Outcome, Refusal, Running, SessionInfo, Stopped
from boxy.request import (
    CopyItem,
    EnvItem,
    RunOptions,
    RunRequest,
    Secret,
    Terminal,
    Value,
    env_entry,
    secret_entry,
)
from boxy.varlink import Client

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
    from typing import IO, Any

    from boxy.outcome import Reason, RunReply

    Stdio = int | IO[Any] | bytes | None

PIPE = -1  # capture the stream (Result.stdout, Result.stderr)
DEVNULL = -3  # /dev/null
# the repeatable options under their plural names (the field's name works too)
ALIASES = {
    "allow_hosts": "allow_host",
    "allow_ports": "allow_port",
    "allow_cidrs": "allow_cidr",
    "secrets": "secret",
}
# fields the library sets itself: start() detaches, run() follows
_OWN = ("detach",)
DETACH_KEY = b"\x1d"  # Ctrl-]: boxyd's PTY relay lets the session go on without us


# -- the options: Python values -> RunOptions, checked as the command line checks them --


def run_options(given: Mapping[str, Any], caller: str) -> RunOptions:
    """GIVEN (keyword -> value; None means not given) as RunOptions, each value read
    as its flag's text is and the table's refused combinations refused."""
    fields: dict[str, Any] = {}
    for key, value in given.items():
        field = ALIASES.get(key, key)
        if field not in BY_FIELD or field in _OWN:
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}")
        if field in fields:
            raise TypeError(f"{caller}() got {field!r} twice (as {key!r} too)")
        if value is not None:
            fields[field] = _value(BY_FIELD[field], value)
    options = RunOptions(**fields)
    check_combinations(options)
    return options


def _value(option: Option, value: Any) -> Any:
    if option.kind == "true":
        if not isinstance(value, bool):
            raise UsageError(f"{option.flag}: expected True or False, not {value!r}")
        return value
    if option.kind == "value":
        return _one(option, value)
    if option.type == "env":
        return _env(value)
    if option.type == "secret":
        return _secrets(value)
    single = (str, bytes, os.PathLike, tuple, int, float, values.HostSpec, values.PortMapping)
    items = [value] if isinstance(value, single) else list(value)
    out: list[Any] = []
    for item in items:
        got = _one(option, item)
        out += got if option.type == "cidrs" else [got]
    return out


def _text(option: Option, value: object) -> str:
    """A number as the text its flag would get; text as it is."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise UsageError(f"{option.flag}: {value!r} is not a number or its text")


def _one(option: Option, value: Any) -> Any:
    flag, kind = option.flag, option.type
    if kind == "path":
        return _path(flag, value)
    if kind == "profile":
        name = _str(flag, value)
        return _path(flag, name) if "/" in name or name.endswith((".yaml", ".yml")) else name
    if kind == "copy":
        src, dst = value if isinstance(value, tuple) else (_str(flag, value), None)
        if not isinstance(value, tuple) and ":" in src:
            src, _, dst = src.partition(":")
        return CopyItem(_path(flag, src), _path(flag, dst) if dst else None)
    if kind == "choice":
        if value not in (option.choices or ()):
            raise UsageError(f"{flag}: {value!r} is not one of {', '.join(option.choices or ())}")
        return value
    if (kind, type(value)) in (("host", values.HostSpec), ("publish", values.PortMapping)):
        return value  # already the value: as given
    if kind in ("host", "cidrs", "publish"):
        return values.from_text(kind, _str(flag, value), flag)
    return values.from_text(kind, _text(option, value), flag)  # a number or its text


def _str(flag: str, value: object) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"{flag}: {value!r} is not a string")
    return os.fspath(value)


def _path(flag: str, value: object) -> str:
    """Absolute against our cwd, ~ from our HOME (as boxyctl reads a path)."""
    text = _str(flag, value)
    if not text:
        raise UsageError(f"{flag}: empty path")
    if text == "~" or text.startswith("~/"):
        text = os.path.expanduser(text)
    return os.path.normpath(os.path.abspath(text))


def _env(value: Mapping[str, str | None] | Iterable[str]) -> list[EnvItem]:
    """{NAME: VALUE} (None: ours, as -e NAME) or ["NAME=VALUE", "NAME"]."""
    if hasattr(value, "items"):
        return [
            env_entry(str(k), os.environ, None if v is None else str(v)) for k, v in value.items()
        ]
    return [env_entry(str(e), os.environ) for e in ([value] if isinstance(value, str) else value)]


def _secrets(value: Mapping[str, str] | Iterable[str]) -> list[Secret]:
    """{NAME: VALUE}, or NAMEs whose values come from our environment."""
    if hasattr(value, "items"):
        return [secret_entry(str(k), os.environ, str(v)) for k, v in value.items()]
    names = [value] if isinstance(value, str) else list(value)
    return [secret_entry(n, os.environ) for n in names]


def request(argv: Iterable[str] | str, options: Mapping[str, Any], caller: str) -> RunRequest:
    """A RunRequest as boxyctl would send it, from our cwd and environment. Every
    run, start and spawn_pty begins here: fds 0-2 are made open before the library
    opens anything (a pipe or a connection on fd 0 would be the payload's stdin)."""
    stdfds.ensure()
    command = [argv] if isinstance(argv, str) else [os.fspath(a) for a in argv]
    if not command or not command[0]:
        raise UsageError(f"{caller}: missing command")
    try:
        cwd = os.getcwd()
    except OSError:
        raise UsageError(f"{caller}: the current directory was removed") from None
    return RunRequest(
        command, cwd, run_options(options, caller), client_env(os.environ), build=build_id()
    )


# -- what a run ends with ---------------------------------------------------------------


class Result(Value):
    """How a run ended: EXIT_STATUS as a shell reports it (128+N for a signal), REASON
    (boxy.outcome.Reason: exit, signal, seccomp, timeout, setup, exec), DESTINATIONS
    (boxy.outcome.Destination rows, busiest first: name, connections, denied,
    addresses, bytes_up, bytes_down; [] when the network went nowhere), REFUSALS
    (boxy.outcome.Refusal rows: each kind of refusal once with its count, most
    frequent first: layer, proto, addr, port, host, reason, count), NOTICES (each
    denial as it was said while it ran, with verbose=True), FINDINGS (what the guard
    found afterwards); STDOUT and STDERR captured with PIPE."""

    __slots__ = (
        "id", "exit_status", "reason", "signal", "message", "destinations", "refusals",
        "notices", "findings", "notes", "warnings", "stdout", "stderr",
    )  # fmt: skip

    def __init__(self, sid: str, outcome: Outcome, notices: list[str] | None = None) -> None:
        self.id = sid
        self.exit_status: int = outcome.exit_status
        self.reason: Reason = outcome.reason
        self.signal, self.message = outcome.signal, outcome.message
        self.destinations, self.findings = outcome.destinations, outcome.findings
        self.notes, self.warnings = outcome.notes, outcome.warnings
        self.refusals: list[Refusal] = outcome.refusals
        self.notices: list[str] = list(notices or [])
        self.stdout: bytes | None = None
        self.stderr: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class _Stdio:
    """The three fds a run gets (the caller's, /dev/null, or our pipes) and the
    threads that feed and drain our pipes while it runs."""

    def __init__(self, specs: tuple[Stdio, Stdio, Stdio]) -> None:
        self.fds: list[int] = []
        self._theirs: list[int] = []  # the payload's ends we opened: closed once sent
        self._threads: list[threading.Thread] = []
        self._got: dict[int, bytearray] = {}
        try:
            for i, spec in enumerate(specs):
                self.fds.append(self._fd(i, spec))
        except BaseException:
            self.release()
            raise

    def _fd(self, i: int, spec: Stdio) -> int:
        if spec is None:  # ours, as subprocess passes it; a closed one: /dev/null
            try:
                os.fstat(i)
                return i
            except OSError:
                spec = DEVNULL
        if spec == DEVNULL:
            self._theirs.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
            return self._theirs[-1]
        if isinstance(spec, bytes) and i == 0:  # the payload's input, fed as it reads
            r, w = os.pipe2(os.O_CLOEXEC)
            self._thread(_feed, w, spec)
            self._theirs.append(r)
            return r
        if spec == PIPE and i > 0:
            r, w = os.pipe2(os.O_CLOEXEC)
            self._got[i] = bytearray()
            self._thread(_drain, r, self._got[i])
            self._theirs.append(w)
            return w
        if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
            return spec
        if hasattr(spec, "fileno"):
            return int(spec.fileno())
        what = ("stdin", "stdout", "stderr")[i]
        raise TypeError(f"{what}: expected None, PIPE, DEVNULL, a file or an fd, not {spec!r}")

    def _thread(self, target: Callable[[int, Any], None], fd: int, data: Any) -> None:
        t = threading.Thread(target=target, args=(fd, data), daemon=True)
        t.start()
        self._threads.append(t)

    def release(self) -> None:
        """boxyd holds its own copies once the run is under way: ours go."""
        for fd in self._theirs:
            os.close(fd)
        self._theirs = []

    def collect(self, result: Result) -> None:
        self.release()
        for t in self._threads:
            t.join(timeout=10)
        if 1 in self._got:
            result.stdout = bytes(self._got[1])
        if 2 in self._got:
            result.stderr = bytes(self._got[2])


def _feed(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError:  # the payload stopped reading (EPIPE): what it did not read is lost
        pass
    finally:
        os.close(fd)


def _drain(fd: int, into: bytearray) -> None:
    try:
        while chunk := os.read(fd, 65536):
            into += chunk
    finally:
        os.close(fd)


def _follow(
    controls: Controls,
    replies: Iterator[dict[str, Any]],
    notices: list[str],
    lock: threading.Lock | None = None,
) -> tuple[str, Ended | Detached]:
    """The replies after the first, to the last: notices kept, a stopped payload
    continued (no shell above us to stop) through CONTROLS (the stream's connection
    carries no other call). LOCK: held for a send, when callers' threads send on
    CONTROLS too."""
    for params in replies:
        reply = read_reply(params)
        if isinstance(reply, Notice):
            notices.append(reply.text)
        elif isinstance(reply, Stopped):
            with lock or contextlib.nullcontext():
                controls.send(f"{INTERFACE}.Signal", {"id": reply.id, "signal": signal.SIGCONT})
        elif isinstance(reply, (Ended, Detached)):
            return reply.id, reply
    raise DaemonError("boxyd ended the call without saying how the session ended")


def _last(sid: str, reply: Ended | Detached, notices: list[str]) -> Result:
    if isinstance(reply, Detached):
        raise DaemonError(f"session {sid} was detached; boxy.attach({sid!r}) takes it back")
    return Result(sid, reply.outcome, notices)


# -- runs --------------------------------------------------------------------------------


def run(
    argv: Iterable[str] | str,
    *,
    stdin: Stdio = DEVNULL,
    stdout: Stdio = None,
    stderr: Stdio = None,
    **options: Any,
) -> Result:
    """Run ARGV in a sandbox and wait for it to end. STDIN: DEVNULL (the default),
    None (ours), bytes (fed to it), a file or an fd; STDOUT, STDERR: None (ours), PIPE
    (captured in the Result), DEVNULL, a file or an fd. A terminal among them is
    relayed through boxyd's PTY, as for boxyctl. OPTIONS: see the module docstring."""
    req = request(argv, options, "run")
    stdio = _Stdio((stdin, stdout, stderr))
    try:

        def once(client: Client, req: RunRequest) -> Result:
            notices: list[str] = []
            replies = client.stream(f"{INTERFACE}.Run", req.to_wire(), fds=stdio.fds)
            first = read_reply(next(replies))
            stdio.release()  # boxyd has the fds now (a retry never follows a Running)
            if isinstance(first, (Ended, Detached)):
                return _last(first.id, first, notices)
            controls = Controls()
            try:
                return _last(*_follow(controls, replies, notices), notices)
            finally:
                controls.close()

        result = with_retries(req, once, environ=os.environ)
    finally:
        stdio.release()
    stdio.collect(result)
    return result


def start_request(argv: Iterable[str] | str, options: Mapping[str, Any]) -> RunRequest:
    """start()'s request: run's, detached (-d is start's to give, never a keyword)."""
    req = request(argv, options, "start")
    req.options.detach = True
    return req


def start(argv: Iterable[str] | str, **options: Any) -> Session:
    """Start ARGV in a sandbox in the background (boxyctl run -d): it gets a terminal
    of its own (Session.attach takes it) and none of our fds."""
    req = start_request(argv, options)

    def once(client: Client, req: RunRequest) -> Session:
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            reply = read_reply(client.call(f"{INTERFACE}.Run", req.to_wire(), fds=[null] * 3))
        finally:
            os.close(null)
        if not isinstance(reply, (Running, Ended)):
            raise DaemonError(f"start: boxyd answered {reply.kind} instead of the session's id")
        return Session(reply.id, reply.warnings if isinstance(reply, Running) else [])

    return with_retries(req, once, environ=os.environ)


class Session:
    """A session of boxyd by its ID (from start(), or sessions())."""

    def __init__(self, id: str, warnings: list[str] | None = None) -> None:
        self.id = id
        self.warnings = list(warnings or [])  # what was said as it started

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def info(self) -> SessionInfo:
        return show(self.id)

    def watch(self) -> Iterator[Snapshot | Event]:
        return watch(self.id)

    def stop(self, kill: bool = False) -> SessionInfo:
        return stop(self.id, kill=kill)

    def attach(self, *, cols: int = 80, rows: int = 24) -> SandboxedPTY:
        return attach(self.id, cols=cols, rows=rows)

    def wait(self, timeout: float | None = None) -> Result:
        """Until it has ended (TimeoutError after TIMEOUT seconds): how it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.02
        while True:
            info = show(self.id)
            if info.state.finished and info.outcome is not None:
                return Result(self.id, info.outcome)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"session {self.id} still {info.state.value}")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


# -- questions about sessions -----------------------------------------------------------


def _call(method: str, params: dict[str, Any]) -> dict[str, Any]:
    with connect() as client:
        return client.call(f"{INTERFACE}.{method}", params)


def _session(reply: dict[str, Any], what: str) -> SessionInfo:
    info = SessionInfo.from_wire(reply.get("session"))
    if info is None:
        raise DaemonError(f"{what}: boxyd sent no session")
    return info


def sessions(all: bool = False) -> list[SessionInfo]:
    """The sessions starting or running (ALL: every one on record too), oldest first."""
    got = _call("List", {"all": all}).get("sessions", [])
    return [i for d in got if (i := SessionInfo.from_wire(d)) is not None]


def show(id: str) -> SessionInfo:
    """One session in full; NoSuchSession for an id boxyd does not know."""
    return _session(_call("Show", {"id": id}), "show")


def stop(id: str, kill: bool = False) -> SessionInfo:
    """SIGTERM, SIGKILL 5 s later (KILL: now); returns the session as it ended."""
    return _session(_call("Stop", {"id": id, "kill": kill}), "stop")


def watch(id: str | None = None) -> Generator[Snapshot | Event, None, None]:
    """The session (ID; None: the only running one) as a Snapshot, then each of its
    events as it happens (boxy.events), then a Snapshot as it ended. A finished
    session: its Snapshot alone. Close the iterator to stop watching."""
    client = connect()
    try:
        for reply in client.stream(f"{INTERFACE}.Watch", {"id": id} if id else {}):
            ev = reply.get("event")
            if isinstance(ev, dict):
                yield decode(ev)
            elif (info := SessionInfo.from_wire(reply.get("session"))) is not None:
                yield Snapshot(info)
    finally:
        client.close()


# -- a terminal --------------------------------------------------------------------------


def _pty_pair(cols: int, rows: int) -> tuple[int, int, Terminal]:
    """A pty pair at ROWS x COLS, and the slave's settings from before it went raw:
    boxyd relays the slave (raw: bytes pass untouched) through the PTY it owns, which
    gets these settings (cooked, echo), as a raw terminal's client sends its own."""
    import tty  # termios: only for a terminal

    for n, what in ((cols, "cols"), (rows, "rows")):
        if type(n) is not int or not 0 < n < 65536:
            raise UsageError(f"spawn_pty: {what} {n!r} is not a size (1–65535)")
    master, slave = os.openpty()
    os.set_blocking(master, True)
    settings = termsettings.capture(slave)
    settings["winsize"] = [rows, cols, 0, 0]
    termsettings.apply(slave, settings)
    tty.setraw(slave)
    terminal = Terminal.from_wire(settings)
    assert terminal is not None
    return master, slave, terminal


class SandboxedPTY:
    """A sandboxed program on a terminal: read() its output, write() its input,
    resize() the window, wait() for its exit status. The session is followed by this
    object's connection: close() (or its end) hangs the payload up and stops the
    session it started (one it attached to is left detached); detach() leaves it
    running (boxy.attach takes it back)."""

    def __init__(self, client: Client, master: int, first: RunReply) -> None:
        self.id = first.id
        self._client, self._master = client, master
        self._controls = Controls()  # Resize, Signal: not on the stream's connection
        self._lock = threading.Lock()  # sends from callers' threads; receives in ours
        self._notices: list[str] = []
        self._last: Ended | Detached | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._replies: Iterator[dict[str, Any]] | None = None
        if isinstance(first, (Ended, Detached)):
            self._last = first
            self._done.set()

    def _start(self, replies: Iterator[dict[str, Any]]) -> None:
        if self._done.is_set():
            return
        self._replies = replies
        threading.Thread(target=self._follow, name=f"boxy-{self.id}", daemon=True).start()

    def _follow(self) -> None:
        assert self._replies is not None
        try:
            _, self._last = _follow(self._controls, self._replies, self._notices, self._lock)
        except BaseException as e:  # handed to wait()
            self._error = e
        finally:
            self._done.set()

    def fileno(self) -> int:
        """The master's fd (for select; read() and write() do the I/O)."""
        return self._master

    def read(self, timeout: float | None = None) -> bytes:
        """What the payload wrote (up to 64 KiB); b"" once the terminal has closed;
        TimeoutError when nothing came within TIMEOUT seconds."""
        if self._master < 0:
            return b""
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            raise TimeoutError(f"session {self.id}: no output within {timeout}s")
        try:
            return os.read(self._master, 65536)
        except OSError:  # EIO: every copy of the slave is closed: the session's ended
            return b""

    def write(self, data: bytes) -> int:
        """Type DATA (all of it). Ctrl-] (b"\\x1d") detaches, as on boxyctl's terminal."""
        view = memoryview(data)
        while view:
            view = view[os.write(self._master, view) :]
        return len(data)

    def resize(self, cols: int, rows: int) -> None:
        """The window is now COLS x ROWS: the payload's terminal follows (SIGWINCH)."""
        import fcntl
        import struct
        import termios

        fcntl.ioctl(self._master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        with self._lock:
            self._controls.send(f"{INTERFACE}.Resize", {"id": self.id, "rows": rows, "cols": cols})

    def wait(self, timeout: float | None = None) -> int:
        """The payload's exit status, once the session has ended (TimeoutError)."""
        return self._wait(timeout).exit_status

    @property
    def result(self) -> Result:
        """How it ended (wait()'s, in full)."""
        return self._wait(None)

    def _wait(self, timeout: float | None) -> Result:
        if not self._done.wait(timeout):
            raise TimeoutError(f"session {self.id} is still running")
        if self._error is not None:
            raise self._error
        assert self._last is not None
        return _last(self.id, self._last, self._notices)

    def detach(self, timeout: float = 10.0) -> None:
        """Leave the session running on its own terminal (Ctrl-]); then close."""
        self.write(DETACH_KEY)
        if not self._done.wait(timeout):
            raise TimeoutError(f"session {self.id} did not detach")
        self.close()

    def close(self) -> None:
        """Let go: a session this object started and still follows is hung up and
        stopped by boxyd; one it attached to (attach()) is left detached."""
        self._client.close()
        with self._lock:
            self._controls.close()
        if self._master >= 0:
            os.close(self._master)
            self._master = -1

    def __enter__(self) -> SandboxedPTY:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spawn_pty(
    argv: Iterable[str] | str | None = None, *, cols: int, rows: int, **options: Any
) -> SandboxedPTY:
    """ARGV (None: $SHELL, else /bin/sh) in a sandbox on a terminal of COLS x ROWS.
    Returns once the payload runs (or has failed to start: wait() says how)."""
    command = argv if argv is not None else [os.environ.get("SHELL") or "/bin/sh"]
    req = request(command, options, "spawn_pty")
    master, slave, terminal = _pty_pair(cols, rows)
    req.terminal = terminal

    def once(client: Client, req: RunRequest) -> SandboxedPTY:
        replies = client.stream(f"{INTERFACE}.Run", req.to_wire(), fds=[slave] * 3)
        pty = SandboxedPTY(client, master, read_reply(next(replies)))
        pty._start(replies)
        return pty

    try:
        return with_retries(req, once, environ=os.environ, keep=True)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # boxyd holds its own copy: the master reads EIO once it lets go


def attach(id: str, *, cols: int = 80, rows: int = 24) -> SandboxedPTY:
    """Take over the terminal of session ID (one started with start()): its output
    so far comes first. detach() leaves it running again, and so does close(): a
    session in the background is left detached, not hung up."""
    stdfds.ensure()  # before the PTY pair (request() does it for the others)
    master, slave, terminal = _pty_pair(cols, rows)
    client = connect()
    try:
        params = {"id": id, "terminal": terminal.to_wire()}
        replies = client.stream(f"{INTERFACE}.Attach", params, fds=[slave] * 3)
        pty = SandboxedPTY(client, master, read_reply(next(replies)))
    except BaseException:
        client.close()
        os.close(master)
        raise
    finally:
        os.close(slave)
    pty._start(replies)
    return pty
