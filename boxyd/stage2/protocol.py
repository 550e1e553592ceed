"""The messages between boxyd and stage 2, typed end to end (standard library only:
stage 2 and boxyd/daemon/stage2proc.py both import it).

Five channels carry them:

- boxyd -> the outer stage 2 (its control socket, SOCK_SEQPACKET): the plan, the
  scope's placement, signals for the payload until PID 1 is handed over.
- the outer stage 2 -> boxyd (the same socket): what happened (``Report``), up to
  ``Started``, which hands PID 1 over to boxyd (docs/design.md, "Processes").
- PID 1 -> boxyd (the status pipe, one JSON line each): ``Status``.
- boxyd <-> a joiner (boxyd/stage2/joiner.py; its own socket): ``Join``, then the
  live guard's requests and published ports' sockets, answered by ``LiveDone`` and
  ``SocketMade``.
- boxyd <-> a tool sandbox's server (two pipes, one JSON line each): ToolCall,
  answered by ToolAnswer and the tool's stdout.

A frame is one JSON object ``{"kind": ..., field: value...}`` and, on the socket,
the SCM_RIGHTS fds its kind carries (``fd_count``). Decoding is strict: PID 1 ends up
running beside the payload and boxyd reads its lines, so a frame with an unknown
kind, a missing, extra or ill-typed field, a value out of range or the wrong number
of fds is a ``ProtocolError`` naming the message, never a KeyError or a half-read
dict.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import math
import os
import socket
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from boxy import wirejson

MAX_FRAME = 1 << 16  # a datagram or status line; a stand-in's content fits well within
MAX_FDS = 32  # the gateway sends 15 with --pcap
MAX_TEXT = 2000  # an error line
MAX_NOTE = 500  # a Landlock note, a command name
MAX_NOTES = 32
MAX_PATH = 4096


class ProtocolError(ValueError):
    """A frame that is not one of the messages below (or not with these fds)."""


class _Message:
    """What every message shares: its wire name, and how many fds travel with it."""

    KIND: ClassVar[str]
    FDS: ClassVar[int] = 0

    def fd_count(self) -> int:
        return self.FDS

    def check(self) -> str | None:
        """Why the (well-typed) values are out of range, or None."""
        return None


def _signal_ok(sig: int) -> bool:
    return 0 < sig < 65


# -- boxyd -> the outer stage 2 ------------------------------------------------------
@dataclass(frozen=True)
class PlanFds(_Message):
    """The plan (a sealed memfd) and the payload's stdin, stdout, stderr."""

    KIND = "plan"
    FDS = 4


@dataclass(frozen=True)
class Prepare(_Message):
    """To a spare, before its plan: make steps 1–3 (the user namespace as this user,
    the gateway's and the payload's network namespaces; without GATEWAY, --net none's
    loopback-only one) while no run waits; a plan of the other kind makes its own
    network. RULESET: a sealed memfd comes with it holding the ruleset of the
    networked run before (JSON text), loaded ahead into the gateway netns; boxyd gives
    such a spare only a plan with that very ruleset."""

    KIND = "prepare"
    ruleset: bool = False
    gateway: bool = True

    def check(self) -> str | None:
        return "a ruleset without a gateway" if self.ruleset and not self.gateway else None

    def fd_count(self) -> int:
        return 1 if self.ruleset else 0


@dataclass(frozen=True)
class Placed(_Message):
    """Step 0 is done: stage 2 is in the run's scope (IN_SCOPE) or runs without one."""

    KIND = "placed"
    in_scope: bool


@dataclass(frozen=True)
class Signal(_Message):
    """For the payload (through PID 1); before the run starts it ends the run."""

    KIND = "signal"
    signal: int

    def check(self) -> str | None:
        return None if _signal_ok(self.signal) else f"signal {self.signal} is out of range"


