"""PID 1 of the sandbox: docs/design.md, steps 6–10, then init duties until the payload exits.

Forked (not exec'd) by the outer stage 2 inside the new namespaces, so it starts
with every capability over them; each step below removes something for good.
PID 1 lives as long as the session, and every page of the template it writes is
its own copy for all that time (issue #18), so it does the least it can itself:
the setup that touches memory runs in a child, the builder, which makes the root
and the session terminal (step 6), confines itself (8–9) and execs (10), freeing
all it touched. With a session terminal the builder exits instead, and PID 1 forks
the payload's process once it holds the terminal (take_terminal() says why). PID 1
drops its privileges (step 7) while the root is built, confines itself too, and
supervises. Its reports and theirs go to boxyd through one status pipe, one line
each (boxyd/stage2/protocol.py's Status), which boxyd treats as untrusted. The outer
stage 2 hands PID 1 over to boxyd and exits (docs/design.md, "Processes"): PID 1
ends with boxyd, when boxyd's end of the alive pipe hangs up (watch_boxyd).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import _thread
import base64
import contextlib
import ctypes
import errno
import fcntl
import os
import resource
import select
import signal
import socket
import struct
import termios
import typing
from typing import Any, NoReturn

from boxy import termsettings, wirejson
from boxy.errors import SetupError
from boxyd.kernel.sys import libc, read_small, write_small
from boxyd.plan.ops import Init, Plan, split_wire
from boxyd.stage2 import caps, landlock, notify, protocol, rootfs, seccomp, syscalls, toolserver

STATUS_FD = 3
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGWINCH,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
# SIGIO: boxyd's end of the alive pipe hung up (watch_boxyd)
WAITED = {signal.SIGCHLD, signal.SIGIO, *FORWARDED}
NICE = 19  # the payload's

# Per-user-namespace limits written while PID 1 still holds its capabilities: no
# nested user namespace at all (seccomp's clone/unshare rules are the other layer),
# and inotify bounded so one sandbox cannot exhaust the user's instances.
SYSCTLS = (
    ("user.max_user_namespaces", "0"),
    ("user.max_inotify_instances", "128"),
    ("user.max_inotify_watches", "65536"),
)


def report(msg: protocol.Status) -> None:
    """One line to boxyd, which believes only a well-formed one."""
    with contextlib.suppress(OSError, protocol.ProtocolError):
        os.write(STATUS_FD, protocol.encode(msg) + b"\n")


INIT_NAME = b"boxy-init"
# made in the template, read by PR_SET_NAME only: a string buffer's ctypes array type,
# made in PID 1, would stay there, dirty, for the session (issue #18)
_INIT_NAME_BUFFER = ctypes.create_string_buffer(INIT_NAME)


def argv_area() -> tuple[int, int]:
    """Where the kernel keeps this process's argv strings (/proc/self/stat's arg_start
    and arg_end, fields 48 and 49): the template's, which every child it forks shares
    (the template reads it once: remember_argv_area)."""
    fields = read_small("/proc/self/stat").rsplit(")", 1)[1].split()
    return int(fields[45]), int(fields[46])


_argv_area: tuple[int, int] | None = None


def remember_argv_area() -> None:
    """In the template, before it forks: PID 1 then parses no /proc file for it (a
    string per field, pages it would keep for the session: issue #18)."""
    global _argv_area
    _argv_area = argv_area()


def rename() -> None:
    """What the payload sees of PID 1 in /proc/1/{cmdline,comm}: "boxy-init", not the
    interpreter's path (the venv, often under the user's home). Our own memory: the
    argv strings the kernel shows are overwritten in place. Needs nothing."""
    libc.prctl(15, ctypes.addressof(_INIT_NAME_BUFFER), 0, 0, 0)  # PR_SET_NAME
    start, end = _argv_area or argv_area()
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)
        ctypes.memmove(start, INIT_NAME, min(len(INIT_NAME), end - start - 1))


def arrange_fds(stdio: list[int], status_w: int) -> None:
    """Payload stdio at 0–2, the status pipe at 3, nothing else (close_range later)."""
    high = [os.dup(fd) for fd in (*stdio, status_w)]
    for i, fd in enumerate(high):
        os.dup2(fd, i, inheritable=i < 3)
    os.set_inheritable(STATUS_FD, False)


