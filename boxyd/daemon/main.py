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

from boxy.errors import BoxyError
from boxy.paths import ensure_private_dir, runtime_dir, socket_path
from boxyd.api.service import VarlinkService
from boxyd.api.varlink import VarlinkServer
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
    server = VarlinkServer(service.handle)
    stop = asyncio.Event()
    service.on_shutdown = stop.set
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock.setblocking(False)
    task = asyncio.create_task(server.serve(sock))
    sd_notify(f"READY=1\nSTATUS={status_line(0)}")
    log.info("listening (build %s)", manager.status().build)
    bus = await start_dbus(manager, stop)
    launcher.scopes.bus = bus.bus if bus is not None else None  # the user manager is on it
    watcher = asyncio.create_task(report_status(manager))
    idle = asyncio.create_task(exit_when_idle(manager, server, stop, idle_limit()))
    await stop.wait()
    watcher.cancel()
    idle.cancel()
    if bus is not None:
        bus.close()
    sd_notify("STOPPING=1")
    server.stop_accepting()  # running sessions are stopped and recorded, and their
    await manager.shutdown()  # clients, still connected, hear how they ended
    server.close()
    task.cancel()


async def start_dbus(manager: Manager, stop: asyncio.Event) -> DbusService | None:
    """dev.boxy.Daemon on the session bus when there is one (dbus-fast loads only
    then). Without it varlink still serves; a bus lost later stops boxyd under
    systemd (which restarts it on the next call), and only the D-Bus API otherwise."""
    # started by the bus itself (D-Bus activation without systemd): its address
    address = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or os.environ.get("DBUS_STARTER_ADDRESS")
    if not address:
        return None
    try:
        from boxyd.api.dbus import DbusService

        service = DbusService(manager)
        await service.start(address)
    except Exception as e:  # no bus, or the name taken: varlink alone
        log.warning("D-Bus API off: %s", e)
        return None

    async def watch_bus() -> None:
        await service.lost()
        log.warning("lost the session bus")
        if os.environ.get("INVOCATION_ID"):
            stop.set()

    asyncio.get_running_loop().create_task(watch_bus())
    return service


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="boxyd", description="boxy's per-user daemon")
    parser.parse_args(argv)
    setup_logging()
    raise_nofile()
    try:
        lock = lifetime_lock()  # held until exit: `daemon restart` waits on it
        sock = activated_socket() or own_socket()
    except BoxyError as e:
        log.error("%s", e)
        return 1
    asyncio.run(serve(sock))
    os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