@dataclass(frozen=True)
class Release(_Message):
    """PID 1 is boxyd's now (after Started): the outer stage 2 passes on the signals
    that came before this, then exits."""

    KIND = "release"


@dataclass(frozen=True)
class Join(_Message):
    """To a joiner (a fresh child of the template): the sandbox's user, mount and
    network namespaces (nsfs fds, in that order), to join before its requests."""

    KIND = "join"
    FDS = 3


@dataclass(frozen=True)
class LiveCover(_Message):
    """The live guard: cover DST (beneath DST_BASE) with a stand-in again: an empty
    directory, or a file holding CONTENT (base64). Answered by LiveDone(ID)."""

    KIND = "live-cover"
    id: int
    dst: str
    dst_base: str
    is_dir: bool
    content: str


@dataclass(frozen=True)
class LivePin(_Message):
    """The live guard: bind the git control file REL beneath ROOT read-only onto itself
    again. Answered by LiveDone(ID)."""

    KIND = "live-pin"
    id: int
    rel: str
    root: str

    def check(self) -> str | None:
        return None if len(self.rel) <= MAX_PATH and len(self.root) <= MAX_PATH else "too long"


@dataclass(frozen=True)
class OpenSocket(_Message):
    """A published port's connection (boxyd/daemon/publish.py): an unconnected TCP
    socket of FAMILY (AF_INET or AF_INET6) made in the sandbox's network namespace,
    which boxyd then connects to the sandbox's loopback. Answered by SocketMade(ID)."""

    KIND = "open-socket"
    id: int
    family: int

    def check(self) -> str | None:
        ok = self.family in (socket.AF_INET, socket.AF_INET6)
        return None if ok else f"family {self.family} is not AF_INET or AF_INET6"


Request = PlanFds | Prepare | Placed | Signal | Release | Join | LiveCover | LivePin | OpenSocket


# -- PID 1 -> boxyd (its status pipe) ------------------------------------------------
@dataclass(frozen=True)
class Confined(_Message):
    """PID 1 is in the sandbox's root, confined (what Landlock could not do: NOTES)."""

    KIND = "confined"
    notes: tuple[str, ...]

    def check(self) -> str | None:
        if len(self.notes) > MAX_NOTES or any(len(n) > MAX_NOTE for n in self.notes):
            return "too many or too long notes"
        return None


@dataclass(frozen=True)
class Stopped(_Message):
    """The payload stopped (job control) with SIGNAL."""

    KIND = "stopped"
    signal: int

    def check(self) -> str | None:
        return None if _signal_ok(self.signal) else f"signal {self.signal} is out of range"


@dataclass(frozen=True)
class Exited(_Message):
    """The payload exited with CODE."""

    KIND = "exited"
    code: int

    def check(self) -> str | None:
        return None if 0 <= self.code < 256 else f"exit status {self.code} is out of range"


@dataclass(frozen=True)
class Killed(_Message):
    """The payload (or, unheard, PID 1: CORE False) died of SIGNAL."""

    KIND = "killed"
    signal: int
    core: bool = False

    def check(self) -> str | None:
        return None if _signal_ok(self.signal) else f"signal {self.signal} is out of range"


@dataclass(frozen=True)
class ExecFailed(_Message):
    """The payload's command CMD could not be executed (ERRNO)."""

    KIND = "exec-failed"
    errno: int
    cmd: str

    def check(self) -> str | None:
        if not 0 <= self.errno < 4096 or len(self.cmd) > MAX_NOTE:
            return "errno out of range or command too long"
        return None


@dataclass(frozen=True)
class SetupFailed(_Message):
    """A layer could not be applied: ERROR says which and why."""

    KIND = "setup-failed"
    error: str

    def check(self) -> str | None:
        return None if len(self.error) <= MAX_TEXT else "error line too long"