def setup_failed(e: Exception) -> NoReturn:
    """A step that failed, reported as the run's end (stderr is the payload's)."""
    if isinstance(e, SetupError):
        why = str(e)
    elif isinstance(e, OSError):
        why = f"sandbox setup: {e}"
    else:  # a bug, not a refusal: say so
        why = f"sandbox setup: internal error: {type(e).__name__}: {e}"
    report(protocol.SetupFailed(why[: protocol.MAX_TEXT]))
    os._exit(125)


def child_failed(pid: int) -> NoReturn:
    """A child of PID 1 ended before its setup was done: it reported why itself (a
    second report would contradict it), unless a signal killed it unheard."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        report(protocol.Killed(os.WTERMSIG(status)))
        os._exit(125)
    os._exit(os.WEXITSTATUS(status))


def limits(plan: Init) -> None:
    """RLIMIT_NPROC counts per user namespace, so inside this one it bounds the
    sandbox's own tasks (threads included). Before any fork, so both children inherit
    them: /proc/self is still the host's procfs (the builder pivots the root away)
    and still ours (step 7's not_dumpable makes it root's). Needs nothing;
    CAP_SYS_RESOURCE would bypass them, and the payload's process never has it."""
    resource.setrlimit(resource.RLIMIT_NPROC, (plan.nproc, plan.nproc))
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))  # the payload's nice 19 stays
    if plan.address_space is not None:
        resource.setrlimit(resource.RLIMIT_AS, (plan.address_space, plan.address_space))
    write_small("/proc/self/oom_score_adj", "1000")


def new_session(plan: Init) -> None:
    """With a session PTY, PID 1 leads a session of its own, before any fork: the
    payload's process group must be in PID 1's session, or, its parent outside the
    session, the group is orphaned and the kernel discards ^Z's SIGTSTP for it."""
    if plan.ctty:
        os.setsid()


# -- the builder: a child with PID 1's capabilities, which exits once the root is built
def build_root(plan: Plan) -> None:
    """Step 6. Needs CAP_SYS_ADMIN over the mount namespace (the builder exits with it)."""
    rootfs.staging()
    rootfs.root_tmpfs()
    rootfs.scratch(plan)
    rootfs.dev()
    rootfs.proc()
    for name, value in SYSCTLS:
        rootfs.sysctl(name, value)
    rootfs.apply_ops(plan)
    rootfs.mask_proc()
    rootfs.seal_and_enter(plan.cwd)


# Missing from Python's termios module (asm-generic/ioctls.h).
TIOCSPTLCK = 0x40045431  # _IOW('T', 0x31, int): unlock the slave
TIOCGPTPEER = 0x5441  # _IO('T', 0x41): open the slave through its master, race-free


def session_terminal(plan: Plan, pty: socket.socket | None) -> int | None:
    """A session terminal, after step 6: a PTY pair in the sandbox's own devpts (so
    ttyname() and /dev/tty name it inside), set to the client terminal's settings
    before the payload can read them. The master goes to boxyd, through the outer
    stage 2; the slave is returned, for PID 1. Needs the devpts that step 6 mounted."""
    if plan.pty is None or pty is None:
        return None
    try:
        master = os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
            slave: int = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY)
            try:
                termsettings.apply(slave, plan.pty)
                protocol.send(pty, protocol.Pty(), [master])
            except BaseException:
                os.close(slave)
                raise
        finally:
            os.close(master)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SetupError(f"session terminal: {e}") from None
    finally:
        pty.close()
    return slave


def builder(
    inner: bytes, pty: socket.socket | None, link: socket.socket, last_cap: int, bpf: bytes
) -> NoReturn:
    """The builder's steps. With a controlling terminal to be, its one message to PID 1
    says they are done, with the session PTY's slave (nothing untrusted has run: the
    payload's process is forked after), and it exits; without, it goes on as the
    payload's process (a fork fewer on every start: hooks and scripts have no PTY)."""
    try:
        plan = read_plan(inner)  # here, not in PID 1: freed with the builder
        build_root(plan)
        slave = session_terminal(plan, pty)
        if plan.ctty:
            # It may still be exiting (supervise() reaps it) as the payload starts: /proc
            # closed to it as to PID 1, and the payload's seccomp and Landlock deny ptrace
            caps.not_dumpable()
            send_built(link, slave)
            os._exit(0)
        place_terminal(Init.of(plan).pty_fds, slave)
        close_fds(link.fileno())
        drop_privileges(last_cap)  # step 7 for itself
        caps.verify_dropped()
    except Exception as e:
        setup_failed(e)
    payload(plan, bpf, link)


