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
from tests.escape.test_kernel import PRELUDE, out_of, py
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


# -- 2 and 3: the reader, stalled, fed garbage, or used as a deputy ------------------
READER = r"""
def readers():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) not in (1, os.getpid()):
            try:
                if open(f"/proc/{p}/comm").read().strip() == "boxy-init":
                    out.append(int(p))
            except OSError:
                pass
    return out

def timed_connect(case, fd, addr, length):
    t0 = time.monotonic()
    r, e = sysc(42, fd, addr, length)
    ms = (time.monotonic() - t0) * 1000
    print(f"{case} {name(e) if r == -1 else 'connected'} {ms:.0f}ms", flush=True)
"""

GARBAGE = r"""
import socket
[reader] = readers()
print("READER", reader, flush=True)
devnull = os.open("/dev/null", os.O_RDONLY)
tcp, socks = socket.socket(), [socket.socket() for _ in range(20)]
sa = ctypes.create_string_buffer(struct.pack("=HH4s8x", socket.AF_INET, socket.htons(9),
                                             socket.inet_aton("127.0.0.1")), 16)
timed_connect("not-a-socket", devnull, sa, 16)
timed_connect("no-fd", -1, sa, 16)
timed_connect("high-bits-fd", (0xFFFFFFFF << 32) | tcp.fileno(), sa, 16)
timed_connect("null-address", tcp.fileno(), 0, 16)
timed_connect("unmapped-address", tcp.fileno(), 0xDEAD0000, 0xFFFFFFFF)
timed_connect("huge-length", socks[0].fileno(), sa, 1 << 40)
timed_connect("kernel-address", socks[1].fileno(), 0xFFFFFFFF81000000, 16)  # past off_t
timed_connect("after", socks[2].fileno(), sa, 16)
time.sleep(0.2)
print("READERS ALIVE", len(readers()), flush=True)
os.kill(reader, signal.SIGSTOP)
for i in range(6):
    timed_connect(f"stopped-{i}", socks[3 + i].fileno(), sa, 16)
os.kill(reader, signal.SIGKILL)
for i in range(3):
    timed_connect(f"killed-{i}", socks[10 + i].fileno(), sa, 16)
take_listener([{PERSONALITY}], "listener")
attempt("personality", {PERSONALITY}, {ADDR_NO_RANDOMIZE})
check_persona("personality")
print("DONE", flush=True)
"""


def net_run(net: Topology, user: User, workdir: Path, body: str) -> tuple[str, str]:
    run = run_probes(
        net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test", "-v",
        "--audit-log", "audit.jsonl",
        cmd=["python3", "-c", PRELUDE + FILTERS + READER + body],
    )  # fmt: skip
    out = run.proc.stdout.decode(errors="replace")
    assert "ESCAPED" not in out and "DONE" in out, run.describe()
    return out, run.stderr


def test_garbage_connects_and_a_stalled_reader_leave_the_notifier_standing(
    net: Topology, user: User, workdir: Path
) -> None:
    body = GARBAGE.replace("{PERSONALITY}", str(PERSONALITY))
    out, err = net_run(net, user, workdir, body.replace("{ADDR_NO_RANDOMIZE}", "0x40000"))
    # each garbage connect() answered by the kernel as it would be, in no time
    for case in (
        "not-a-socket ENOTSOCK",
        "no-fd EBADF",
        "null-address EFAULT",
        "kernel-address EFAULT",
        "after EACCES",
    ):
        assert re.search(rf"^{case} \d+ms$", out, re.M), out
    assert "READERS ALIVE 1" in out, out  # none of them killed the reader (an address
    # past off_t once did: its pread raised OverflowError, which nothing caught)
    waits = [int(m) for m in re.findall(r"^(?:stopped|killed)-\d \w+ (\d+)ms$", out, re.M)]
    assert len(waits) == 9 and sum(w >= 200 for w in waits) <= 1, out  # once, not each time
    assert sum(waits) < 1500, out
    # the notifier still answers, names, and holds the chain's one listener
    assert "listener EBUSY" in out and "personality EPERM" in out.splitlines(), out
    assert "seccomp: personality(0x40000" in err, err
    calls = [x.get("call") for x in map(json.loads, (workdir / "audit.jsonl").open())]
    assert "personality" in calls, calls


DEPUTY = r"""
import socket
[reader] = readers()
print("READER", reader, flush=True)
def try_open(case, path, flags):
    try:
        fd = os.open(path, flags)
    except OSError as e:
        print(case, name(e.errno), flush=True)
        return
    print(f"ESCAPED {case}: opened {path}", flush=True)
    os.close(fd)
for who in (reader, 1):
    try_open(f"mem-{who}", f"/proc/{who}/mem", os.O_RDONLY)
    try_open(f"mem-rw-{who}", f"/proc/{who}/mem", os.O_RDWR)
    try:
        fds = os.listdir(f"/proc/{who}/fd")
    except OSError as e:
        fds = []
        print(f"fds-{who}", name(e.errno), flush=True)
    for n in fds:
        try_open(f"fd-{who}-{n}", f"/proc/{who}/fd/{n}", os.O_RDWR)
    pidfd, e = sysc(434, who, 0)  # pidfd_open
    print(f"pidfd-{who}", pidfd if pidfd >= 0 else name(e), flush=True)
    if pidfd >= 0:
        for n in range(8):
            attempt(f"pidfd_getfd-{who}-{n}", 438, pidfd, n, 0)
    attempt(f"ptrace-{who}", 101, 16, who, 0, 0)  # PTRACE_ATTACH
# the reader looks at the socket of the caller's connect(): a pidfd or a listener-less
# fd in its place gains nothing; connect() from a thread whose pid is then reused is
# a report gone wrong, not an fd taken
s = socket.socket()
sa = ctypes.create_string_buffer(struct.pack("=HH4s8x", socket.AF_INET, socket.htons(9),
                                             socket.inet_aton("127.0.0.1")), 16)
timed_connect("own-socket", s.fileno(), sa, 16)
print("READERS ALIVE", len(readers()), flush=True)
print("DONE", flush=True)
"""


def test_the_reader_lends_the_payload_nothing(net: Topology, user: User, workdir: Path) -> None:
    out, _ = net_run(net, user, workdir, DEPUTY)
    lines = out.splitlines()
    reader = int(next(x.split()[1] for x in lines if x.startswith("READER ")))
    for who in (reader, 1):  # non-dumpable, and (PID 1) another Landlock domain
        assert f"mem-{who} EACCES" in lines or f"mem-{who} EPERM" in lines, out
        assert not any(x.startswith(f"pidfd_getfd-{who}-") and "EPERM" not in x for x in lines)
        assert f"ptrace-{who} EPERM" in lines, out
    assert "READERS ALIVE 1" in lines, out
