"""PID 1 of the sandbox: docs/design.md, steps 6–10, then init duties until the payload exits.

Forked (not exec'd) by the outer stage 2 inside the new namespaces, so it starts
with every capability over them; each step below removes something for good.
Its reports go to the outer stage 2 through one status pipe, one line each
(boxyd/stage2/protocol.py's Status); the outer side treats them as untrusted.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
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
from boxyd.plan.ops import Plan
from boxyd.stage2 import caps, landlock, protocol, rootfs, seccomp, toolserver

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
WAITED = {signal.SIGCHLD, *FORWARDED}
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
    """One line to the outer stage 2, which believes only a well-formed one."""
    with contextlib.suppress(OSError, protocol.ProtocolError):
        os.write(STATUS_FD, protocol.encode(msg) + b"\n")


INIT_NAME = b"boxy-init"


def rename() -> None:
    """What the payload sees of PID 1 in /proc/1/{cmdline,comm}: "boxy-init", not the
    interpreter's path (the venv, often under the user's home). Our own memory: the
    argv strings the kernel shows are overwritten in place. Needs nothing."""
    name = ctypes.create_string_buffer(INIT_NAME)
    libc.prctl(15, ctypes.addressof(name), 0, 0, 0)  # PR_SET_NAME
    fields = read_small("/proc/self/stat").rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)
        ctypes.memmove(start, INIT_NAME, min(len(INIT_NAME), end - start - 1))


def arrange_fds(stdio: list[int], status_w: int) -> None:
    """Payload stdio at 0–2, the status pipe at 3, nothing else (close_range later)."""
    high = [os.dup(fd) for fd in (*stdio, status_w)]
    for i, fd in enumerate(high):
        os.dup2(fd, i, inheritable=i < 3)
    os.set_inheritable(STATUS_FD, False)


def build_root(plan: Plan) -> None:
    """Step 6. Needs CAP_SYS_ADMIN over the mount namespace (dropped in step 7)."""
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


def limits(plan: Plan) -> None:
    """RLIMIT_NPROC counts per user namespace, so inside this one it bounds the
    sandbox's own tasks (threads included). Needs nothing; CAP_SYS_RESOURCE would
    bypass it, and step 7 removes that."""
    resource.setrlimit(resource.RLIMIT_NPROC, (plan.nproc, plan.nproc))
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))  # the payload's nice 19 stays
    if plan.address_space is not None:
        resource.setrlimit(resource.RLIMIT_AS, (plan.address_space, plan.address_space))
    write_small("/proc/self/oom_score_adj", "1000")


# Missing from Python's termios module (asm-generic/ioctls.h).
TIOCSPTLCK = 0x40045431  # _IOW('T', 0x31, int): unlock the slave
TIOCGPTPEER = 0x5441  # _IO('T', 0x41): open the slave through its master, race-free


def session_terminal(plan: Plan, pty: socket.socket | None) -> None:
    """A session terminal, after step 6: a PTY pair in the sandbox's own devpts (so
    ttyname() and /dev/tty name it inside), set to the client terminal's settings
    before the payload can read them. The slave replaces the /dev/null placeholders
    at plan.pty["fds"]; the master goes to boxyd, through the outer stage 2, and PID 1
    keeps neither. Needs nothing beyond the devpts that step 6 mounted."""
    if plan.pty is None or pty is None:
        return
    try:
        master = os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
            slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY)
            try:
                termsettings.apply(slave, plan.pty)
                for i in plan.pty["fds"]:
                    if i in (0, 1, 2):
                        os.dup2(slave, i)
            finally:
                os.close(slave)
            protocol.send(pty, protocol.Pty(), [master])
        finally:
            os.close(master)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise SetupError(f"session terminal: {e}") from None
    finally:
        pty.close()


def terminal_fd() -> int:
    """The first of fds 0–2 that is the session's PTY (stdin may be a pipe: `… | boxyctl run`)."""
    return next((fd for fd in (0, 1, 2) if os.isatty(fd)), 0)


def controlling_terminal(plan: Plan) -> None:
    """With a session PTY, make it our controlling terminal so job control and ^C work
    (TIOCSCTTY is denied by seccomp later). Without one, /dev/tty gives ENXIO."""
    if plan.ctty:
        os.setsid()
        fcntl.ioctl(terminal_fd(), termios.TIOCSCTTY, 0)


def drop_privileges() -> None:
    """Step 7. Needs CAP_SETPCAP (for securebits and the bounding set) — which it removes."""
    caps.drop_all()
    caps.no_new_privs()
    caps.not_dumpable()
    caps.verify_dropped()
    os.closerange(STATUS_FD + 1, 1 << 20)


def confine(plan: Plan) -> list[str]:
    """Steps 8 and 9: Landlock before seccomp, which denies the landlock syscalls."""
    notes = landlock.apply(
        [(r.path, r.access) for r in plan.landlock],
        connect_ports=plan.landlock_ports,
        scope=plan.landlock_scopes,
    )
    seccomp.load(base64.b64decode(plan.seccomp_bpf))
    return notes


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


