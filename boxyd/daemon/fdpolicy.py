"""Which descriptors a client may hand to a sandbox (docs/design.md, "The front
door"). Pure: passedfds.py looks at a descriptor and fills in FdFacts; judge() says
whether it may enter, and if not, why, in words a user can act on.

The class closed here: a descriptor that carries the user's authority beyond its own
bytes. A sandbox keeps no path to boxyd, the user's agents, buses and services, the
host's network or its processes, but a descriptor opened outside needs no path: a
socket connected to boxyd (a client started with stdin closed gave the payload its
own varlink connection), to the session bus, to a database on loopback (a cron job
that connected to one on fd 0 and ran boxyctl), any socket of the host's network; a
directory or O_PATH handle (openat() from the host's tree); a process, namespace,
message queue or other kernel object; a device. So what may enter is an allowlist of
what stdio is for, and everything else is refused, named: a regular file on a
filesystem that holds data (a known list: a file of any other, /proc, /sys, mqueue
or one boxy does not know, is refused), a pipe or FIFO, a null-like device, a
terminal (boxyd relays it through a PTY of its own: the host's never enters), and of
sockets only a stream socketpair (unnamed at both ends: node and other runtimes make
stdio so) and journald's stdout stream (a unit's stdout: the payload can only log).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

STDIO_NAMES = ("stdin", "stdout", "stderr")

# AF_* and SOCK_* (<sys/socket.h>), S_IF* file types
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_SEQPACKET = 1, 5

# Filesystems whose regular files hold data and nothing else (<linux/magic.h> and the
# filesystems' own sources). A regular file anywhere else (/proc, /sys, mqueue, pidfs,
# nsfs, anonymous inodes, bpffs, cgroupfs, securityfs, debugfs, tracefs, configfs,
# efivarfs, or one not listed) acts on the kernel, a process or a device: refused.
DATA_FS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xCA451A4E: "bcachefs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
    0x3153464A: "jfs",
    0x52654973: "reiserfs",
    0x3434: "nilfs2",
    0x01021994: "tmpfs",
    0x858458F6: "ramfs",
    0x958458F6: "hugetlbfs",
    0x794C7630: "overlayfs",
    0x6969: "nfs",
    0x65735546: "fuse",
    0xFE534D42: "smb2",
    0xFF534D42: "cifs",
    0x517B: "smb",
    0x01021997: "9p",
    0x00C36400: "ceph",
    0x01161970: "gfs2",
    0x7461636F: "ocfs2",
    0x5346414F: "afs",
    0x73717368: "squashfs",
    0xE0F5E1E2: "erofs",
    0x9660: "iso9660",
    0x15013346: "udf",
    0x4D44: "fat",
    0x2011BAB0: "exfat",
    0x5346544E: "ntfs",
    0x482B: "hfsplus",
    0x786F4256: "vboxsf",
    0xF15F: "ecryptfs",
}
# a few by name, for the refusal's words
KERNEL_FS = {
    0x9FA0: "/proc",
    0x62656572: "/sys",
    0x19800202: "mqueue (a message queue of the host's)",
    0x50494446: "pidfs (a process descriptor)",
    0x6E736673: "nsfs (a namespace descriptor)",
    0x09041934: "an anonymous inode (eventfd, epoll, io_uring, BPF, perf, userfaultfd …)",
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


def judge(facts: FdFacts, own_pid: int) -> str | None:
    """None when FACTS may enter a sandbox; else what it is and why it may not.
    OWN_PID: boxyd's (a socketpair whose other end boxyd holds)."""
    if facts.o_path:
        return "an O_PATH descriptor (a handle into the host's file tree)"
    match facts.kind:
        case Kind.FIFO:
            return None
        case Kind.REGULAR if facts.fs in DATA_FS:
            return None
        case Kind.REGULAR:
            return f"a file of {_fs_name(facts.fs)}"
        case Kind.CHAR:
            if facts.tty or facts.rdev in NULL_LIKE:
                return None  # a terminal never enters: boxyd's PTY takes its place
            return f"the device {facts.rdev[0]}:{facts.rdev[1]} (only null-like devices pass)"
        case Kind.SOCKET if facts.sock is not None:
            return _judge_socket(facts.sock, own_pid)
        case Kind.DIRECTORY:
            return "a directory (openat() from it reaches the host's files)"
        case Kind.OTHER if facts.fs in KERNEL_FS:
            return f"a descriptor of {KERNEL_FS[facts.fs]}"
    return f"a {facts.kind.value}"


def _fs_name(fs: int) -> str:
    return KERNEL_FS.get(fs) or f"a filesystem that is not known to hold plain data (0x{fs:x})"


def _judge_socket(s: SockFacts, own_pid: int) -> str | None:
    """Only a stream socketpair, or journald's stdout stream, passes."""
    if s.listening:
        return "a listening socket (it would accept the host's connections; use --publish)"
    if s.family != AF_UNIX:
        where = f" connected to {s.peer}" if s.peer else ""
        return (
            f"a network socket of the host's{where} (a connection to a service is the "
            "user's: boxy's network is the gateway)"
        )
    if s.peer_pid == own_pid:
        return "a socket connected to boxyd itself"
    if s.type not in (SOCK_STREAM, SOCK_SEQPACKET):
        return "a unix datagram socket (it reaches any socket by name)"
    if s.peer is None:
        return "an unconnected unix socket (it reaches any socket by name)"
    if s.local:
        return f"a unix socket bound at {_shown(s.local)} (a service's end)"
    if s.peer and s.peer != JOURNAL_STDOUT:
        return f"a unix socket connected to {_shown(s.peer)} (a service of the host's)"
    return None


def _shown(name: str) -> str:
    return repr(name) if name.startswith("@") or not name.startswith("/") else name


def refusal(index: int, what: str) -> str:
    """The one line for a refused descriptor at INDEX of a run's stdio."""
    name = STDIO_NAMES[index] if index < len(STDIO_NAMES) else f"descriptor {index}"
    return (
        f"{name} (fd {index}) is {what}: it would hand the sandbox what it reaches; "
        f"give the run a file, a pipe or /dev/null instead (e.g. {_redirect(index)})"
    )


def _redirect(index: int) -> str:
    return {0: "</dev/null", 1: ">/dev/null", 2: "2>/dev/null"}.get(index, "/dev/null")
