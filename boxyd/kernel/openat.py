"""openat2(2): opening a path under a directory without following symlinks, and
without leaving it. Used wherever a path lies in a tree the payload can write: by
stage 2 for the mount plan, by boxyd for the files it reads from a work directory
(docs/design.md, "The daemon's host paths")."""

from __future__ import annotations

import ctypes
import os

from boxyd.kernel.sys import errno_call, syscall

SYS_openat2 = 437

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _b(path: str) -> bytes:
    return os.fsencode(path)


def openat2(dirfd: int, path: str, flags: int, step: str, *, beneath: bool = True) -> int:
    """Open PATH relative to DIRFD without following any symlink and, with BENEATH,
    without ever leaving DIRFD (no "..", no absolute jumps). A symlink anywhere in
    the path is an error (ELOOP), which is what a swapped-in symlink must be."""
    how = _OpenHow(
        flags | os.O_CLOEXEC,
        0,
        RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | (RESOLVE_BENEATH if beneath else 0),
    )
    return errno_call(
        step,
        path,
        SYS_openat2,
        ctypes.c_int(dirfd),
        _b(path),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )


def open_how(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2(2) with RESOLVE flags; the fd, or -errno instead of raising."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, resolve)
    fd = syscall(
        SYS_openat2,
        ctypes.c_int(dirfd),
        _b(path),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    return fd if fd >= 0 else -ctypes.get_errno()


def open_in_root(dirfd: int, path: str, flags: int) -> int:
    """Open PATH inside the tree at DIRFD following symlinks as the host would, with
    DIRFD as their root (RESOLVE_IN_ROOT: an absolute target is read from DIRFD, not
    from our staging root). Magic links never. Returns -errno instead of raising."""
    return open_how(dirfd, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)


def open_beneath(dirfd: int, path: str, flags: int) -> int:
    """Open PATH beneath DIRFD with no symlink in any component (the payload's tree:
    a swapped-in symlink must fail, ELOOP/EXDEV). Returns -errno instead of raising."""
    return open_how(
        dirfd, path, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
    )