def start_payload(plan: Plan) -> int:
    """Step 10: fork; the child gets its own process group (the terminal's foreground),
    exactly fds 0–2, default signal dispositions, and execs the payload."""
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            # The payload and all it starts at nice 19, never lowered (no capability,
            # RLIMIT_NICE 0). Not PID 1: its own start and end (and so the run's) would
            # wait behind every busy process of the machine.
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
            os.setpgid(0, 0)
            os.close(go_w)
            os.read(go_r, 1)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, *FORWARDED, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.close(STATUS_FD)
            if plan.serve == "tools":  # nothing is executed in its place: see toolserver.py
                os.close(err_w)
                os._exit(toolserver.serve())
            execvp_like_libc(plan.argv, plan.env)
        except OSError as e:
            os.write(err_w, str(e.errno or 0).encode())
        os._exit(127)
    os.close(go_r)
    os.close(err_w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    if plan.ctty:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal_fd(), pid)
    os.close(go_w)
    err = os.read(err_r, 16)
    os.close(err_r)
    if err:
        report(protocol.ExecFailed(int(err or b"0"), plan.argv[0][: protocol.MAX_NOTE]))
    return pid


def supervise(pid: int) -> NoReturn:
    """Reap every orphan, forward signals to the payload's group, and exit (taking
    the whole PID namespace with us) when the payload exits."""
    for fd in (0, 1, 2):
        os.close(fd)
    while True:
        info = signal.sigwaitinfo(WAITED)
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
                if os.WIFSIGNALED(status):
                    report(protocol.Killed(os.WTERMSIG(status), os.WCOREDUMP(status)))
                else:
                    report(protocol.Exited(os.WEXITSTATUS(status)))
                os._exit(0)


def confined_report(notes: list[str]) -> protocol.Confined:
    """Landlock's notes, bounded as the outer stage 2 will check them."""
    return protocol.Confined(tuple(n[: protocol.MAX_NOTE] for n in notes[: protocol.MAX_NOTES]))


def read_plan(inner: bytes) -> Plan:
    """PID 1's part of the plan (boxyd/plan/ops.py's to_wire), decoded here: the outer
    stage 2 never decodes it (what it decodes stays in its memory for the session)."""
    try:
        return Plan.from_json(typing.cast(dict[str, Any], wirejson.loads(inner)))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SetupError(f"control: the plan cannot be read ({e})") from None


def setup(
    inner: bytes, stdio: list[int], status_w: int, alive_r: int, pty: socket.socket | None
) -> int:
    """Steps 6–10 in order, each with the privilege it needs and the step that removes
    it; the payload's pid."""
    caps.die_with_parent(signal.SIGKILL)  # needs nothing; holds until PID 1 exits
    # The outer stage 2 may have died before the line above: its end of this pipe
    # then reads as hung up, and there is nobody left to report to.
    if select.select([alive_r], [], [], 0)[0]:
        os._exit(1)
    rename()  # needs nothing: our own memory
    arrange_fds(stdio, status_w)  # needs nothing; step 7 closes every other fd
    plan = read_plan(inner)  # needs nothing; reported through the status pipe from here
    build_root(plan)  # step 6: CAP_SYS_ADMIN over the mount namespace (step 7 drops it)
    session_terminal(plan, pty)  # needs the devpts step 6 mounted; keeps no master
    limits(plan)  # needs nothing; CAP_SYS_RESOURCE would bypass it (step 7 drops it)
    controlling_terminal(plan)  # TIOCSCTTY: seccomp (step 9) denies it from then on
    drop_privileges()  # step 7: CAP_SETPCAP, which it removes with every other one
    notes = confine(plan)  # steps 8-9: Landlock, then seccomp (which denies landlock)
    _signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)  # init's; no enums (template.py)
    report(confined_report(notes))  # the live guard's requests may run from now on
    return start_payload(plan)  # step 10: needs nothing; the payload gets none of it


def main(
    inner: bytes, stdio: list[int], status_w: int, alive_r: int, pty: socket.socket | None = None
) -> NoReturn:
    """PID 1: the steps, then init until the payload exits; a step that fails is
    reported and ends the sandbox."""
    try:
        pid = setup(inner, stdio, status_w, alive_r, pty)
    except SetupError as e:
        report(protocol.SetupFailed(str(e)[: protocol.MAX_TEXT]))
        os._exit(125)
    except OSError as e:
        report(protocol.SetupFailed(f"sandbox setup: {e}"[: protocol.MAX_TEXT]))
        os._exit(125)
    except Exception as e:  # a bug, not a refusal: say so (stderr is the payload's)
        why = f"sandbox setup: internal error: {type(e).__name__}: {e}"
        report(protocol.SetupFailed(why[: protocol.MAX_TEXT]))
        os._exit(125)
    supervise(pid)


__all__ = ["main", "libc"]
