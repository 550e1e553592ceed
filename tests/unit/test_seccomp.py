"""The seccomp policy, checked by running the exported BPF in tests/unit/bpfsim.py.

The expected verdicts are written out here on purpose, independently of the
tables in boxyd/plan/seccomp.py: changing the policy means changing both.
"""

from __future__ import annotations

import errno
import itertools
import struct

import pyseccomp
import pytest

from boxy.errors import SetupError
from boxyd.plan.seccomp import build_filter
from boxyd.stage2 import seccomp as loader

from . import bpfsim as B

ALLOW = "ALLOW"
KILL = "KILL_PROCESS"
EPERM = f"ERRNO({errno.EPERM})"
ENOSYS = f"ERRNO({errno.ENOSYS})"

EXPECTED_ALLOW = set(
    """
    read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2 lseek close
    close_range dup dup2 dup3 fcntl flock pipe pipe2 sendfile splice tee vmsplice
    copy_file_range readahead fadvise64 fallocate ftruncate truncate fsync fdatasync sync
    syncfs sync_file_range
    open openat openat2 creat stat fstat lstat newfstatat statx statfs fstatfs access
    faccessat faccessat2 getdents getdents64 getcwd chdir fchdir mkdir mkdirat rmdir rename
    renameat renameat2 link linkat unlink unlinkat symlink symlinkat readlink readlinkat
    mknod mknodat chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat umask utime
    utimes futimesat utimensat setxattr lsetxattr fsetxattr getxattr lgetxattr fgetxattr
    listxattr llistxattr flistxattr removexattr lremovexattr fremovexattr memfd_create
    cachestat
    brk mmap munmap mremap mprotect madvise msync mincore remap_file_pages mlock mlock2
    munlock mlockall munlockall membarrier pkey_alloc pkey_free pkey_mprotect
    map_shadow_stack mbind set_mempolicy get_mempolicy set_mempolicy_home_node
    poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait
    epoll_pwait2 eventfd eventfd2 inotify_init inotify_init1 inotify_add_watch
    inotify_rm_watch timerfd_create timerfd_settime timerfd_gettime signalfd signalfd4
    io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents
    connect accept accept4 bind listen shutdown getsockname getpeername setsockopt
    getsockopt sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg
    fork vfork execve execveat exit exit_group wait4 waitid getpid gettid getppid getpgid
    setpgid getpgrp getsid setsid set_tid_address set_robust_list get_robust_list rseq
    arch_prctl prctl restart_syscall pidfd_open pidfd_send_signal futex futex_waitv
    futex_wake futex_wait futex_requeue
    getuid geteuid getgid getegid getresuid getresgid getgroups setuid setgid setreuid
    setregid setresuid setresgid setfsuid setfsgid setgroups capget capset
    rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait rt_sigqueueinfo
    rt_tgsigqueueinfo rt_sigsuspend sigaltstack pause kill tkill tgkill alarm getitimer
    setitimer
    time gettimeofday clock_gettime clock_getres clock_nanosleep nanosleep times
    timer_create timer_settime timer_gettime timer_getoverrun timer_delete
    sched_yield sched_getparam sched_setparam sched_getscheduler sched_setscheduler
    sched_get_priority_max sched_get_priority_min sched_rr_get_interval sched_getaffinity
    sched_setaffinity sched_getattr sched_setattr getcpu getpriority setpriority ioprio_get
    ioprio_set getrlimit setrlimit prlimit64 getrusage
    shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl
    mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr
    uname sysinfo getrandom seccomp
    """.split()  # noqa: SIM905 - a list of words reads better here
)

EXPECTED_ENOSYS = {"io_uring_setup", "io_uring_enter", "io_uring_register", "clone3"}

EXPECTED_EPERM = set(
    """
    bpf perf_event_open userfaultfd keyctl add_key request_key
    landlock_create_ruleset landlock_add_rule landlock_restrict_self
    mount umount2 pivot_root chroot move_mount fsopen fsconfig fsmount fspick open_tree
    mount_setattr setns ptrace process_vm_readv process_vm_writev pidfd_getfd
    process_madvise kcmp modify_ldt iopl ioperm syslog kexec_load kexec_file_load
    init_module finit_module delete_module reboot swapon swapoff acct quotactl quotactl_fd
    vhangup lookup_dcookie nfsservctl sethostname setdomainname settimeofday clock_settime
    clock_adjtime adjtimex name_to_handle_at open_by_handle_at fanotify_init fanotify_mark
    """.split()  # noqa: SIM905 - a list of words reads better here
)

