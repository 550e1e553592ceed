"""The kernel's rule the notifier's listener lives by, and PID 1's notifier holding to
it (tests/escape/test_attack_notify.py attacks it from inside a sandbox): a filter's
listener, once closed, frees its task's chain for a listener of the payload's own,
whose CONTINUE runs a call boxy's filter notified. So a notifier that fails must leave
its listener open (boxyd/stage2/notify.py; pid1.py then ends the sandbox).

Each case is a forked child under a small filter of its own (never this process), on
the real kernel; the child reports what happened over a socket, as JSON."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import struct
import threading
from collections.abc import Callable

import pytest

from boxyd.plan.seccomp import kernel_notifies
from boxyd.stage2 import notify, seccomp

PERSONALITY = 135
ADDR_NO_RANDOMIZE = 0x0040000
QUERY = 0xFFFFFFFF
USER_NOTIF, ALLOW = 0x7FC00000, 0x7FFF0000
SECCOMP_SET_MODE_FILTER, NEW_LISTENER = 1, 1 << 3
PR_SET_NO_NEW_PRIVS = 38

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

pytestmark = pytest.mark.skipif(
    not kernel_notifies(), reason="the kernel has no seccomp user_notif (doctor: seccomp-names)"
)


def program(nr: int) -> bytes:
    """Classic BPF: call NR is a user notification, anything else allowed."""
    ins = [(0x20, 0, 0, 0), (0x15, 0, 1, nr), (0x06, 0, 0, USER_NOTIF), (0x06, 0, 0, ALLOW)]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def own_listener(nr: int) -> int:
    """A filter of the caller's own with a listener: its fd, or -errno."""
    code = ctypes.create_string_buffer(program(nr), len(program(nr)))
    prog = struct.pack("=HxxxxxxQ", len(code.raw) // 8, ctypes.addressof(code))
    buf = ctypes.create_string_buffer(prog, len(prog))
    r = libc.syscall(
        ctypes.c_long(317), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
        ctypes.c_long(NEW_LISTENER), buf,
    )  # fmt: skip
    return int(r) if r >= 0 else -ctypes.get_errno()


def personality(persona: int) -> tuple[int, int]:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(PERSONALITY), ctypes.c_ulong(persona))
    return int(r), ctypes.get_errno()


def continue_all(listener: int) -> None:
    """A supervisor of the child's own: every call it hears of runs."""
    while True:
        try:
            note = notify.receive(listener)
        except OSError:
            return
        notify.let_through(listener, note.id)


def in_child(work: Callable[[socket.socket], dict[str, object]]) -> tuple[socket.socket, int]:
    """WORK in a forked child with no_new_privs, its result sent as JSON on its end of
    a socketpair; our end, and its pid."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            theirs.send(json.dumps(work(theirs)).encode())
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    return ours, pid


def result(sock: socket.socket, pid: int) -> dict[str, object]:
    sock.settimeout(30)
    data = sock.recv(4096)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    got: dict[str, object] = json.loads(data)
    return got


def closed_then_own(_: socket.socket) -> dict[str, object]:
    out: dict[str, object] = {}
    first = seccomp.load(program(PERSONALITY), listener=True)
    assert first is not None
    out["second while open"] = own_listener(PERSONALITY)
    os.close(first)  # as a notifier that closes its listener on failure did
    out["after close"] = personality(ADDR_NO_RANDOMIZE)
    mine = own_listener(PERSONALITY)
    out["own"] = mine
    if mine >= 0:
        threading.Thread(target=continue_all, args=(mine,), daemon=True).start()
        out["continued"] = personality(ADDR_NO_RANDOMIZE)
    out["persona"] = personality(QUERY)[0]
    return out


def test_a_closed_listener_frees_the_chain_for_one_that_lets_calls_through() -> None:
    # The kernel's side of the rule: why boxy's listener must outlive the payload.
    got = result(*in_child(closed_then_own))
    assert got["second while open"] == -errno.EBUSY, got  # one listener a chain
    assert got["after close"] == [-1, errno.ENOSYS], got  # a dead notifier refuses...
    assert isinstance(got["own"], int) and got["own"] >= 0, got  # ...until one is taken
    assert got["continued"] == [0, 0], got  # and the call boxy's filter notified ran
    assert isinstance(got["persona"], int) and got["persona"] & ADDR_NO_RANDOMIZE, got


def hands_over_then_tries(sock: socket.socket) -> dict[str, object]:
    listener = seccomp.load(program(PERSONALITY), listener=True)
    assert listener is not None
    socket.send_fds(sock, [b"listener"], [listener])
    os.close(listener)  # as the payload's process does once PID 1 holds it
    out: dict[str, object] = {"refused": personality(ADDR_NO_RANDOMIZE)}
    sock.recv(16)  # the notifier has failed
    mine = own_listener(PERSONALITY)
    out["own"] = mine
    if mine >= 0:
        print("ESCAPED: the payload took a listener of its own", flush=True)
        threading.Thread(target=continue_all, args=(mine,), daemon=True).start()
        out["continued"] = personality(ADDR_NO_RANDOMIZE)
    return out


def failing_report(note: notify.Notification, who: notify.Caller, action: str) -> None:
    raise RuntimeError(f"the report of {note.nr} failed")


def test_a_notifier_that_fails_keeps_its_listener_open() -> None:
    sock, pid = in_child(hands_over_then_tries)
    _, [listener], _, _ = socket.recv_fds(sock, 16, 1)
    notifier = notify.Notifier(listener, "compat", frozenset({PERSONALITY}), failing_report)
    try:
        with pytest.raises(RuntimeError):
            notifier.serve()  # the child's call answered (EPERM), then its report fails
        os.fstat(listener)  # still open: the chain's one listener is still ours
        sock.send(b"failed")
        got = result(sock, pid)
    finally:
        os.close(listener)
    assert got["refused"] == [-1, errno.EPERM], got
    assert got["own"] == -errno.EBUSY and "continued" not in got, got
