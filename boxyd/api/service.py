"""varlink adapter: dev.boxy.Manager calls onto the Manager core. No logic here:
decode, call the core, encode; errors through boxy.errors' one table. The server
(boxyd.api.varlink) has checked every parameter against the IDL before a call
comes here: what the IDL requires is there, with its declared type."""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from boxy import INTERFACE
from boxy.buildid import build_id
from boxy.errors import (
    BoxyError,
    BuildMismatch,
    DaemonError,
    InternalError,
    NoSuchSession,
    UsageError,
    varlink_error,
)
from boxy.outcome import RunReply
from boxy.request import RunRequest, Terminal
from boxy.varlink import MAX_MESSAGE, close_fds, to_json
from boxyd.api.varlink import Call, encode_reply
from boxyd.daemon.events import (
    Audited,
    SessionEvent,
    Subscription,
)
from boxyd.daemon.manager import Manager
from boxyd.daemon.seam import Caller, Change
from boxyd.daemon.session import Follow

log = logging.getLogger("boxyd")

# The calls that follow a session on their connection: each owns it until its last
# reply (boxyd/api/varlink.py; a connection that leaked into a sandbox carries no other)
STREAMS = frozenset(f"{INTERFACE}.{m}" for m in ("Run", "Attach", "Watch"))
WATCH_BATCH = 64 << 10  # bytes of events a watcher sends in one write, at most
WATCH_LINGER = 0.005  # seconds a watcher waits for more before writing a trickle
WATCH_GATHER = 64  # events that are worth a write at once: the wait ends there
WATCH_SHARE = 1 / 4  # of the CPU the rest of the loop used: a backlogged watcher's turn
WATCH_LEAST = 16  # frames a turn sends at least (when there are)
_WATCH_FRAME = "varlink.watch"  # the Event.memo key of an event's Watch reply
_AUDIT_HEAD = '{"parameters":{"event":{"kind":"audit","t":'
_AUDIT_TAIL = '}},"continues":true}'


async def final_reply(call: Call, reply: RunReply) -> None:
    """A run's last reply; one over the wire's limit (the outcome's lists are bounded:
    a bug, or a near-ARG_MAX argv in the message) still brings the exit status."""
    params = reply.to_wire()
    try:
        await call.reply(params)
    except ValueError:
        log.error("varlink: %s: the final reply is over the wire's limit", call.method)
        keep = ("kind", "id", "exit_status", "reason", "state", "signal")
        await call.reply(
            {
                **{k: params[k] for k in keep if k in params},
                "message": "the outcome was too large to send; "
                f"`boxyctl show {params.get('id')}` has it",
            }
        )


def watch_frame(ev: SessionEvent) -> bytes:
    """EV's Watch reply, framed: encoded once, the same bytes for every watcher."""
    return ev.memo(_WATCH_FRAME, _encode_watch_frame)


def _encode_watch_frame(ev: SessionEvent) -> bytes:
    if isinstance(ev, Audited):  # the flood: its text is assembled around the record's
        return _audit_frame(ev)
    return encode_reply({"event": ev.to_wire()}, continues=True)


def _audit_frame(ev: Audited) -> bytes:
    """encode_reply({"event": ev.to_wire()}, True), byte for byte, without building
    the dicts around the record: its time and record in one encoder call."""
    both = to_json([round(ev.t, 3), ev.record])  # "[t,{...}]": no comma in a number
    cut = both.index(",")
    data = f'{_AUDIT_HEAD}{both[1:cut]},"record":{both[cut + 1 : -1]}{_AUDIT_TAIL}'.encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"varlink message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data + b"\0"


def watch_batch(events: Subscription[SessionEvent], until: float = math.inf) -> list[bytes]:
    """The frames of the events queued now: up to WATCH_BATCH bytes, and past
    WATCH_LEAST frames no more once the loop's thread has used the CPU up to UNTIL
    (time.thread_time). The rest wait in the bounded queue, where a watcher that
    falls behind loses them."""
    frames: list[bytes] = []
    size = n = 0
    pop = events.pop
    while size < WATCH_BATCH and (ev := pop()) is not None:  # per watcher and event: lean
        frame = ev.memo(_WATCH_FRAME, _encode_watch_frame)
        frames.append(frame)
        size += len(frame)
        n += 1
        if n >= WATCH_LEAST and not n % 4 and time.thread_time() > until:
            break
    return frames


