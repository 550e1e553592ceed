"""Attacks on the path that names refused system calls (issue 34 §3): the payload
turning PID 1's seccomp listener, the reader or the reports into a way around a
refusal, or into a way to stall or blind the supervisor (docs/design.md, "Syscalls").

The kernel's rules these lean on (seccomp_unotify(2), kernel/seccomp.c): of stacked
filters the lowest action wins and, between equal ones, the newest filter's, so a
filter of the payload's own that returns SECCOMP_RET_USER_NOTIF with a listener of its
own would take boxy's notifications and could answer CONTINUE; only one filter of a
task's chain may have a listener while it is open (EBUSY), and a listener closed makes
every notification of its filter ENOSYS. So boxy holds as long as PID 1's listener
stays open and PID 1 sends nothing but errors (CONTINUE for connect() alone).

Each probe prints ESCAPED only where an attack worked. Real processes on the real
kernel; the connect() probes dial only the sandbox's own loopback or the test internet.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.netutil import run_probes
from tests.escape.test_kernel import out_of, py
from tests.escape.test_seccomp_named import records, said
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

PERSONALITY, MOVE_PAGES, PTRACE = 135, 279, 101
ADDR_NO_RANDOMIZE = 0x0040000  # a personality boxy refuses (EPERM, by its argument)

# The payload's own seccomp filters and listener: classic BPF by hand (no libseccomp in
# the sandbox), the notification structs as in boxyd/stage2/notify.py
FILTERS = r"""
import fcntl, signal, struct, threading, time
USER_NOTIF, ALLOW, LOG, ERRNO = 0x7fc00000, 0x7fff0000, 0x7ffc0000, 0x00050000
NEW_LISTENER, WAIT_KILLABLE_RECV = 1 << 3, 1 << 5
RECV, SEND, CONTINUE = 0xC0502100, 0xC0182101, 1
_keep = []

def program(nrs, action):
    ins = [(0x20, 0, 0, 0)]  # A = seccomp_data.nr
    for nr in nrs:
        ins += [(0x15, 0, 1, nr), (0x06, 0, 0, action)]  # A == nr: return ACTION
    ins.append((0x06, 0, 0, ALLOW))
    return b"".join(struct.pack("=HBBI", *i) for i in ins)

def install(nrs, action, flags=0):
    code = ctypes.create_string_buffer(program(nrs, action))
    prog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", (len(code) - 1) // 8,
                                                   ctypes.addressof(code)))
    _keep.extend((code, prog))
    return sysc(317, 1, flags, prog)  # seccomp(SECCOMP_SET_MODE_FILTER, flags, &prog)

def answer_continue(fd):
    # a supervisor of the payload's own: every call it hears of runs
    while True:
        buf = bytearray(80)
        try:
            fcntl.ioctl(fd, RECV, buf, True)
        except OSError:
            return
        ident = struct.unpack_from("=Q", buf)[0]
        try:
            fcntl.ioctl(fd, SEND, bytearray(struct.pack("=QqiI", ident, 0, 0, CONTINUE)), True)
        except OSError:
            pass

def take_listener(nrs, case):
    for flags in (NEW_LISTENER, NEW_LISTENER | WAIT_KILLABLE_RECV):
        r, e = install(nrs, USER_NOTIF, flags)
        if r >= 0:
            print(f"ESCAPED {case}: a listener of the payload's own, fd {r}", flush=True)
            threading.Thread(target=answer_continue, args=(r,), daemon=True).start()
            return r
        print(f"{case} {name(e)}", flush=True)
    return None

def persona():
    return sysc(135, 0xFFFFFFFF)[0]  # the query

def check_persona(case):
    p = persona()
    if p != -1 and p & 0x0040000:
        print(f"ESCAPED {case}: personality {p:#x} set", flush=True)
"""


def body_of(text: str) -> str:
    return FILTERS + text


# -- 5: a filter of the payload's own ------------------------------------------------
@pytest.mark.parametrize("mode", ["strict", "compat"])
def test_a_listener_of_the_payloads_own_is_refused(boxy: Boxy, mode: str) -> None:
    # With one, it would hear of (and CONTINUE) the calls boxy's filter notifies: the
    # newest filter wins a tie of USER_NOTIF
    body = body_of(f"""
take_listener([{PERSONALITY}, {PTRACE}], "listener")
attempt("personality", {PERSONALITY}, {ADDR_NO_RANDOMIZE})
check_persona("personality")
print("DONE", flush=True)
""")
    r = py(boxy, body, "--seccomp", mode, "--audit-log", "audit.jsonl")
    out = out_of(r)
    assert "ESCAPED" not in out and "DONE" in out and r.returncode == 0, said(r)
    assert out.count("listener EBUSY") == 2, said(r)  # PID 1's listener is the chain's one
    assert "personality EPERM" in out.splitlines(), said(r)
    assert [x["call"] for x in records(boxy)] == ["personality"], said(r)


def test_a_filter_of_its_own_that_notifies_nobody_refuses_still(boxy: Boxy) -> None:
    # USER_NOTIF without a listener of its own: its filter, the newest, takes the tie,
    # and a filter with no listener answers ENOSYS: the call is refused (unnamed, and in
    # strict mode not killed, as the ERRNO of a filter of its own already could); LOG,
    # above USER_NOTIF, changes nothing
    body = body_of(f"""
r, e = install([{MOVE_PAGES}, {PERSONALITY}], USER_NOTIF)
print("INSTALLED", r, name(e), flush=True)
attempt("move_pages", {MOVE_PAGES}, 0, 0, 0, 0, 0, 0)
attempt("personality", {PERSONALITY}, {ADDR_NO_RANDOMIZE})
r, e = install([{PTRACE}], LOG)
attempt("ptrace", {PTRACE}, 16, 1, 0, 0, 0, 0)
check_persona("personality")
print("DONE", flush=True)
""")
    r = py(boxy, body, "--audit-log", "audit.jsonl")
    out = out_of(r)
    assert "ESCAPED" not in out and "DONE" in out and r.returncode == 0, said(r)
    lines = out.splitlines()
    assert "move_pages ENOSYS" in lines and "personality ENOSYS" in lines, said(r)
    assert "ptrace EPERM" in lines, said(r)
    assert [x["call"] for x in records(boxy)] == ["ptrace"], said(r)
