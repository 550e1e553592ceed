"""Thin ctypes access to the syscalls stage 2 needs; every failure names its step.

Stage 2 imports only the standard library: it runs before and after pivot_root,
and anything it needs after the pivot must already be imported.
"""

from __future__ import annotations

import ctypes
import errno
import os

from boxy.errors import SetupError

# Namespaces, from <linux/sched.h> (shared with the doctor's probes).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


def read_small(path: str, limit: int = 1 << 16) -> str:
    """A small file (of /proc or /sys) in one read. Not open(): a text stream's
    machinery, run in a child of the stage-2 template, copies some 200 KiB of the
    template's pages into each (issue #18)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit).decode()
    finally:
        os.close(fd)


def write_small(path: str, text: str) -> None:
    """TEXT written at once to a small file (of /proc or /sys) that exists; OSError
    as open() would raise it (see read_small)."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, f"{path}: short write")
    finally:
        os.close(fd)


libc = ctypes.CDLL(None, use_errno=True)
_syscall = libc.syscall
_syscall.restype = ctypes.c_long


def fs_type(fd: int) -> int:
    """The f_type of the filesystem FD is on (fstatfs(2); __fsword_t, the first field
    of struct statfs, is a long on every Linux ABI). OSError on failure."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit ABIs
    if libc.fstatfs(fd, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"fstatfs: {os.strerror(e)}")
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def syscall(nr: int, *args: object) -> int:
    """Raw syscall(2); returns the result or -1 with ctypes errno set."""
    return int(_syscall(ctypes.c_long(nr), *args))


def check(ret: int, step: str, path: str | None = None) -> int:
    """Turn a -1 return into SetupError("step: path: strerror")."""
    if ret == -1:
        err = ctypes.get_errno()
        where = f"{step}: {path}" if path else step
        raise SetupError(f"{where}: {os.strerror(err)} (errno {err})")
    return ret


def errno_call(step: str, path: str | None, nr: int, *args: object) -> int:
    return check(syscall(nr, *args), step, path)
