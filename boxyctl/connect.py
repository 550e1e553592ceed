"""Reach boxyd: verify the front door, start the daemon on demand, check its build."""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time

from boxy.errors import DaemonError
from boxy.paths import ensure_private_dir, runtime_dir, socket_path, state_dir
from boxy.varlink import Client, DaemonUnavailable

START_TIMEOUT = 10.0
# The daemon's own environment: where things are, never the caller's secrets.
DAEMON_ENV = (
    "HOME",
    "USER",
    "LOGNAME",
    "PATH",
    "LANG",
    "LC_ALL",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "DBUS_SESSION_BUS_ADDRESS",
    "BOXY_UPSTREAM_DNS",
    "BOXY_IDLE_EXIT",
)


def _try_connect() -> Client | None:
    try:
        return Client.connect(str(socket_path()))
    except DaemonUnavailable as e:
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise


def connect(*, start: bool = True) -> Client:
    """Connect to boxyd, starting it (under a lock, detached, as us) when nothing listens."""
    ensure_private_dir(runtime_dir())
    client = _try_connect()
    if client is not None or not start:
        if client is None:
            raise DaemonError("boxyd is not running")
        return client
    lock = os.open(runtime_dir() / "start.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = _try_connect()  # someone else may have started it while we waited
        if client is None:
            client = _start_daemon()
        return client
    finally:
        os.close(lock)


def _start_daemon() -> Client:
    log_dir = ensure_private_dir(state_dir())
    env = {k: os.environ[k] for k in DAEMON_ENV if k in os.environ}
    with open(log_dir / "boxyd.log", "ab") as log:
        import subprocess  # only to start the daemon: not on every run's path

        proc = subprocess.Popen(
            [sys.executable, "-m", "boxyd.daemon.main"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        client = _try_connect()
        if client is not None:
            return client
        if proc.poll() is not None:
            raise DaemonError(
                f"boxyd exited at start (status {proc.returncode}); see {log_dir / 'boxyd.log'}"
            )
        time.sleep(0.005)
    raise DaemonError(f"boxyd did not start within {START_TIMEOUT:g}s; see {log_dir / 'boxyd.log'}")


def wait_gone(timeout: float = 5.0) -> None:
    """After Shutdown: wait until the old daemon has let go of its lifetime lock."""
    deadline = time.monotonic() + timeout
    fd = os.open(runtime_dir() / "boxyd.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.02)
    finally:
        os.close(fd)
    raise DaemonError("the old boxyd did not stop")
