"""varlink adapter: maps dev.boxy.Manager calls onto the Manager core. No logic here."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from boxyd.api.varlink import Call
from boxyd.buildid import build_id
from boxyd.daemon.manager import Manager, Session
from boxyd.errors import BoxyError, UsageError

IFACE = "dev.boxy.Manager"
log = logging.getLogger("boxyd")


class VarlinkService:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.on_shutdown: Callable[[], None] = lambda: None

    async def handle(self, call: Call) -> None:
        name = call.method.removeprefix(IFACE + ".")
        method = getattr(self, "do_" + name, None) if call.method.startswith(IFACE + ".") else None
        if method is None:
            await call.error("org.varlink.service.MethodNotFound", {"method": call.method})
            return
        try:
            await method(call)
        except UsageError as e:
            await call.error(f"{IFACE}.InvalidArgument", {"message": str(e)})
        except BoxyError as e:
            await call.error(f"{IFACE}.SetupFailed", {"message": str(e)})
        except KeyError as e:
            await call.error(f"{IFACE}.NoSuchSession", {"id": str(e.args[0]) if e.args else ""})
        except Exception:
            log.exception("%s failed", call.method)
            await call.error(f"{IFACE}.SetupFailed", {"message": "internal error in boxyd (see its log)"})

    async def do_Version(self, call: Call) -> None:
        await call.reply(self.manager.version())

    async def do_DaemonStatus(self, call: Call) -> None:
        await call.reply(self.manager.status())

    async def do_Shutdown(self, call: Call) -> None:
        if self.manager.busy():
            await call.error(f"{IFACE}.Busy", {"message": "sessions are still running"})
            return
        await call.reply({})
        self.on_shutdown()

    async def do_Run(self, call: Call) -> None:
        params = call.parameters
        client_build = str(params.get("build", ""))
        if client_build != build_id():
            for fd in call.take_fds():
                os.close(fd)
            await call.error(f"{IFACE}.BuildMismatch", {"daemon_build": build_id(), "client_build": client_build})
            return
        fds = call.take_fds()

        async def started(s: Session, warnings: list[str]) -> None:
            if call.more:
                await call.reply({"id": s.id, "state": "running", "warnings": warnings}, continues=True)

        def notice(text: str) -> None:  # -v: denials as they happen
            if call.more:
                asyncio.get_running_loop().create_task(call.reply({"notice": text}, continues=True))

        def stopped(sig: int) -> None:  # the payload stopped (^Z): the client follows suit
            if call.more:
                asyncio.get_running_loop().create_task(call.reply({"stopped": sig}, continues=True))

        result = await self.manager.run(params, fds, started, notice, stopped)
        await call.reply(result)

    async def do_Resize(self, call: Call) -> None:
        p = call.parameters
        self.manager.resize(str(p.get("id")), int(p.get("rows", 0)), int(p.get("cols", 0)))

    async def do_Signal(self, call: Call) -> None:
        p = call.parameters
        self.manager.signal(str(p.get("id")), int(p.get("signal", 0)))

    async def do_Stop(self, call: Call) -> None:
        p = call.parameters
        self.manager.stop(str(p.get("id")), bool(p.get("kill")))
        if not call.oneway:
            await call.reply({})
