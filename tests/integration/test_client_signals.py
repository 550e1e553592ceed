"""The client never hangs on a stuck daemon: a signal is passed on to the session; a
second one, or a daemon that no longer answers a few seconds after the first, ends
the wait with one clear line."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.integration.clients import client_err, sessions_running, start_client

pytestmark = pytest.mark.sandbox


def _daemon_pid(user: User) -> int:
    r = user.run([str(BIN / "boxyctl"), "daemon", "status"])
    words = r.stdout.decode().split()
    if "pid" in words:
        return int(words[words.index("pid") + 1])
    raise AssertionError(f"no pid in `boxyctl daemon status`: {r.stdout!r} {r.stderr!r}")


def _kill_daemon(pid: int) -> None:
    """SIGKILL a (stopped) boxyd and wait until it is gone: until then its listening
    socket is still open, and the next test's client, queued on it, would be reset
    as the dying daemon's fds close. Gone is the pidfd's word, not /proc's: the main
    thread shows Z while the others still exit, holding the fds (CI, a reset)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)  # its sandboxes die with it (PDEATHSIG)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(10_000):  # readable once the whole thread group has exited
            raise AssertionError(f"boxyd {pid} still running 10 s after SIGKILL")
    finally:
        os.close(pidfd)


def test_a_stopped_daemon_does_not_hang_the_client(boxy: Boxy, user: User, workdir: Path) -> None:
    proc, client = start_client(user, workdir, "echo ready; exec sleep 60")
    daemon = _daemon_pid(user)
    os.kill(daemon, signal.SIGSTOP)
    try:
        start = time.monotonic()
        os.kill(client, signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        _kill_daemon(daemon)
        if proc.poll() is None:
            proc.kill()
    err = client_err(workdir)
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err
    assert (
        lines and "boxyd did not answer within 5s of the SIGTERM: stopped waiting" in lines[-1]
    ), err
    assert took < 15, f"the client gave up only after {took:.1f}s"


def test_sigterm_ends_a_client_whose_session_never_started(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """boxyd not answering at all (stopped) before the session started: there is
    nothing to pass the signal on to, and `timeout`'s SIGTERM used to be ignored."""
    assert boxy.sh("true").returncode == 0  # boxyd is up
    daemon = _daemon_pid(user)
    os.kill(daemon, signal.SIGSTOP)
    argv = user.cmd([str(BIN / "boxyctl"), "run", "--net", "none", "--", "true"])
    # a file, not a pipe: the fds sent with the Run wait in the socket, held open
    errfile = workdir.parent / f"{workdir.name}.err"
    with open(errfile, "wb") as errf:
        proc = subprocess.Popen(
            argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf
        )
    try:
        time.sleep(1.5)  # connected (the listener's backlog), its Run sent, waiting
        assert proc.poll() is None, "the client ended before the signal"
        kids = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        client = int(kids[0]) if os.getuid() != user.uid else proc.pid
        start = time.monotonic()
        os.kill(client, signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        _kill_daemon(daemon)
        if proc.poll() is None:
            proc.kill()
    stderr = errfile.read_text()
    lines = stderr.strip().splitlines()
    assert proc.returncode not in (0, None) and len(lines) == 1, stderr
    assert "SIGTERM before the session started: stopped waiting for boxyd" in lines[0], lines
    assert took < 3, f"the client ended only after {took:.1f}s"


def test_a_second_interrupt_ends_the_wait(boxy: Boxy, user: User, workdir: Path) -> None:
    proc, client = start_client(user, workdir, "trap '' INT; echo ready; sleep 60")
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
    err = client_err(workdir)
    assert proc.returncode == 1, err
    assert "SIGINT again: stopped waiting for boxyd; boxyd stops session" in err, err


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_client_gone_hangs_its_session_up(
    boxy: Boxy, user: User, workdir: Path, how: signal.Signals
) -> None:
    """An attached session whose client goes away (killed; or given up after a second
    ^C) gets SIGHUP as from a closed terminal, and is stopped: a cancelled CI job
    leaves nothing running."""
    hup = workdir / "hup.txt"
    script = (
        "trap 'echo hup >> hup.txt; exit 129' HUP; trap '' INT TERM; echo ready; "
        "while :; do sleep 0.1; done"
    )
    proc, client = start_client(user, workdir, script)
    try:
        assert sessions_running(user) == 1
        os.kill(client, how)
        if how == signal.SIGINT:
            time.sleep(0.3)
            os.kill(client, how)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while sessions_running(user) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sessions_running(user) == 0, "the session outlived its client"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert hup.read_text() == "hup\n"
