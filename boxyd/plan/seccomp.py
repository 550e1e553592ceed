"""The sandbox's syscall policy, compiled daemon-side to a classic-BPF program.

Read top to bottom, this module *is* the policy (docs/design.md, "Syscalls"):

- an allowlist; anything not named here kills the process (`strict`) or gets
  EPERM (`compat`, for diagnosis);
- calls that runtimes probe and handle get an errno instead of a kill
  (ENOSYS for io_uring and clone3, EPERM for the rest);
- a few syscalls are decided on their arguments: clone/unshare (namespace
  flags), ioctl (terminal injection), socket/socketpair (address families,
  types, protocols), personality (only the default and the query);
- only the native x86_64 ABI is in the filter: any other architecture and
  the x32 ABI (nr | 0x40000000) get the bad-arch action, kill-process.

libseccomp ORs the rules of one syscall and refuses (EEXIST) or silently
merges rules that overlap with *different* actions (a shorter rule swallows a
longer one whatever their actions). So every argument-dependent syscall is
written as rules that never overlap across actions: the allowed cases, and
their exact complement as masked-equality blocks. tests/unit/test_seccomp.py
runs the exported program and checks every syscall number and the argument
edges.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from functools import cache
from typing import Literal

import pyseccomp as sc

Mode = Literal["strict", "compat"]

# ---------------------------------------------------------------------------
# Allowed unconditionally
# ---------------------------------------------------------------------------

ALLOWED: tuple[str, ...] = (
    # file descriptors, reading and writing
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
    "preadv2", "pwritev2", "lseek", "close", "close_range", "dup", "dup2", "dup3",
    "fcntl", "flock", "pipe", "pipe2", "sendfile", "splice", "tee", "vmsplice",
    "copy_file_range", "readahead", "fadvise64", "fallocate", "ftruncate", "truncate",
    "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
    # paths: open, stat, directories, links, permissions, times, xattrs
    "open", "openat", "openat2", "creat", "stat", "fstat", "lstat", "newfstatat", "statx",
    "statfs", "fstatfs", "access", "faccessat", "faccessat2", "getdents", "getdents64",
    "getcwd", "chdir", "fchdir", "mkdir", "mkdirat", "rmdir", "rename", "renameat",
    "renameat2", "link", "linkat", "unlink", "unlinkat", "symlink", "symlinkat",
    "readlink", "readlinkat", "mknod", "mknodat",  # device nodes need CAP_MKNOD; FIFOs don't
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "umask", "utime", "utimes", "futimesat", "utimensat",
    "setxattr", "lsetxattr", "fsetxattr", "getxattr", "lgetxattr", "fgetxattr",
    "listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
    "memfd_create", "cachestat",
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore",
    "remap_file_pages", "mlock", "mlock2", "munlock", "mlockall", "munlockall",
    "membarrier", "pkey_alloc", "pkey_free", "pkey_mprotect", "map_shadow_stack",
    "mbind", "set_mempolicy", "get_mempolicy", "set_mempolicy_home_node",
    # polling and event sources (epoll, poll, select, eventfd, inotify, timers, signalfd)
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    "timerfd_create", "timerfd_settime", "timerfd_gettime", "signalfd", "signalfd4",
    # legacy Linux AIO (databases, libaio); io_uring is refused below
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
    # sockets: creation is checked below; everything on an existing socket is fine
    "connect", "accept", "accept4", "bind", "listen", "shutdown", "getsockname",
    "getpeername", "setsockopt", "getsockopt", "sendto", "recvfrom", "sendmsg",
    "recvmsg", "sendmmsg", "recvmmsg",
    # processes and threads (clone is checked below; clone3 is refused so libc uses clone)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
    "getpid", "gettid", "getppid", "getpgid", "setpgid", "getpgrp", "getsid", "setsid",
    "set_tid_address", "set_robust_list", "get_robust_list", "rseq", "arch_prctl",
    "prctl", "restart_syscall", "pidfd_open", "pidfd_send_signal",
    "futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
    # credentials: without capabilities these can only shuffle the ids already held
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
    "setfsuid", "setfsgid", "setgroups", "capget", "capset",
    # signals (the PID namespace bounds whom kill can reach)
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend", "sigaltstack", "pause",
    "kill", "tkill", "tgkill", "alarm", "getitimer", "setitimer",
    # time: reading clocks, sleeping, POSIX timers (setting clocks is refused below)
    "time", "gettimeofday", "clock_gettime", "clock_getres", "clock_nanosleep",
    "nanosleep", "times", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete",
    # scheduling and resource limits (raising a hard limit needs a capability)
    "sched_yield", "sched_getparam", "sched_setparam", "sched_getscheduler",
    "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "sched_getaffinity", "sched_setaffinity", "sched_getattr",
    "sched_setattr", "getcpu", "getpriority", "setpriority", "ioprio_get", "ioprio_set",
    "getrlimit", "setrlimit", "prlimit64", "getrusage",
    # System V and POSIX IPC: private to the sandbox's IPC namespace
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
    "mq_timedreceive", "mq_notify", "mq_getsetattr",
    # system information, randomness, and stacking a stricter filter of one's own
    "uname", "sysinfo", "getrandom", "seccomp",
)  # fmt: skip

# ---------------------------------------------------------------------------
# Refused with an errno: runtimes probe these and fall back (a kill would kill them)
# ---------------------------------------------------------------------------

ENOSYS_SYSCALLS: tuple[str, ...] = (
    # libuv (node) probes io_uring and falls back to epoll and its thread pool
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # glibc falls back to clone, whose flags the filter can read (clone3's are behind a pointer)
    "clone3",
)  # fmt: skip

EPERM_SYSCALLS: tuple[str, ...] = (
    # kernel attack surface with a history of privilege escalations
    "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key",
    # the sandbox is already confined by Landlock; stacking is not needed
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
    # the mount family and changing root
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "open_tree", "mount_setattr",
    # namespaces (unshare and clone are checked on their flags below)
    "setns",
    # reaching into other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
    "kcmp",
    # legacy x86 segment and I/O port access
    "modify_ldt", "iopl", "ioperm",
    # system administration
    "syslog", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
    "vhangup", "lookup_dcookie", "nfsservctl", "sethostname", "setdomainname",
    # setting clocks
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    # file handles bypass path-based checks; fanotify watches the whole mount
    "name_to_handle_at", "open_by_handle_at", "fanotify_init", "fanotify_mark",
)  # fmt: skip

# ---------------------------------------------------------------------------
# Decided on their arguments (rules in _argument_rules)
# ---------------------------------------------------------------------------

CONDITIONAL: tuple[str, ...] = ("clone", "unshare", "ioctl", "socket", "socketpair", "personality")

# Namespace flags: clone/unshare with any of them → EPERM; any other flags are allowed.
# CLONE_NEWTIME (0x80) shares its bit with clone's exit-signal byte, where a value
# ≥ 0x80 is invalid anyway, so refusing it costs nothing.
NAMESPACE_FLAGS: dict[str, int] = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

# Terminal ioctls → EPERM: typing into (TIOCSTI) or driving (TIOCLINUX) the terminal,
# changing its line discipline, taking it as controlling tty, redirecting the console.
DENIED_IOCTLS: dict[str, int] = {
    "TIOCSCTTY": 0x540E,
    "TIOCSTI": 0x5412,
    "TIOCLINUX": 0x541C,
    "TIOCCONS": 0x541D,
    "TIOCSETD": 0x5423,
}

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW = 1, 2, 3
SOCK_TYPE_MASK = 0xF  # strips SOCK_NONBLOCK and SOCK_CLOEXEC (the kernel refuses other bits)
IPPROTO_TCP, IPPROTO_UDP = 6, 17
NETLINK_ROUTE = 0

# family → type → protocols allowed; every other combination → EPERM.
SOCKETS: dict[int, dict[int, tuple[int, ...]]] = {
    AF_UNIX: {SOCK_STREAM: (0,), SOCK_DGRAM: (0,)},
    AF_INET: {SOCK_STREAM: (0, IPPROTO_TCP), SOCK_DGRAM: (0, IPPROTO_UDP)},
    AF_INET6: {SOCK_STREAM: (0, IPPROTO_TCP), SOCK_DGRAM: (0, IPPROTO_UDP)},
    # getaddrinfo and getifaddrs read addresses and routes over rtnetlink
    AF_NETLINK: {SOCK_RAW: (NETLINK_ROUTE,), SOCK_DGRAM: (NETLINK_ROUTE,)},
}

# personality(2): PER_LINUX (0) and the query 0xffffffff; anything else → EPERM
# (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, PER_LINUX32, … weaken the process).
PERSONALITIES: tuple[int, ...] = (0, 0xFFFFFFFF)

# ---------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_EPERM = sc.ERRNO(errno.EPERM)
_ENOSYS = sc.ERRNO(errno.ENOSYS)
# With the kernel's user notification, a refusal waits for PID 1, which names the call
# and answers (EPERM, or a kill in strict mode): boxyd/stage2/notify.py
_NOTIFY = sc.NOTIFY

Rule = tuple[int, str, tuple[sc.Arg, ...]]


def _blocks(lo: int, hi: int, field: int) -> Iterator[tuple[int, int]]:
    """Cover [lo, hi] exactly with aligned power-of-two blocks, as (mask, value) pairs
    for MASKED_EQ over the low bits selected by `field` (e.g. 0xffffffff)."""
    while lo <= hi:
        size = lo & -lo if lo else field + 1
        while lo + size - 1 > hi:
            size >>= 1
        yield field & ~(size - 1), lo
        lo += size


def _masked_outside(arg: int, allowed: tuple[int, ...], field: int) -> list[sc.Arg]:
    """Comparisons matching exactly the values of (arg & field) that are not allowed."""
    out: list[sc.Arg] = []
    lo = 0
    for value in sorted(set(allowed)) + [field + 1]:
        out += [sc.Arg(arg, sc.MASKED_EQ, m, v) for m, v in _blocks(lo, value - 1, field)]
        lo = value + 1
    return out


def _outside(arg: int, allowed: tuple[int, ...]) -> list[sc.Arg]:
    """Comparisons matching every 64-bit value not in `allowed` (small ints): one GT for
    everything above, masked blocks for the gaps. Garbage in the upper half is refused."""
    top = max(allowed)
    out = [sc.Arg(arg, sc.GT, top)]
    lo = 0
    for value in sorted(set(allowed)):
        out += [sc.Arg(arg, sc.MASKED_EQ, m, v) for m, v in _blocks(lo, value - 1, _U64)]
        lo = value + 1
    return out


def _namespace_rules(name: str) -> list[Rule]:
    # Only the low 32 bits count: clone takes lower_32_bits(flags), unshare refuses
    # unknown bits with EINVAL. The refusals overlap each other but share one action.
    ns_mask = 0
    out: list[Rule] = []
    for flag in NAMESPACE_FLAGS.values():
        ns_mask |= flag
        out.append((_EPERM, name, (sc.Arg(0, sc.MASKED_EQ, flag, flag),)))
    out.append((sc.ALLOW, name, (sc.Arg(0, sc.MASKED_EQ, ns_mask, 0),)))
    return out


def _ioctl_rules() -> list[Rule]:
    # The kernel reads the request as an unsigned int, so compare the low 32 bits only:
    # (0x123 << 32) | TIOCSTI is still TIOCSTI, and a sign-extended _IOR request from
    # a musl program must still be allowed.
    denied = tuple(DENIED_IOCTLS.values())
    out: list[Rule] = [(_EPERM, "ioctl", (sc.Arg(1, sc.MASKED_EQ, _U32, r),)) for r in denied]
    out += [(sc.ALLOW, "ioctl", (a,)) for a in _masked_outside(1, denied, _U32)]
    return out


def _socket_rules(name: str) -> list[Rule]:
    # Families and protocols are compared as whole 64-bit values (exact EQ to allow):
    # the only effect of garbage in the upper half of an int is a refusal.
    out: list[Rule] = [(_EPERM, name, (a,)) for a in _outside(0, tuple(SOCKETS))]
    for family, types in SOCKETS.items():
        fam = sc.Arg(0, sc.EQ, family)
        for a in _masked_outside(1, tuple(types), SOCK_TYPE_MASK):
            out.append((_EPERM, name, (fam, a)))
        for sock_type, protocols in types.items():
            typ = sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, sock_type)
            for proto in protocols:
                out.append((sc.ALLOW, name, (fam, typ, sc.Arg(2, sc.EQ, proto))))
            for a in _outside(2, protocols):
                out.append((_EPERM, name, (fam, typ, a)))
    return out


def _personality_rules() -> list[Rule]:
    # The kernel takes an unsigned int: compare the low 32 bits, so the query works
    # whether the caller passed 0xffffffff or a sign-extended -1.
    out: list[Rule] = [
        (sc.ALLOW, "personality", (sc.Arg(0, sc.MASKED_EQ, _U32, p),)) for p in PERSONALITIES
    ]
    out += [(_EPERM, "personality", (a,)) for a in _masked_outside(0, PERSONALITIES, _U32)]
    return out


def _argument_rules() -> list[Rule]:
    return [
        *_namespace_rules("clone"),
        *_namespace_rules("unshare"),
        *_ioctl_rules(),
        *_socket_rules("socket"),
        *_socket_rules("socketpair"),
        *_personality_rules(),
    ]


def rules() -> list[Rule]:
    """Every rule of the policy as (action, syscall name, argument comparisons)."""
    out: list[Rule] = [(sc.ALLOW, name, ()) for name in ALLOWED]
    out += [(_ENOSYS, name, ()) for name in ENOSYS_SYSCALLS]
    out += [(_EPERM, name, ()) for name in EPERM_SYSCALLS]
    return out + _argument_rules()


@cache
def build_filter(mode: Mode, notify: bool = False, connect: bool = False) -> bytes:
    """The policy as raw `struct sock_filter` bytes for seccomp(SECCOMP_SET_MODE_FILTER).

    strict: unlisted syscalls, x32 and foreign architectures kill the process.
    compat: each of those kills is EPERM instead; the errno refusals are unchanged.
    notify: every EPERM refusal and every unlisted call is a user notification instead,
    answered by PID 1 as above (errno_calls() says which answer EPERM in strict mode).
    The ENOSYS probes stay in the filter: glibc tries clone3 on every thread it starts.
    Foreign architectures and x32 still kill: their numbers name nothing.
    connect (with notify): every connect() is a notification too, which PID 1 lets
    through (Landlock decides), to name the ports Landlock refuses.
    """
    if mode not in ("strict", "compat"):
        raise ValueError(f"unknown seccomp mode {mode!r}")
    kill = sc.KILL_PROCESS if mode == "strict" else _EPERM
    default = _NOTIFY if notify else kill
    flt = sc.SyscallFilter(defaction=default)
    # libseccomp defaults to killing only the thread on a foreign architecture
    flt.set_attr(sc.Attr.ACT_BADARCH, kill)
    # only the native ABI: anything else is a way around the rules
    if (
        not flt.exist_arch(sc.Arch.X86_64)
        or flt.exist_arch(sc.Arch.X86)
        or flt.exist_arch(sc.Arch.X32)
    ):
        raise RuntimeError("seccomp: the filter must hold exactly the x86_64 ABI")
    # binary search over syscall numbers instead of a linear chain of ~300 compares
    flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    for action, name, args in rules():
        if notify and (action == _EPERM or (connect and name == "connect")):
            action = _NOTIFY
        # libseccomp refuses a rule that repeats the default action (compat's EPERM);
        # such a rule changes nothing, the default already applies
        if action != default:
            flt.add_rule_exactly(action, _number(name), *args)
    return _export(flt)


def _number(name: str) -> int:
    nr = sc.resolve_syscall(sc.Arch.X86_64, name)
    if nr < 0:
        raise RuntimeError(f"seccomp: libseccomp does not know syscall {name!r}")
    return int(nr)


@cache
def kernel_notifies() -> bool:
    """This kernel has SECCOMP_RET_USER_NOTIF (5.0): refused calls can be named. Without
    it they are refused as before and a kill is recorded by its signal alone (doctor
    says so)."""
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as f:
            return "user_notif" in f.read().split()
    except OSError:
        return False


@cache
def errno_calls() -> tuple[int, ...]:
    """The numbers whose notification PID 1 answers with EPERM in strict mode too: the
    calls refused with EPERM by name or on their arguments (an argument-dependent
    call's rules cover every value, so its notification is always one of those)."""
    return tuple(sorted({_number(n) for n in (*EPERM_SYSCALLS, *CONDITIONAL)}))


def name_table() -> tuple[str, ...]:
    """x86_64 syscall names by number up to the last libseccomp knows, "" for a gap:
    the source of boxyd/stage2/syscalls.py (stage 2 does not import libseccomp)."""
    out: list[str] = []
    for nr in range(1024):
        try:
            out.append(sc.resolve_syscall(sc.Arch.X86_64, nr).decode())
        except ValueError:
            out.append("")
    while out and not out[-1]:
        out.pop()
    return tuple(out)


# The reader (boxyd/stage2/notify.py): a process of the payload's Landlock domain
# that copies a connect()'s address out of its caller's memory for PID 1; it needs
# no more than this, and anything else fails (EPERM) rather than kill it.
READER_CALLS: tuple[str, ...] = (
    "read", "write", "close", "openat", "pread64", "lseek", "fstat", "newfstatat",
    "recvfrom", "sendto", "recvmsg", "sendmsg", "pidfd_open", "pidfd_getfd",
    "getsockopt", "brk", "mmap", "munmap", "mremap", "madvise", "futex",
    "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack", "getpid", "gettid",
    "clock_gettime", "exit", "exit_group",
)  # fmt: skip


@cache
def reader_filter() -> bytes:
    """The reader's own filter: READER_CALLS, nothing else (EPERM), x86_64 only."""
    flt = sc.SyscallFilter(defaction=_EPERM)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in READER_CALLS:
        flt.add_rule_exactly(sc.ALLOW, _number(name))
    return _export(flt)


def _export(flt: sc.SyscallFilter) -> bytes:
    # export_bpf writes to a file descriptor; a memfd avoids a temporary file and
    # cannot fill up and block the way a pipe can on a large program
    fd = os.memfd_create("boxy-seccomp", os.MFD_CLOEXEC)
    try:
        with open(fd, "w+b", closefd=False) as f:
            flt.export_bpf(f)
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)
