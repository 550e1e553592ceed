"""The compiled seccomp policy on the real kernel.

Every case forks: the child sets no_new_privs, loads the filter with
boxyd.stage2.seccomp.load and then either reports what a few syscalls
returned (over a pipe, as JSON) or execs a program; the parent asserts on
the report or on the wait status. The test process itself is never filtered.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from boxy.errors import SetupError
from boxyd.plan.seccomp import build_filter
from boxyd.stage2 import seccomp as loader

PR_SET_NO_NEW_PRIVS = 38
SYS_IO_URING_SETUP = 425
SYS_UNSHARE = 272
SYS_IOCTL = 16
SYS_SOCKET = 41
SYS_PERSONALITY = 135
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
AF_VSOCK = 40
SOCK_STREAM = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def raw_syscall(nr: int, *args: int) -> tuple[int, int]:
    """syscall(2) with every argument as a full 64-bit long; returns (result, errno)."""
    ctypes.set_errno(0)
    ret = _libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a) for a in args))
    return ret, ctypes.get_errno() if ret == -1 else 0


def _enter_filter(mode: str) -> None:
    # no core files from the SIGSYS kills we provoke
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    loader.load(build_filter(mode))


def in_filtered_child(fn: Callable[[], Any], mode: str = "strict") -> Any:
    """Run fn() in a forked child under the filter; return its JSON result."""
    bpf = build_filter(mode)  # compiled before the fork, as boxyd does
    assert bpf
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 0
        try:
            os.close(r)
            _enter_filter(mode)
            out = {"ok": fn()}
        except BaseException as e:  # report everything to the parent
            out = {"error": f"{type(e).__name__}: {e}"}
            status = 1
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, wstatus = os.waitpid(pid, 0)
    assert data, f"child reported nothing (wait status {wstatus:#x})"
    report = json.loads(data)
    assert "error" not in report, report["error"]
    assert os.WIFEXITED(wstatus) and os.WEXITSTATUS(wstatus) == 0
    return report["ok"]


def exec_filtered(
    argv: list[str], mode: str = "strict", filtered: bool = True
) -> tuple[int, bytes]:
    """fork + (filter) + execv; returns (wait status, stdout+stderr)."""
    bpf = build_filter(mode)
    assert bpf
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            if filtered:
                _enter_filter(mode)
            os.execv(argv[0], argv)
        except BaseException as e:
            os.write(2, f"exec_filtered: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(127)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        output = f.read()
    _, wstatus = os.waitpid(pid, 0)
    return wstatus, output


def describe(wstatus: int) -> str:
    if os.WIFSIGNALED(wstatus):
        return f"killed by {signal.Signals(os.WTERMSIG(wstatus)).name}"
    return f"exit {os.WEXITSTATUS(wstatus)}"


# --- the loader ------------------------------------------------------------------


def test_load_requires_no_new_privs() -> None:
    def attempt() -> list[str]:
        # this child does not set no_new_privs (as root, the kernel itself would allow it)
        try:
            loader.load(build_filter("strict"))
        except SetupError as e:
            status = Path("/proc/self/status").read_text()
            return [str(e), next(ln for ln in status.splitlines() if ln.startswith("Seccomp:"))]
        return ["loaded", ""]

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, json.dumps(attempt()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        message, seccomp_line = json.loads(f.read())
    os.waitpid(pid, 0)
    assert "no_new_privs" in message
    assert seccomp_line.split() == ["Seccomp:", "0"]


def test_filter_is_installed() -> None:
    def status() -> dict[str, str]:
        lines = Path("/proc/self/status").read_text().splitlines()
        return dict(ln.split(":\t", 1) for ln in lines if ln.startswith(("Seccomp", "NoNewPrivs")))

    got = in_filtered_child(status)
    assert got["Seccomp"].strip() == "2"  # SECCOMP_MODE_FILTER
    assert got["Seccomp_filters"].strip() == "1"
    assert got["NoNewPrivs"].strip() == "1"


# --- refusals with an errno ------------------------------------------------------


def _probe_refusals() -> dict[str, int]:
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    c = ctypes.c_char(b"x")
    return {
        "io_uring_setup": raw_syscall(SYS_IO_URING_SETUP, 1, ctypes.addressof(params))[1],
        "unshare_newuser": raw_syscall(SYS_UNSHARE, CLONE_NEWUSER)[1],
        "ioctl_tiocsti_hi": raw_syscall(SYS_IOCTL, 0, 0x123 << 32 | TIOCSTI, ctypes.addressof(c))[
            1
        ],
        "socket_vsock": raw_syscall(SYS_SOCKET, AF_VSOCK, SOCK_STREAM, 0)[1],
        "personality_linux32": raw_syscall(SYS_PERSONALITY, 0x0008)[1],
        "personality_query": raw_syscall(SYS_PERSONALITY, 0xFFFFFFFF)[1],
    }


def test_refusals_get_their_errno() -> None:
    got = in_filtered_child(_probe_refusals)
    assert got == {
        "io_uring_setup": errno.ENOSYS,
        "unshare_newuser": errno.EPERM,
        "ioctl_tiocsti_hi": errno.EPERM,
        "socket_vsock": errno.EPERM,
        "personality_linux32": errno.EPERM,
        "personality_query": 0,
    }


def test_ordinary_work_keeps_working_after_the_refusals() -> None:
    def work() -> list[Any]:
        _probe_refusals()
        import socket
        import threading

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
        a, b = socket.socketpair()
        a.close()
        b.close()
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
        proc = subprocess.run(["/bin/true"], check=False)
        return [proc.returncode, os.getpid() > 0]

    assert in_filtered_child(work) == [0, True]


# --- kills -----------------------------------------------------------------------


def _unknown_syscall() -> None:
    raw_syscall(1000)


def test_unknown_syscall_is_killed_with_sigsys() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _enter_filter("strict")
            os.write(w, b"loaded")
            _unknown_syscall()
            os.write(w, b" survived")
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    _, wstatus = os.waitpid(pid, 0)
    assert said == b"loaded"
    assert os.WIFSIGNALED(wstatus) and os.WTERMSIG(wstatus) == signal.SIGSYS, describe(wstatus)


def test_unknown_syscall_is_eperm_in_compat_mode() -> None:
    assert in_filtered_child(lambda: raw_syscall(1000), mode="compat") == [-1, errno.EPERM]


I386_GETPID = r"""
int main(void) {
    long ret;
    /* the 32-bit entry point: eax=20 is getpid on i386 */
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(20L) : "memory");
    return ret > 0 ? 0 : 3;
}
"""


@pytest.fixture(scope="module")
def int80_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("cc")
    assert cc is not None, "cc is missing: make setup installs gcc"
    d = tmp_path_factory.mktemp("int80")
    (d / "int80.c").write_text(I386_GETPID)
    subprocess.run([cc, "-O0", "-o", str(d / "int80"), str(d / "int80.c")], check=True)
    return str(d / "int80")


def test_i386_abi_is_killed(int80_binary: str) -> None:
    wstatus, out = exec_filtered([int80_binary], filtered=False)
    assert os.WIFEXITED(wstatus) and os.WEXITSTATUS(wstatus) == 0, (describe(wstatus), out)
    wstatus, out = exec_filtered([int80_binary])
    assert os.WIFSIGNALED(wstatus) and os.WTERMSIG(wstatus) == signal.SIGSYS, (
        describe(wstatus),
        out,
    )


def test_i386_abi_is_refused_in_compat_mode(int80_binary: str) -> None:
    wstatus, out = exec_filtered([int80_binary], mode="compat")
    assert os.WIFEXITED(wstatus) and os.WEXITSTATUS(wstatus) == 3, (describe(wstatus), out)


# --- real workloads --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/bin/node", "-e", "require('fs').readFileSync('/etc/hostname')"],
        [
            "/usr/bin/node",
            "-e",
            "require('child_process').execFileSync('/bin/true');"
            "require('fs').promises.readFile('/etc/hostname')"
            ".then(() => require('os').networkInterfaces())",
        ],
        ["/usr/bin/python3", "-c", "import asyncio, ssl, sqlite3"],
        [
            "/usr/bin/python3",
            "-c",
            "import asyncio, subprocess, sqlite3; sqlite3.connect(':memory:').execute('select 1');"
            "asyncio.run(asyncio.sleep(0)); subprocess.run(['/bin/true'], check=True)",
        ],
        ["/usr/bin/git", "--version"],
        ["/bin/sh", "-c", "ls / | wc -l >/dev/null && echo ok | cat"],
    ],
    ids=["node-readfile", "node-spawn-async", "python-imports", "python-run", "git", "sh"],
)
def test_workload_runs_under_the_filter(argv: list[str]) -> None:
    assert os.access(argv[0], os.X_OK), f"{argv[0]} is missing: make setup installs it"
    wstatus, out = exec_filtered(argv)
    assert os.WIFEXITED(wstatus) and os.WEXITSTATUS(wstatus) == 0, (describe(wstatus), out)