MAX_CALL = 40  # a system call's name ("syscall 1073741823" at most)
MAX_CALLS = 65  # names in Refusals: notify.MAX_NAMES and its "other calls"
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Refused(_Message):
    """seccomp refused CALL (number NR, ARGS) to PID (the thread, in the sandbox's PID
    namespace) of process TGID, COMM, ARGV0; ACTION "kill" (its process was killed)
    or "errno" (EPERM). boxyd/stage2/notify.py."""

    KIND = "refused"
    call: str
    nr: int
    args: tuple[int, ...]
    pid: int
    tgid: int
    comm: str
    argv0: str
    action: str

    def check(self) -> str | None:
        if self.action not in ("kill", "errno") or not 0 <= self.nr < 1 << 31:
            return "an unknown action or call number"
        if len(self.args) != 6 or not all(0 <= a <= _U64 for a in self.args):
            return "not six 64-bit arguments"
        if not (0 < self.pid < 1 << 22 and 0 < self.tgid < 1 << 22):
            return "a pid out of range"
        if len(self.call) > MAX_CALL or len(self.comm) > MAX_NOTE or len(self.argv0) > MAX_NOTE:
            return "a name too long"
        return None


@dataclass(frozen=True)
class Refusals(_Message):
    """Every refusal of the run counted by name (CALLS[i] COUNTS[i] times), the ones
    past the report rate included: PID 1's last word before the payload's end."""

    KIND = "refusals"
    calls: tuple[str, ...]
    counts: tuple[int, ...]

    def check(self) -> str | None:
        if len(self.calls) != len(self.counts) or len(self.calls) > MAX_CALLS:
            return "calls and counts differ or are too many"
        if any(len(c) > MAX_CALL for c in self.calls) or any(n < 1 for n in self.counts):
            return "a name too long or a count below one"
        return None


@dataclass(frozen=True)
class PortRefused(_Message):
    """Landlock refused the TCP connect() of PID (process TGID, COMM, ARGV0) to ADDR
    port PORT: not among the run's ports (boxyd/stage2/notify.py's connect)."""

    KIND = "port-refused"
    addr: str
    port: int
    pid: int
    tgid: int
    comm: str
    argv0: str

    def check(self) -> str | None:
        if not 0 <= self.port <= 65535 or len(self.addr) > 45:
            return "a port out of range or an address too long"
        if not (0 < self.pid < 1 << 22 and 0 < self.tgid < 1 << 22):
            return "a pid out of range"
        return None if max(len(self.comm), len(self.argv0)) <= MAX_NOTE else "a name too long"


End = Exited | Killed | ExecFailed | SetupFailed
Status = Confined | Stopped | Refused | Refusals | PortRefused | End


# -- the outer stage 2 -> boxyd ------------------------------------------------------
@dataclass(frozen=True)
class Pid(_Message):
    """Step 0: place PID (the outer stage 2) and ZYGOTE (PID 1's parent-to-be,
    boxyd/stage2/zygote.py) in the run's scope, then answer Placed."""

    KIND = "pid"
    pid: int
    zygote: int

    def check(self) -> str | None:
        return None if self.pid > 0 and self.zygote > 0 else f"pid {self.pid}, {self.zygote}"


@dataclass(frozen=True)
class Listeners(_Message):
    """Step 4: the gateway's sockets, one fd per name, in this order."""

    KIND = "listeners"
    names: tuple[str, ...]

    def fd_count(self) -> int:
        return len(self.names)

    def check(self) -> str | None:
        if len(set(self.names)) != len(self.names) or any(len(n) > 64 for n in self.names):
            return "names repeated or too long"
        return None


@dataclass(frozen=True)
class Started(_Message):
    """PID 1 (PID in stage 2's namespace) is forked, and handed over to boxyd with
    its fds: a pidfd, the read end of its status pipe, the write end of the pipe
    whose hang-up ends it (boxyd's death), the user, mount and network namespaces
    (for joiners), and with a PTY (PTY) the socket its master comes back on."""

    KIND = "started"
    pid: int
    pty: bool = False

    def fd_count(self) -> int:
        return 7 if self.pty else 6

    def check(self) -> str | None:
        return None if self.pid > 0 else f"pid {self.pid}"


