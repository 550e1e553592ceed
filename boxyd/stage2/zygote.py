"""PID 1's parent: a process forked from the template's child before that child reads
anything (docs/design.md, "PID 1 from a clean parent"; issue #18).

A forked child keeps a private copy of every page its lineage writes, for as long as
it lives, and PID 1 lives as long as the session. Forked from the outer stage 2 after
steps 0–5, PID 1 kept the ~0.9 MiB those steps wrote (the plan read, the scope,
the network made with pyroute2): most of what a session cost. The zygote is forked
first, waits, and then

1. enters the namespaces the outer stage 2 made in steps 1–5: the user namespace
   (needs nothing: its user owns that namespace, so setns(2) grants every capability
   over it; the template's children are single-threaded, as it requires), then the
   mount, network, IPC, UTS and cgroup namespaces (CAP_SYS_ADMIN over them, from the
   first), closing each fd;
2. makes step 5's PID namespace itself (CAP_SYS_ADMIN over the user namespace, from
   1): a PID namespace cannot be entered before its first process exists;
3. forks PID 1, the first process of that PID namespace (it drops every capability:
   boxyd/stage2/pid1.py, step 7), and sends the outer stage 2 its pid;
4. exits at its socket's end, once the outer stage 2 holds PID 1's pidfd: PID 1 is
   then the template's, as it was once the outer stage 2 exited.

boxyd places the zygote in the run's scope with the outer stage 2 (protocol.Pid), so
PID 1 starts in it. The zygote dies with the outer stage 2 (PR_SET_PDEATHSIG), and
exits at its socket's end when the child is not a run (a joiner) or the run ended
before PID 1. It runs nothing of the payload's and is gone before the payload starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable
from typing import NoReturn

from boxy.errors import SetupError
from boxyd.kernel.sys import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    check,
)
from boxyd.kernel.sys import libc as _libc
from boxyd.stage2 import caps
from boxyd.stage2 import protocol as p

# (nsfs name in /proc/self/ns, its CLONE_ flag): the user namespace first
NAMESPACES = (
    ("user", CLONE_NEWUSER), ("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET),
    ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS), ("cgroup", CLONE_NEWCGROUP),
)  # fmt: skip
MAX_FDS = len(NAMESPACES) + 7  # the plan, status, alive, stdin, stdout, stderr, a PTY socket
_FAILED = b"!"  # a reply's first byte when a step failed: the rest says why

# PID 1's entry point: the plan's rest, its stdio, the status pipe's write end, the
# alive pipe's read end, the socket the PTY's master goes back on
Init = Callable[[bytes, list[int], int, int, socket.socket | None], NoReturn]


class Zygote:
    """The outer stage 2's end of a zygote: its pid (for the scope) and its socket."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock

    def start(
        self, plan_fd: int, offset: int, stdio: list[int], status_w: int, alive_r: int,
        pty: socket.socket | None,
    ) -> tuple[int, int]:  # fmt: skip
        """Steps 1–4 in the zygote: PID 1 forked in this process's namespaces, with the
        plan's rest (PLAN_FD from OFFSET) and its fds; PID 1's pid and pidfd. Needs
        nothing here. Raises SetupError."""
        ns: list[int] = []
        where = "its socket"
        try:
            for name, _ in NAMESPACES:
                where = f"/proc/self/ns/{name}"
                ns.append(os.open(where, os.O_RDONLY | os.O_CLOEXEC))
            where = "its socket"
            fds = [*ns, plan_fd, status_w, alive_r, *stdio]
            if pty is not None:
                fds.append(pty.fileno())
            socket.send_fds(self.sock, [b"%d" % offset], fds)
        except OSError as e:
            raise SetupError(f"PID 1's parent: {where}: {e.strerror}") from None
        finally:
            p.close(ns)
        return self._started()

    def _started(self) -> tuple[int, int]:
        """PID 1's pid, and a pidfd made while the zygote, which waits for no child
        and exits only at its socket's end (close), keeps that pid PID 1's."""
        try:
            data = self.sock.recv(4096)
        except OSError as e:
            raise SetupError(f"PID 1's parent: no answer ({e.strerror})") from None
        if data.startswith(_FAILED) or not data.isdigit():
            said = data[1:].decode(errors="replace") if data.startswith(_FAILED) else ""
            raise SetupError(said or "PID 1's parent: gone before it forked PID 1")
        pid = int(data)
        try:
            return pid, os.pidfd_open(pid)
        except OSError as e:
            raise SetupError(f"PID 1's parent: pidfd_open({pid}): {e.strerror}") from None

    def close(self) -> None:
        """Not needed (a joiner, or a run that ended first): it exits."""
        self.sock.close()


