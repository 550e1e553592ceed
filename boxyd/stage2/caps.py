"""docs/design.md, step 7: give up every privilege PID 1 still holds, for good."""

from __future__ import annotations

import ctypes
import os

from boxy.errors import SetupError
from boxyd.kernel.sys import check, libc, read_small

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each with its lock, and KEEP_CAPS
# locked off: nothing executed later can regain a capability by any uid transition.
SECUREBITS_LOCKED = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80

_LINUX_CAPABILITY_VERSION_3 = 0x20080522

libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def prctl(option: int, arg2: int = 0, arg3: int = 0, step: str = "prctl") -> int:
    return check(libc.prctl(option, arg2, arg3, 0, 0), step)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


# The array type made here, in the template: made in PID 1, it would stay there, dirty,
# for the session (issue #18)
_CapDataV3 = _CapData * 2  # version 3: two of them


_last_cap: int | None = None


def last_cap() -> int:
    """The highest capability this kernel knows (a path: read it while it resolves),
    read once: the template reads it before it forks, and no PID 1 then parses a file
    for it (pages it would keep for the session, issue #18)."""
    global _last_cap
    if _last_cap is None:
        try:
            _last_cap = int(read_small("/proc/sys/kernel/cap_last_cap"))
        except OSError:
            return 63  # (not kept: dropping past the kernel's last fails, closed)
    return _last_cap


def drop_all(last: int | None = None) -> None:
    """Securebits locked, bounding set emptied (up to LAST, else last_cap()), ambient
    cleared (all need CAP_SETPCAP, so first), then effective/permitted/inheritable
    zeroed. Removes: every capability."""
    prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED, step="securebits")
    for cap in range((last_cap() if last is None else last) + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == -1:  # (the step named only then)
            check(-1, f"drop capability {cap} from the bounding set")
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, step="clear ambient capabilities")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = _CapDataV3()
    check(libc.capset(ctypes.byref(header), data), "capset")


CAP_DAC_READ_SEARCH = 2
CAP_SETFCAP = 31


def keep_only(*caps: int) -> None:
    """Effective and permitted hold CAPS (each below 32) and nothing else, inheritable
    none: for a process that entered a user namespace of its own to do one thing."""
    mask = 0
    for cap in caps:
        mask |= 1 << cap
    data = _CapDataV3()
    data[0].effective = data[0].permitted = mask
    check(libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")


def no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1, step="no_new_privs")


def not_dumpable() -> None:
    """Closes /proc/1/*, ptrace and pidfd_getfd on PID 1 to the payload."""
    prctl(PR_SET_DUMPABLE, 0, step="dumpable 0")


def die_with_parent(sig: int) -> None:
    prctl(PR_SET_PDEATHSIG, sig, step="pdeathsig")


def adopt_orphans() -> None:
    """PR_SET_CHILD_SUBREAPER: the orphans of our children are ours (a sandbox's PID 1
    once its outer stage 2 has exited), not the machine's init's."""
    prctl(PR_SET_CHILD_SUBREAPER, 1, step="child subreaper")


def verify_dropped(status_fd: int | None = None) -> None:
    """Layers never fail open: read back what the kernel says we hold (from STATUS_FD,
    our /proc/self/status opened earlier, when no path may resolve now). Only the five
    lines are looked at: a string per line of the file would be a page or two more that
    PID 1 keeps for the session (issue #18)."""
    if status_fd is None:
        status = read_small("/proc/self/status").encode()
    else:
        status = os.pread(status_fd, 1 << 16, 0)
    for key in _CAP_SETS:
        start = status.find(key) + len(key)  # (each key has its line's newline first)
        end = status.find(b"\n", start)
        value = status[start:end].strip() if start >= len(key) and end > 0 else b""
        if not value or int(value, 16) != 0:  # (missing: what we hold is unknown)
            name = key.strip().decode()
            raise SetupError(f"capabilities: {name} {value.decode()!r} after dropping")


_CAP_SETS = (b"\nCapInh:\t", b"\nCapPrm:\t", b"\nCapEff:\t", b"\nCapBnd:\t", b"\nCapAmb:\t")