@dataclass(frozen=True)
class Pty(_Message):
    """The session PTY's master (its one fd), made by PID 1 in the sandbox's devpts."""

    KIND = "pty"
    FDS = 1


@dataclass(frozen=True)
class LiveDone(_Message):
    """The live request ID was carried out (ERROR None) or why not."""

    KIND = "live-done"
    id: int
    error: str | None

    def check(self) -> str | None:
        return None if self.error is None or len(self.error) <= MAX_TEXT else "error too long"


@dataclass(frozen=True)
class Done(_Message):
    """The last message: how the run ended."""

    KIND = "done"
    end: End


@dataclass(frozen=True)
class SocketMade(_Message):
    """The socket of OpenSocket(ID) (its one fd), or why there is none (ERROR)."""

    KIND = "socket-made"
    id: int
    error: str | None

    def fd_count(self) -> int:
        return 0 if self.error is not None else 1

    def check(self) -> str | None:
        return None if self.error is None or len(self.error) <= MAX_TEXT else "error too long"


Report = Pid | Listeners | Started | Pty | LiveDone | SocketMade | Confined | Stopped | Done


# -- boxyd <-> a tool sandbox's server (boxyd/stage2/toolserver.py; its pipes) --------
@dataclass(frozen=True)
class ToolCall(_Message):
    """One tool call: ARGV run in CWD with ENV, killed after TIMEOUT seconds or past
    LIMIT bytes of output."""

    KIND = "tool-call"
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    timeout: float
    limit: int

    def check(self) -> str | None:
        if not self.argv or self.timeout < 0 or self.limit < 0:
            return "no command, or a negative timeout or limit"
        return None


@dataclass(frozen=True)
class ToolAnswer(_Message):
    """The call's end (RC None: it did not run, or was killed; ERROR why it did not
    run), then SIZE bytes of its stdout (TRUNCATED: cut at the limit)."""

    KIND = "tool-answer"
    rc: int | None
    timeout: bool
    error: str | None
    size: int
    truncated: bool

    def check(self) -> str | None:
        if self.size < 0 or (self.error is not None and len(self.error) > MAX_TEXT):
            return "a negative size, or an error too long"
        return None


TOOLS: tuple[type[_Message], ...] = (ToolCall, ToolAnswer)
REQUESTS: tuple[type[_Message], ...] = (
    PlanFds,
    Prepare,
    Placed,
    Signal,
    Release,
    Join,
    LiveCover,
    LivePin,
    OpenSocket,
)
STATUSES: tuple[type[_Message], ...] = (
    Confined,
    Stopped,
    Refused,
    Refusals,
    PortRefused,
    Exited,
    Killed,
    ExecFailed,
    SetupFailed,
)
REPORTS: tuple[type[_Message], ...] = (
    Pid,
    Listeners,
    Started,
    Pty,
    LiveDone,
    SocketMade,
    Confined,
    Stopped,
    Done,
)
_ENDS: tuple[type[_Message], ...] = (Exited, Killed, ExecFailed, SetupFailed)
_BY_KIND: dict[str, type[_Message]] = {c.KIND: c for c in (*REQUESTS, *STATUSES, *REPORTS, *TOOLS)}


# -- encoding ------------------------------------------------------------------------
# Each message's fields as (name, type hint, required), resolved once at import: the
# template imports this before it forks, so no run pays for evaluating annotations,
# and a child touches one tuple where dataclasses.fields() touched every Field (each
# touched object is a page of the template's copied into the child: issue #18).
_Fields = tuple[tuple[str, Any, bool], ...]
_FIELDS: dict[type[_Message], _Fields] = {}
_NAMES: dict[type[_Message], frozenset[str]] = {}