# decided on arguments; checked one by one below
EXPECTED_CONDITIONAL = {"clone", "unshare", "ioctl", "socket", "socketpair", "personality"}

# Everything else libseccomp names is killed: e.g. set_thread_area (32-bit TLS), uselib,
# _sysctl, the unimplemented slots, migrate_pages, move_pages, memfd_secret.
NR_LIMIT = 1024  # well past the highest x86_64 syscall (kernel 6.18: 469)


def nr(name: str) -> int:
    n: int = pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, name)
    assert n >= 0, name
    return n


def name_of(number: int) -> str | None:
    try:
        name: bytes = pyseccomp.resolve_syscall(pyseccomp.Arch.X86_64, number)
        return name.decode()
    except ValueError:
        return None


@pytest.fixture(scope="module")
def strict() -> B.Filter:
    return B.Filter(build_filter("strict"))


@pytest.fixture(scope="module")
def compat() -> B.Filter:
    return B.Filter(build_filter("compat"))


def verdict(flt: B.Filter, name: str | int, *args: int, arch: int = B.AUDIT_ARCH_X86_64) -> str:
    number = nr(name) if isinstance(name, str) else name
    return B.describe(flt(number, *args, arch=arch))


# --- the simulator itself --------------------------------------------------------


def _prog(*insns: tuple[int, int, int, int]) -> bytes:
    return b"".join(struct.pack("<HBBI", *i) for i in insns)


def test_bpfsim_executes_loads_alu_and_jumps() -> None:
    prog = _prog(
        (0x20, 0, 0, 16),  # A = args[0].lo
        (0x54, 0, 0, 0xF0),  # A &= 0xf0
        (0x45, 1, 0, 0x80),  # if A & 0x80 goto +1
        (0x06, 0, 0, B.RET_ALLOW),
        (0x02, 0, 0, 3),  # M[3] = A
        (0x61, 0, 0, 3),  # X = M[3]
        (0x87, 0, 0, 0),  # A = X
        (0x04, 0, 0, 1),  # A += 1
        (0x16, 0, 0, 0),  # ret A
    )
    flt = B.Filter(prog)
    assert flt(0, 0x17) == B.RET_ALLOW
    assert flt(0, 0x1FF) == 0xF1
    assert flt(0, 0x80 | (5 << 32)) == 0x81  # the upper word lives at offset 20


def test_bpfsim_refuses_what_the_kernel_refuses() -> None:
    with pytest.raises(B.BPFError):
        B.parse(b"\0" * 7)
    with pytest.raises(B.BPFError):  # misaligned load
        B.Filter(_prog((0x20, 0, 0, 2), (0x16, 0, 0, 0)))(0)
    with pytest.raises(B.BPFError):  # past the end of seccomp_data
        B.Filter(_prog((0x20, 0, 0, 64), (0x16, 0, 0, 0)))(0)
    with pytest.raises(B.BPFError):  # no return
        B.Filter(_prog((0x20, 0, 0, 0)))(0)


# --- the program as a whole ------------------------------------------------------


@pytest.mark.parametrize("mode", ["strict", "compat"])
def test_program_shape(mode: str) -> None:
    bpf = build_filter(mode)
    prog = B.parse(bpf)  # within the kernel's 4096 instructions
    assert build_filter(mode) is bpf  # cached per mode
    # the only verdicts the program can ever return
    returns = {i.k for i in prog if i.code == 0x06}
    allowed = {pyseccomp.ALLOW, pyseccomp.ERRNO(errno.EPERM), pyseccomp.ERRNO(errno.ENOSYS)}
    if mode == "strict":
        allowed.add(B.RET_KILL_PROCESS)
    assert returns <= allowed
    assert all(i.code != 0x16 for i in prog)  # no "ret A"


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        build_filter("lenient")


def test_expected_tables_are_consistent() -> None:
    groups = [EXPECTED_ALLOW, EXPECTED_ENOSYS, EXPECTED_EPERM, EXPECTED_CONDITIONAL]
    for a, b in itertools.combinations(groups, 2):
        assert not a & b
    for name in set().union(*groups):
        nr(name)  # a typo would silently become "killed"