async def stream_events(call: Call, events: Subscription[SessionEvent]) -> bool:
    """Send EVENTS as Watch replies until the stream ends (True) or the peer goes
    (False). Each turn waits for the peer to read (Call.drain), then sends what was
    queued meanwhile in one write; after a wait for events, up to WATCH_LINGER more
    for WATCH_GATHER of them (a steady stream costs both ends a wake-up per batch,
    not per event; a burst goes at once). With a backlog, a turn uses at most WATCH_SHARE of the CPU the rest of
    the loop used since the last one (CPU: not the time the daemon waited for one),
    then yields: a flood's publisher and the other connections keep most of the
    loop, and this watcher's queue loses what it must (and says so)."""
    left = time.thread_time()  # the loop's CPU time when this watcher last yielded
    while True:
        idle = not events.queued
        if not await events.ready():
            return True
        if idle:
            await events.gather(WATCH_GATHER, WATCH_LINGER)
        await call.drain()
        if call.connection_closed.is_set():
            return False
        now = time.thread_time()
        call.send_frames(watch_batch(events, now + (now - left) * WATCH_SHARE))
        left = time.thread_time()
        if events.queued:
            await asyncio.sleep(0)


async def _no_bus(address: str) -> None:
    raise DaemonError("this boxyd has no D-Bus API")