def send_built(link: socket.socket, slave: int | None) -> None:
    if slave is None:
        link.send(b"built")
    else:
        socket.send_fds(link, [b"built"], [slave])


def fork_builder(
    inner: bytes, pty: socket.socket | None, last_cap: int, bpf: bytes
) -> tuple[int, socket.socket]:
    """Step 6 in a child that holds PID 1's capabilities and exits (its pages with it),
    or becomes the payload's process. Its pivot_root moves our root and cwd (the
    template's, "/") with its own: none stays in the host's tree."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        builder(inner, pty, theirs, last_cap, bpf)
    theirs.close()  # the builder's end: it closes as the builder exits
    if pty is not None:
        pty.close()
    return pid, ours


# -- PID 1, while the root is built and after
def watch_boxyd(alive_r: int) -> int:
    """Whoever holds the alive pipe's write end (the outer stage 2, then boxyd) dying
    hangs it up: the kernel then sends SIGIO (O_ASYNC), blocked here and taken by
    supervise(), which ends the sandbox. Replaces PR_SET_PDEATHSIG, which would fire
    as the outer stage 2 exits. The fd moved above stdio and the status pipe, which
    arrange_fds() puts at 0-3. Needs nothing; SIGIO blocked first (WAITED)."""
    alive = fcntl.fcntl(alive_r, fcntl.F_DUPFD_CLOEXEC, STATUS_FD + 1)
    os.close(alive_r)
    fcntl.fcntl(alive, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(alive, fcntl.F_SETFL, fcntl.fcntl(alive, fcntl.F_GETFL) | os.O_ASYNC)
    if hung_up(alive):  # before the lines above: no signal came for it
        os._exit(1)
    return alive


def hung_up(alive: int) -> bool:
    """Nobody holds the alive pipe's write end (nothing is ever written to it)."""
    return bool(select.select([alive], [], [], 0)[0])


def close_fds(*keep: int) -> None:
    """Every fd but stdio, the status pipe and KEEP: the outer stage 2's, the session
    socket (the builder holds its own copies), the alive pipe."""
    low = STATUS_FD + 1
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def drop_privileges(last_cap: int) -> None:
    """Step 7 (in PID 1, while the builder works: no path, since its pivot_root moves
    our root under us). Needs CAP_SETPCAP (for securebits and the bounding set) —
    which it removes with every other one."""
    caps.drop_all(last_cap)
    caps.no_new_privs()
    caps.not_dumpable()


def built(link: socket.socket, pid: int) -> int | None:
    """The builder's message: the root is built (and the session PTY's slave, if any);
    none, and it failed. Needs nothing."""
    data, fds, _ = protocol.recv_fds(link, 16, 1)
    link.close()
    if data != b"built":
        protocol.close(fds)
        child_failed(pid)
    return fds[0] if fds else None


def place_terminal(fds: list[int] | None, slave: int | None) -> None:
    """The slave replaces the /dev/null placeholders at FDS (plan.pty["fds"])."""
    if fds is None:
        return
    if slave is None:
        raise SetupError("session terminal: the builder sent no PTY")
    for i in fds:
        if i in (0, 1, 2):
            os.dup2(slave, i)


def take_terminal(plan: Init, slave: int | None) -> None:
    """The slave in place, and our controlling terminal, before the payload's process
    is forked: a process gets one only by inheriting it or as a session leader
    (TIOCSCTTY; seccomp denies it from step 9 on). Without one, /dev/tty gives ENXIO."""
    place_terminal(plan.pty_fds, slave)
    if slave is not None:
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)


def payload_process(
    plan: Init, inner: bytes, child: int, link: socket.socket, bpf: bytes
) -> tuple[int, socket.socket]:
    """With a controlling terminal: once the builder is done, the terminal taken and
    the payload's process forked (it inherits it); without, the builder is it."""
    if not plan.ctty:
        return child, link
    slave = built(link, child)
    take_terminal(plan, slave)  # TIOCSCTTY: seccomp (step 9) denies it from then on
    pid, link = fork_payload(inner, bpf)
    take_foreground(plan, pid, slave)
    return pid, link