def test_every_syscall_number(strict: B.Filter) -> None:
    wrong = []
    for number in range(NR_LIMIT):
        name = name_of(number)
        if name in EXPECTED_CONDITIONAL:
            continue  # argument tests below
        if name in EXPECTED_ALLOW:
            want = ALLOW
        elif name in EXPECTED_ENOSYS:
            want = ENOSYS
        elif name in EXPECTED_EPERM:
            want = EPERM
        else:
            want = KILL  # unknown numbers included
        got = verdict(strict, number, 1, 2, 3, 4, 5, 6)
        if got != want:
            wrong.append(f"{number} {name}: {got}, expected {want}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("number", [-1, 0x3FFFFFFF, 0x7FFFFFFF, -0x80000000, 0x12345678, 1 << 20])
def test_out_of_range_numbers_are_killed(strict: B.Filter, number: int) -> None:
    assert verdict(strict, number) == KILL


@pytest.mark.parametrize("name", ["read", "write", "execve", "ioctl", "clone", "io_uring_setup"])
def test_x32_abi_is_killed(strict: B.Filter, name: str) -> None:
    assert verdict(strict, nr(name) | B.X32_SYSCALL_BIT) == KILL


@pytest.mark.parametrize(
    "arch", [B.AUDIT_ARCH_I386, B.AUDIT_ARCH_AARCH64, pyseccomp.Arch.X32, 0, 0xFFFFFFFF]
)
@pytest.mark.parametrize("number", [0, 1, 3, 11, 20, 59, 102, 425])
def test_other_architectures_are_killed(strict: B.Filter, arch: int, number: int) -> None:
    assert verdict(strict, number, arch=arch) == KILL


# --- argument conditions ---------------------------------------------------------

NS_FLAGS = {
    "CLONE_NEWTIME": 0x80,
    "CLONE_NEWNS": 0x20000,
    "CLONE_NEWCGROUP": 0x2000000,
    "CLONE_NEWUTS": 0x4000000,
    "CLONE_NEWIPC": 0x8000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
SIGCHLD = 17
# what glibc passes for pthread_create and for fork
THREAD_FLAGS = 0x003D0F00  # VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID|CHILD_CLEARTID
FORK_FLAGS = 0x01200000 | SIGCHLD  # CHILD_SETTID|CHILD_CLEARTID|SIGCHLD


@pytest.mark.parametrize("flag", NS_FLAGS.values(), ids=NS_FLAGS.keys())
def test_clone_with_a_namespace_flag_is_eperm(strict: B.Filter, flag: int) -> None:
    for extra in (0, SIGCHLD, FORK_FLAGS, THREAD_FLAGS, 0xFFFF << 32):
        assert verdict(strict, "clone", flag | extra) == EPERM, hex(flag | extra)
    assert verdict(strict, "clone", 0x7E0200FF) == EPERM  # every namespace flag at once


@pytest.mark.parametrize("flags", [0, SIGCHLD, FORK_FLAGS, THREAD_FLAGS, 0x4111, 1 << 40 | 17])
def test_clone_for_threads_and_forks_is_allowed(strict: B.Filter, flags: int) -> None:
    assert verdict(strict, "clone", flags, 0, 0, 0, 0) == ALLOW


@pytest.mark.parametrize("flag", NS_FLAGS.values(), ids=NS_FLAGS.keys())
def test_unshare_with_a_namespace_flag_is_eperm(strict: B.Filter, flag: int) -> None:
    assert verdict(strict, "unshare", flag) == EPERM
    assert verdict(strict, "unshare", flag | 0x400 | 0x200) == EPERM


@pytest.mark.parametrize("flags", [0, 0x400, 0x200, 0x40000, 0x600])  # FILES, FS, SYSVSEM
def test_unshare_without_namespaces_is_allowed(strict: B.Filter, flags: int) -> None:
    assert verdict(strict, "unshare", flags) == ALLOW


DENIED_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C, "TIOCSETD": 0x5423}
DENIED_IOCTLS |= {"TIOCSCTTY": 0x540E, "TIOCCONS": 0x541D}


@pytest.mark.parametrize("request_", DENIED_IOCTLS.values(), ids=DENIED_IOCTLS.keys())
@pytest.mark.parametrize("upper", [0, 0x123, 0xFFFFFFFF, 1])
def test_terminal_injection_ioctls_are_eperm(strict: B.Filter, request_: int, upper: int) -> None:
    assert verdict(strict, "ioctl", 0, upper << 32 | request_, 0) == EPERM


@pytest.mark.parametrize(
    "request_",
    [
        0x5401,  # TCGETS
        0x5413,  # TIOCGWINSZ
        0x541B,  # FIONREAD
        0x5421,  # FIONBIO
        0x5414,  # TIOCSWINSZ
        0x80045430,  # TIOCGPTN
        0xFFFFFFFF80045430,  # TIOCGPTN sign-extended (musl's int request)
        0x5411,
        0x5424,  # neighbours of denied values
        0x540D,
        0x540F,
        0x541E,
        0x5422,
        0x15412,  # a bit above TIOCSTI
        0,
        0xFFFFFFFF,
    ],
)
def test_other_ioctls_are_allowed(strict: B.Filter, request_: int) -> None:
    assert verdict(strict, "ioctl", 1, request_, 0) == ALLOW


def test_ioctl_sweep_around_the_terminal_range(strict: B.Filter) -> None:
    denied = set(DENIED_IOCTLS.values())
    for low in range(0x5300, 0x5600):
        for upper in (0, 0xDEAD):
            want = EPERM if low in denied else ALLOW
            assert verdict(strict, "ioctl", 0, upper << 32 | low) == want, hex(low)
    for bit in range(64):  # one flipped bit away from TIOCSTI is some other request
        req = 0x5412 ^ (1 << bit)
        want = EPERM if (req & 0xFFFFFFFF) in denied else ALLOW
        assert verdict(strict, "ioctl", 0, req) == want, hex(req)


AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW, SOCK_SEQPACKET = 1, 2, 3, 5
SOCK_NONBLOCK, SOCK_CLOEXEC = 0o4000, 0o2000000


def socket_expected(family: int, type_: int, proto: int) -> str:
    """The socket rule, stated independently of the policy module."""
    kind = type_ & 0xF
    if family == AF_UNIX and kind in (SOCK_STREAM, SOCK_DGRAM) and proto == 0:
        return ALLOW
    if family in (AF_INET, AF_INET6):
        if kind == SOCK_STREAM and proto in (0, 6):
            return ALLOW
        if kind == SOCK_DGRAM and proto in (0, 17):
            return ALLOW
    if family == AF_NETLINK and kind in (SOCK_RAW, SOCK_DGRAM) and proto == 0:
        return ALLOW
    return EPERM


@pytest.mark.parametrize("call", ["socket", "socketpair"])
def test_socket_sweep(strict: B.Filter, call: str) -> None:
    families = [*range(0, 48), 255, 1 << 31, 1 << 32 | AF_INET, -1]
    types = [
        t | flags
        for t in range(16)
        for flags in (0, SOCK_NONBLOCK, SOCK_CLOEXEC, SOCK_NONBLOCK | SOCK_CLOEXEC)
    ]
    protos = [0, 1, 2, 5, 6, 7, 16, 17, 18, 58, 132, 136, 255, 256, 262, 1 << 32, -1]
    wrong = []
    for family, type_, proto in itertools.product(families, types, protos):
        got = verdict(strict, call, family, type_, proto)
        want = socket_expected(family, type_, proto)
        if got != want:
            wrong.append(f"{call}({family:#x}, {type_:#x}, {proto:#x}) = {got}, expected {want}")
    assert not wrong, "\n".join(wrong[:40])


@pytest.mark.parametrize(
    ("family", "type_", "proto"),
    [
        (40, SOCK_STREAM, 0),  # AF_VSOCK: the hypervisor
        (17, SOCK_RAW, 0x0300),  # AF_PACKET
        (AF_INET, SOCK_RAW, 1),  # raw ICMP
        (AF_INET, SOCK_DGRAM, 1),  # ICMP "ping" socket
        (AF_INET6, SOCK_DGRAM, 58),  # ICMPv6 ping socket
        (38, 5, 0),  # AF_ALG
        (15, 3, 2),  # AF_KEY
        (44, 3, 0),  # AF_XDP
        (31, 5, 0),  # AF_BLUETOOTH
        (AF_INET, SOCK_STREAM, 132),  # SCTP: a module the kernel would autoload
        (AF_NETLINK, SOCK_RAW, 9),  # NETLINK_AUDIT
        (AF_NETLINK, SOCK_RAW, 4),  # NETLINK_SOCK_DIAG
        (AF_UNIX, SOCK_SEQPACKET, 0),
    ],
)
def test_dangerous_sockets_are_eperm(strict: B.Filter, family: int, type_: int, proto: int) -> None:
    assert verdict(strict, "socket", family, type_, proto) == EPERM
    assert verdict(strict, "socket", family, type_ | SOCK_CLOEXEC | SOCK_NONBLOCK, proto) == EPERM


@pytest.mark.parametrize(
    ("family", "type_", "proto"),
    [
        (AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
        (AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 6),
        (AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 17),
        (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0),
        (AF_UNIX, SOCK_DGRAM, 0),
        (AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0),  # NETLINK_ROUTE
        (AF_NETLINK, SOCK_DGRAM, 0),
    ],
)
def test_ordinary_sockets_are_allowed(
    strict: B.Filter, family: int, type_: int, proto: int
) -> None:
    assert verdict(strict, "socket", family, type_, proto) == ALLOW


@pytest.mark.parametrize(
    ("persona", "want"),
    [
        (0, ALLOW),  # PER_LINUX
        (0xFFFFFFFF, ALLOW),  # the query
        (-1, ALLOW),  # the query, sign-extended (the kernel reads an unsigned int)
        (1 << 32, ALLOW),  # upper half ignored by the kernel: PER_LINUX
        (0x0008, EPERM),  # PER_LINUX32
        (0x0040000, EPERM),  # ADDR_NO_RANDOMIZE
        (0x0400000, EPERM),  # READ_IMPLIES_EXEC
        (1, EPERM),
        (0xFFFFFFFE, EPERM),
        (0x80000000, EPERM),
        (0x7FFFFFFF, EPERM),
    ],
)
def test_personality(strict: B.Filter, persona: int, want: str) -> None:
    assert verdict(strict, "personality", persona) == want


# --- compat mode -----------------------------------------------------------------


def _probes() -> list[tuple[int, tuple[int, ...], int]]:
    out: list[tuple[int, tuple[int, ...], int]] = []
    for number in range(NR_LIMIT):
        out.append((number, (), B.AUDIT_ARCH_X86_64))
        out.append((number, (1, 2, 3), B.AUDIT_ARCH_X86_64))
    for number in (0, 1, 59, 425):
        out.append((number | B.X32_SYSCALL_BIT, (), B.AUDIT_ARCH_X86_64))
        out.append((number, (), B.AUDIT_ARCH_I386))
        out.append((number, (), B.AUDIT_ARCH_AARCH64))
    for flag in NS_FLAGS.values():
        out += [(nr("clone"), (flag,), B.AUDIT_ARCH_X86_64)]
        out += [(nr("unshare"), (flag,), B.AUDIT_ARCH_X86_64)]
    for req in (*DENIED_IOCTLS.values(), 0x5401, 0x123 << 32 | 0x5412):
        out.append((nr("ioctl"), (0, req), B.AUDIT_ARCH_X86_64))
    for family, type_, proto in itertools.product(range(0, 46), range(6), (0, 1, 6, 17)):
        out.append((nr("socket"), (family, type_, proto), B.AUDIT_ARCH_X86_64))
    for persona in (0, 8, 0xFFFFFFFF):
        out.append((nr("personality"), (persona,), B.AUDIT_ARCH_X86_64))
    return out


def test_compat_turns_every_kill_into_eperm(strict: B.Filter, compat: B.Filter) -> None:
    kills = 0
    for number, args, arch in _probes():
        s = verdict(strict, number, *args, arch=arch)
        c = verdict(compat, number, *args, arch=arch)
        if s == KILL:
            kills += 1
            assert c == EPERM, (number, args, hex(arch))
        else:
            assert c == s, (number, args, hex(arch))
    assert kills > 100  # the probes did reach the killing paths


# --- the loader's own checks (no kernel needed) ----------------------------------


@pytest.mark.parametrize("bpf", [b"", b"\0" * 7, b"\0" * 8 * 4097])
def test_loader_refuses_malformed_programs(bpf: bytes) -> None:
    # refused before the no_new_privs check, which would fail here too
    with pytest.raises(SetupError, match="instructions"):
        loader.load(bpf)
