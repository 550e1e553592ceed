"""Landlock through ctypes: the filesystem, TCP-connect and scoping layer of PID 1.

Applied in stage 2's PID 1 after pivot_root and the capability drop, before
seccomp (which denies the landlock syscalls). Standard library only. The ruleset
handles every right this kernel's ABI knows, so anything not granted by a rule is
denied; what the ABI cannot express is returned as notes, never silently skipped.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING

from boxy.errors import SetupError
from boxyd.kernel import sys as ksys

if TYPE_CHECKING:
    from boxyd.plan.ops import LandlockRule

SYS_landlock_create_ruleset = 444
SYS_landlock_add_rule = 445
SYS_landlock_restrict_self = 446

LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2

# Filesystem rights (include/uapi/linux/landlock.h).
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
FS_RESOLVE_UNIX = 1 << 16  # ABI 9: connect()/sendmsg() to a pathname unix socket

NET_BIND_TCP = 1 << 0  # ABI 4; never handled: local servers must keep working
NET_CONNECT_TCP = 1 << 1  # ABI 4

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_FS_ABI1 = (1 << 13) - 1  # EXECUTE … MAKE_SYM
# Rights the kernel accepts in a rule on a non-directory.
FS_FILE_RIGHTS = (
    FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV | FS_RESOLVE_UNIX
)

_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39

ACCESS_CLASSES = ("ro", "rox", "rw", "dev", "dir", "read", "scratch")


class RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    ]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def handled_fs(abi: int) -> int:
    """Every filesystem right the ABI knows (handling one it does not know is EINVAL)."""
    if abi < 1:
        return 0
    mask = _FS_ABI1
    if abi >= 2:
        mask |= FS_REFER
    if abi >= 3:
        mask |= FS_TRUNCATE
    if abi >= 5:
        mask |= FS_IOCTL_DEV
    if abi >= 9:
        mask |= FS_RESOLVE_UNIX
    return mask


def rights_for(access: str, abi: int) -> int:
    """The rights of one access class, limited to what the ABI knows.

    RESOLVE_UNIX (ABI 9) is handled but granted by no class: a pathname socket
    made outside the sandbox is exactly what the payload must not reach, and
    sockets the payload makes itself stay reachable (same Landlock domain).
    """
    known = handled_fs(abi)
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    if access in ("ro", "rox"):
        mask = read
    elif access == "rw":
        # REFER: without it a cross-directory rename fails with EXDEV (git breaks).
        mask = known & ~(FS_IOCTL_DEV | FS_RESOLVE_UNIX)
    elif access == "dev":
        mask = FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV | FS_TRUNCATE
    elif access == "dir":
        mask = FS_READ_DIR
    elif access == "read":  # a payload-writable tree under a tool of boxyd's own
        mask = FS_READ_FILE | FS_READ_DIR
    elif access == "scratch":  # a tool sandbox's /tmp: written, never executed
        mask = known & ~(FS_EXECUTE | FS_IOCTL_DEV | FS_RESOLVE_UNIX)
    else:
        raise SetupError(
            f"landlock: unknown access class {access!r} (expected one of {ACCESS_CLASSES})"
        )
    return mask & known


def for_non_directory(mask: int) -> int:
    """Drop directory-only rights: the kernel refuses them in a rule on a file (EINVAL)."""
    return mask & FS_FILE_RIGHTS


def ruleset_size(abi: int) -> int:
    """The ruleset_attr size this ABI defines.

    A larger struct is accepted only when the extra bytes are zero (else E2BIG);
    passing exactly the ABI's size means a field it does not know can never be sent.
    """
    if abi >= 6:
        return 24
    if abi >= 4:
        return 16
    return 8


def missing_features(abi: int) -> list[str]:
    """What this ABI cannot enforce, one line each, for the audit log and doctor."""
    if abi < 1:
        return ["landlock unsupported by this kernel: no filesystem, port or scope rules"]
    notes: list[str] = []
    if abi < 2:
        notes.append("no REFER (ABI < 2): every cross-directory rename or link fails with EXDEV")
    if abi < 3:
        notes.append("no TRUNCATE right (ABI < 3): truncate() is not stopped by Landlock")
    if abi < 4:
        notes.append("no TCP port rules (ABI < 4): connect() ports are not stopped by Landlock")
    if abi < 5:
        notes.append("no IOCTL_DEV right (ABI < 5): device ioctls are not stopped by Landlock")
    if abi < 6:
        notes.append(
            "no scoping (ABI < 6): abstract unix sockets and signals outside the sandbox "
            "are not stopped by Landlock"
        )
    if abi < 9:
        notes.append(
            f"landlock ABI {abi}: no unix-socket rights (ABI 9): a connect() to a pathname "
            "socket inside an exposed tree is not stopped by Landlock"
        )
    return notes


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when unsupported (not built in or disabled at boot)."""
    ret = ksys.syscall(
        SYS_landlock_create_ruleset,
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    if ret >= 0:
        return ret
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EOPNOTSUPP):  # not built in / disabled at boot
        return 0
    return ksys.check(ret, "landlock_create_ruleset(VERSION)")


