"""Is a process inside one of boxyd's sandboxes? (docs/design.md, "The front door")

boxyd refuses calls from a process that runs in a sandbox it made: that is the
payload, whatever connection it holds (one that leaked into it, however that came
about). Every process of a sandbox is in the sandbox's user namespace and cannot
leave it (setns and unshare are denied, and no capability is left to enter another),
so that namespace names the sandbox: its nsfs identity is registered when stage 2
hands PID 1 over (daemon/stage2proc.py) and let go when the sandbox is closed.

A caller's namespace is read from /proc/PID/ns/user, walking up its parents
(NS_GET_PARENT) until boxyd's own: a namespace nested below a sandbox's counts as
the sandbox's. A caller that cannot be looked at (gone already, or refused) counts
as inside: fail closed.
"""

from __future__ import annotations

import fcntl
import os
import select
import threading

NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2), <linux/nsfs.h>
MAX_DEPTH = 32  # the kernel nests user namespaces 32 deep at most

NsKey = tuple[int, int]  # (st_dev, st_ino) of an nsfs file


def _key(st: os.stat_result) -> NsKey:
    return (st.st_dev, st.st_ino)


class Insiders:
    """The user namespaces of the live sandboxes; and, until one is registered, the
    outer stage 2 that makes it (``pending``): PID 1 starts the payload without waiting
    for boxyd to read Started, so in that moment the namespace is known as the one
    the outer stage 2 (alive until boxyd releases it) is in."""

    def __init__(self) -> None:
        self._own = _key(os.stat("/proc/self/ns/user"))
        self._sandboxes: set[NsKey] = set()
        self._pending: dict[int, int] = {}  # pidfd -> pid of an outer stage 2
        self._lock = threading.Lock()  # registered on the loop, asked on it and in tests

    def pending(self, pid: int) -> int:
        """The outer stage 2 PID (step 0: no namespace of its yet) stands for its
        sandbox's user namespace until add(); the token for pending_done()."""
        pidfd = os.pidfd_open(pid)
        with self._lock:
            self._pending[pidfd] = pid
        return pidfd

    def pending_done(self, token: int) -> None:
        with self._lock:
            if self._pending.pop(token, None) is None:
                return
        os.close(token)

    def _pending_keys(self) -> set[NsKey]:
        """The user namespaces the pending outer stage 2s are in now (one that has
        exited stands for nothing: its sandbox is registered, or never ran)."""
        with self._lock:
            pending = list(self._pending.items())
        keys = set()
        for pidfd, pid in pending:
            try:
                key = _key(os.stat(f"/proc/{pid}/ns/user"))
            except OSError:
                continue
            if not _exited(pidfd):  # the key read is that very process's
                keys.add(key)
        return keys

    def add(self, userns_fd: int) -> NsKey:
        """A sandbox's user namespace (an nsfs fd); its key, for discard()."""
        key = _key(os.fstat(userns_fd))
        with self._lock:
            self._sandboxes.add(key)
        return key

    def discard(self, key: NsKey) -> None:
        with self._lock:
            self._sandboxes.discard(key)

    def __len__(self) -> int:
        return len(self._sandboxes)

    def inside(self, pid: int, pidfd: int | None = None) -> str | None:
        """Why PID counts as inside a sandbox, or None when it does not. With its
        PIDFD (SCM_PIDFD), the answer is that very process's: one that exited meanwhile
        (its pid free for another) counts as inside."""
        if pid <= 0:
            return "a process boxyd cannot see (no pid in its namespace)"
        try:
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            return f"pid {pid} could not be looked at ({e.strerror})"
        try:
            why = self._walk(pid, fd)
        finally:
            os.close(fd)
        if why is None and pidfd is not None and _exited(pidfd):
            return f"pid {pid} exited before it could be looked at"
        return why

    def _walk(self, pid: int, fd: int) -> str | None:
        """Up from FD (PID's user namespace, ours to close) to boxyd's own."""
        held = [fd]
        starting: set[NsKey] | None = None
        try:
            for _ in range(MAX_DEPTH + 1):
                key = _key(os.fstat(held[-1]))
                if key == self._own:
                    return None
                with self._lock:
                    if key in self._sandboxes:
                        return f"pid {pid} runs inside a sandbox of boxyd's"
                if starting is None:
                    starting = self._pending_keys()
                if key in starting:
                    return f"pid {pid} runs inside a sandbox of boxyd's (starting)"
                try:
                    held.append(fcntl.ioctl(held[-1], NS_GET_PARENT))
                except OSError:  # EPERM: above boxyd's own namespace (a sibling's)
                    return None
            return f"pid {pid}: its user namespaces nest deeper than the kernel allows"
        finally:
            for other in held[1:]:
                os.close(other)


def _exited(pidfd: int) -> bool:
    """A pidfd reads as readable once its process has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


INSIDERS = Insiders()