# -- the payload's process: steps 8–10 for itself
def confine(plan: Plan, bpf: bytes) -> tuple[list[str], list[int]]:
    """Steps 8 and 9: Landlock before seccomp, which denies the landlock syscalls; the
    filter's listener too where it names refusals (PID 1 answers them: notify.py), and
    between the two the reader, in our domain but not under our filter, where
    connect() is named."""
    notes = landlock.apply(
        [(r.path, r.access) for r in plan.landlock],
        connect_ports=plan.landlock_ports,
        scope=plan.landlock_scopes,
    )
    fds = []
    if plan.seccomp_reader is not None:
        fds.append(notify.fork_reader(base64.b64decode(plan.seccomp_reader)).detach())
    listener = seccomp.load(bpf, listener=plan.seccomp_notify is not None)
    return notes, ([listener] if listener is not None else []) + fds


def send_confined(link: socket.socket, fds: list[int]) -> None:
    """Confined, to PID 1, with the listener (and the reader's socket), which this
    process then closes: one that answered its own notifications could let them
    through."""
    try:
        socket.send_fds(link, [b"confined"], fds) if fds else link.send(b"confined")
    finally:
        protocol.close(fds)


def confined_report(notes: list[str]) -> protocol.Confined:
    """Landlock's notes, bounded as boxyd will check them."""
    return protocol.Confined(tuple(n[: protocol.MAX_NOTE] for n in notes[: protocol.MAX_NOTES]))


def execvp_like_libc(argv: list[str], env: dict[str, str]) -> None:
    """os.execvpe, and then what libc's execvp does that Python's does not: a file the
    kernel will not run (ENOEXEC: a script without #!) runs through /bin/sh."""
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        if e.errno != errno.ENOEXEC:
            raise
    path = argv[0]
    if "/" not in path:
        dirs = env.get("PATH", os.defpath).split(":")
        path = next(
            (
                os.path.join(d or ".", argv[0])
                for d in dirs
                if os.access(os.path.join(d or ".", argv[0]), os.X_OK)
            ),
            argv[0],
        )
    os.execve("/bin/sh", ["/bin/sh", path, *argv[1:]], env)


def exec_payload(plan: Plan) -> NoReturn:
    """Step 10: exactly fds 0–2 (the status pipe is close-on-exec), default signal
    dispositions, nothing blocked, and the payload in our place; one that cannot run
    is reported here."""
    try:
        # The payload and all it starts at nice 19, never lowered (no capability,
        # RLIMIT_NICE 0). Not PID 1: its own start and end (and so the run's) would
        # wait behind every busy process of the machine.
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, *FORWARDED, signal.SIGCHLD):
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if plan.serve == "tools":  # nothing is executed in its place: see toolserver.py
            os.close(STATUS_FD)
            os._exit(toolserver.serve())
        execvp_like_libc(plan.argv, plan.env)
    except OSError as e:
        report(protocol.ExecFailed(e.errno or 0, plan.argv[0][: protocol.MAX_NOTE]))
    os._exit(127)


def payload(plan: Plan, bpf: bytes, link: socket.socket) -> NoReturn:
    """The payload's process: its own process group (the terminal's foreground), the
    plan's cwd, steps 8–9; it says so to PID 1 and waits for its go (PID 1 confined,
    the terminal's foreground set) before step 10."""
    try:
        os.setpgid(0, 0)
        try:
            os.chdir(plan.cwd)
        except OSError as e:
            raise SetupError(f"chdir {plan.cwd}: {e.strerror}") from None
        notes, fds = confine(plan, bpf)
        send_confined(link, fds)
        if link.recv(16) != b"go":
            os._exit(125)  # PID 1 failed, and said why
        link.close()
    except Exception as e:
        setup_failed(e)
    report(confined_report(notes))  # the live guard's requests may run from now on
    exec_payload(plan)


def fork_payload(inner: bytes, bpf: bytes) -> tuple[int, socket.socket]:
    """The payload's process, forked from PID 1 once it holds the terminal; it decodes
    the plan itself (its exec frees what that touched)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            plan = read_plan(inner)
        except SetupError as e:
            setup_failed(e)
        payload(plan, bpf, theirs)
    theirs.close()
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # as the child does: whichever runs first
    return pid, ours


# -- PID 1 again, until the payload exits
def take_foreground(plan: Init, pid: int, slave: int | None) -> None:
    """The payload's group becomes the terminal's foreground; PID 1 keeps no terminal
    fd and none of the payload's stdio."""
    if slave is not None:
        if plan.ctty:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(slave, pid)
        os.close(slave)
    for fd in (0, 1, 2):
        os.close(fd)


