"""The client never hangs on a stuck daemon: a signal is passed on to the session; a
second one, or a daemon that no longer answers a few seconds after the first, ends
the wait with one clear line."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox


def _client(user: User, workdir: Path, script: str) -> tuple[subprocess.Popen, int]:
    """boxyctl run as USER, its output in files (the payload holds on to them: pipes
    would not reach EOF when the client goes); returns the process and boxyctl's own
    pid (the child of runuser, which only passes signals on)."""
    argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--", "sh", "-c", script]
    with open(workdir.parent / f"{workdir.name}.out", "wb") as out, \
            open(workdir.parent / f"{workdir.name}.err", "wb") as err:
        proc = subprocess.Popen(user.cmd(argv), cwd=workdir, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err)
    deadline = time.monotonic() + 30
    while _out(workdir) != b"ready\n" and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert _out(workdir) == b"ready\n", _err(workdir)
    if os.getuid() != user.uid:
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(kids) == 1, kids
        return proc, int(kids[0])
    return proc, proc.pid


def _out(workdir: Path) -> bytes:
    return (workdir.parent / f"{workdir.name}.out").read_bytes()


def _err(workdir: Path) -> str:
    return (workdir.parent / f"{workdir.name}.err").read_text()


def _daemon_pid(user: User) -> int:
    r = user.run([str(BIN / "boxyctl"), "daemon", "status"])
    words = r.stdout.decode().split()
    if "pid" in words:
        return int(words[words.index("pid") + 1])
    raise AssertionError(f"no pid in `boxyctl daemon status`: {r.stdout!r} {r.stderr!r}")


def test_a_stopped_daemon_does_not_hang_the_client(boxy: Boxy, user: User, workdir: Path) -> None:
    proc, client = _client(user, workdir, "echo ready; exec sleep 60")
    daemon = _daemon_pid(user)
    os.kill(daemon, signal.SIGSTOP)
    try:
        start = time.monotonic()
        os.kill(client, signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        os.kill(daemon, signal.SIGCONT)
        os.kill(daemon, signal.SIGKILL)  # its sandboxes die with it (PDEATHSIG)
        if proc.poll() is None:
            proc.kill()
    err = _err(workdir)
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err
    assert lines and "boxyd did not answer within 5s of the SIGTERM: stopped waiting" in lines[-1], err
    assert took < 15, f"the client gave up only after {took:.1f}s"


def test_a_second_interrupt_ends_the_wait(boxy: Boxy, user: User, workdir: Path) -> None:
    proc, client = _client(user, workdir, "trap '' INT; echo ready; sleep 60")
    try:
        os.kill(client, signal.SIGINT)  # passed on; the payload ignores it
        time.sleep(0.5)
        assert proc.poll() is None, "the first ^C must only be passed on"
        start = time.monotonic()
        os.kill(client, signal.SIGINT)
        proc.wait(timeout=10)
        assert time.monotonic() - start < 5
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["pkill", "-u", str(user.uid), "-f", "^sleep 60$"], check=False)
    err = _err(workdir)
    assert proc.returncode == 1, err
    assert "SIGINT again: stopped waiting for boxyd; boxyd stops session" in err, err


def _sessions_running(user: User) -> int:
    words = user.run([str(BIN / "boxyctl"), "daemon", "status"]).stdout.decode().split()
    # boxyd: running  pid N  build B  sessions running N  up Ts
    return int(words[words.index("sessions") + 2]) if "sessions" in words else 0


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_client_gone_hangs_its_session_up(boxy: Boxy, user: User, workdir: Path,
                                            how: signal.Signals) -> None:
    """An attached session whose client goes away (killed; or given up after a second
    ^C) gets SIGHUP as from a closed terminal, and is stopped: a cancelled CI job
    leaves nothing running."""
    hup = workdir / "hup.txt"
    script = ("trap 'echo hup >> hup.txt; exit 129' HUP; trap '' INT TERM; echo ready; "
              "while :; do sleep 0.1; done")
    proc, client = _client(user, workdir, script)
    try:
        assert _sessions_running(user) == 1
        os.kill(client, how)
        if how == signal.SIGINT:
            time.sleep(0.3)
            os.kill(client, how)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _sessions_running(user) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sessions_running(user) == 0, "the session outlived its client"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert hup.read_text() == "hup\n"
