"""Load the seccomp program the daemon compiled (boxyd.plan.seccomp) into this process.

Standard library only: stage 2 does not import libseccomp, it only hands the
kernel the bytes. This is the last step before the payload's execve, so
nothing after it can trip its own filter.
"""

from __future__ import annotations

import ctypes

from boxy.errors import SetupError
from boxyd.kernel import sys as _sys

SYS_SECCOMP = 317  # x86_64
SECCOMP_SET_MODE_FILTER = 1
# A listener fd for the filter's user notifications (the caller hands it to PID 1), and
# once PID 1 has received one, only a fatal signal interrupts the wait (5.19): another
# would restart the call and notify it twice
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5
PR_GET_NO_NEW_PRIVS = 39
SYS_PRCTL = 157  # x86_64
SOCK_FILTER_SIZE = 8  # struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }
BPF_MAXINSNS = 4096


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(bpf: bytes, listener: bool = False) -> int | None:
    """Install `bpf` (raw struct sock_filter array) as a seccomp filter on this thread;
    with LISTENER, return the filter's notification fd (close-on-exec).

    The caller must have set PR_SET_NO_NEW_PRIVS first. The kernel only insists
    on it for callers without CAP_SYS_ADMIN; checking it here makes a wrong
    startup order fail the same way whatever capabilities stage 2 still holds.
    SetupError on any failure: the layer never fails open.
    """
    if not bpf or len(bpf) % SOCK_FILTER_SIZE:
        raise SetupError(
            f"seccomp: program of {len(bpf)} bytes is not a whole number of instructions"
        )
    count = len(bpf) // SOCK_FILTER_SIZE
    if count > BPF_MAXINSNS:
        raise SetupError(
            f"seccomp: program has {count} instructions (the kernel takes {BPF_MAXINSNS})"
        )
    zero = ctypes.c_long(0)  # a variadic int could leave the register's upper half unset
    nnp = _sys.check(
        _sys.syscall(SYS_PRCTL, ctypes.c_long(PR_GET_NO_NEW_PRIVS), zero, zero, zero, zero),
        "seccomp: prctl(PR_GET_NO_NEW_PRIVS)",
    )
    if nnp != 1:
        raise SetupError("seccomp: no_new_privs is not set; PR_SET_NO_NEW_PRIVS must come first")
    # BPF's own buffer (the kernel copies the program before returning, and only reads
    # it), and byref: no ctypes type made here (a string buffer's array type is new for
    # each length, pointer()'s on first use), whose making PID 1 would keep, dirty, for
    # the session (issue #18)
    prog = _SockFprog(count, ctypes.cast(ctypes.c_char_p(bpf), ctypes.c_void_p))
    if not listener:
        _install(prog, 0)
        return None
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
    try:
        return _install(prog, flags)
    except SetupError:  # a kernel before 5.19: the listener alone (EINVAL: nothing set)
        return _install(prog, SECCOMP_FILTER_FLAG_NEW_LISTENER)


def _install(prog: _SockFprog, flags: int) -> int:
    return _sys.check(
        _sys.syscall(
            SYS_SECCOMP,
            ctypes.c_long(SECCOMP_SET_MODE_FILTER),
            ctypes.c_long(flags),
            ctypes.byref(prog),
        ),
        "seccomp: seccomp(SECCOMP_SET_MODE_FILTER)",
    )
