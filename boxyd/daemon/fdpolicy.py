"""Which descriptors a client may hand to a sandbox (docs/design.md, "The front
door"). Pure: passedfds.py looks at a descriptor and fills in FdFacts; judge() says
whether it may enter, and if not, why, in words a user can act on.

The class closed here: a descriptor that carries the user's authority beyond its own
bytes. A sandbox keeps no path to boxyd, the user's agents or buses, the host's
network or its processes, but a descriptor opened outside needs no path: a socket
connected to boxyd (a client started with stdin closed gave the payload its own
varlink connection, and the payload ran `Run` with `ro: [~/.ssh]` on it), to the SSH
agent or the session bus; an unconnected or listening socket of the host's network
namespace; a directory or O_PATH descriptor (openat() from the host's tree); a
process, namespace, BPF, io_uring or other anonymous-inode descriptor; a file of
/proc or /sys; a device. What may enter is what stdio is for: a regular file, a pipe
or FIFO, a null-like device, a terminal (boxyd relays it through a PTY of its own:
the host's never enters), a connected stream socket whose peer is nobody's service
of the user (a socketpair, as node and other runtimes make stdio; a TCP connection;
journald's stdout stream).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

STDIO_NAMES = ("stdin", "stdout", "stderr")

# AF_* and SOCK_* (<sys/socket.h>), S_IF* file types
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM = 1

# Pseudo-filesystems whose files act on the kernel, processes or devices rather than
# hold bytes (<linux/magic.h>): a "regular file" there is refused.
PSEUDO_FS = {
    0x9FA0: "/proc",
    0x62656572: "/sys",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0x50494446: "pidfs (a process descriptor)",
    0x6E736673: "nsfs (a namespace descriptor)",
    0x09041934: "an anonymous inode (eventfd, epoll, io_uring, BPF, perf, userfaultfd …)",
    0xCAFE4A11: "bpffs",
    0x27E0EB: "cgroupfs",
    0x63677270: "cgroup2",
    0x62656570: "configfs",
    0xDE5E81E4: "efivarfs",
    0xF97CFF8C: "selinuxfs",
    0x43415D53: "smackfs",
    0x65735543: "fusectl",
    0x42494E4D: "binfmt_misc",
    0x6165676C: "pstore",
}

# (major, minor) of the memory devices that hold nothing: null, zero, full, random,
# urandom (<linux/major.h>, Documentation/admin-guide/devices.txt)
NULL_LIKE = {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9)}

# journald's stream for services' stdout and stderr: a unit that runs boxyctl hands
# it down; the payload can only log through it
JOURNAL_STDOUT = "/run/systemd/journal/stdout"


class Kind(Enum):
    REGULAR = "regular file"
    DIRECTORY = "directory"
    FIFO = "pipe"
    CHAR = "character device"
    BLOCK = "block device"
    SOCKET = "socket"
    SYMLINK = "symbolic link"
    OTHER = "descriptor of no file type"  # anonymous inodes, pidfds on older kernels


@dataclass(frozen=True)
class SockFacts:
    """A socket as getsockopt and getsockname/getpeername see it. A unix name is a
    path, "@name" for the abstract namespace, "" when unnamed (a socketpair), None
    when there is none (not connected); an inet peer is "ADDR:PORT" or None."""

    family: int
    type: int
    listening: bool
    local: str | None
    peer: str | None
    peer_pid: int = 0  # SO_PEERCRED's (unix); 0 when unknown


@dataclass(frozen=True)
class FdFacts:
    kind: Kind
    fs: int = 0  # statfs f_type
    rdev: tuple[int, int] = (0, 0)
    o_path: bool = False
    tty: bool = False
    sock: SockFacts | None = None


def judge(
    facts: FdFacts,
    sensitive: Sequence[tuple[str, str]],
    own_pid: int,
) -> str | None:
    """None when FACTS may enter a sandbox; else what it is and why it may not.
    SENSITIVE: (path, why) of the user's sockets and the trees that hold them
    (boxyd/config/exposure.py's sensitive_paths); OWN_PID: boxyd's."""
    if facts.o_path:
        return "an O_PATH descriptor (a handle into the host's file tree)"
    if facts.fs in PSEUDO_FS and facts.kind is not Kind.SOCKET:
        return f"a file of {PSEUDO_FS[facts.fs]}"
    match facts.kind:
        case Kind.REGULAR | Kind.FIFO:
            return None
        case Kind.CHAR:
            if facts.tty or facts.rdev in NULL_LIKE:
                return None  # a terminal never enters: boxyd's PTY takes its place
            return f"the device {facts.rdev[0]}:{facts.rdev[1]} (only null-like devices pass)"
        case Kind.SOCKET if facts.sock is not None:
            return _judge_socket(facts.sock, sensitive, own_pid)
        case Kind.DIRECTORY:
            return "a directory (openat() from it reaches the host's files)"
    return f"a {facts.kind.value}"


def _judge_socket(s: SockFacts, sensitive: Sequence[tuple[str, str]], own_pid: int) -> str | None:
    if s.listening:
        return "a listening socket (it would accept the host's connections; use --publish)"
    if s.family == AF_UNIX:
        return _judge_unix(s, sensitive, own_pid)
    if s.family in (AF_INET, AF_INET6):
        if s.type != SOCK_STREAM:
            return "an IP datagram socket of the host's network (it sends anywhere)"
        if s.peer is None:
            return "an unconnected IP socket of the host's network (it connects anywhere)"
        return None
    return f"a socket of address family {s.family} (only unix and TCP streams pass)"


def _judge_unix(s: SockFacts, sensitive: Sequence[tuple[str, str]], own_pid: int) -> str | None:
    if s.peer_pid == own_pid:
        return "a socket connected to boxyd itself"
    if s.peer is None:
        return "an unconnected unix socket (it reaches any socket by name)"
    for name, side in ((s.peer, "connected to"), (s.local, "bound at")):
        if not name or name == JOURNAL_STDOUT and side == "connected to":
            continue
        if name.startswith("@"):
            return f"a unix socket {side} the abstract name {name!r} (a host service's)"
        if not name.startswith("/"):
            return f"a unix socket {side} the relative name {name!r} (not known where)"
        why = _sensitive(posixpath.normpath(name), sensitive)
        if why is not None:
            return f"a unix socket {side} {name} ({why})"
    return None


def _sensitive(path: str, sensitive: Sequence[tuple[str, str]]) -> str | None:
    for tree, why in sensitive:
        if path == tree or path.startswith(tree.rstrip("/") + "/"):
            return why
    return None


def refusal(index: int, what: str) -> str:
    """The one line for a refused descriptor at INDEX of a run's stdio."""
    name = STDIO_NAMES[index] if index < len(STDIO_NAMES) else f"descriptor {index}"
    return (
        f"{name} (fd {index}) is {what}: it would hand the sandbox what it reaches; "
        f"give the run a file, a pipe or /dev/null instead (e.g. {_redirect(index)})"
    )


def _redirect(index: int) -> str:
    return {0: "</dev/null", 1: ">/dev/null", 2: "2>/dev/null"}.get(index, "/dev/null")
