"""D-Bus adapter (dbus-fast): dev.boxy.Daemon on the session bus, mapped onto the
Manager core. No logic here: the objects mirror the core's sessions and events.

- /dev/boxy/Manager, dev.boxy.Manager1: List(b all) -> a(sso) (id, state, path),
  Stop(s id, b kill) -> s (the state it ended in), Run(s request, h, h, h) -> so;
  --review's Diff(s id, b text) -> s, Apply(s id, as paths) -> s (JSON, as
  `boxyctl diff/apply --json` print it) and Discard(s id);
  signals SessionNew(s, o) and SessionRemoved(s, o).
- /dev/boxy/session/<id>, dev.boxy.Session1: read-only properties State, Argv,
  Profile, WorkDir, StartedAt, ExitStatus (-1 while it runs) and the counters
  (Connections, Denials, NamesDenied, CountsExact, BytesUp, BytesDown),
  with PropertiesChanged as they change; signal Event(s kind, a{sv} fields);
  methods Allow(as hosts) -> s and Deny(as hosts) -> s (`boxyctl allow` / `deny`,
  the caller's pid as the bus gave it to CallerVetting); --ask's questions: signals
  AskDenied(u number, s host, q port, u pid (the host's), s argv0, as choices,
  d timeout, s text)
  and AskEnded(u number, s answer, s line), method Answer(u number, s choice) -> s.
  A question goes to the bus when no terminal can answer and a client called
  Manager1.AnswerQuestions(true) (until it leaves the bus), or the run asked for
  --ask-notify (a desktop notification with the choices as actions: api/notify.py).
- /dev/boxy: org.freedesktop.DBus.ObjectManager (GetManagedObjects; InterfacesAdded
  and InterfacesRemoved as sessions come and go), there alone (_Bus, only_one_object_manager).
- Every argument is named in the introspection (NamedArgs).

Each follower waits for its own signals to be written (MessageBus.send's future):
a bus that reads slowly makes the follower's bounded queue lose events, counted,
instead of growing dbus-fast's queue.

Errors go through boxy.errors' one table (dev.boxy.Error.<name>).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar

from dbus_fast import Message, MessageType, Variant
from dbus_fast import introspection as intr
from dbus_fast.aio import MessageBus
from dbus_fast.constants import (
    ArgDirection,
    ErrorType,
    MessageFlag,
    NameFlag,
    PropertyAccess,
    RequestNameReply,
)
from dbus_fast.errors import DBusError
from dbus_fast.service import ServiceInterface, dbus_property, method, signal

from boxy.errors import BoxyError, NoSuchSession, UsageError, dbus_error_name
from boxy.request import RunRequest
from boxy.varlink import close_fds
from boxyd.api.buscall import to_the_bus
from boxyd.api.notify import Notifier
from boxyd.daemon.asking import Answer, Question
from boxyd.daemon.events import (
    CountersTick,
    Exited,
    ManagerEvent,
    SessionEvent,
    SessionNew,
    SessionRemoved,
    StateChanged,
)
from boxyd.daemon.manager import Manager
from boxyd.daemon.seam import Caller, Change
from boxyd.daemon.session import Session

log = logging.getLogger("boxyd")

BUS_NAME = "dev.boxy.Daemon"
MANAGER_PATH = "/dev/boxy/Manager"
MANAGER_INTERFACE = "dev.boxy.Manager1"
SESSION_INTERFACE = "dev.boxy.Session1"
OBJECT_MANAGER_PATH = "/dev/boxy"  # the ObjectManager: the Manager and every session below it
OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager"
PROPERTIES = "org.freedesktop.DBus.Properties"
CONNECT_TIMEOUT = 5.0


def session_path(sid: str) -> str:
    return f"/dev/boxy/session/{sid}"  # ids are [0-9a-f]{8}: a valid path element


def _error(e: BoxyError) -> DBusError:
    return DBusError(dbus_error_name(e), str(e))


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError as e:
        raise UsageError(f"Run: the request is not JSON ({e})") from None


def check_fds(msg: Message) -> bool | None:
    """Runs before dbus-fast dispatches a call (a message handler). dbus-fast hands
    a method the raw index of an "h" argument when no fds came with the call, as if
    it were one of the daemon's own fds: Run must come with exactly its three fds,
    at indices 0, 1, 2. Any fds a call brings and Run does not take are closed."""
    if (
        msg.message_type == MessageType.METHOD_CALL
        and msg.path == MANAGER_PATH
        and msg.member == "Run"
        and msg.interface in (None, MANAGER_INTERFACE)
    ):
        if msg.signature != "shhh" or list(msg.body[1:]) != [0, 1, 2] or len(msg.unix_fds) != 3:
            close_fds(msg.unix_fds)
            raise DBusError(
                dbus_error_name(UsageError("")),
                "Run: attach exactly three file descriptors (stdin, stdout, stderr)",
            )
        return None  # the method owns them
    close_fds(msg.unix_fds)
    return None


def only_one_object_manager(msg: Message) -> bool | None:
    """A message handler: dbus-fast answers GetManagedObjects at any path; boxy's
    ObjectManager is /dev/boxy alone (the one its introspection shows). Runs after
    check_fds, which closed any fds the call brought."""
    if (
        msg.message_type == MessageType.METHOD_CALL
        and msg.interface == OBJECT_MANAGER
        and msg.path != OBJECT_MANAGER_PATH
    ):
        raise DBusError(ErrorType.UNKNOWN_METHOD, f"no {OBJECT_MANAGER} at {msg.path}")
    return None


def variant(value: object) -> Variant | None:
    """One event field as a D-Bus variant (nested values as JSON text)."""
    if isinstance(value, bool):
        return Variant("b", value)
    if isinstance(value, int):
        return Variant("x", value) if -(1 << 63) <= value < 1 << 63 else Variant("s", str(value))
    if isinstance(value, float):
        return Variant("d", value)
    if isinstance(value, str):
        return Variant("s", value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return Variant("as", value)
    if value is None:
        return None
    return Variant("s", json.dumps(value, default=str))


def event_fields(ev: SessionEvent) -> dict[str, Variant]:
    """The Event signal's fields: the event's one wire encoding (Event.to_wire, as
    varlink's Watch carries it) but its kind, each field a variant."""
    out: dict[str, Variant] = {}
    for k, v in ev.to_wire().items():
        var = variant(v)
        if k != "kind" and var is not None:
            out[k] = var
    return out


class NamedArgs(ServiceInterface):
    """dbus-fast leaves a signal's arguments and a method's results unnamed in the
    introspection (clients show arg_0): a signal's are named after the Python method's
    parameters (SessionNew: id, path), a method's results from RESULTS."""

    RESULTS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def introspect(self) -> intr.Interface:
        out = super().introspect()
        for sig in out.signals:
            fn = getattr(type(self), sig.name)
            names = [n for n in inspect.signature(fn).parameters if n != "self"]
            sig.args = [intr.Arg(a.signature, name=n) for a, n in zip(sig.args, names, strict=True)]
        for m in out.methods:
            names = list(self.RESULTS.get(m.name, ()))
            m.out_args = [
                intr.Arg(a.signature, ArgDirection.OUT, n)
                for a, n in zip(m.out_args, names, strict=True)
            ]
        return out


class ManagerInterface(NamedArgs):
    RESULTS: ClassVar[dict[str, tuple[str, ...]]] = {
        "List": ("sessions",),
        "Stop": ("state",),
        "Output": ("data", "offset", "ended", "kept"),
        "Run": ("id", "path"),
        "Doctor": ("checks",),
        "Profiles": ("profiles", "lines"),
        "ProfileShow": ("profile", "lines"),
        "AnswerQuestions": ("answering",),
        "Diff": ("review",),
        "Apply": ("result",),
    }

    def __init__(
        self,
        manager: Manager,
        exported: dict[str, SessionInterface],
        answering: Callable[[str, bool], bool],
    ) -> None:
        super().__init__(MANAGER_INTERFACE)
        self.manager = manager
        self._exported = exported  # the session objects on the bus (DbusService's)
        self._answering = answering

    @method()
    def AnswerQuestions(self, on: "b") -> "b":
        """--ask: the calling connection answers the questions no terminal can (each
        session's AskDenied, then its Answer) while it stays on the bus, or until it
        calls this with false. Returns whether any connection answers now."""
        return self._answering(SENDER.get(), on)

    @method()
    async def List(self, all: "b") -> "a(sso)":
        """The sessions the core lists that have an object on the bus (a record from
        before a restart has none)."""
        infos = await self.manager.infos(all=all)
        return [[i.id, i.state.value, session_path(i.id)] for i in infos if i.id in self._exported]

    @method()
    async def Stop(self, id: "s", kill: "b") -> "s":
        try:
            info = await self.manager.stop_and_wait(id, kill)
        except BoxyError as e:
            raise _error(e) from None
        return info.state.value

    @method()
    async def Output(self, id: "s", offset: "t") -> "aytbb":
        """`boxyctl logs` over D-Bus (varlink's Output): up to 64 KiB of a detached
        session's output from OFFSET; the next offset; whether the session had ended
        before the read (an empty piece then is the end); whether it kept any output."""
        try:
            out = await self.manager.output(id, offset)
        except BoxyError as e:
            raise _error(e) from None
        return [out.data, out.offset, out.ended, out.kept]

    @method()
    async def Profiles(self) -> "sas":
        """`boxyctl profile list`: the JSON document --json prints, and the lines."""
        view = await self.manager.profiles()
        return [json.dumps(view.doc), view.lines]

    @method()
    async def ProfileShow(self, name: "s", cwd: "s", client_env: "a{ss}") -> "sas":
        """`boxyctl profile show NAME` as a run in CWD would load it (CLIENT_ENV: the
        client's npm and pip settings): the JSON document --json prints, the lines."""
        try:
            view = await self.manager.profile(name, cwd, client_env)
        except BoxyError as e:
            raise _error(e) from None
        return [json.dumps(view.doc), view.lines]

    @method()
    async def Diff(self, id: "s", text: "b") -> "s":
        """`boxyctl diff --json`: what session ID holds for review (--review), as JSON;
        TEXT: with the unified diff of its text files."""
        try:
            return json.dumps(await self.manager.review_diff(id, text))
        except BoxyError as e:
            raise _error(e) from None

    @method()
    async def Apply(self, id: "s", paths: "as") -> "s":
        """`boxyctl apply ID [PATH...]`: its held changes land (all when PATHS is empty);
        what landed and what was refused, as JSON."""
        try:
            return json.dumps(await self.manager.review_apply(id, list(paths) or None))
        except BoxyError as e:
            raise _error(e) from None

    @method()
    async def Discard(self, id: "s") -> "":
        """`boxyctl discard ID`: its held changes are dropped."""
        try:
            await self.manager.review_discard(id)
        except BoxyError as e:
            raise _error(e) from None

    @method()
    async def Doctor(self) -> "a(sbbs)":
        """`boxyctl doctor`'s checks as boxyd finds them: name, ok, required, detail."""
        return [[c.name, c.ok, c.hard, c.detail] for c in await self.manager.doctor()]

    @method()
    async def Run(self, request: "s", stdin: "h", stdout: "h", stderr: "h") -> "so":
        """REQUEST: the JSON of varlink's Run parameters (boxy.request); the three fds
        are the payload's stdio (checked to be attached: check_fds). Returns once
        the session is under way; it lives until it ends or is stopped (no client
        follows it over D-Bus)."""
        fds = [stdin, stdout, stderr]
        try:
            req = RunRequest.from_wire(_json(request))
        except BoxyError as e:
            close_fds(fds)
            raise _error(e) from None
        try:
            session = await self.manager.start(req, fds, follower=False)
        except BoxyError as e:
            raise _error(e) from None
        return [session.id, session_path(session.id)]

    @signal()
    def SessionNew(self, id: str, path: str) -> "so":
        return [id, path]

    @signal()
    def SessionRemoved(self, id: str, path: str) -> "so":
        return [id, path]


# Who sent the method call being dispatched: set by CallerVetting just before dbus-fast
# dispatches it, in the same call (a synchronous handler runs inside it).
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("caller", default=None)
# the calling connection's unique name (AnswerQuestions keeps it while it lives)
SENDER: contextvars.ContextVar[str] = contextvars.ContextVar("sender", default="")


class SessionInterface(NamedArgs):
    RESULTS: ClassVar[dict[str, tuple[str, ...]]] = {
        "Allow": ("line",),
        "Deny": ("line",),
        "Answer": ("host",),
    }

    def __init__(self, session: Session) -> None:
        super().__init__(SESSION_INTERFACE)
        self.session = session

    @method()
    def Allow(self, hosts: "as") -> "s":
        """`boxyctl allow`: HOSTS allowed in the running session at once (varlink's
        Allow says what cannot widen); returns the line show keeps."""
        return self._change(Change.ALLOW, hosts)

    @method()
    def Deny(self, hosts: "as") -> "s":
        """`boxyctl deny`: HOSTS refused from now on; open connections they decided
        are cut."""
        return self._change(Change.DENY, hosts)

    @method()
    def Answer(self, number: "u", choice: "s") -> "s":
        """--ask: the answer to question NUMBER (AskDenied's): once, session, project or
        deny, as it offered them. Returns the host; what came of it is AskEnded."""
        try:
            return self.session.questions.answer(number, choice)
        except BoxyError as e:
            raise _error(e) from None

    @signal()
    def AskDenied(
        self,
        number: int,
        host: str,
        port: int,
        pid: int,
        argv0: str,
        choices: list[str],
        timeout: float,
        text: str,
    ) -> "usqusasds":
        return [number, host, port, pid, argv0, choices, timeout, text]

    @signal()
    def AskEnded(self, number: int, answer: str, line: str) -> "uss":
        return [number, answer, line]

    def asked(self, q: Question) -> None:
        who = q.who  # the pid a desktop tool can look at: the host's
        pid = (who.host_pid if who.host_pid is not None else who.pid) if who else 0
        self.AskDenied(
            q.number, q.host, q.port or 0, pid, who.argv0 if who else "",
            [c.value for c in q.choices], q.timeout, q.text(),
        )  # fmt: skip

    def ended(self, q: Question, answer: Answer | None, line: str) -> None:
        self.AskEnded(q.number, answer.value if answer is not None else "", line)

    def _change(self, change: Change, hosts: list[str]) -> str:
        caller = CALLER.get() or Caller(os.getuid(), None, "D-Bus")
        try:
            return self.session.change_policy(change, list(hosts), caller)
        except BoxyError as e:
            raise _error(e) from None

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> "s":
        return self.session.state.value

    @dbus_property(access=PropertyAccess.READ)
    def Argv(self) -> "as":
        return list(self.session.info().argv)

    @dbus_property(access=PropertyAccess.READ)
    def Profile(self) -> "s":
        return self.session.info().profile or ""  # the core names it

    @dbus_property(access=PropertyAccess.READ)
    def WorkDir(self) -> "s":
        return self.session.info().workdir

    @dbus_property(access=PropertyAccess.READ)
    def StartedAt(self) -> "d":
        return self.session.started_at

    @dbus_property(access=PropertyAccess.READ)
    def ExitStatus(self) -> "i":
        out = self.session.outcome
        return out.exit_status if out is not None and self.session.state.finished else -1

    @dbus_property(access=PropertyAccess.READ)
    def Connections(self) -> "t":
        return self.session.counters().connections

    @dbus_property(access=PropertyAccess.READ)
    def Denials(self) -> "t":
        return self.session.counters().denials

    @dbus_property(access=PropertyAccess.READ)
    def NamesDenied(self) -> "t":
        return self.session.counters().names_denied

    @dbus_property(access=PropertyAccess.READ)
    def CountsExact(self) -> "b":
        return self.session.counters().exact

    @dbus_property(access=PropertyAccess.READ)
    def BytesUp(self) -> "t":
        return self.session.counters().bytes_up

    @dbus_property(access=PropertyAccess.READ)
    def BytesDown(self) -> "t":
        return self.session.counters().bytes_down

    @signal()
    def Event(self, kind: str, fields: dict[str, Variant]) -> "sa{sv}":
        return [kind, fields]

    def properties(self) -> dict[str, Variant]:
        """Every property (ObjectManager's InterfacesAdded)."""
        return {
            "State": Variant("s", self.State),
            "Argv": Variant("as", self.Argv),
            "Profile": Variant("s", self.Profile),
            "WorkDir": Variant("s", self.WorkDir),
            "StartedAt": Variant("d", self.StartedAt),
            "ExitStatus": Variant("i", self.ExitStatus),
            **self.counter_values(),
        }

    def counter_values(self) -> dict[str, Variant]:
        c = self.session.counters()
        return {
            "Connections": Variant("t", c.connections),
            "Denials": Variant("t", c.denials),
            "NamesDenied": Variant("t", c.names_denied),
            "CountsExact": Variant("b", c.exact),
            "BytesUp": Variant("t", c.bytes_up),
            "BytesDown": Variant("t", c.bytes_down),
        }


class SendsThatWait:
    """dbus-fast's writer takes EAGAIN from send() for a lost bus and drops the
    daemon off it (a burst of replies fills the socket buffer). Said as "0 bytes
    sent" instead, the writer keeps the rest and waits for the socket to be
    writable. Messages with fds (none of ours) wait here instead: their fds must
    go with their first byte."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def send(self, data: Any, *flags: int) -> int:
        try:
            return int(self._sock.send(data, *flags))
        except (BlockingIOError, InterruptedError):
            return 0

    def sendmsg(self, buffers: Any, ancdata: Any = (), *rest: Any) -> int:
        from boxy import fdwait

        while True:
            try:
                return int(self._sock.sendmsg(buffers, ancdata, *rest))
            except (BlockingIOError, InterruptedError):
                fdwait.writable(self._sock, 1.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def wait_when_full(bus: MessageBus) -> None:
    """The one change to dbus-fast: its writer's socket (see SendsThatWait). dbus-fast
    offers no public way to its socket; this is the one private attribute we touch."""
    writer = getattr(bus, "_writer", None)
    if writer is not None:
        writer.sock = SendsThatWait(writer.sock)


# a connection leaving the bus (no new owner): an answerer of questions gone
LEFT = (
    "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
    "member='NameOwnerChanged'"
)
KNOWN_CALLERS = 4096  # unique names whose verdict is kept (each busctl call is a new one)


class CallerVetting:
    """Calls to boxy's objects from a bus connection whose process is inside one of
    boxyd's sandboxes are refused (docs/design.md, "The front door"). The bus names a
    caller by its unique name; its process is asked of the bus once
    (GetConnectionUnixProcessID), the answer kept for as long as that name lives (the
    bus never gives a unique name twice). A call that comes before the answer waits
    for it (held here, then dispatched as it came); one whose caller cannot be looked
    up is refused. VET: why a pid may not call (daemon/insiders.py)."""

    def __init__(self, vet: Callable[[int, int | None], str | None]) -> None:
        self.vet = vet
        self.bus: MessageBus | None = None
        self._known: dict[str, str | None] = {}  # unique name -> why refused, or None
        self._pids: dict[str, int] = {}  # unique name -> its process, as the bus said
        self._held: dict[str, list[Message]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def handler(self, msg: Message) -> bool | None:
        """A message handler, first of all: True (held or refused) or None (dispatch)."""
        if msg.message_type != MessageType.METHOD_CALL or not _ours(msg.path):
            return None
        sender = msg.sender or ""
        if sender in self._known:
            why = self._known[sender]
            if why is None:
                CALLER.set(Caller(os.getuid(), self._pids.get(sender), "D-Bus"))
                SENDER.set(sender)
                return None
            close_fds(msg.unix_fds)
            raise DBusError(dbus_error_name(UsageError("")), f"refused: {why}")
        self._held.setdefault(sender, []).append(msg)
        if len(self._held[sender]) == 1:
            task = asyncio.get_running_loop().create_task(self._look_up(sender))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    async def _look_up(self, sender: str) -> None:
        why = await self._why(sender)
        if len(self._known) >= KNOWN_CALLERS:  # asked again later: a lookup, nothing more
            self._known.clear()
            self._pids.clear()
        self._known[sender] = why
        for msg in self._held.pop(sender, []):
            if self.bus is None or not self.bus.connected:
                close_fds(msg.unix_fds)
            elif why is None:
                CALLER.set(Caller(os.getuid(), self._pids.get(sender), "D-Bus"))
                self.bus._process_message(msg)  # as it came: the handlers run again
            else:
                close_fds(msg.unix_fds)
                await self._refuse(msg, why)

    async def _why(self, sender: str) -> str | None:
        if self.bus is None:
            return "no bus"
        try:
            reply = await self.bus.call(to_the_bus("GetConnectionUnixProcessID", sender))
        except Exception as e:  # the bus went, or the caller with it
            return f"its process could not be looked up ({type(e).__name__})"
        if reply.message_type != MessageType.METHOD_RETURN or not reply.body:
            return "its process could not be looked up"
        self._pids[sender] = int(reply.body[0])
        return self.vet(int(reply.body[0]), None)

    async def _refuse(self, msg: Message, why: str) -> None:
        log.warning("D-Bus: refused %s.%s from %s: %s", msg.interface, msg.member, msg.sender, why)
        if self.bus is not None and _expects_reply(msg):
            with contextlib.suppress(Exception):
                await self.bus.send(
                    Message.new_error(msg, dbus_error_name(UsageError("")), f"refused: {why}")
                )

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for held in self._held.values():
            for msg in held:
                close_fds(msg.unix_fds)
        self._held.clear()


def _ours(path: str | None) -> bool:
    return path is not None and (path == OBJECT_MANAGER_PATH or path.startswith("/dev/boxy/"))


def _expects_reply(msg: Message) -> bool:
    return not (msg.flags & MessageFlag.NO_REPLY_EXPECTED)


class _Bus(MessageBus):
    """dbus-fast's bus without the InterfacesAdded and InterfacesRemoved it sends at
    each export and unexport from the object's own path: the ObjectManager's are ours,
    sent from its path (/dev/boxy) as the specification has them; clients got each
    twice."""

    def _emit_interface_added(self, path: str, interface: ServiceInterface) -> None:
        return

    def _emit_interface_removed(self, path: str, removed_interfaces: list[str]) -> None:
        return

    def _introspect_export_path(self, path: str) -> intr.Node:
        """dbus-fast advertises an ObjectManager at every exported path and none at
        /dev/boxy, which is not exported: the ObjectManager is said where it answers
        (only_one_object_manager refuses it elsewhere)."""
        node = super()._introspect_export_path(path)
        if path == OBJECT_MANAGER_PATH:
            node.interfaces = [
                i for i in intr.Node.default(path).interfaces if i.name != PROPERTIES
            ]
        else:
            node.interfaces = [i for i in node.interfaces if i.name != OBJECT_MANAGER]
        return node


class DbusService:
    """The bus connection and the objects; follows the manager's events."""

    def __init__(self, manager: Manager, vet: Callable[[int, int | None], str | None]) -> None:
        self.manager = manager
        self.vetting = CallerVetting(vet)
        self.bus: MessageBus | None = None
        self._sessions: dict[str, SessionInterface] = {}
        self._iface = ManagerInterface(manager, self._sessions, self._answer_questions)
        self._tasks: set[asyncio.Task[None]] = set()
        self._answering: set[str] = set()  # connections that answer --ask's questions
        self.notifier: Notifier | None = None

    async def start(self, address: str) -> None:
        """Connect, export, own the name; raises on failure (the caller logs it)."""
        bus = await asyncio.wait_for(
            _Bus(bus_address=address, negotiate_unix_fd=True).connect(), CONNECT_TIMEOUT
        )
        self.bus = bus  # close() lets it go from here on
        wait_when_full(bus)
        self.vetting.bus = bus
        bus.add_message_handler(self.vetting.handler)  # first: who calls, then the fds
        bus.add_message_handler(check_fds)
        bus.add_message_handler(only_one_object_manager)
        bus.add_message_handler(self._left)
        bus.export(MANAGER_PATH, self._iface)
        self.notifier = Notifier(bus)
        await self.notifier.start()
        await bus.call(to_the_bus("AddMatch", LEFT))
        reply = await bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            raise RuntimeError(f"{BUS_NAME} is owned by another process ({reply.name})")
        for s in self.manager.known():
            self._export(s)
        self._spawn(self._follow_manager())

    async def has_owner(self, name: str) -> bool:
        """Is NAME on the bus now (asked without activating it)?"""
        assert self.bus is not None
        reply = await self.bus.call(to_the_bus("NameHasOwner", name))
        return reply.message_type == MessageType.METHOD_RETURN and reply.body == [True]

    async def lost(self) -> None:
        """Returns when the bus connection is gone (however it went)."""
        assert self.bus is not None
        try:
            await self.bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
        except Exception as e:  # the error it went with: said once, as a line
            log.info("D-Bus: %s", e or type(e).__name__)

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.vetting.close()
        if self.bus is not None and self.bus.connected:
            self.bus.disconnect()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow_manager(self) -> None:
        async for ev in self.manager.subscribe():
            self._on_manager(ev)

    def _on_manager(self, ev: ManagerEvent) -> None:
        if isinstance(ev, SessionNew):
            try:
                self._export(self.manager.get(ev.id))
            except NoSuchSession:  # already forgotten: nothing to show
                return
            self._iface.SessionNew(ev.id, session_path(ev.id))
        elif isinstance(ev, SessionRemoved):
            iface = self._sessions.pop(ev.id, None)
            if iface is None:
                return
            if self.bus is not None:
                self.bus.unexport(session_path(ev.id), iface)
            self._iface.SessionRemoved(ev.id, session_path(ev.id))
            self._spawn(
                self._send(
                    Message.new_signal(
                        OBJECT_MANAGER_PATH,
                        OBJECT_MANAGER,
                        "InterfacesRemoved",
                        "oas",
                        [session_path(ev.id), [SESSION_INTERFACE]],
                    )
                )
            )

    def _answer_questions(self, sender: str, on: bool) -> bool:
        if on and sender:
            self._answering.add(sender)
            self._spawn(self._still_here(sender))
        else:
            self._answering.discard(sender)
        return bool(self._answering)

    async def _still_here(self, sender: str) -> None:
        """SENDER may have left before the match on its leaving was in force."""
        if not await self.has_owner(sender):
            self._answering.discard(sender)

    def _left(self, msg: Message) -> None:
        """NameOwnerChanged: a connection that answered questions left the bus."""
        if (
            msg.message_type == MessageType.SIGNAL
            and msg.member == "NameOwnerChanged"
            and msg.sender == "org.freedesktop.DBus"
            and msg.signature == "sss"
            and msg.body[2] == ""
        ):
            self._answering.discard(msg.body[0])

    def _ask_here(self, s: Session, iface: SessionInterface) -> None:
        """--ask's questions that no terminal can answer come here: to a connection
        that said it answers (AnswerQuestions), or to a notification (--ask-notify)."""
        q = s.questions

        def notifies() -> bool:
            return s.sandbox is not None and s.spec.ask_notify and self.notifier is not None

        q.can = lambda: bool(self._answering) or notifies()
        q.on_put.append(iface.asked)
        q.on_end.append(iface.ended)
        if self.notifier is not None:
            notifier = self.notifier
            q.on_put.append(
                lambda question: self._spawn(notifier.show(q, question)) if notifies() else None
            )
            q.on_end.append(lambda question, _a, _l: self._spawn(notifier.ended(q, question)))

    def _export(self, s: Session) -> None:
        if s.id in self._sessions or self.bus is None:
            return
        iface = SessionInterface(s)
        self._sessions[s.id] = iface
        self._ask_here(s, iface)
        self.bus.export(session_path(s.id), iface)
        added = Message.new_signal(
            OBJECT_MANAGER_PATH,
            OBJECT_MANAGER,
            "InterfacesAdded",
            "oa{sa{sv}}",
            [session_path(s.id), {SESSION_INTERFACE: iface.properties()}],
        )
        self._spawn(self._send(added))
        self._spawn(self._follow_session(s, iface))

    async def _send(self, msg: Message) -> None:
        """Send and wait until it is written: one message in dbus-fast's queue per
        follower, so a bus that reads slowly makes the follower's own bounded queue
        lose (and count) the flood instead of growing dbus-fast's."""
        if self.bus is None or not self.bus.connected:
            return
        with contextlib.suppress(Exception):  # the bus went: lost() says so
            await self.bus.send(msg)

    async def _follow_session(self, s: Session, iface: SessionInterface) -> None:
        path = session_path(s.id)
        last: dict[str, Variant] = {}
        async for ev in s.subscribe():
            await self._send(
                Message.new_signal(
                    path, SESSION_INTERFACE, "Event", "sa{sv}", [ev.kind, event_fields(ev)]
                )
            )
            changed: dict[str, Variant] = {}
            if isinstance(ev, (StateChanged, Exited)):
                changed = {
                    "State": Variant("s", s.state.value),
                    "ExitStatus": Variant("i", iface.ExitStatus),
                }
            elif isinstance(ev, CountersTick):
                now = iface.counter_values()
                changed = {k: v for k, v in now.items() if last.get(k) != v}
                last = now
            if changed:
                await self._send(
                    Message.new_signal(
                        path,
                        PROPERTIES,
                        "PropertiesChanged",
                        "sa{sv}as",
                        [SESSION_INTERFACE, changed, []],
                    )
                )
