"""boxyd: the per-user daemon (`python -m boxyd`, or the `boxyd` script). Socket-
activated by systemd, started by boxyctl, or activated by the session bus.

Listens on $XDG_RUNTIME_DIR/boxy/boxyd.sock (the directory verified 0700 and ours),
serves dev.boxy.Manager over varlink, logs to the journal under systemd and to
stderr otherwise, and tells systemd READY=1 once it accepts calls. This module is
the process: the lock, the socket, logging, D-Bus activation; the serving loop is
boxyd/daemon/serve.py.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import resource
import socket
import sys

from boxy.errors import BoxyError
from boxy.paths import ensure_private_dir, runtime_dir, socket_path, state_dir

# asyncio comes in through boxyd.daemon (its __init__: without TLS), never imported here
from boxyd.daemon.serve import run

log = logging.getLogger("boxyd")
SD_LISTEN_FDS_START = 3
JOURNAL_SOCKET = "/run/systemd/journal/socket"


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


_HELD_TERMINAL: list[int] = []  # the pty below, open for boxyd's lifetime


def hold_a_terminal() -> None:
    """boxyd leads its session (systemd's setsid, or boxyctl's start_new_session): a
    session leader without a controlling terminal takes the first terminal it opens
    without O_NOCTTY (a /dev/pts path a client or a payload names: `profile show`,
    `extends:`), and dies of that terminal's SIGHUP with every session. A pty of its
    own as its controlling terminal closes this for every open boxyd makes: a process
    that has one takes no other. Nothing writes to it; it closes when boxyd exits."""
    import termios

    if os.getsid(0) != os.getpid() or _HELD_TERMINAL:
        return  # not a leader (or done): an open never makes a terminal ours
    master, slave = os.openpty()  # not inherited (PEP 446)
    try:
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    except OSError as e:  # a terminal of its own already: nothing to hold
        log.info("no terminal of its own held (%s)", e.strerror)
        os.close(master)
        os.close(slave)
        return
    _HELD_TERMINAL.extend((master, slave))


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
    hold_a_terminal()
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
    run(sock)
    os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
