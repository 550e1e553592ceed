"""The daemon's serving loop: the core (Manager, StageLauncher, Records) wired to its
adapters — varlink on the socket it is handed, D-Bus once on a session bus (Bus) —
READY=1 and STATUS= told to systemd, and the exit after BOXY_IDLE_EXIT seconds with
no session and no client. The process around it (the lock, the socket, logging,
D-Bus activation) is boxyd/__main__.py, which starts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from typing import TYPE_CHECKING

from boxy.errors import BoxyError, DaemonError, UsageError
from boxyd.api.service import STREAMS, VarlinkService
from boxyd.api.varlink import VarlinkServer
from boxyd.daemon.insiders import INSIDERS
from boxyd.daemon.manager import Manager
from boxyd.daemon.records import Records
from boxyd.daemon.sandbox import StageLauncher

if TYPE_CHECKING:  # dbus-fast loads only with a bus
    from boxyd.api.dbus import DbusService

log = logging.getLogger("boxyd")
IDLE_EXIT = 600.0  # seconds with no session and no client before boxyd exits
BUS_JOIN_TIMEOUT = 5.0  # seconds the session bus may take before boxyd serves without it


def sd_notify(state: str) -> None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.sendto(state.encode(), addr)
        except OSError as e:
            log.warning("sd_notify: %s", e)


def run(sock: socket.socket) -> None:
    """Serve on SOCK until stopped (a signal, Shutdown, or idle)."""
    asyncio.run(serve(sock))


async def serve(sock: socket.socket) -> None:
    launcher = StageLauncher()
    manager = Manager(launcher, Records(launcher.user.pw_dir))
    manager.start_launcher()
    service = VarlinkService(manager)
    server = VarlinkServer(
        service.handle, first=service.other_build, exclusive=STREAMS, vet=INSIDERS.inside
    )
    stop = asyncio.Event()
    service.on_shutdown = stop.set
    bus = Bus(manager, launcher)
    service.join_bus = bus.join
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # On the bus before the first client is served: a run accepted before would be
    # placed with no scope (the first run after socket activation, CI run 22).
    address = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or os.environ.get("DBUS_STARTER_ADDRESS")
    if address:
        try:
            await asyncio.wait_for(bus.join(address), BUS_JOIN_TIMEOUT)
        except BoxyError as e:  # no bus, or the name taken: varlink alone
            log.warning("%s", e)
        except TimeoutError:
            log.warning("the session bus did not answer in %ss: varlink alone", BUS_JOIN_TIMEOUT)
    sock.setblocking(False)
    task = asyncio.create_task(server.serve(sock))
    sd_notify(f"READY=1\nSTATUS={status_line(0)}")
    log.info("listening (build %s)", manager.status().build)
    watcher = asyncio.create_task(report_status(manager))
    idle = asyncio.create_task(exit_when_idle(manager, server, stop, idle_limit()))
    await stop.wait()
    watcher.cancel()
    idle.cancel()
    bus.close()
    sd_notify("STOPPING=1")
    server.stop_accepting()  # running sessions are stopped and recorded, and their
    await manager.shutdown()  # clients, still connected, hear how they ended
    server.close()
    task.cancel()


class Bus:
    """boxyd's place on the session bus (dbus-fast loads only then): joined at start
    from our environment, or later when a client brings the address (JoinBus: a
    D-Bus activation that found boxyd running). Lost, the D-Bus API is off and
    varlink goes on serving; the next JoinBus brings it back."""

    def __init__(self, manager: Manager, launcher: StageLauncher) -> None:
        self.manager, self.launcher = manager, launcher
        self.service: DbusService | None = None
        self._watch: asyncio.Task[None] | None = None

    async def join(self, address: str) -> None:
        """On the bus at ADDRESS, owning dev.boxy.Daemon, when it returns (at once when
        on one already); DaemonError when that cannot be."""
        if self.service is not None:
            return
        # A session bus is a unix socket: a tcp: (or any other) address would make
        # boxyd dial wherever a caller names.
        if not address or any(not a.startswith("unix:") for a in address.split(";") if a):
            raise UsageError(f"JoinBus: {address!r} is not a unix: D-Bus address")
        from boxyd.api.dbus import DbusService

        service = DbusService(self.manager, INSIDERS.inside)
        try:
            await service.start(address)
        except asyncio.CancelledError:  # (a start that took too long)
            service.close()
            raise
        except Exception as e:
            service.close()
            raise DaemonError(f"D-Bus API off: {e or type(e).__name__}") from None
        self.service = service
        # runs are placed through the user manager once it is on this bus (scopes.py)
        self.launcher.scopes.joined(service.bus, service.has_owner)
        self._watch = asyncio.get_running_loop().create_task(self._lost(service))
        log.info("on the session bus as dev.boxy.Daemon")

    async def _lost(self, service: DbusService) -> None:
        await service.lost()
        log.warning("lost the session bus: the D-Bus API is off, varlink still serves")
        service.close()
        if self.service is service:
            self.service = None
            self.launcher.scopes.joined(None)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.service is not None:
            self.service.close()
            self.service = None


def status_line(running: int) -> str:
    return f"{running} session{'s' if running != 1 else ''} running"


async def report_status(manager: Manager) -> None:
    """STATUS= for `systemctl --user status boxyd`, as sessions come and go."""
    async for _ in manager.subscribe():
        sd_notify(f"STATUS={status_line(len(manager.running()))}")


def idle_limit() -> float:
    """BOXY_IDLE_EXIT seconds (0: never); unset: IDLE_EXIT."""
    try:
        return max(0.0, float(os.environ.get("BOXY_IDLE_EXIT", IDLE_EXIT)))
    except ValueError:
        return IDLE_EXIT


async def exit_when_idle(
    manager: Manager, server: VarlinkServer, stop: asyncio.Event, limit: float
) -> None:
    """No session and no client for LIMIT seconds: exit (the socket, or the next
    boxyctl, starts boxyd again; the stage-2 template is not held for nothing)."""
    if not limit:
        return
    idle_since = time.monotonic()
    while True:
        await asyncio.sleep(min(limit, 1.0))
        if manager.busy() or server.connections:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= limit:
            log.info("idle for %gs: exiting", limit)
            stop.set()
            return
