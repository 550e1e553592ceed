"""Every system call seccomp refuses is named: the call, its arguments, the process
(issue 34). Real processes on the real kernel, which has SECCOMP_RET_USER_NOTIF here
(the doctor's seccomp-names line): PID 1 answers each refusal (boxyd/stage2/notify.py)
and boxyd records it in the audit log, says it with -v and counts it at the end."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Boxy
from tests.escape.test_kernel import out_of, py

pytestmark = pytest.mark.sandbox

MOVE_PAGES = 279  # allowed by no rule: strict mode kills it
PTRACE, ADD_KEY = 101, 248  # refused by name: EPERM in either mode


def records(boxy: Boxy) -> list[dict[str, Any]]:
    path: Path = boxy.workdir / "audit.jsonl"
    lines = path.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("layer") == "seccomp" and "call" in r]


def said(r: subprocess.CompletedProcess[bytes]) -> str:
    return (
        f"status {r.returncode}\nstdout:\n{out_of(r)}\nstderr:\n{r.stderr.decode(errors='replace')}"
    )


def pid_of(out: str, label: str = "PID") -> int:
    m = re.search(rf"^{label} (\d+)$", out, re.M)
    assert m, out
    return int(m.group(1))


def test_a_strict_kill_names_the_call_its_arguments_and_the_process(boxy: Boxy) -> None:
    body = f"""
print("PID", os.getpid(), flush=True)
attempt("move_pages", {MOVE_PAGES}, 0, 1, 0x1234, 0, 0, 0)
print("DONE", flush=True)
"""
    r = py(boxy, body, "--audit-log", "audit.jsonl")
    out, err = out_of(r), r.stderr.decode(errors="replace")
    assert "ESCAPED" not in out and "DONE" not in out, said(r)
    assert r.returncode == 128 + 31, said(r)  # as seccomp's own kill: SIGSYS
    pid = pid_of(out)
    assert "killed by seccomp: the payload called move_pages" in err, said(r)
    assert re.search(rf"refused system calls: move_pages ×1 \(killed pid {pid} python3", err), said(
        r
    )
    [rec] = records(boxy)
    assert rec["call"] == "move_pages" and rec["nr"] == MOVE_PAGES, rec
    assert rec["action"] == "kill" and rec["verdict"] == "deny", rec
    assert rec["args"] == ["0x0", "0x1", "0x1234", "0x0", "0x0", "0x0"], rec
    assert rec["pid"] == pid and rec["tid"] == pid and rec["comm"].startswith("python3"), rec
    lines = (boxy.workdir / "audit.jsonl").read_text().splitlines()
    fallback = [x for x in map(json.loads, lines) if x.get("layer") == "seccomp" and "signal" in x]
    assert not fallback, "the unnamed fallback was recorded too"


def test_a_thread_that_makes_the_call_takes_its_whole_process(boxy: Boxy) -> None:
    body = f"""
import threading, time
print("PID", os.getpid(), flush=True)
def call():
    print("TID", libc.syscall(186), flush=True)  # gettid
    attempt("move_pages", {MOVE_PAGES}, 0, 0, 0, 0, 0, 0)
threading.Thread(target=call).start()
time.sleep(5)
print("SURVIVED", flush=True)
"""
    r = py(boxy, body, "--audit-log", "audit.jsonl")
    out = out_of(r)
    assert "ESCAPED" not in out and "SURVIVED" not in out, said(r)
    assert r.returncode == 128 + 31, said(r)
    [rec] = records(boxy)
    assert rec["pid"] == pid_of(out) and rec["tid"] == pid_of(out, "TID") != rec["pid"], rec
    assert f"thread {rec['tid']}: killed" in rec["reason"], rec


def test_a_child_killed_for_a_call_is_named_and_its_parent_goes_on(boxy: Boxy) -> None:
    body = f"""
child = os.fork()
if child == 0:
    attempt("move_pages", {MOVE_PAGES}, 7, 0, 0, 0, 0, 0)
    os._exit(0)
_, status = os.waitpid(child, 0)
print("CHILD", child, "signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
print("DONE", flush=True)
"""
    r = py(boxy, body, "--audit-log", "audit.jsonl")
    out = out_of(r)
    assert "ESCAPED" not in out and "DONE" in out and r.returncode == 0, said(r)
    m = re.search(r"^CHILD (\d+) signal 9$", out, re.M)  # SIGKILL, from PID 1
    assert m, said(r)
    [rec] = records(boxy)
    assert rec["pid"] == int(m.group(1)) and rec["args"][0] == "0x7", rec


def test_compat_counts_each_refused_call_by_name(boxy: Boxy) -> None:
    body = f"""
attempt("ptrace-1", {PTRACE}, 16, 1, 0, 0, 0, 0)
attempt("ptrace-2", {PTRACE}, 16, 1, 0, 0, 0, 0)
attempt("add_key", {ADD_KEY}, 0, 0, 0, 0, 0, 0)
attempt("move_pages", {MOVE_PAGES}, 0, 0, 0, 0, 0, 0)
print("DONE", flush=True)
"""
    r = py(boxy, body, "--seccomp", "compat", "--audit-log", "audit.jsonl")
    out, err = out_of(r), r.stderr.decode(errors="replace")
    assert "ESCAPED" not in out and "DONE" in out and r.returncode == 0, said(r)
    for case in ("ptrace-1", "ptrace-2", "add_key", "move_pages"):
        assert f"{case} EPERM" in out.splitlines(), said(r)
    assert "refused system calls: ptrace ×2, add_key ×1, move_pages ×1" in err, said(r)
    got = [(x["call"], x["action"]) for x in records(boxy)]
    assert got == [("ptrace", "errno")] * 2 + [("add_key", "errno"), ("move_pages", "errno")]


def test_a_refusal_by_name_is_said_with_v_and_the_process_lives(boxy: Boxy) -> None:
    body = f"""
print("PID", os.getpid(), flush=True)
attempt("ptrace", {PTRACE}, 16, 1, 0, 0, 0, 0)
print("DONE", flush=True)
"""
    r = py(boxy, body, "-v")
    out, err = out_of(r), r.stderr.decode(errors="replace")
    assert "ptrace EPERM" in out.splitlines() and r.returncode == 0, said(r)
    line = f"seccomp: ptrace(0x10, 0x1, 0x0, 0x0, 0x0, 0x0) by pid {pid_of(out)} python3"
    assert line in err and "EPERM" in err, said(r)


def test_a_flood_is_counted_whole_and_recorded_at_a_bounded_rate(boxy: Boxy) -> None:
    body = f"""
for _ in range(3000):
    r, e = sysc({PTRACE}, 16, 1, 0, 0, 0, 0)
    assert r == -1 and e == errno.EPERM, (r, e)
print("DONE", flush=True)
"""
    r = py(boxy, body, "--seccomp", "compat", "--audit-log", "audit.jsonl")
    err = r.stderr.decode(errors="replace")
    assert "DONE" in out_of(r) and r.returncode == 0, said(r)
    assert "refused system calls: ptrace ×3,000" in err, said(r)
    assert 1 <= len(records(boxy)) <= 200, len(records(boxy))  # 20 a second, per second run
