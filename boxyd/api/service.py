"""varlink adapter: dev.boxy.Manager calls onto the Manager core. No logic here:
decode, call the core, encode; errors through boxy.errors' one table."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from boxy import INTERFACE
from boxy.buildid import build_id
from boxy.errors import BoxyError, BuildMismatch, Busy, InternalError, UsageError, varlink_error
from boxy.request import RunRequest
from boxyd.api.varlink import Call
from boxyd.daemon.manager import Manager
from boxyd.daemon.session import Session

log = logging.getLogger("boxyd")
RUN_EVENTS = ("started", "notice", "stopped")  # what an attached client hears during Run


class VarlinkService:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.on_shutdown: Callable[[], None] = lambda: None

    async def handle(self, call: Call) -> None:
        name = call.method.removeprefix(INTERFACE + ".")
        method = getattr(self, "do_" + name, None) if call.method.startswith(INTERFACE + ".") else None
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
        await call.reply({"build": st.build, "version": st.version, "pid": st.pid,
                          "uptime": st.uptime, "sessions_running": st.sessions_running})

    async def do_Shutdown(self, call: Call) -> None:
        if self.manager.busy():
            raise Busy("sessions are still running")
        await call.reply({})
        self.on_shutdown()

    async def do_Run(self, call: Call) -> None:
        fds = call.take_fds()
        try:
            request = RunRequest.from_wire(call.parameters)
            if request.build != build_id():
                raise BuildMismatch(build_id(), request.build)
        except BaseException:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        session = await self.manager.start(request, fds)
        events = session.subscribe(RUN_EVENTS)
        hangup = asyncio.get_running_loop().create_task(self._hangup(call, session))
        try:
            async for ev in events:
                if not call.more:
                    continue
                if ev.kind == "started":
                    await call.reply({"id": session.id, "state": "running",
                                      "warnings": ev.fields["warnings"]}, continues=True)
                elif ev.kind == "notice":
                    await call.reply({"notice": ev.fields["text"]}, continues=True)
                elif ev.kind == "stopped":
                    await call.reply({"stopped": ev.fields["signal"]}, continues=True)
            outcome = await session.wait()
        finally:
            hangup.cancel()
            events.close()
        await call.reply({"id": session.id, **outcome.to_wire()})

    @staticmethod
    async def _hangup(call: Call, session: Session) -> None:
        """The attached client went away (killed, crashed, connection dropped)."""
        await call.connection_closed.wait()
        session.hangup()

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
        p = call.parameters
        self.manager.stop(str(p.get("id")), bool(p.get("kill")))
        await call.reply({})
