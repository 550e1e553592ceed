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


# -- 1: the instant PID 1's listener closes, at the run's end ------------------------
RACER = r"""
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
if os.fork() == 0:
    os.setsid()  # an orphan of its own session: the payload's end leaves it running
    code = ctypes.create_string_buffer(program([{PERSONALITY}], USER_NOTIF))
    prog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", (len(code) - 1) // 8,
                                                   ctypes.addressof(code)))
    tries = 0
    os.write(out, b"SPINNING\n")
    while True:
        tries += 1
        r = libc.syscall(ctypes.c_long(317), ctypes.c_long(1), ctypes.c_long(NEW_LISTENER), prog)
        if r >= 0:
            os.write(out, b"ESCAPED took a listener after %d tries\n" % tries)
            threading.Thread(target=answer_continue, args=(r,), daemon=True).start()
            p = libc.syscall(ctypes.c_long(135), ctypes.c_ulong(0x0040000))
            os.write(out, b"ESCAPED personality %d\n" % p)
            os._exit(0)
time.sleep(0.3)
{END}
"""


@pytest.mark.parametrize("end", ["exit", "timeout"])
def test_an_orphan_cannot_take_the_listener_as_the_run_ends(boxy: Boxy, end: str) -> None:
    # PID 1's exit closes its listener (do_exit's files) before the kernel kills what is
    # left of the PID namespace (zap_pid_ns_processes): an orphan spinning on seccomp()
    # with a listener of its own meanwhile. PID 1 now SIGKILLs them all first (exit);
    # boxyd's own SIGKILL to PID 1 (timeout: the payload ignores SIGTERM) still leaves
    # the instant, a race of microseconds this only probes (not won in 40 runs of the
    # exit case against the code before PID 1 killed them first)
    ending = (
        "os._exit(0)"
        if end == "exit"
        else "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"
    )
    body = FILTERS + RACER.replace("{PERSONALITY}", str(PERSONALITY)).replace("{END}", ending)
    log = boxy.workdir / "racer.log"
    flags = ["--timeout", "1"] if end == "timeout" else []
    for _ in range(3 if end == "exit" else 1):
        r = boxy.run(
            *flags, "--net", "none", cmd=["python3", "-c", PRELUDE + body, str(log)], timeout=60
        )
        text = log.read_text() if log.exists() else ""
        assert "SPINNING" in text, said(r)
        assert "ESCAPED" not in text, text


# -- 1: races on a notification: threads, signals, exec, a killed sibling ------------
RACES = r"""
import threading
hits = {"EPERM": 0, "EINTR": 0, "other": 0}
def caller(n):
    for _ in range(n):
        r, e = sysc(PERSONALITY_NR, ADDR)
        if r != -1:
            print(f"ESCAPED personality returned {r}", flush=True)
        hits[name(e) if e in (errno.EPERM, errno.EINTR) else "other"] += 1
signal.signal(signal.SIGUSR1, lambda *_: None)  # interrupts, not fatal: the call restarts
threads = [threading.Thread(target=caller, args=(150,)) for _ in range(6)]
for t in threads:
    t.start()
while any(t.is_alive() for t in threads):
    signal.pthread_kill(threads[0].ident, signal.SIGUSR1) if threads[0].is_alive() else None
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.0005)
for t in threads:
    t.join()
check_persona("threads")
print("COUNTED", hits["EPERM"], hits["EINTR"], hits["other"], flush=True)
# a child whose sibling thread's kill (strict: move_pages) races its refused calls
for _ in range(10):
    child = os.fork()
    if child == 0:
        threading.Thread(target=caller, args=(1000,), daemon=True).start()
        threading.Thread(target=caller, args=(1000,), daemon=True).start()
        time.sleep(0.002)
        sysc(MOVE_PAGES_NR, 0, 0, 0, 0, 0, 0)
        os._exit(3)
    _, status = os.waitpid(child, 0)
    if not os.WIFSIGNALED(status):
        print(f"ESCAPED a child outlived move_pages: {status}", flush=True)
# a thread's refused calls cut short by another's execve
if os.fork() == 0:
    threading.Thread(target=caller, args=(100000,), daemon=True).start()
    time.sleep(0.005)
    os.execv(sys.executable, [sys.executable, "-c",
        "import ctypes; libc = ctypes.CDLL(None); libc.syscall.restype = ctypes.c_long; "
        "p = libc.syscall(ctypes.c_long(135), ctypes.c_ulong(0xFFFFFFFF)); "
        "print('ESCAPED after exec: personality', hex(p), flush=True) if p & 0x40000 "
        "else print('EXECED', flush=True)"])
os.wait()
print("DONE", flush=True)
"""