def confine_init(bpf: bytes, naming: bool) -> None:
    """Steps 8 and 9 for PID 1 itself: a Landlock domain that grants no filesystem
    access (but reading the sandbox's /proc where PID 1 names refused calls: a caller's
    comm and argv[0]) and no TCP connect at all, then the plan's seccomp filter
    (nothing PID 1 does from here on is denied by it). No Landlock scopes: the
    payload's domain is not nested in this one, and a signal scope would stop PID 1
    forwarding signals. After confined(): "/proc" is the sandbox's once the builder
    has pivoted."""
    landlock.apply([("/proc", "read")] if naming else [], connect_ports=[], scope=False)
    seccomp.load(bpf)


def confined(link: socket.socket, pid: int) -> list[int]:
    """The payload's process is confined (its filter's listener with it, and the
    reader's socket, if any). Nothing from it: it failed, and said why. Needs nothing."""
    data, fds, _ = protocol.recv_fds(link, 16, 2)
    if data != b"confined":
        protocol.close(fds)
        child_failed(pid)
    return fds


def go(link: socket.socket) -> None:
    """PID 1 confined too: the payload's go. Needs nothing."""
    link.send(b"go")
    link.close()


def report_refused(note: notify.Notification, who: notify.Caller, action: str) -> None:
    """One refused call, named (notify.Notifier's report)."""
    call = syscalls.name(note.nr)[: protocol.MAX_CALL]
    report(
        protocol.Refused(call, note.nr, note.args, note.pid, who.tgid, who.comm, who.argv0, action)
    )


def report_port(note: notify.Notification, who: notify.Caller, seen: notify.Connect) -> None:
    """One connect() Landlock refused, named (notify.Notifier's port report)."""
    addr = seen.addr or ""
    report(protocol.PortRefused(addr, seen.port, note.pid, who.tgid, who.comm, who.argv0))


def start_notifier(plan: Init, fds: list[int]) -> notify.Notifier | None:
    """A thread of PID 1's answers the payload's refused calls (notify.py); started
    once PID 1 is confined, so it is too. Needs the listener, the reader's socket and
    /proc, read-only."""
    if not fds or plan.seccomp_notify is None:
        protocol.close(fds)
        return None
    listener, *reader = fds
    notifier = notify.Notifier(
        listener, plan.seccomp_notify, frozenset(plan.seccomp_errno), report_refused
    )
    if reader and plan.connect_ports is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, reader[0])
        notifier.name_ports(sock, frozenset(plan.connect_ports), report_port)
    _thread.start_new_thread(quietly, (notifier.serve,))
    return notifier


def quietly(serve: typing.Callable[[], None]) -> None:
    """A notifier that fails ends the sandbox, its listener still open: closed, it
    would let the payload take a listener of its own and let through what ours refuses
    (notify.py). supervise() then reports the payload's end. Nothing to print, PID 1
    has no stderr."""
    try:
        serve()
    except Exception:
        kill_all()


def kill_all() -> None:
    """SIGKILL to every process of the sandbox but PID 1 (kill(-1) from a PID
    namespace's init reaches that namespace alone), before PID 1 lets the notifier's
    listener go: its exit closes the listener before the kernel kills what is left
    (do_exit's files before zap_pid_ns_processes), and a process still running then
    could take a listener of its own (notify.py). A process with SIGKILL pending makes
    no other call. Only PID 1 of the sandbox does this."""
    if os.getpid() == 1:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)


def last_words(notifier: notify.Notifier | None) -> None:
    """The refusals counted by name, those past the report rate too: before the end."""
    if notifier is None or not notifier.tally.counts:
        return
    counts = dict(notifier.tally.counts)  # the thread may add to it meanwhile
    names = tuple(counts)[: protocol.MAX_CALLS]
    report(protocol.Refusals(names, tuple(counts[n] for n in names)))


