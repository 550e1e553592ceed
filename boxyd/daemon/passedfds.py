"""Look at the descriptors a client hands to a sandbox and refuse those that carry
the user's authority (the policy, and why: fdpolicy.py). Thin I/O: fstat, fstatfs,
fcntl and the socket's own getsockopt/getsockname/getpeername, none of which blocks.
Both wires' Run come through Launcher.prepare, which calls check()."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
import termios
from collections.abc import Sequence

from boxy.errors import UsageError
from boxyd.daemon.fdpolicy import (
    AF_INET,
    AF_INET6,
    AF_UNIX,
    FdFacts,
    Kind,
    SockFacts,
    judge,
    refusal,
)
from boxyd.kernel.sys import fs_type

O_PATH = 0o10000000
_KINDS = (
    (stat.S_ISREG, Kind.REGULAR),
    (stat.S_ISDIR, Kind.DIRECTORY),
    (stat.S_ISFIFO, Kind.FIFO),
    (stat.S_ISCHR, Kind.CHAR),
    (stat.S_ISBLK, Kind.BLOCK),
    (stat.S_ISSOCK, Kind.SOCKET),
    (stat.S_ISLNK, Kind.SYMLINK),
)
_UCRED = struct.Struct("3i")


def check(fds: Sequence[int]) -> None:
    """UsageError naming the first of FDS (a run's stdio, in order) that may not enter
    a sandbox."""
    for index, fd in enumerate(fds):
        what = judge(inspect(fd), os.getpid())
        if what is not None:
            raise UsageError(refusal(index, what))


def inspect(fd: int) -> FdFacts:
    """What FD is, as fdpolicy.judge needs it; one it cannot look at is OTHER."""
    try:
        st = os.fstat(fd)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return FdFacts(Kind.OTHER)
    kind = next((k for test, k in _KINDS if test(st.st_mode)), Kind.OTHER)
    try:
        fs = fs_type(fd)
    except OSError:
        fs = 0
    o_path = bool(flags & O_PATH)
    rdev = (os.major(st.st_rdev), os.minor(st.st_rdev))
    tty = kind is Kind.CHAR and not o_path and _is_tty(fd)
    sock = _socket(fd) if kind is Kind.SOCKET and not o_path else None
    return FdFacts(kind, fs, rdev, o_path, tty, sock)


def _is_tty(fd: int) -> bool:
    try:
        termios.tcgetattr(fd)
    except termios.error:
        return False
    return True


def _socket(fd: int) -> SockFacts | None:
    """The socket's facts, read through a duplicate (a socket object owns its fd)."""
    try:
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    with probe:
        family = probe.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
        kind = probe.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        listening = bool(probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
        if family not in (AF_UNIX, AF_INET, AF_INET6):
            return SockFacts(family, kind, listening, None, None)
        local = _name(family, _call(probe.getsockname))
        peer = _name(family, _call(probe.getpeername))
        pid = 0
        if family == AF_UNIX:
            with contextlib.suppress(OSError):
                pid = _UCRED.unpack(
                    probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                )[0]
        return SockFacts(family, kind, listening, local, peer, pid)


def _call(get: object) -> object:
    """getsockname()/getpeername()'s answer; None when there is none (ENOTCONN)."""
    try:
        return get()  # type: ignore[operator]
    except OSError as e:
        if e.errno in (errno.ENOTCONN, errno.EINVAL):
            return None
        raise


def _name(family: int, address: object) -> str | None:
    """A socket address as SockFacts holds it."""
    if address is None:
        return None
    if family != AF_UNIX:
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
    if isinstance(address, bytes):  # the abstract namespace (a leading NUL)
        return "@" + address.lstrip(b"\0").decode(errors="backslashreplace")
    return str(address)
