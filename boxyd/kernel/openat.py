"""openat2(2): opening a path under a directory without following symlinks, and
without leaving it. Used wherever a path lies in a tree the payload can write: by
stage 2 for the mount plan, by boxyd for the files it reads from a work directory
(docs/design.md, "The daemon's host paths")."""

from __future__ import annotations

import ctypes
import os
import stat

from boxy.errors import SetupError
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


def walk_create(root_fd: int, rel: str, *, leaf: str | None, step: str, mode: int = 0o755) -> int:
    """Open REL under ROOT_FD one component at a time with O_NOFOLLOW, creating missing
    directories (and, when LEAF is "file", an empty final file; "dir" a final directory;
    None: the final component must exist). Returns an O_PATH fd of the final component.
    Used on boxy's own tmpfs and for --mkdir sources: no component may be a symlink."""
    parts = [p for p in rel.split("/") if p and p != "."]
    if any(p == ".." for p in parts):
        raise_setup(step, rel, "'..' in path")
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if last and leaf == "file":
                try:
                    nfd = os.open(
                        part,
                        os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=fd,
                    )
                except OSError as e:
                    raise_setup(step, rel, e.strerror or str(e))
                os.close(fd)
                fd = nfd
                break
            if last and leaf is None:
                nfd = _open_nofollow(fd, part, os.O_PATH, step, rel)
            else:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise_setup(step, rel, e.strerror or str(e))
                nfd = _open_nofollow(fd, part, os.O_PATH | os.O_DIRECTORY, step, rel)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_nofollow(dirfd: int, name: str, flags: int, step: str, rel: str) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError as e:
        raise_setup(step, rel, e.strerror or str(e))
        raise AssertionError("unreachable") from None
    if stat.S_ISLNK(os.fstat(fd).st_mode):
        os.close(fd)
        raise_setup(step, rel, "is a symlink (refused)")
    return fd


def raise_setup(step: str, path: str, why: str) -> None:
    raise SetupError(f"{step}: {path}: {why}")
