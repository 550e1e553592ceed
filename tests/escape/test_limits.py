"""Resource exhaustion and lifetime (docs/design.md, "Limits", startup step 10).

A payload that exhausts PIDs or time must be stopped without hurting the host;
a sandbox must not outlive boxyd; a limit the kernel cannot enforce here
(memory: no controller on this machine) is reported, never claimed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox

NET = ("--net", "none")


def _wait(pred: Callable[[], object], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _pgrep(marker: str) -> list[int]:
    r = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split() if _alive(int(p))]


# --- PIDs ------------------------------------------------------------------------------

FORK_BOMB = r"""
import errno, os, sys, time
n = 0
err = None
for _ in range(1000):
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print(f"FORKED {n} {err}", flush=True)
if err is None:
    print(f"ESCAPED forked {n} processes without a limit", flush=True)
"""


def test_fork_bomb_hits_pids_limit(boxy: Boxy, user: User) -> None:
    r = boxy.run(
        *NET,
        "--pids",
        "64",
        "--timeout",
        "20s",
        cmd=["python3", "-c", FORK_BOMB],
        input=b"",
        timeout=60,
    )
    out = r.stdout.decode()
    assert "ESCAPED" not in out, out
    m = re.search(r"FORKED (\d+) (\S+)", out)
    assert m, (out, r.stderr)
    forked, err = int(m.group(1)), m.group(2)
    assert err == "EAGAIN", out
    # the payload and PID 1 count too; a handful of children must still have worked
    assert 10 <= forked < 64, out
    # the payload exits once refused: its sleeping children die with the PID namespace
    # (0, not 124: it ended before its --timeout)
    assert r.returncode == 0, (r.returncode, r.stderr)
    # the host user can still fork
    assert user.run(["sh", "-c", "true & wait; echo host-ok"], timeout=20).stdout == b"host-ok\n"


def test_nproc_cannot_be_raised(boxy: Boxy) -> None:
    body = r"""
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
print("NPROC", soft, hard)
try:
    resource.setrlimit(resource.RLIMIT_NPROC, (hard + 1000, hard + 1000))
    print("ESCAPED raised RLIMIT_NPROC")
except (OSError, ValueError) as e:
    print("TRIED raise-nproc", type(e).__name__)
