"""varlink adapter: dev.boxy.Manager calls onto the Manager core. No logic here:
decode, call the core, encode; errors through boxy.errors' one table."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from boxy import INTERFACE
from boxy.buildid import build_id
from boxy.errors import (
    BoxyError,
    BuildMismatch,
    Busy,
    InternalError,
    NoSuchSession,
    UsageError,
    varlink_error,
)
from boxy.outcome import Outcome
from boxy.request import RunRequest, Terminal
from boxy.varlink import close_fds
from boxyd.api.varlink import Call
from boxyd.daemon.events import Event, Subscription
from boxyd.daemon.manager import Manager
from boxyd.daemon.session import Session

log = logging.getLogger("boxyd")
FOLLOW_EVENTS = ("started", "notice", "stopped", "detached")  # what an attached client hears


async def final_reply(call: Call, params: dict[str, Any]) -> None:
    """A run's last reply; one over the wire's limit (the outcome's lists are bounded:
    a bug, or a near-ARG_MAX argv in the message) still brings the exit status."""
    try:
        await call.reply(params)
    except ValueError:
        log.error("varlink: %s: the final reply is over the wire's limit", call.method)
        keep = ("id", "exit_status", "reason", "state", "signal")
        await call.reply(
            {
                **{k: params[k] for k in keep if k in params},
                "message": "the outcome was too large to send; "
                f"`boxyctl show {params.get('id')}` has it",
            }
        )


def event_wire(ev: Event) -> dict[str, Any]:
    """{kind, t, ...fields}; an outcome as its wire form."""
    fields = {k: (v.to_wire() if isinstance(v, Outcome) else v) for k, v in ev.fields.items()}
    return {"kind": ev.kind, "t": round(ev.t, 3), **fields}


class VarlinkService:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.on_shutdown: Callable[[], None] = lambda: None

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
        running = self.manager.running()
        if running and call.parameters.get("force") is not True:
            ids = ", ".join(s.id for s in running)
            raise Busy(f"sessions are running ({ids}); --force stops them first")
        await call.reply({})
        self.on_shutdown()

    async def do_Run(self, call: Call) -> None:
        fds = call.take_fds()
        try:
            request = RunRequest.from_wire(call.parameters)
            if request.build != build_id():
                raise BuildMismatch(build_id(), request.build)
        except BaseException:
            close_fds(fds)
            raise
        session = await self.manager.start(request, fds)
        if request.options.detach:  # the id once it runs, and the session is on its own
            events = session.subscribe(("started",))
            try:
                async for ev in events:
                    await call.reply(
                        {"id": session.id, "state": "running", "warnings": ev.fields["warnings"]}
                    )
                    return
            finally:
                events.close()
            await final_reply(call, {"id": session.id, **(await session.wait()).to_wire()})
            return
        await self._follow(call, session, session.subscribe(FOLLOW_EVENTS))

    async def do_Attach(self, call: Call) -> None:
        """As Run, for a session already under way whose terminal nobody holds."""
        # a refusal before the fds are taken: the server closes them with the call
        session = self.manager.get(str(call.parameters.get("id")))
        events = session.subscribe(FOLLOW_EVENTS)
        try:
            session.attach(call.take_fds(), Terminal.from_wire(call.parameters.get("terminal")))
        except BaseException:
            events.close()
            raise
        await call.reply({"id": session.id, "state": "running", "warnings": []}, continues=True)
        await self._follow(call, session, events)

    async def _follow(self, call: Call, session: Session, events: Subscription) -> None:
        """Relay to an attached client until the session ends or it detaches; a
        client that goes away hangs its session up (Session.client_gone)."""
        gone = asyncio.get_running_loop().create_task(self._client_gone(call, session))
        try:
            async for ev in events:
                if not call.more:
                    continue
                if ev.kind == "started":
                    await call.reply(
                        {"id": session.id, "state": "running", "warnings": ev.fields["warnings"]},
                        continues=True,
                    )
                elif ev.kind == "notice":
                    await call.reply({"notice": ev.fields["text"]}, continues=True)
                elif ev.kind == "stopped":
                    await call.reply({"stopped": ev.fields["signal"]}, continues=True)
                elif ev.kind == "detached":
                    await call.reply({"id": session.id, "detached": True})
                    return
            outcome = await session.wait()
        finally:
            gone.cancel()
            events.close()
        await final_reply(call, {"id": session.id, **outcome.to_wire()})

    async def do_Watch(self, call: Call) -> None:
        """Streamed: the session first, then each event as it happens, then the
        session as it ended. Waits for the peer to read (Call.drain): a watcher that
        falls behind loses events in its own bounded queue and is told how many."""
        if not call.more:
            raise UsageError("Watch: streams its replies; call it with more")
        sid = call.parameters.get("id")
        if sid is not None and not isinstance(sid, str):
            raise UsageError("Watch: id: expected a session id")
        try:
            session = self.manager.watched(sid)
        except NoSuchSession:  # finished and forgotten: its record, and the end at once
            await call.reply({"session": (await self.manager.info(str(sid))).to_wire()})
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

    @staticmethod
    async def _client_gone(call: Call, session: Session) -> None:
        """The attached client went away (killed, crashed, connection dropped)."""
        await call.connection_closed.wait()
        session.client_gone()

    async def do_Resize(self, call: Call) -> None:
        p = call.parameters
        rows, cols = p.get("rows"), p.get("cols")
        if type(rows) is int and type(cols) is int:
            self.manager.get(str(p.get("id"))).resize(rows, cols)

    async def do_Signal(self, call: Call) -> None:
        p = call.parameters
        sig = p.get("signal")
        if type(sig) is not int or not 0 < sig < 65:
            raise UsageError(f"Signal: {sig!r} is not a signal number")
        self.manager.get(str(p.get("id"))).signal(sig)

    async def do_Stop(self, call: Call) -> None:
        """Replies once the session has ended (SIGTERM, grace, SIGKILL: bounded)."""
        p = call.parameters
        info = await self.manager.stop_and_wait(str(p.get("id")), p.get("kill") is True)
        await call.reply({"session": info.to_wire()})

    async def do_List(self, call: Call) -> None:
        infos = await self.manager.infos(all=call.parameters.get("all") is True)
        await call.reply({"sessions": [i.summary().to_wire() for i in infos]})

    async def do_Show(self, call: Call) -> None:
        info = await self.manager.info(str(call.parameters.get("id")))
        try:
            await call.reply({"session": info.to_wire()})
        except ValueError:  # over the wire's limit (an argv near it, and an outcome)
            await call.reply({"session": info.summary().to_wire()})
