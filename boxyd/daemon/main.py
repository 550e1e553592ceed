"""boxyd: the per-user daemon. Socket-activated by systemd, or started by boxyctl.

Listens on $XDG_RUNTIME_DIR/boxy/boxyd.sock (the directory verified 0700 and ours),
serves dev.boxy.Manager over varlink, logs to the journal under systemd and to
stderr otherwise, and tells systemd READY=1 once it accepts calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import resource
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

from boxy.errors import BoxyError, DaemonError, UsageError
from boxy.paths import ensure_private_dir, runtime_dir, socket_path, state_dir
from boxyd.api.service import STREAMS, VarlinkService
from boxyd.api.varlink import VarlinkServer
from boxyd.daemon.insiders import INSIDERS
from boxyd.daemon.manager import Manager
from boxyd.daemon.records import Records
from boxyd.daemon.sandbox import StageLauncher

if TYPE_CHECKING:  # dbus-fast loads only with a bus
    from boxyd.api.dbus import DbusService

log = logging.getLogger("boxyd")
SD_LISTEN_FDS_START = 3
JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDLE_EXIT = 600.0  # seconds with no session and no client before boxyd exits


def setup_logging() -> None:
    handler: logging.Handler
    under_systemd = os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID")
    if under_systemd and os.path.exists(JOURNAL_SOCKET):
        try:
            from systemd.journal import JournalHandler

            handler = JournalHandler(SYSLOG_IDENTIFIER="boxyd")
        except ImportError:
            handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s boxyd[%(process)d] %(levelname)s %(message)s")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def activated_socket() -> socket.socket | None:
    """The listening socket systemd passed us (LISTEN_FDS), if any."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    n = int(os.environ.get("LISTEN_FDS", "0"))
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    if n < 1:
        return None
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    os.set_inheritable(sock.fileno(), False)
    return sock


def lifetime_lock() -> int:
    """A lock held for the daemon's lifetime: a second daemon exits instead of
    stealing the socket path, and a client waiting for a restart knows when."""
    d = ensure_private_dir(runtime_dir())
    lock = os.open(d / "boxyd.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise BoxyError("another boxyd is already running for this user") from None
    return lock


def own_socket() -> socket.socket:
    """Bind our socket under the verified runtime directory (the lock is held)."""
    path = socket_path()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


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
    sock.setblocking(False)
    task = asyncio.create_task(server.serve(sock))
    sd_notify(f"READY=1\nSTATUS={status_line(0)}")
    log.info("listening (build %s)", manager.status().build)
    # started by the bus itself (D-Bus activation without systemd): its address
    address = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or os.environ.get("DBUS_STARTER_ADDRESS")
    if address:
        try:
            await bus.join(address)
        except BoxyError as e:  # no bus, or the name taken: varlink alone
            log.warning("%s", e)
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


SYSTEMD1 = "org.freedesktop.systemd1"


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
        except Exception as e:
            service.close()
            raise DaemonError(f"D-Bus API off: {e or type(e).__name__}") from None
        self.service = service
        # runs are placed through the user manager only when there is one on this bus:
        # a call to its name would start one (or wait for a start that never comes)
        has_manager = await service.has_owner(SYSTEMD1)
        self.launcher.scopes.bus = service.bus if has_manager else None
        self._watch = asyncio.get_running_loop().create_task(self._lost(service))
        log.info("on the session bus as dev.boxy.Daemon")

    async def _lost(self, service: DbusService) -> None:
        await service.lost()
        log.warning("lost the session bus: the D-Bus API is off, varlink still serves")
        service.close()
        if self.service is service:
            self.service = None
            self.launcher.scopes.bus = None

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


def detach_from_bus_daemon() -> None:
    """Started by a bus daemon (D-Bus activation without a user manager), our stdio
    are the bus daemon's own: `o=$(dbus-run-session -- busctl --user call …)` would
    wait for their EOF as long as boxyd lives. They go to /dev/null and our log
    file (as boxyctl starts us), in a session of our own."""
    if not os.environ.get("DBUS_STARTER_ADDRESS") or os.environ.get("INVOCATION_ID"):
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        logfile = ensure_private_dir(state_dir()) / "boxyd.log"
        err = os.open(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except (OSError, BoxyError):
        err = null
    for fd, target in ((0, null), (1, null), (2, err)):
        os.dup2(target, fd)
    for fd in {null, err}:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.setsid()


def hand_over_bus(address: str) -> int:
    """This boxyd was activated by a bus while another runs (started before the bus,
    by boxyctl or the socket): the running one joins the bus (JoinBus returns once
    it owns the name, so the activation completes), and this one exits."""
    from boxy import INTERFACE
    from boxy.varlink import Client

    try:
        with Client.connect(str(socket_path())) as client:
            client.call(f"{INTERFACE}.JoinBus", {"address": address})
    except BoxyError as e:
        log.error("activated by the session bus, but the running boxyd cannot join it: %s", e)
        return 1
    log.info("activated by the session bus: the running boxyd joined it")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="boxyd", description="boxy's per-user daemon")
    parser.parse_args(argv)
    detach_from_bus_daemon()
    setup_logging()
    raise_nofile()
    try:
        lock = lifetime_lock()  # held until exit: `daemon restart` waits on it
        sock = activated_socket() or own_socket()
    except BoxyError as e:
        starter = os.environ.get("DBUS_STARTER_ADDRESS")
        if starter and not os.environ.get("INVOCATION_ID"):
            return hand_over_bus(starter)  # activated while one runs: it joins this bus
        log.error("%s", e)
        return 1
    asyncio.run(serve(sock))
    os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