def fork(init: Init, close: socket.socket) -> Zygote:
    """Fork the zygote (CLOSE: the template child's control socket, which is boxyd's
    and not the zygote's); it never returns here."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid != 0:
        theirs.close()
        return Zygote(pid, ours)
    status = 1
    try:
        close.close()
        ours.close()
        caps.die_with_parent(signal.SIGKILL)  # (the outer stage 2's death ends the wait)
        if os.getppid() == parent:
            status = serve(theirs, init)
    finally:
        os._exit(status)


def serve(sock: socket.socket, init: Init) -> int:
    """Wait for step 1's namespaces and PID 1's fds; 0 when the socket ends first.
    Once PID 1 is forked, say its pid and wait for the socket's end: until this
    process exits, PID 1 cannot be reaped, so its pid names it for the outer stage
    2's pidfd_open."""
    try:
        data, fds, _ = p.recv_fds(sock, 64, MAX_FDS)
    except OSError:
        return 1
    if not data:
        return 0
    try:
        pid = begin(data, fds, init, sock)
    except SetupError as e:
        _say(sock, _FAILED + str(e)[: p.MAX_TEXT].encode())
        return 1
    try:
        sock.send(b"%d" % pid)
        sock.recv(1)  # (the end: the outer stage 2 has its pidfd, or is gone)
    except OSError:
        return 1  # the outer stage 2 is gone; it ends PID 1's run with it
    return 0


def begin(data: bytes, fds: list[int], init: Init, sock: socket.socket) -> int:
    """Steps 1–3: PID 1's pid. PID 1 reads its part of the plan itself (the outer stage
    2 waits for the pid, not for that)."""
    n = len(NAMESPACES)
    if not n + 6 <= len(fds) <= MAX_FDS or not data.isdigit():
        p.close(fds)
        raise SetupError("PID 1's parent: the outer stage 2's message is malformed")
    ns, (plan_fd, status_w, alive_r), stdio = fds[:n], fds[n : n + 3], fds[n + 3 : n + 6]
    pty = socket.socket(fileno=fds[n + 6]) if len(fds) > n + 6 else None
    try:
        for fd, (name, flag) in zip(ns, NAMESPACES, strict=True):
            check(_libc.setns(fd, flag), f"PID 1's parent: setns({name})")
        check(_libc.unshare(CLONE_NEWPID), "PID 1's parent: unshare(CLONE_NEWPID)")
        pid = os.fork()
    except OSError as e:
        raise SetupError(f"PID 1's parent: fork: {e.strerror}") from None
    finally:
        p.close(ns)
    if pid == 0:
        sock.close()
        init(_plan_rest(plan_fd, int(data)), stdio, status_w, alive_r, pty)
    os.close(plan_fd)
    return pid


def _plan_rest(plan_fd: int, offset: int) -> bytes:
    """In PID 1, before its steps move its fds: its part of the plan, from OFFSET of
    PLAN_FD (closed). One it cannot read is none: PID 1 says it cannot read its plan."""
    try:
        return os.pread(plan_fd, os.fstat(plan_fd).st_size - offset, offset)
    except OSError:
        return b""
    finally:
        os.close(plan_fd)


def _say(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the outer stage 2 is gone: nobody to tell
        sock.send(data)
