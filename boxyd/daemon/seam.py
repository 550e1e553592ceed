"""The seam between the core (Session, Manager) and what builds sandboxes.

The core knows a run only through these Protocols: the real launcher
(boxyd.daemon.sandbox) builds stage 2, the gateway and the git guard behind them;
the core's unit tests use a fake one. What a sandbox tells the core comes as the
typed values below, never as stage 2's messages.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from boxy.outcome import Counters, Destination, Refusal
from boxy.request import RunRequest, Terminal
from boxyd.config.parsedoor import Parser
from boxyd.config.runspec import RunSpec

if TYPE_CHECKING:  # the view loads with the first `profile show`, not with boxyd
    from boxyd.config.profileview import ProfileView
    from boxyd.daemon.asking import RemoteQuestions


class Change(enum.Enum):
    """How `boxyctl allow` / `deny` (Allow, Deny on both wires) change a policy."""

    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class Caller:
    """Who asked for a change, as the wire saw them (the audit log keeps it)."""

    uid: int
    pid: int | None
    via: str  # "varlink" or "D-Bus"

    def __str__(self) -> str:
        return f"uid {self.uid}, pid {self.pid if self.pid is not None else '?'}, {self.via}"


@dataclass(frozen=True)
class Started:
    """The payload is under way: stage 2 forked PID 1, which executes it next."""


@dataclass(frozen=True)
class Stopped:
    """The payload stopped (^Z, SIGTTIN…): an attached client stops too."""

    signal: int


@dataclass(frozen=True)
class Exit:
    """How stage 2 ended: exactly one of CODE, SIGNAL, EXEC_ERRNO (with CMD) or
    ERROR (a layer that could not be applied); all None when it died unheard."""

    code: int | None = None
    signal: int | None = None
    exec_errno: int | None = None
    cmd: str = ""
    error: str | None = None


SandboxEvent = Started | Stopped | Exit


@dataclass
class Report:
    """What is known once the payload is gone: the guard's findings (git, tools'
    files), further lines for the user, where the network went (busiest first)."""

    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    destinations: list[Destination] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    seccomp_kill: str | None = None  # the call a process was killed for, named by PID 1


class Sink(Protocol):
    """What a sandbox may tell its session while it runs."""

    id: str
    questions: RemoteQuestions  # --ask's questions to clients on a wire (D-Bus)

    def record(self, layer: str, **fields: object) -> None:
        """One audit record (the session bounds them)."""

    def notice(self, text: str) -> None:
        """One line for an attached client now (-v: a denial as it happens)."""

    def detach_requested(self) -> None:
        """Ctrl-] on the session's terminal: the client leaves, the session goes on."""


class Sandbox(Protocol):
    spec: RunSpec

    async def start(self) -> list[str]:
        """Build and start it: it returns once the payload is under way (or the sandbox
        has ended: events() says how), with the warnings to say before the payload runs.
        Raises UsageError (bad input found late: 2) or another BoxyError (125)."""

    def events(self) -> AsyncIterator[SandboxEvent]:
        """Started, Stopped…, then one Exit, after which the iteration ends (no side
        effects: what they report has happened)."""

    def signal(self, sig: int) -> None:
        """To the payload; ignored once it has exited. A stop may come while start()
        still waits (SIGKILL: it ends the run wherever it is)."""

    def resize(self, rows: int, cols: int) -> None: ...

    def change_policy(self, change: Change, hosts: list[str], caller: Caller, t: float) -> str:
        """Allow / Deny HOSTS in the running network policy; T: seconds into the run.
        Returns the line show keeps; raises UsageError when it cannot change."""
        ...

    def limit_lines(self) -> list[str]:
        """What each limit amounts to (its scope's controllers, or the fallbacks)."""

    def counters(self) -> Counters:
        """The network's totals so far (zeros without one)."""

    def destinations(self, limit: int) -> list[Destination]:
        """The busiest LIMIT destinations so far."""

    def detach(self) -> bool:
        """Let the client's terminal go; False when there is none to keep."""

    def attach_client(self, stdio: list[int], terminal: Terminal | None) -> None:
        """A new client's fds (ours from the call on) take over the terminal."""

    async def finish(self) -> Report:
        """After the Exit: drain the terminal, close the network, judge the trees."""

    def audit_log(self) -> int | None:
        """The open --audit-log descriptor, if one was asked for."""

    def close(self) -> None:
        """Release everything still held (idempotent; also after a failed start)."""


class QuestionParser(Parser, Protocol):
    def close(self) -> None: ...


class Launcher(Protocol):
    async def prepare(self, request: RunRequest, stdio: list[int], sink: Sink) -> Sandbox:
        """Check REQUEST into a sandbox not yet started. Owns STDIO from the call on
        (closed on failure). Raises UsageError before anything starts."""

    def start(self) -> None:
        """Warm up on the event loop (the stage-2 template)."""

    def parser(self) -> QuestionParser:
        """A Parser for one question's parses of project files (`trust`): a parse
        child of its own, closed by the caller."""

    async def profile(self, name: str, cwd: str, client_env: dict[str, str]) -> ProfileView:
        """`profile show NAME` as a run in CWD would load it (npm and pip asked as a
        run asks them, with the client's CLIENT_ENV)."""

    def close(self) -> None: ...