class VarlinkService:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.on_shutdown: Callable[[], None] = lambda: None
        self.join_bus: Callable[[str], Awaitable[None]] = _no_bus

    @staticmethod
    def other_build(call: Call) -> tuple[str, dict[str, Any]] | None:
        """VarlinkServer's first check: a call that names a build other than ours is
        BuildMismatch before its parameters are checked (the client then replaces an
        idle boxyd of another build: boxy.client)."""
        build = call.parameters.get("build")
        if isinstance(build, str) and build and build != build_id():
            return varlink_error(BuildMismatch(build_id(), build))
        return None

    async def handle(self, call: Call) -> None:
        name = call.method.removeprefix(INTERFACE + ".")
        method = (
            getattr(self, "do_" + name, None) if call.method.startswith(INTERFACE + ".") else None
        )
        if method is None:
            await call.error("org.varlink.service.MethodNotFound", {"method": call.method})
            return
        try:
            await method(call)
        except BoxyError as e:
            await call.error(*varlink_error(e))
        except Exception:
            log.exception("%s failed", call.method)
            await call.error(*varlink_error(InternalError("internal error in boxyd (see its log)")))

    async def do_Version(self, call: Call) -> None:
        st = self.manager.status()
        await call.reply({"build": st.build, "version": st.version})

    async def do_DaemonStatus(self, call: Call) -> None:
        st = self.manager.status()
        await call.reply(
            {
                "build": st.build,
                "version": st.version,
                "pid": st.pid,
                "uptime": st.uptime,
                "sessions_running": st.sessions_running,
            }
        )

    async def do_Profiles(self, call: Call) -> None:
        view = await self.manager.profiles()
        await call.reply({"profiles": view.doc, "lines": view.lines})

    async def do_ProfileShow(self, call: Call) -> None:
        p = call.parameters
        view = await self.manager.profile(p["name"], p["cwd"], p["client_env"])
        await call.reply({"profile": view.doc, "lines": view.lines})

    async def do_Trust(self, call: Call) -> None:
        p = call.parameters
        got = await self.manager.approve(p["cwd"], p["client_env"])
        await call.reply(
            {
                "workdir": got.workdir,
                "path": got.path,
                "text": got.text,
                "registries": [{"source": s, "key": k, "shown": v} for s, k, v in got.registries],
                "wider": got.wider,
            }
        )

    async def do_Revoke(self, call: Call) -> None:
        await call.reply({"revoked": await self.manager.revoke(call.parameters["cwd"])})

    async def do_Approvals(self, call: Call) -> None:
        await call.reply({"approvals": await self.manager.approvals()})

    async def do_Trusted(self, call: Call) -> None:
        p = call.parameters
        profile = await self.manager.trusted(p["cwd"], p["client_env"])
        await call.reply({"trusted": profile is not None, "profile": profile})

    async def do_Doctor(self, call: Call) -> None:
        await call.reply({"checks": [c.to_wire() for c in await self.manager.doctor()]})

    async def do_Shutdown(self, call: Call) -> None:
        """Refused while sessions run, unless forced: then they are stopped and
        recorded first (boxyd's own exit path does that)."""
        self.manager.check_shutdown(call.parameters.get("force") is True)
        await call.reply({})
        self.on_shutdown()

    async def do_JoinBus(self, call: Call) -> None:
        """Replies once boxyd owns its name on the bus at ADDRESS (main.Bus)."""
        await self.join_bus(call.parameters["address"])
        await call.reply({})

    async def do_Run(self, call: Call) -> None:
        fds = call.take_fds()
        try:
            request = RunRequest.from_wire(call.parameters)
        except BaseException:
            close_fds(fds)
            raise
        session = await self.manager.start(request, fds)  # owns the fds
        await self._follow(call, session.follow())

    async def do_Attach(self, call: Call) -> None:
        """As Run, for a session already under way whose terminal nobody holds."""
        # a refusal before the fds are taken: the server closes them with the call
        session = self.manager.get(call.parameters["id"])
        terminal = Terminal.from_wire(call.parameters.get("terminal"))
        await self._follow(call, session.attach(call.take_fds(), terminal))

    async def _follow(self, call: Call, follow: Follow) -> None:
        """Relay the core's reply stream until its last reply; a client that goes
        away hangs an attached session up (Follow.client_gone)."""
        gone = asyncio.get_running_loop().create_task(self._client_gone(call, follow))
        try:
            async for reply in follow:
                if follow.last(reply):
                    await final_reply(call, reply)
                    return
                if call.more:  # without "more" only the last reply is sent
                    await call.reply(reply.to_wire(), continues=True)
        finally:
            gone.cancel()
            follow.close()
        raise AssertionError("the reply stream ended without its last reply")

    @staticmethod
    async def _client_gone(call: Call, follow: Follow) -> None:
        """The attached client went away (killed, crashed, connection dropped)."""
        await call.connection_closed.wait()
        follow.client_gone()

    async def do_Watch(self, call: Call) -> None:
        """Streamed: the session first, then each event as it happens (stream_events),
        then the session as it ended. A watcher that falls behind loses events in its
        own bounded queue and is told how many."""
        if not call.more:
            raise UsageError("Watch: streams its replies; call it with more")
        sid = call.parameters.get("id")
        try:
            session = self.manager.watched(sid)
        except NoSuchSession:  # finished and forgotten: its record, and the end at once
            await call.reply({"session": (await self.manager.info(str(sid))).to_wire()})
            return
        if session.state.finished:  # nothing more will happen: the session, once
            await call.reply({"session": session.info().to_wire()})
            return
        events = session.subscribe()
        try:
            await call.reply({"session": session.info().to_wire()}, continues=True)
            if not await stream_events(call, events):
                return
        finally:
            events.close()
        await call.reply({"session": session.info().to_wire()})

    async def do_Output(self, call: Call) -> None:
        p = call.parameters
        out = await self.manager.output(p["id"], p["offset"])
        await call.reply(
            {
                "id": out.id,
                "data": base64.b64encode(out.data).decode(),
                "offset": out.offset,
                "ended": out.ended,
                "kept": out.kept,
            }
        )

    async def do_Resize(self, call: Call) -> None:
        p = call.parameters
        self.manager.get(p["id"]).resize(p["rows"], p["cols"])
        await call.reply({})  # a oneway call hears nothing (Call.reply)

    async def do_Signal(self, call: Call) -> None:
        p = call.parameters
        self.manager.get(p["id"]).signal(p["signal"])
        await call.reply({})

    async def do_Allow(self, call: Call) -> None:
        await self._change(call, Change.ALLOW)

    async def do_Deny(self, call: Call) -> None:
        await self._change(call, Change.DENY)

    async def _change(self, call: Call, change: Change) -> None:
        p, peer = call.parameters, call.peer
        caller = Caller(peer.uid, peer.pid, "varlink")
        line = self.manager.change_policy(p["id"], change, list(p["hosts"]), caller)
        await call.reply({"line": line})

    async def do_Diff(self, call: Call) -> None:
        p = call.parameters
        await call.reply(await self.manager.review_diff(p["id"], p.get("text") is not False))

    async def do_Apply(self, call: Call) -> None:
        p = call.parameters
        paths = p.get("paths")
        await call.reply(await self.manager.review_apply(p["id"], list(paths) if paths else None))

    async def do_Discard(self, call: Call) -> None:
        await self.manager.review_discard(call.parameters["id"])
        await call.reply({})

    async def do_Stop(self, call: Call) -> None:
        """Replies once the session has ended (SIGTERM, grace, SIGKILL: bounded)."""
        p = call.parameters
        info = await self.manager.stop_and_wait(p["id"], p.get("kill") is True)
        await call.reply({"session": info.to_wire()})

    async def do_List(self, call: Call) -> None:
        infos = await self.manager.infos(all=call.parameters.get("all") is True)
        await call.reply({"sessions": [i.summary().to_wire() for i in infos]})

    async def do_Show(self, call: Call) -> None:
        info = await self.manager.info(call.parameters["id"])
        try:
            await call.reply({"session": info.to_wire()})
        except ValueError:  # over the wire's limit (an argv near it, and an outcome)
            await call.reply({"session": info.summary().to_wire()})
