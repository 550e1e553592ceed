"""Who asked (--ask, issue 34 §2): the program in the sandbox whose lookup or connection
the gateway holds, named on the question by its pid and argv[0].

The flow's addresses name the payload's socket (boxyd/net/sockdiag.py: its inode, from
the payload netns's socket table); the process is the one of the sandbox's whose fd
table holds socket:[INODE]. The sandbox's processes are those in its user namespace
(the payload can make none of its own: seccomp and max_user_namespaces=0), found by a
walk of the host's /proc (newest pid first: the program that asked is usually young),
each fd read with readlink. Not PID 1's pid namespace: PID 1 is not dumpable and its
mm was made outside the sandbox, so boxyd may not read its /proc/PID/ns (a race it
sometimes won). That walk is the cost: it runs
in a worker thread (pools.WHO), within BUDGET seconds and MAX_LINKS readlinks, and a
session's lookups run one at a time, a few a second at most; past any bound the
question says "an unknown process".

What the payload wrote is read bounded and not parsed: argv[0] is the cmdline's bytes
up to the first NUL (CMDLINE_READ of them), decoded and made safe for a terminal
(``terminal_safe``); the pid it sees itself by is the last field of the kernel's
NSpid line.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from boxyd.daemon import pools
from boxyd.daemon.asking import Who
from boxyd.net.dnsproxy import TokenBucket
from boxyd.net.sockdiag import Flow, SockDiag

NsKey = str  # a namespace as /proc/PID/ns/user links to it: "user:[INODE]"

BUDGET = 0.25  # seconds per lookup, the walk of /proc included
MAX_LINKS = 65536  # readlinks per lookup (a payload holding 10,000 fds in each of many)
MAX_PROCS = 65536  # /proc entries looked at per lookup
CMDLINE_READ = 4096  # bytes of /proc/PID/cmdline read
ARGV0_SHOWN = 64  # characters of argv[0] on the question
STATUS_READ = 8192  # bytes of /proc/PID/status read (the kernel's text, ~1.5 KB)
RATE, BURST = 4.0, 8  # lookups per second per session (a lookup flood buys "unknown")
WAITING = 4  # a session's lookups waiting their turn; past it, "unknown" at once


def terminal_safe(text: str, limit: int = ARGV0_SHOWN) -> str:
    """TEXT as a terminal may show it: every character that is not printable (control
    characters, escapes, bidirectional overrides, line separators) as "?", at most
    LIMIT characters ("…" past them)."""
    safe = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return safe if len(safe) <= limit else safe[: limit - 1] + "…"


def argv0(cmdline: bytes) -> str:
    """argv[0] from /proc/PID/cmdline's bytes, safe for a terminal ("?" when empty)."""
    first = cmdline.split(b"\0", 1)[0]
    return terminal_safe(first.decode("utf-8", "replace")) or "?"


def ns_pid(status: bytes) -> int | None:
    """The pid in the innermost pid namespace: the last field of status's NSpid line."""
    at = status.find(b"\nNSpid:")
    if at < 0:
        return None
    fields = status[at + 7 : status.find(b"\n", at + 1)].split()
    return int(fields[-1]) if fields and fields[-1].isdigit() else None


def _read(path: str, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def namespace(fd: int) -> NsKey:
    """The user namespace an nsfs FD is (Started's: the sandbox's), as a process's
    /proc/PID/ns/user links to it (a readlink costs a fifth of a stat there)."""
    return f"user:[{os.fstat(fd).st_ino}]"


class _Walk:
    """One lookup's budget: a deadline, and readlinks and entries left."""

    def __init__(self, budget: float, links: int, procs: int) -> None:
        self.deadline = time.monotonic() + budget
        self.links, self.procs = links, procs

    def over(self) -> bool:
        return self.links <= 0 or self.procs <= 0 or time.monotonic() > self.deadline


def _holds(pid: int, target: str, walk: _Walk, proc: str) -> str | bool:
    """The fd of PID's that links to TARGET; False when none does, True when the walk
    ran out of budget first."""
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return False
    for fd in fds:
        walk.links -= 1
        if walk.links < 0 or (walk.links & 255 == 0 and walk.over()):
            return True
        if _link(f"{proc}/{pid}/fd/{fd}") == target:
            return fd
    return False


def holder(inode: int, userns: NsKey, walk: _Walk, proc: str = "/proc") -> tuple[int, str] | None:
    """The host pid of a process in USERNS whose fds hold socket INODE (newest first),
    and that fd; None: none does, or the walk ran out of budget."""
    target = f"socket:[{inode}]"
    try:
        pids = sorted((int(n) for n in os.listdir(proc) if n.isdigit()), reverse=True)
    except OSError:
        return None
    for pid in pids:
        walk.procs -= 1
        if walk.over():
            return None
        if _link(f"{proc}/{pid}/ns/user") != userns:
            continue
        held = _holds(pid, target, walk, proc)
        if held is True:
            return None
        if held:
            return pid, str(held)
    return None


def describe(host_pid: int, fd: str, target: str, proc: str = "/proc") -> Who | None:
    """Who HOST_PID is, read while its FD still links to TARGET (so what was read is
    the holder's, not a process's that took its pid since)."""
    try:
        cmdline = _read(f"{proc}/{host_pid}/cmdline", CMDLINE_READ)
        status = _read(f"{proc}/{host_pid}/status", STATUS_READ)
    except OSError:
        return None
    if _link(f"{proc}/{host_pid}/fd/{fd}") != target:
        return None
    pid = ns_pid(status)
    return Who(pid if pid is not None else host_pid, argv0(cmdline), host_pid)


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def who_sent(diag: SockDiag, flow: Flow, userns: NsKey, budget: float = BUDGET) -> Who | None:
    """The program whose socket sent FLOW, within BUDGET seconds; None past it, or when
    the socket or its holder is gone. Blocking: a worker thread's."""
    owner = diag.owner(flow)
    if owner is None:
        return None
    found = holder(owner.inode, userns, _Walk(budget, MAX_LINKS, MAX_PROCS))
    return None if found is None else describe(*found, f"socket:[{owner.inode}]")


class Whos:
    """One session's lookups of who asked: one at a time, a few a second."""

    def __init__(self, diag: SockDiag, lookup: Callable[..., Who | None] = who_sent) -> None:
        self.diag = diag
        self.userns: NsKey | None = None  # the sandbox's, once Started sent it
        self._lookup = lookup
        self._one = asyncio.Lock()
        self._waiting = 0
        self._bucket = TokenBucket(RATE, BURST)

    async def who(self, flow: Flow | None) -> Who | None:
        """Who sent FLOW, or None (not known, or over a bound)."""
        userns = self.userns
        if flow is None or userns is None or self._waiting >= WAITING or not self._bucket.take():
            return None
        self._waiting += 1
        try:
            async with self._one:
                return await pools.run(pools.WHO, self._lookup, self.diag, flow, userns)
        except OSError:
            return None
        finally:
            self._waiting -= 1

    def close(self) -> None:
        self.diag.close()