def _resolve(cls: type[_Message]) -> None:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    _FIELDS[cls] = tuple((f.name, hints[f.name], f.default is dataclasses.MISSING) for f in fields)
    _NAMES[cls] = frozenset([f.name for f in fields] + ["kind"])


for _cls in _BY_KIND.values():
    _resolve(_cls)


def _wire(msg: _Message) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": msg.KIND}
    for name, _, _ in _FIELDS[type(msg)]:
        v = getattr(msg, name)
        out[name] = _wire(v) if isinstance(v, _Message) else list(v) if type(v) is tuple else v
    return out


def encode(msg: _Message, nfds: int = 0, *, limit: int = MAX_FRAME) -> bytes:
    """MSG as one frame (at most LIMIT bytes), to travel with NFDS fds; a message that
    breaks the rules is a bug of ours and raises ProtocolError too."""
    why = msg.check()
    if why is not None:
        raise ProtocolError(f"{msg.KIND}: {why}")
    if nfds != msg.fd_count():
        raise ProtocolError(f"{msg.KIND}: carries {msg.fd_count()} fds, not {nfds}")
    data = wirejson.dumps(_wire(msg)).encode()
    if len(data) > limit:
        raise ProtocolError(f"{msg.KIND}: {len(data)} bytes (more than {limit})")
    return data


# -- decoding ------------------------------------------------------------------------
_NO = object()  # a value that is not of the type asked for


def _plain(v: object, hint: Any) -> object:
    """V as the plain type HINT, else _NO: a bool is never an int, an int is a float."""
    if hint is bool or hint is str or hint is int:
        return v if type(v) is hint else _NO
    if hint is float:
        ok = type(v) in (int, float) and math.isfinite(typing.cast(float, v))
        return float(typing.cast(float, v)) if ok else _NO
    if hint is type(None):
        return v if v is None else _NO
    if hint == tuple[str, ...]:
        ok = type(v) is list and all(type(x) is str for x in v)
        return tuple(typing.cast(list[str], v)) if ok else _NO
    if hint == tuple[int, ...]:
        ok = type(v) is list and all(type(x) is int for x in v)
        return tuple(typing.cast(list[int], v)) if ok else _NO
    if hint == dict[str, str]:
        ok = type(v) is dict and all(type(k) is str and type(x) is str for k, x in v.items())
        return dict(typing.cast(dict[str, str], v)) if ok else _NO
    if isinstance(hint, types.UnionType):  # int | None, str | None
        return next((x for a in typing.get_args(hint) if (x := _plain(v, a)) is not _NO), _NO)
    return _NO


