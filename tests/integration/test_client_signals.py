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
from tests.integration.clients import client_err, client_out, sessions_running, start_client

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


RECVMSG = 47  # the syscall's number on x86_64


def _waits_for_boxyd(pid: int) -> bool:
    """Is PID (a `boxyctl run`) waiting for boxyd's answer to its Run: the follower's
    handlers in place (SIGTERM, and its SIGALRM watchdog's) and blocked in recvmsg?"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:  # not there yet, or gone
        return False
    caught = int(next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1], 16)
    wanted = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGALRM - 1))
    return caught & wanted == wanted and syscall[:1] == [str(RECVMSG)]


def _client_waiting(proc: subprocess.Popen[bytes], user: User, timeout: float = 30) -> int:
    """boxyctl's pid (runuser's child when we are root) once it waits for boxyd."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the client ended before the signal"
        if os.getuid() == user.uid:
            kids = [str(proc.pid)]
        else:
            kids = subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
            ).stdout.split()
        if kids and _waits_for_boxyd(int(kids[0])):
            return int(kids[0])
        time.sleep(0.01)
    raise AssertionError(f"the client was not waiting for boxyd after {timeout:g}s")


def _wait_for_output(workdir: Path, text: bytes, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while client_out(workdir) != text:
        assert time.monotonic() < deadline, (client_out(workdir), client_err(workdir))
        time.sleep(0.02)


def test_a_stopped_daemon_does_not_hang_the_client(boxy: Boxy, user: User, workdir: Path) -> None:
    proc, client = start_client(user, workdir, "echo ready; exec sleep 60")
    daemon = _daemon_pid(user)
    os.kill(daemon, signal.SIGSTOP)
    try:
        os.kill(client, signal.SIGTERM)
        proc.wait(timeout=60)  # a hang fails here
    finally:
        _kill_daemon(daemon)
        if proc.poll() is None:
            proc.kill()
    err = client_err(workdir)
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err
    # its 5 s watchdog ended it, not the 12 s END_WAIT (that one says "no outcome")
    assert (
        lines and "boxyd did not answer within 5s of the SIGTERM: stopped waiting" in lines[-1]
    ), err


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
        # connected (the listener's backlog), its Run sent, waiting: not a time (a
        # SIGTERM while the client still started killed it silently, on a busy machine)
        client = _client_waiting(proc, user)
        os.kill(client, signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        _kill_daemon(daemon)
        if proc.poll() is None:
            proc.kill()
    stderr = errfile.read_text()
    lines = stderr.strip().splitlines()
    assert proc.returncode not in (0, None) and len(lines) == 1, stderr
    # at once, from the handler (no watchdog's message: "did not answer", "no outcome")
    assert "SIGTERM before the session started: stopped waiting for boxyd" in lines[0], lines


def test_a_second_interrupt_ends_the_wait(boxy: Boxy, user: User, workdir: Path) -> None:
    script = "trap 'echo int' INT; echo ready; while :; do sleep 0.1; done"
    proc, client = start_client(user, workdir, script)
    try:
        os.kill(client, signal.SIGINT)  # passed on; the payload says so and goes on
        _wait_for_output(workdir, b"ready\nint\n")
        assert proc.poll() is None, "the first ^C must only be passed on"
        os.kill(client, signal.SIGINT)
        proc.wait(timeout=30)  # a hang fails here
        deadline = time.monotonic() + 30  # boxyd stops the session it saw its client leave
        while sessions_running(user) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = client_err(workdir)
    assert proc.returncode == 1, err
    # ended by the second ^C itself, not by a watchdog
    assert "SIGINT again: stopped waiting for boxyd; boxyd stops session" in err, err
    assert sessions_running(user) == 0, "the session outlived its client"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_client_gone_hangs_its_session_up(
    boxy: Boxy, user: User, workdir: Path, how: signal.Signals
) -> None:
    """An attached session whose client goes away (killed; or given up after a second
    ^C) gets SIGHUP as from a closed terminal, and is stopped: a cancelled CI job
    leaves nothing running."""
    hup = workdir / "hup.txt"
    script = (
        "trap 'echo hup >> hup.txt; exit 129' HUP; trap 'echo int' INT; trap '' TERM; "
        "echo ready; while :; do sleep 0.1; done"
    )
    proc, client = start_client(user, workdir, script)
    try:
        assert sessions_running(user) == 1
        os.kill(client, how)
        if how == signal.SIGINT:  # the second once the first was passed on (not merged)
            _wait_for_output(workdir, b"ready\nint\n")
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
