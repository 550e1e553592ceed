"""D-Bus adapter (dbus-fast): dev.boxy.Daemon on the session bus, mapped onto the
Manager core. No logic here: the objects mirror the core's sessions and events.

- /dev/boxy/Manager, dev.boxy.Manager1: List(b all) -> a(sso) (id, state, path),
  Stop(s id, b kill) -> s (the state it ended in), Run(s request, h, h, h) -> so;
  signals SessionNew(s, o) and SessionRemoved(s, o).
- /dev/boxy/session/<id>, dev.boxy.Session1: read-only properties State, Argv,
  Profile, WorkDir, StartedAt, ExitStatus (-1 while it runs) and the counters,
  with PropertiesChanged as they change; signal Event(s kind, a{sv} fields).

Errors go through boxy.errors' one table (dev.boxy.Error.<name>).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.constants import NameFlag, PropertyAccess, RequestNameReply
from dbus_fast.errors import DBusError
from dbus_fast.service import ServiceInterface, dbus_property, method, signal

from boxy.errors import BoxyError, UsageError, dbus_error_name
from boxy.request import RunRequest
from boxy.varlink import close_fds
from boxyd.daemon.events import Event
from boxyd.daemon.manager import Manager
from boxyd.daemon.session import Session

log = logging.getLogger("boxyd")

BUS_NAME = "dev.boxy.Daemon"
MANAGER_PATH = "/dev/boxy/Manager"
MANAGER_INTERFACE = "dev.boxy.Manager1"
CONNECT_TIMEOUT = 5.0
MAX_QUEUED = 1024  # messages waiting in dbus-fast's writer before a follower waits


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


def event_fields(ev: Event) -> dict[str, Variant]:
    """An audit event's fields are its record's; an outcome's are its own."""
    fields: dict[str, Any] = dict(ev.fields)
    if ev.kind == "audit" and isinstance(fields.get("record"), dict):
        fields = fields["record"]
    elif ev.kind == "exited" and hasattr(fields.get("outcome"), "to_wire"):
        fields = fields["outcome"].to_wire()
    elif ev.kind == "counters" and isinstance(fields.get("counters"), dict):
        fields = {**fields["counters"], "top": fields.get("destinations", [])}
    out = {"t": Variant("d", ev.t)}
    for k, v in fields.items():
        var = variant(v)
        if var is not None:
            out[str(k)] = var
    return out


class ManagerInterface(ServiceInterface):
    def __init__(self, manager: Manager) -> None:
        super().__init__(MANAGER_INTERFACE)
        self.manager = manager

    @method()
    async def List(self, all: "b") -> "a(sso)":
        infos = await self.manager.infos(all=all)
        return [[i.id, i.state.value, session_path(i.id)] for i in infos]

    @method()
    async def Stop(self, id: "s", kill: "b") -> "s":
        try:
            info = await self.manager.stop_and_wait(id, kill)
        except BoxyError as e:
            raise _error(e) from None
        return info.state.value

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
            session = await self.manager.start(req, fds)
        except BoxyError as e:
            raise _error(e) from None
        session.attached = False
        return [session.id, session_path(session.id)]

    @signal()
    def SessionNew(self, id: str, path: str) -> "so":
        return [id, path]

    @signal()
    def SessionRemoved(self, id: str, path: str) -> "so":
        return [id, path]