def test_racing_a_refused_call_never_lets_it_run(boxy: Boxy) -> None:
    # threads refused at once while signals interrupt them (WAIT_KILLABLE_RECV: none
    # notified twice, none let through), a sibling's kill and an execve cutting others'
    # calls short: every one refused, counted once, the persona never changed
    body = FILTERS + RACES.replace("PERSONALITY_NR", str(PERSONALITY)).replace(
        "ADDR", str(ADDR_NO_RANDOMIZE)
    ).replace("MOVE_PAGES_NR", str(MOVE_PAGES))
    r = py(boxy, body, "--audit-log", "audit.jsonl")
    out, err = out_of(r), r.stderr.decode(errors="replace")
    assert "ESCAPED" not in out and "DONE" in out and "EXECED" in out, said(r)
    # EINTR: a signal before PID 1 took the notification, the handler not SA_RESTART
    m = re.search(r"^COUNTED (\d+) (\d+) 0$", out, re.M)
    assert m and int(m.group(1)) + int(m.group(2)) == 900, said(r)
    assert re.search(r"refused system calls: personality ×[\d,]+", err), said(r)


# -- 4: what the payload names itself -------------------------------------------------
NAMES = r"""
libc.prctl(15, b"\x1b]52;c;SGk=\x07\x9b2J", 0, 0, 0)  # PR_SET_NAME: OSC 52, a CSI
attempt("ptrace", 101, 16, 1, 0, 0, 0, 0)
print("DONE", flush=True)
"""


def test_a_name_the_payload_chose_never_drives_the_terminal(boxy: Boxy) -> None:
    # comm and argv[0] are the payload's: they reach -v, the end line and the audit
    # log, escaped, never as the terminal's control sequences or a line of their own
    argv0 = "\x1b[2J\x1b]0;owned\x07\nboxyctl: seccomp: nothing refused"
    cmd = ["python3", "-c", f"import os, sys; os.execv(sys.executable, [{argv0!r}, '-c', "
           f"{(PRELUDE + NAMES)!r}])"]  # fmt: skip
    r = boxy.run("--net", "none", "-v", "--audit-log", "audit.jsonl", cmd=cmd, timeout=60)
    out, err = out_of(r), r.stderr.decode(errors="replace")
    assert "ptrace EPERM" in out and "DONE" in out, said(r)
    assert "seccomp: ptrace(" in err, said(r)
    assert not any(c in err for c in "\x1b\x07\x9b"), ascii(err)
    assert "\nboxyctl: seccomp: nothing refused" not in err, err
    [rec] = records(boxy)
    assert rec["argv0"] == argv0 and "\x1b]52" in rec["comm"], rec  # JSON kept it whole


# -- 2: a flood of names --------------------------------------------------------------
def test_a_flood_of_distinct_calls_is_bounded_everywhere(boxy: Boxy) -> None:
    # 300 numbers no kernel knows (each its own name, "syscall N"), from 4 processes at
    # once: PID 1 keeps 64 names and "other calls", boxyd's end line the same, the audit
    # log at most 20 a second
    body = """
kids = []
for k in range(4):
    pid = os.fork()
    if pid == 0:
        for nr in range(600 + k * 75, 675 + k * 75):
            r, e = sysc(nr)
            if r != -1:
                print("ESCAPED", nr, r, flush=True)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("DONE", flush=True)
"""
    r = py(boxy, body, "--seccomp", "compat", "--audit-log", "audit.jsonl")
    out, err = out_of(r), r.stderr.decode(errors="replace")
    assert "ESCAPED" not in out and "DONE" in out and r.returncode == 0, said(r)
    [line] = [x for x in err.splitlines() if "refused system calls:" in x]
    assert line.count("×") == 65 and "other calls ×236" in line, line
    assert len(line) < 3000, len(line)
    assert 1 <= len(records(boxy)) <= 60, len(records(boxy))