def ended(status: int, pid: int, notifier: notify.Notifier | None) -> protocol.End:
    """The payload's end; a process PID 1 killed for a forbidden call ended as seccomp's
    own kill would have (SIGSYS), though SIGKILL took it."""
    if not os.WIFSIGNALED(status):
        return protocol.Exited(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    if sig == signal.SIGKILL and notifier is not None and pid in notifier.killed:
        return protocol.Killed(signal.SIGSYS)
    return protocol.Killed(sig, os.WCOREDUMP(status))


def supervise(pid: int, alive: int, notifier: notify.Notifier | None = None) -> NoReturn:
    """Reap every orphan, forward signals to the payload's group, and exit (taking
    the whole PID namespace with us) when the payload exits or boxyd is gone."""
    while True:
        info = signal.sigwaitinfo(WAITED)
        if info.si_signo == signal.SIGIO:  # (or the payload's kill(1, SIGIO): looked at)
            if hung_up(alive):
                kill_all()
                os._exit(1)
            continue
        if info.si_signo != signal.SIGCHLD:
            with contextlib.suppress(OSError):
                os.killpg(pid, info.si_signo)
            continue
        while True:
            try:
                # WUNTRACED: the payload stopping (^Z on the session PTY) is reported, so
                # the client can stop too and give the user's shell its prompt back
                child, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                child = 0
            if child == 0:
                break
            if child == pid and os.WIFSTOPPED(status):
                report(protocol.Stopped(os.WSTOPSIG(status)))
                continue
            if child == pid:
                last_words(notifier)
                report(ended(status, pid, notifier))
                kill_all()
                os._exit(0)


def read_plan(inner: bytes) -> Plan:
    """The sandbox's plan (boxyd/plan/ops.py's to_wire), decoded by the builder and the
    payload's process only: what a process decodes stays in its memory until it
    execs or exits, and PID 1 lives as long as the session."""
    try:
        return Plan.from_json(typing.cast(dict[str, Any], wirejson.loads(inner)))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SetupError(f"control: the plan cannot be read ({e})") from None


def read_init(rest: bytes) -> tuple[Init, bytes]:
    """PID 1's own line of the plan, decoded, and the plan as it came."""
    try:
        line, inner = split_wire(rest)
        return Init.from_json(typing.cast(dict[str, Any], wirejson.loads(line))), inner
    except (ValueError, TypeError) as e:
        raise SetupError(f"control: the plan cannot be read ({e})") from None


def setup(
    rest: bytes, stdio: list[int], status_w: int, alive_r: int, pty: socket.socket | None
) -> tuple[int, int, notify.Notifier | None]:
    """PID 1's steps in order, each with the privilege it needs and the step that
    removes it; the payload's pid, the alive pipe and the notifier."""
    # init's, before any fork: no child's SIGCHLD is lost before supervise() waits (no
    # enums: template.py), and SIGIO waits for it; the payload's process unblocks them
    _signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    alive = watch_boxyd(alive_r)  # needs nothing; SIGIO blocked
    rename()  # needs nothing: our own memory
    arrange_fds(stdio, status_w)  # needs nothing; close_fds() closes every other fd
    plan, inner = read_init(rest)  # needs nothing; reported through the status pipe now
    limits(plan)  # needs nothing; before any fork and before step 7
    new_session(plan)  # needs nothing; before any fork
    bpf = base64.b64decode(plan.seccomp_bpf)
    # paths, read while they resolve: the builder's pivot_root moves our root under us
    last_cap = caps.last_cap()
    status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    child, link = fork_builder(inner, pty, last_cap, bpf)  # step 6, with our capabilities
    close_fds(link.fileno(), status, alive)  # needs nothing; the builder has its own
    drop_privileges(last_cap)  # step 7: CAP_SETPCAP, which it removes with every other one
    caps.verify_dropped(status)  # layers never fail open
    os.close(status)
    pid, link = payload_process(plan, inner, child, link, bpf)  # steps 8–10 for itself
    if not plan.ctty:
        take_foreground(plan, pid, None)  # needs nothing
    fds = confined(link, pid)  # needs nothing; the builder has pivoted by now
    confine_init(bpf, bool(fds))  # steps 8–9 for PID 1: no filesystem access
    notifier = start_notifier(plan, fds)  # the listener; /proc read-only
    go(link)  # needs nothing; the payload execs
    return pid, alive, notifier


def main(
    rest: bytes, stdio: list[int], status_w: int, alive_r: int, pty: socket.socket | None = None
) -> NoReturn:
    """PID 1: the steps, then init until the payload exits; a step that fails is
    reported and ends the sandbox."""
    try:
        pid, alive, notifier = setup(rest, stdio, status_w, alive_r, pty)
    except Exception as e:
        setup_failed(e)
    del rest  # the plan: the builder and the payload's process had it (issue #18)
    # What the steps freed goes back rather than stay dirty for the session (issue #18)
    libc.malloc_trim(0)
    supervise(pid, alive, notifier)


__all__ = ["main", "libc"]