class SessionInterface(ServiceInterface):
    def __init__(self, session: Session) -> None:
        super().__init__("dev.boxy.Session1")
        self.session = session

    def _info(self):  # type: ignore[no-untyped-def]
        return self.session.info()

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> "s":
        return self.session.state.value

    @dbus_property(access=PropertyAccess.READ)
    def Argv(self) -> "as":
        return list(self._info().argv)

    @dbus_property(access=PropertyAccess.READ)
    def Profile(self) -> "s":
        return self._info().profile or "generic"

    @dbus_property(access=PropertyAccess.READ)
    def WorkDir(self) -> "s":
        return self._info().workdir

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
    def BytesUp(self) -> "t":
        return self.session.counters().bytes_up

    @dbus_property(access=PropertyAccess.READ)
    def BytesDown(self) -> "t":
        return self.session.counters().bytes_down

    @signal()
    def Event(self, kind: str, fields: dict) -> "sa{sv}":
        return [kind, fields]


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
        import select

        while True:
            try:
                return int(self._sock.sendmsg(buffers, ancdata, *rest))
            except (BlockingIOError, InterruptedError):
                select.select([], [self._sock], [], 1.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def wait_when_full(bus: MessageBus) -> None:
    """The one change to dbus-fast: its writer's socket (see SendsThatWait)."""
    bus._writer.sock = SendsThatWait(bus._writer.sock)


class DbusService:
    """The bus connection and the objects; follows the manager's events."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.bus: MessageBus | None = None
        self._iface = ManagerInterface(manager)
        self._sessions: dict[str, SessionInterface] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, address: str) -> None:
        """Connect, export, own the name; raises on failure (the caller logs it)."""
        bus = await asyncio.wait_for(
            MessageBus(bus_address=address, negotiate_unix_fd=True).connect(), CONNECT_TIMEOUT
        )
        wait_when_full(bus)
        bus.add_message_handler(check_fds)
        bus.export(MANAGER_PATH, self._iface)
        reply = await bus.request_name(BUS_NAME, NameFlag.DO_NOT_QUEUE)
        if reply not in (RequestNameReply.PRIMARY_OWNER, RequestNameReply.ALREADY_OWNER):
            bus.disconnect()
            raise RuntimeError(f"{BUS_NAME} is owned by another process ({reply.name})")
        self.bus = bus
        for s in self.manager.list():
            self._export(s)
        self._spawn(self._follow_manager())

    async def lost(self) -> None:
        """Returns when the bus connection is gone."""
        assert self.bus is not None
        await self.bus.wait_for_disconnect()

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self.bus is not None:
            self.bus.disconnect()

    def _spawn(self, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow_manager(self) -> None:
        async for ev in self.manager.subscribe():
            sid = str(ev.fields.get("id", ""))
            if ev.kind == "session-new" and sid in self.manager.sessions:
                self._export(self.manager.sessions[sid])
                self._iface.SessionNew(sid, session_path(sid))
            elif ev.kind == "session-removed":
                iface = self._sessions.pop(sid, None)
                if iface is not None and self.bus is not None:
                    self.bus.unexport(session_path(sid), iface)
                self._iface.SessionRemoved(sid, session_path(sid))

    def _export(self, s: Session) -> None:
        if s.id in self._sessions or self.bus is None:
            return
        iface = SessionInterface(s)
        self._sessions[s.id] = iface
        self.bus.export(session_path(s.id), iface)
        self._spawn(self._follow_session(s, iface))

    async def _follow_session(self, s: Session, iface: SessionInterface) -> None:
        last_counters: dict = {}
        async for ev in s.subscribe():
            # dbus-fast queues what it cannot send yet without bound: wait for the bus,
            # and let this follower's bounded queue lose (and count) the flood instead
            while self.bus is not None and len(self.bus._writer.messages) > MAX_QUEUED:
                await asyncio.sleep(0.01)
            iface.Event(ev.kind, event_fields(ev))
            if ev.kind in ("state", "exited"):
                iface.emit_properties_changed(
                    {"State": s.state.value, "ExitStatus": iface.ExitStatus}
                )
            elif ev.kind == "counters":
                c = s.counters()
                now = {
                    "Connections": c.connections,
                    "Denials": c.denials,
                    "BytesUp": c.bytes_up,
                    "BytesDown": c.bytes_down,
                }
                changed = {k: v for k, v in now.items() if last_counters.get(k) != v}
                if changed:
                    iface.emit_properties_changed(changed)
                last_counters = now
