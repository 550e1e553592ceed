"""varlink adapter: dev.boxy.Manager calls onto the Manager core. No logic here:
decode, call the core, encode; errors through boxy.errors' one table. The server
(boxyd.api.varlink) has checked every parameter against the IDL before a call
comes here: what the IDL requires is there, with its declared type."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from boxy import INTERFACE
from boxy.errors import (
    BoxyError,
    DaemonError,
    InternalError,
    NoSuchSession,
    UsageError,
    varlink_error,
)
from boxy.outcome import RunReply
from boxy.request import RunRequest, Terminal
from boxy.varlink import close_fds
from boxyd.api.varlink import Call
from boxyd.daemon.events import (
    Audited,
    CountersTick,
    Exited,
    Lost,
    Noticed,
    PayloadStopped,
    RunStarted,
    SessionEvent,
    StateChanged,
)
from boxyd.daemon.manager import Manager
from boxyd.daemon.session import Follow

log = logging.getLogger("boxyd")


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


def event_wire(ev: SessionEvent) -> dict[str, Any]:
    """{kind, t, ...its fields}, as the IDL's Event type declares them."""
    out: dict[str, Any] = {"kind": ev.kind, "t": round(ev.t, 3)}
    if isinstance(ev, StateChanged):
        out["state"] = ev.state.value
    elif isinstance(ev, RunStarted):
        out["warnings"] = ev.warnings
    elif isinstance(ev, Noticed):
        out["text"] = ev.text
    elif isinstance(ev, PayloadStopped):
        out["signal"] = ev.signal
    elif isinstance(ev, Audited):
        out["record"] = ev.record
    elif isinstance(ev, CountersTick):
        out["counters"] = ev.counters.to_wire()
        out["destinations"] = [d.to_wire() for d in ev.destinations]
    elif isinstance(ev, Exited):
        out["outcome"] = ev.outcome.to_wire()
    elif isinstance(ev, Lost):
        out["count"] = ev.count
    return out  # detached, attached: nothing besides


async def _no_bus(address: str) -> None:
    raise DaemonError("this boxyd has no D-Bus API")


class VarlinkService:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.on_shutdown: Callable[[], None] = lambda: None
        self.join_bus: Callable[[str], Awaitable[None]] = _no_bus

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
        """Streamed: the session first, then each event as it happens, then the
        session as it ended. Waits for the peer to read (Call.drain): a watcher that
        falls behind loses events in its own bounded queue and is told how many."""
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
            async for ev in events:
                await call.drain()
                if call.connection_closed.is_set():
                    return
                await call.reply({"event": event_wire(ev)}, continues=True)
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
