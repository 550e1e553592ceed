"""Mount-API syscalls (ctypes) and path resolution that never trusts the payload.

Everything here needs CAP_SYS_ADMIN in the sandbox's user namespace, which PID 1's
builder child holds until it exits (docs/design.md, step 6).
"""

from __future__ import annotations

import ctypes
import os
import stat

from boxyd.kernel.sys import check, errno_call, libc

# x86_64 syscall numbers
SYS_pivot_root = 155
SYS_open_tree = 428
SYS_move_mount = 429
SYS_fsopen = 430
SYS_fsconfig = 431
SYS_fsmount = 432
SYS_mount_setattr = 442

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40

FSOPEN_CLOEXEC = 0x1
FSMOUNT_CLOEXEC = 0x1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_FD = 5
FSCONFIG_CMD_CREATE = 6

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _b(path: str) -> bytes:
    return os.fsencode(path)


def mount(
    src: str | None, dst: str, fstype: str | None, flags: int, data: str | None, step: str
) -> None:
    ret = libc.mount(
        _b(src) if src else None,
        _b(dst),
        _b(fstype) if fstype else None,
        flags,
        _b(data) if data else None,
    )
    check(ret, step, dst)


def umount_detach(path: str, step: str) -> None:
    check(libc.umount2(_b(path), MNT_DETACH), step, path)


def pivot_root(new_root: str, put_old: str) -> None:
    errno_call("pivot_root", new_root, SYS_pivot_root, _b(new_root), _b(put_old))


def open_tree_clone(fd: int, step: str, path: str) -> int:
    """A detached copy of the mount tree at FD (recursive, so submounts come along)."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE
    return errno_call(step, path, SYS_open_tree, ctypes.c_int(fd), b"", ctypes.c_uint(flags))


def set_attr(fd: int, attrs: int, step: str, path: str, *, recursive: bool) -> None:
    """mount_setattr: the only way to make a bind read-only *with* its submounts in a
    user namespace (a plain remount leaves submounts writable)."""
    attr = _MountAttr(attrs, 0, 0, 0)
    flags = AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    errno_call(
        step,
        path,
        SYS_mount_setattr,
        ctypes.c_int(fd),
        b"",
        ctypes.c_uint(flags),
        ctypes.pointer(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )


def move_mount_to_fd(tree_fd: int, target_fd: int, step: str, path: str) -> None:
    flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
    errno_call(
        step,
        path,
        SYS_move_mount,
        ctypes.c_int(tree_fd),
        b"",
        ctypes.c_int(target_fd),
        b"",
        ctypes.c_uint(flags),
    )


def is_dir_fd(fd: int) -> bool:
    return stat.S_ISDIR(os.fstat(fd).st_mode)


def overlay(lower_fd: int, upper_fd: int, work_fd: int, step: str, path: str) -> int:
    """A detached overlayfs mount (an fd for move_mount) of LOWER under UPPER, every
    layer given by fd (kernel >= 6.13: no path is resolved again). ``userxattr``: its
    opaque and redirect marks as user.overlay.* xattrs, as an overlay mounted in a user
    namespace must. Needs: CAP_SYS_ADMIN over the mount namespace's user namespace."""
    layers = [(b"lowerdir+", lower_fd), (b"upperdir", upper_fd), (b"workdir", work_fd)]
    return _overlay_mount(layers, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, step, path)


def overlay_view(lower_fds: list[int], step: str, path: str) -> int:
    """A detached read-only overlayfs mount of LOWER_FDS, topmost first, no upper layer
    (daemon/reviewgit.py: a review's upper layer over the host's tree, as apply would
    leave it). ``userxattr``: whiteouts and opaque marks as an unprivileged overlay
    wrote them."""
    attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
    return _overlay_mount([(b"lowerdir+", fd) for fd in lower_fds], attrs, step, path)


def _overlay_mount(layers: list[tuple[bytes, int]], attrs: int, step: str, path: str) -> int:
    fs = errno_call(step, path, SYS_fsopen, b"overlay", ctypes.c_uint(FSOPEN_CLOEXEC))
    try:
        for key, fd in layers:
            _fsconfig(fs, FSCONFIG_SET_FD, key, fd, step, path)
        _fsconfig(fs, FSCONFIG_SET_FLAG, b"userxattr", 0, step, path)
        _fsconfig(fs, FSCONFIG_CMD_CREATE, None, 0, step, path)
        return errno_call(
            step, path, SYS_fsmount, ctypes.c_int(fs), ctypes.c_uint(FSMOUNT_CLOEXEC),
            ctypes.c_uint(attrs),
        )  # fmt: skip
    finally:
        os.close(fs)


def _fsconfig(fs: int, cmd: int, key: bytes | None, aux: int, step: str, path: str) -> None:
    errno_call(
        step, path, SYS_fsconfig, ctypes.c_int(fs), ctypes.c_uint(cmd), key, None,
        ctypes.c_int(aux),
    )  # fmt: skip
