"""The live guard's hands: re-apply a credential's stand-in or a git pin in the running
sandbox (docs/design.md, "The guard is live").

A stand-in or pin is a bind mount on one file. When the host replaces that file
by rename (an editor's save, ``git config``), the kernel detaches the mount in the
sandbox and the payload sees the new file. boxyd notices (inotify) and asks a
joiner (boxyd/stage2/joiner.py) to cover it again: it has entered the sandbox's
user and mount namespaces (its root is the sandbox's), holds CAP_SYS_ADMIN over
them for this and nothing else (it never runs anything of the payload's), and the
payload cannot reach it (it is outside the PID namespace; ptrace and pidfd_getfd
are denied by seccomp).

Paths are resolved beneath the sandbox's view of the writable tree with
openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS): in the window the payload may have put
a symlink or a directory there, which is refused, never followed.
"""

from __future__ import annotations

import base64
import ctypes
import os

from boxy.errors import SetupError
from boxyd.kernel import openat
from boxyd.kernel.sys import errno_call
from boxyd.plan.ops import Bind, Mask
from boxyd.stage2 import mounts as m
from boxyd.stage2.protocol import LiveCover, LivePin

SYS_fsopen = 430
SYS_fsconfig = 431
SYS_fsmount = 432
FSOPEN_CLOEXEC = 1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 1
STAND_INS_SIZE = "16m"  # every stand-in made during one session (scrubbed copies are small)

_stand_ins: int | None = None  # a detached tmpfs: the new stand-ins' home, seen by nobody
_made = 0


def _stand_in_fs() -> int:
    """A tmpfs mounted nowhere (fsopen/fsmount): a file made in it can be bound over a
    path, and nothing in the sandbox can reach it otherwise."""
    global _stand_ins
    if _stand_ins is None:
        fs = errno_call(
            "live: fsopen", "tmpfs", SYS_fsopen, b"tmpfs", ctypes.c_uint(FSOPEN_CLOEXEC)
        )
        try:
            errno_call(
                "live: tmpfs size",
                None,
                SYS_fsconfig,
                ctypes.c_int(fs),
                ctypes.c_uint(FSCONFIG_SET_STRING),
                b"size",
                STAND_INS_SIZE.encode(),
                ctypes.c_int(0),
            )
            errno_call(
                "live: tmpfs create",
                None,
                SYS_fsconfig,
                ctypes.c_int(fs),
                ctypes.c_uint(FSCONFIG_CMD_CREATE),
                None,
                None,
                ctypes.c_int(0),
            )
            attrs = m.MOUNT_ATTR_NOSUID | m.MOUNT_ATTR_NODEV | m.MOUNT_ATTR_NOEXEC
            _stand_ins = errno_call(
                "live: fsmount",
                "tmpfs",
                SYS_fsmount,
                ctypes.c_int(fs),
                ctypes.c_uint(FSMOUNT_CLOEXEC),
                ctypes.c_uint(attrs),
            )
        finally:
            os.close(fs)
    return _stand_ins


def _target(base: str, rel: str, step: str) -> int:
    """REL beneath the sandbox's BASE, as an O_PATH fd; never through a symlink."""
    bfd = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return openat.openat2(bfd, rel, os.O_PATH, step)
    finally:
        os.close(bfd)


def cover(mk: Mask) -> None:
    """A stand-in (empty, or a scrubbed copy) grafted read-only over MK's entry."""
    global _made
    step = f"cover {mk.dst_base}/{mk.dst} again"
    fs = _stand_in_fs()
    _made += 1
    name = str(_made)
    if mk.is_dir:
        os.mkdir(name, 0o555, dir_fd=fs)
    else:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444, dir_fd=fs)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(mk.content))
    src = os.open(name, os.O_PATH | os.O_CLOEXEC, dir_fd=fs)
    try:
        target = _target(mk.dst_base, mk.dst, step)
        try:
            if m.is_dir_fd(target) != mk.is_dir:
                raise SetupError(
                    f"{step}: not a {'directory' if mk.is_dir else 'file'} now (refused)"
                )
            _graft(src, target, step, mk.dst)
        finally:
            os.close(target)
    finally:
        os.close(src)


def pin(b: Bind) -> None:
    """B's entry (a git control file the host replaced) bound read-only onto itself."""
    assert b.dst_base is not None and b.src == b.dst
    step = f"pin {b.dst_base}/{b.dst} again"
    target = _target(b.dst_base, b.dst, step)
    try:
        _graft(target, target, step, b.dst, ro=b.ro)
    finally:
        os.close(target)


def _graft(src: int, target: int, step: str, path: str, *, ro: bool = True) -> None:
    tree = m.open_tree_clone(src, step, path)
    try:
        attrs = m.MOUNT_ATTR_NOSUID | m.MOUNT_ATTR_NODEV | (m.MOUNT_ATTR_RDONLY if ro else 0)
        m.set_attr(tree, attrs, step, path, recursive=True)
        m.move_mount_to_fd(tree, target, step, path)
    finally:
        os.close(tree)


def apply(op: LiveCover | LivePin) -> str | None:
    """One request from boxyd (boxyd/stage2/protocol.py); None when done, else why not."""
    try:
        match op:
            case LiveCover():
                cover(Mask(op.dst, op.dst_base, op.is_dir, op.content))
            case LivePin():
                pin(Bind(op.rel, op.rel, True, src_base=op.root, dst_base=op.root))
    except (SetupError, OSError, TypeError, ValueError) as e:
        return str(e)[:500]
    return None