"""
    r = boxy.run(*NET, "--pids", "100", cmd=["python3", "-c", body], input=b"")
    out = r.stdout.decode()
    assert "ESCAPED" not in out, out
    assert "NPROC 100 100" in out, out
    assert "TRIED raise-nproc" in out, out


# --- time ------------------------------------------------------------------------------


def test_timeout_stops_sleep(boxy: Boxy) -> None:
    t0 = time.monotonic()
    # (a sleep 60 left running would be the subprocess's 30 s TimeoutExpired)
    r = boxy.run(*NET, "--timeout", "2s", cmd=["sleep", "60"], input=b"", timeout=30)
    elapsed = time.monotonic() - t0
    assert elapsed >= 1.5, f"stopped before the timeout ({elapsed:.1f}s)"
    assert r.returncode == 124, (r.returncode, r.stderr)  # as timeout(1)
    assert "boxyctl: timed out after 2s" in r.stderr.decode(), r.stderr


def test_a_timeout_is_never_invisible(boxy: Boxy) -> None:
    """A payload that handles SIGTERM and exits 0 still makes the run exit 124."""
    r = boxy.sh(
        "trap 'exit 0' TERM; echo TRIED; sleep 30 & wait", "--timeout", "1s", input=b"", timeout=40
    )
    assert b"TRIED" in r.stdout
    assert r.returncode == 124, (r.returncode, r.stderr)
    assert "boxyctl: timed out after 1s" in r.stderr.decode(), r.stderr


def test_timeout_with_sigterm_ignored(boxy: Boxy) -> None:
    # A payload that ignores SIGTERM still ends: SIGKILL after the grace period (one
    # that never did would be the subprocess's 40 s TimeoutExpired).
    r = boxy.sh(
        "trap '' TERM; echo TRIED; while :; do sleep 0.2; done",
        "--timeout",
        "1s",
        input=b"",
        timeout=40,
    )
    assert b"TRIED" in r.stdout
    assert r.returncode == 124, (r.returncode, r.stderr)
    assert "timed out" in r.stderr.decode(), r.stderr


# --- lifetime ----------------------------------------------------------------------


@pytest.fixture
def own_daemon(user: User) -> Iterator[dict[str, str]]:
    """A private XDG_RUNTIME_DIR, so this test starts (and kills) a boxyd of its own
    instead of the one other tests share."""
    runtime = user.runtime / f"limits-{uuid.uuid4().hex[:8]}"
    runtime.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(runtime, user.uid, user.gid)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    yield env
    pid = _daemon_pid(user, env)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(runtime, ignore_errors=True)


def _daemon_pid(user: User, env: dict[str, str]) -> int | None:
    status = user.run([str(BIN / "boxyctl"), "daemon", "status"], extra_env=env, timeout=30)
    m = re.search(rb"pid (\d+)", status.stdout)
    return int(m.group(1)) if m else None


def _start_marked(
    user: User, workdir: Path, env: dict[str, str], script: str
) -> tuple[subprocess.Popen[bytes], str]:
    """A run whose `sleep 60.N` only the shell inside spells out (SCRIPT's {sleep}):
    the client's argv (runuser, boxyctl) holds $((N)), never the expanded marker,
    so pgrep finds the sandbox's processes alone. Returns the client and the marker."""
    n = 100000 + uuid.uuid4().int % 900000
    argv = user.cmd(
        [
            str(BIN / "boxyctl"),
            "run",
            *NET,
            "--",
            "sh",
            "-c",
            script.format(sleep=f"sleep 60.$(({n}))"),
        ],
        env,
    )
    client = subprocess.Popen(
        argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    return client, f"^sleep 60\\.{n}$"


def test_killing_boxyd_kills_the_sandbox(
    user: User, workdir: Path, own_daemon: dict[str, str]
) -> None:
    client, marker = _start_marked(user, workdir, own_daemon, "{sleep} & echo READY; {sleep}; wait")

    def sandboxed() -> list[int]:
        return _pgrep(marker)

    try:
        assert client.stdout is not None
        assert client.stdout.readline() == b"READY\n"
        assert _wait(lambda: len(sandboxed()) >= 2, 10), "payload processes not found"
        daemon = _daemon_pid(user, own_daemon)
        assert daemon is not None, "boxyctl daemon status: no pid"
        tree = _descendants(daemon)  # stage 2, PID 1 and the payload, as the host sees them
        assert set(sandboxed()) <= tree, "the payload is not below this boxyd"
        os.kill(daemon, signal.SIGKILL)
        assert _wait(lambda: not sandboxed(), 5), f"survived boxyd: {sandboxed()}"
        assert _wait(lambda: not any(_alive(p) for p in tree), 5), (
            f"sandbox processes survived boxyd: {[p for p in tree if _alive(p)]}"
        )
        # the client notices and does not hang
        client.wait(timeout=10)
        assert client.returncode != 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        for pid in sandboxed():
            os.kill(pid, signal.SIGKILL)


def test_a_sandbox_outlives_its_stage2_template(
    user: User, workdir: Path, own_daemon: dict[str, str]
) -> None:
    """Runs are forked from one pre-imported stage-2 template, which hands each PID 1
    over to boxyd: the template's death ends no sandbox (boxyd holds them; its own
    death ends them all, above), and boxyd starts a new template for the next run."""
    script = "echo READY; while [ ! -e go ]; do sleep 0.05; done; echo GONE; exit 3"
    client, _ = _start_marked(user, workdir, own_daemon, script)
    try:
        assert client.stdout is not None
        assert client.stdout.readline() == b"READY\n"
        daemon = _daemon_pid(user, own_daemon)
        assert daemon is not None, "boxyctl daemon status: no pid"
        templates = [
            p
            for p in _children(daemon)
            if b"boxyd.stage2" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        assert len(templates) == 1, templates
        os.kill(templates[0], signal.SIGKILL)
        assert _wait(lambda: not _alive(templates[0]), 5), "the template survived SIGKILL"
        time.sleep(0.3)
        assert client.poll() is None, "the run ended with its template"
        (workdir / "go").touch()
        out, _ = client.communicate(timeout=10)
        assert (client.returncode, out) == (3, b"GONE\n")
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        (workdir / "go").unlink(missing_ok=True)
    again = user.run(
        [str(BIN / "boxyctl"), "run", *NET, "--", "echo", "again"],
        extra_env=own_daemon,
        cwd=workdir,
    )
    assert (again.returncode, again.stdout) == (0, b"again\n"), again.stderr


def test_client_sigterm_is_forwarded(user: User, workdir: Path) -> None:
    script = (
        "trap 'echo term > got-sigterm; exit 7' TERM; echo READY; "
        "i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo NOSIGNAL"
    )
    argv = user.cmd([str(BIN / "boxyctl"), "run", *NET, "--", "sh", "-c", script])
    runner = subprocess.Popen(
        argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert runner.stdout is not None
        assert runner.stdout.readline() == b"READY\n"
        # runuser -> env -> boxyctl (env execs): signal the client itself
        client = runner.pid
        if os.getuid() == 0:
            assert _wait(lambda: bool(_children(runner.pid)), 5)
            client = _children(runner.pid)[0]
        assert "boxyctl" in Path(f"/proc/{client}/cmdline").read_bytes().decode(errors="replace")
        os.kill(client, signal.SIGTERM)
        out, err = runner.communicate(timeout=20)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert b"NOSIGNAL" not in out
    assert (workdir / "got-sigterm").read_text() == "term\n", err
    assert runner.returncode == 7, (runner.returncode, err)


# --- reported limits ----------------------------------------------------------------


def _memory_controller(user: User) -> bool:
    code = "import boxyd.daemon.doctor as d; print(d.facts()['memory_controller'])"
    r = user.run([str(BIN / "python"), "-c", code], timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == b"True"


def test_memory_limit_is_reported(boxy: Boxy, user: User, workdir: Path) -> None:
    audit = workdir / "audit.jsonl"
    r = boxy.run(
        *NET, "--memory", "1GiB", "-v", "--audit-log", str(audit), cmd=["echo", "TRIED"], input=b""
    )
    assert r.returncode == 0 and r.stdout == b"TRIED\n", r
    err = r.stderr.decode()
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    memory = [
        rec for rec in records if rec.get("layer") == "cgroup" and rec.get("limit") == "memory"
    ]
    assert len(memory) == 1, records
    mem_lines = [ln for ln in err.splitlines() if "--memory" in ln or "memory limit" in ln]
    if _memory_controller(user):
        assert memory[0].get("enforced") is True, memory
        assert not any("not enforced" in ln for ln in mem_lines), err
    else:
        # never claimed: the run says so, in the audit log and under -v
        assert memory[0].get("enforced") is False, memory
        assert any("not enforced" in ln and "memory controller" in ln for ln in mem_lines), err


def test_priority_limits_inside(boxy: Boxy) -> None:
    body = r"""
import os, resource
oom = open("/proc/self/oom_score_adj").read().strip()
print("OOM", oom)
print("NICE", os.getpriority(os.PRIO_PROCESS, 0))
print("RTPRIO", *resource.getrlimit(resource.RLIMIT_RTPRIO))
print("NPROC", *resource.getrlimit(resource.RLIMIT_NPROC))
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
    if open("/proc/self/oom_score_adj").read().strip() != oom:
        print("ESCAPED lowered oom_score_adj")
except OSError as e:
    print("TRIED oom", e.errno)
try:
    os.setpriority(os.PRIO_PROCESS, 0, 0)
    print("ESCAPED raised priority to", os.getpriority(os.PRIO_PROCESS, 0))
except OSError as e:
    print("TRIED nice", e.errno)
try:
    resource.setrlimit(resource.RLIMIT_RTPRIO, (10, 10))
    print("ESCAPED raised RLIMIT_RTPRIO")
except (OSError, ValueError) as e:
    print("TRIED rtprio", type(e).__name__)
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("ESCAPED realtime scheduling")
except OSError as e:
    print("TRIED fifo", e.errno)
"""
    r = boxy.run(*NET, "--pids", "77", cmd=["python3", "-c", body], input=b"")
    out = r.stdout.decode()
    assert "ESCAPED" not in out, out
    assert r.returncode == 0, r.stderr
    lines = out.splitlines()
    assert "OOM 1000" in lines, out
    assert "NICE 19" in lines, out
    assert "RTPRIO 0 0" in lines, out
    assert "NPROC 77 77" in lines, out
    for what in ("oom", "nice", "rtprio", "fifo"):
        assert any(ln.startswith(f"TRIED {what}") for ln in lines), (what, out)