def probe() -> dict[str, object]:
    """For `boxyctl doctor`: the ABI and what it lacks."""
    abi = abi_version()
    return {"abi": abi, "supported": abi > 0, "notes": missing_features(abi)}


def _no_new_privs() -> bool:
    prctl = ksys.libc.prctl  # restype is int by default
    zero = ctypes.c_ulong(0)
    ret = prctl(ctypes.c_int(_PR_GET_NO_NEW_PRIVS), zero, zero, zero, zero)
    return ksys.check(ret, "prctl(PR_GET_NO_NEW_PRIVS)") == 1


def _rule_pairs(rules: Sequence[LandlockRule] | Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [r if isinstance(r, tuple) else (r.path, r.access) for r in rules]


def apply(
    rules: Sequence[LandlockRule] | Sequence[tuple[str, str]],
    *,
    connect_ports: list[int] | None = None,
    scope: bool = True,
) -> list[str]:
    """Restrict the calling thread (and its future children) to ``rules``.

    ``connect_ports`` None leaves TCP connect unhandled; a list (even empty)
    allows connect only to those ports (ABI >= 4). Bind is never handled.
    Returns notes on what this ABI cannot enforce. Raises SetupError on any
    failure: the layer never fails open.
    """
    abi = abi_version()
    if abi < 1:
        raise SetupError(
            "landlock: not supported by this kernel (ABI 0); refusing to run without it"
        )
    # Without no_new_privs a privileged caller would be restricted while a setuid
    # exec could shed it; stage 2 sets it earlier, so its absence is a bug.
    if not _no_new_privs():
        raise SetupError("landlock: PR_SET_NO_NEW_PRIVS is not set")
    pairs = _rule_pairs(rules)
    for _path, access in pairs:
        rights_for(access, abi)  # an unknown class fails before anything is created
    ports = _ports(connect_ports) if connect_ports is not None and abi >= 4 else []

    attr = RulesetAttr(handled_fs(abi), 0, 0)
    if connect_ports is not None and abi >= 4:
        attr.handled_access_net = NET_CONNECT_TCP
    if scope and abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL

    notes = missing_features(abi)
    ruleset = ksys.errno_call(
        "landlock_create_ruleset",
        None,
        SYS_landlock_create_ruleset,
        ctypes.byref(attr),
        ctypes.c_size_t(ruleset_size(abi)),
        ctypes.c_uint32(0),
    )
    try:
        for path, access in pairs:
            note = _add_path_rule(ruleset, path, access, abi)
            if note:
                notes.append(note)
        for port in ports:
            _add_port_rule(ruleset, port)
        ksys.errno_call(
            "landlock_restrict_self",
            None,
            SYS_landlock_restrict_self,
            ctypes.c_int(ruleset),
            ctypes.c_uint32(0),
        )
    finally:
        os.close(ruleset)
    return notes


def _ports(connect_ports: list[int]) -> list[int]:
    for port in connect_ports:
        if not 0 <= port <= 65535:
            raise SetupError(f"landlock: TCP port out of range: {port}")
    return list(connect_ports)


def _add_path_rule(ruleset: int, path: str, access: str, abi: int) -> str | None:
    """ACCESS beneath PATH; a note instead when it grants nothing on a non-directory."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        # Rules mirror mounts that must exist: a missing one is a plan bug.
        raise SetupError(f"landlock: {path}: {e.strerror} (errno {e.errno})") from None
    try:
        mask = rights_for(access, abi)
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            mask = for_non_directory(mask)
        if mask == 0:
            return f"landlock: rule {access!r} on non-directory {path} grants nothing; skipped"
        beneath = PathBeneathAttr(mask, fd)
        ksys.errno_call(
            "landlock_add_rule(path_beneath)",
            path,
            SYS_landlock_add_rule,
            ctypes.c_int(ruleset),
            ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
            ctypes.byref(beneath),
            ctypes.c_uint32(0),
        )
        return None
    finally:
        os.close(fd)


def _add_port_rule(ruleset: int, port: int) -> None:
    net = NetPortAttr(NET_CONNECT_TCP, port)
    ksys.errno_call(
        "landlock_add_rule(net_port)",
        f"tcp/{port}",
        SYS_landlock_add_rule,
        ctypes.c_int(ruleset),
        ctypes.c_int(LANDLOCK_RULE_NET_PORT),
        ctypes.byref(net),
        ctypes.c_uint32(0),
    )