def _value(kind: str, name: str, v: object, hint: Any) -> object:
    """V as field NAME's type HINT: a plain one, or a nested message (Done's end)."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
    if args and all(isinstance(a, type) and issubclass(a, _Message) for a in args):
        try:
            return _object(v, args)
        except ProtocolError as e:
            raise ProtocolError(f"{kind}: field {name!r}: {e}") from None
    got = _plain(v, hint)
    if got is _NO:
        what = hint.__name__ if isinstance(hint, type) else str(hint)
        raise ProtocolError(f"{kind}: field {name!r} is not a valid {what}")
    return got


def _object(obj: object, allowed: tuple[type[_Message], ...]) -> _Message:
    if not isinstance(obj, dict):
        raise ProtocolError("not a message (a JSON object)")
    kind = obj.get("kind")
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None or cls not in allowed:
        raise ProtocolError(f"unknown message kind {str(kind)[:40]!r}")
    extra = obj.keys() - _NAMES[cls]
    if extra:
        raise ProtocolError(f"{cls.KIND}: unknown field {sorted(extra)[0][:40]!r}")
    args: dict[str, object] = {}
    for name, hint, required in _FIELDS[cls]:
        if name in obj:
            args[name] = _value(cls.KIND, name, obj[name], hint)
        elif required:
            raise ProtocolError(f"{cls.KIND}: field {name!r} is missing")
    msg = cls(**args)
    why = msg.check()
    if why is not None:
        raise ProtocolError(f"{cls.KIND}: {why}")
    return msg


def decode(
    data: bytes, nfds: int, allowed: tuple[type[_Message], ...], *, limit: int = MAX_FRAME
) -> _Message:
    """One frame (at most LIMIT bytes) that arrived with NFDS fds, as one of ALLOWED
    (the direction's messages); anything else raises ProtocolError. The fds stay the
    caller's."""
    if len(data) > limit:
        raise ProtocolError(f"a frame of {len(data)} bytes (more than {limit})")
    try:
        obj = wirejson.loads(data)  # json's C scanner alone (json.loads ran a regex)
    except ValueError:  # UnicodeDecodeError included
        raise ProtocolError("a frame that is not JSON") from None
    msg = _object(obj, allowed)
    if nfds != msg.fd_count():
        raise ProtocolError(f"{msg.KIND}: carries {msg.fd_count()} fds, not {nfds}")
    return msg


def decode_request(data: bytes, nfds: int = 0) -> Request:
    return typing.cast(Request, decode(data, nfds, REQUESTS))


def decode_report(data: bytes, nfds: int = 0) -> Report:
    return typing.cast(Report, decode(data, nfds, REPORTS))


def decode_tool_call(line: bytes, limit: int) -> ToolCall:
    return typing.cast(ToolCall, decode(line, 0, (ToolCall,), limit=limit))


def decode_tool_answer(line: bytes) -> ToolAnswer:
    """A tool server's answer: it comes from inside a sandbox whose trees the payload
    wrote."""
    return typing.cast(ToolAnswer, decode(line, 0, (ToolAnswer,)))


def decode_status(line: bytes) -> Status:
    """One line of PID 1's (it carries no fds: a pipe)."""
    return typing.cast(Status, decode(line, 0, STATUSES))


# -- the socket ----------------------------------------------------------------------
def send(sock: socket.socket, msg: _Message, fds: list[int] | None = None) -> None:
    """MSG and its FDS as one datagram (OSError as the socket raises it)."""
    data = encode(msg, len(fds or []))
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


# Plain ints: MsgFlag's operators are enum's Python code, run by every child of the
# template that receives a frame (its pages copied into each; issue #18)
_RECV_FLAGS = int(socket.MSG_CMSG_CLOEXEC)
_CUT = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)


_SOL_SOCKET, _SCM_RIGHTS = int(socket.SOL_SOCKET), int(socket.SCM_RIGHTS)


def recv_fds(
    sock: socket.socket, size: int, max_fds: int, flags: int = 0
) -> tuple[bytes, list[int], int]:
    """socket.recv_fds, every fd close-on-exec: Python 3.11's drops its flags, and
    MSG_CMSG_CLOEXEC with them (each fd received would be inherited by what the
    receiver execs). The data, the fds, the message's flags."""
    fds = array.array("i")
    data, ancdata, got, _ = sock.recvmsg(
        size, socket.CMSG_LEN(max_fds * fds.itemsize), _RECV_FLAGS | flags
    )
    for level, kind, raw in ancdata:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    return data, fds.tolist(), got


def receive(sock: socket.socket, max_fds: int = MAX_FDS, flags: int = 0) -> tuple[bytes, list[int]]:
    """One datagram and the fds it carried (close-on-exec); b"" at the end. A datagram
    cut short (too long, or with more fds than MAX_FDS) is a ProtocolError, its fds
    closed."""
    data, fds, got = recv_fds(sock, MAX_FRAME + 1, max_fds, flags)
    if got & _CUT or len(data) > MAX_FRAME:
        close(fds)
        raise ProtocolError("a frame cut short (too long, or too many fds)")
    return data, fds


def close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
