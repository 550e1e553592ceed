"""Detach and attach through a real PTY: `run -d`, `attach` with the output so far,
typed input and the window size, Ctrl-] leaving a session running, one client at
a time."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.escape.test_terminal import HARMLESS, print_sequences_cmd, reached
from tests.integration.test_client_signals import _client_waiting

pytestmark = pytest.mark.sandbox


class Term:
    """A boxyctl command as the test user on a fresh PTY the test holds."""

    def __init__(
        self,
        user: User,
        workdir: Path,
        args: list[str],
        size: tuple[int, int] = (24, 80),
        env: dict[str, str] | None = None,
    ) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
        try:
            self.proc = subprocess.Popen(
                user.cmd([str(BIN / "boxyctl"), *args], env),
                cwd=workdir,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
            )
        finally:
            os.close(slave)
        self.seen = bytearray()

    def expect(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.seen.decode(errors="replace"))
            if m:
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} never appeared; terminal: {bytes(self.seen)!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # EIO: the client is gone
                    time.sleep(0.05)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 20) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.master < 0:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            while select.select([self.master], [], [], 0)[0]:
                self.seen += os.read(self.master, 65536)
        except OSError:
            pass
        os.close(self.master)
        self.master = -1


def ctl(user: User, *args: str) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], timeout=60)


def state_of(user: User, sid: str) -> str:
    line = next(
        (ln for ln in ctl(user, "ps", "-a").stdout.decode().splitlines() if ln.startswith(sid)), ""
    )
    return line.split()[1] if line else "absent"


def test_run_d_then_attach_round_trip(boxy: Boxy, user: User, workdir: Path) -> None:
    r = ctl(
        user,
        "run",
        "-d",
        "-w",
        str(workdir),
        "--net",
        "none",
        "--",
        "sh",
        "-c",
        "echo hello-from-detached; read line; stty size; echo got:$line; exit 7",
    )
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    assert re.fullmatch(r"[0-9a-f]{8}", sid), r.stdout
    time.sleep(0.5)
    assert state_of(user, sid) == "running"  # its client is gone; it is not
    term = Term(user, workdir, ["attach", sid], size=(33, 101))
    try:
        term.expect("hello-from-detached")  # written before anyone attached: the ring
        term.send(b"abc\r")
        term.expect(r"33 101")  # the window size followed the new client
        term.expect("got:abc")
        assert term.wait() == 7
    finally:
        term.close()
    assert state_of(user, sid) == "exited"
    log = user.home / ".local/state/boxy/sessions" / sid / "output.log"
    assert b"hello-from-detached" in log.read_bytes()


def test_attach_replay_and_output_log_are_filtered(boxy: Boxy, user: User, workdir: Path) -> None:
    """What a detached payload printed reaches the next client, and output.log,
    filtered as a live terminal is: OSC 52 and the queries are gone, colour and
    title are there."""
    r = ctl(
        user,
        "run",
        "-d",
        "-w",
        str(workdir),
        "--net",
        "none",
        "--",
        *print_sequences_cmd(wait=True),
    )
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    log = user.home / ".local/state/boxy/sessions" / sid / "output.log"
    term = Term(user, workdir, ["attach", sid])
    try:
        term.expect("READY")
        term.send(b"\r")
        term.expect("END")  # printed while attached: live
        term.send(b"\x1d")
        assert term.wait() == 0
    finally:
        term.close()
    again = Term(user, workdir, ["attach", sid])  # and now from the ring
    try:
        again.expect("END")
        again.send(b"\r")
        assert again.wait() == 0
    finally:
        again.close()
    for seen in (bytes(term.seen), bytes(again.seen), log.read_bytes()):
        assert reached(seen) == []
        assert b"BEGIN" + HARMLESS + b"END" in seen


def test_ctrl_bracket_detaches_and_the_session_lives_on(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    script = "i=0; while :; do i=$((i+1)); echo tick$i; sleep 0.2; done"
    term = Term(user, workdir, ["run", "--net", "none", "--", "sh", "-c", script])
    try:
        term.expect("tick2")
        term.send(b"\x1d")
        assert term.wait() == 0
        m = re.search(r"detached from session ([0-9a-f]{8})", term.seen.decode())
        assert m is not None, term.seen
        sid = m.group(1)
    finally:
        term.close()
    time.sleep(0.5)
    assert state_of(user, sid) == "running"
    again = Term(user, workdir, ["attach", sid])
    try:
        n = int(again.expect(r"tick(\d+)\r?\n").group(1))
        again.expect(rf"tick{n + 2}")  # live output, not only the replay
        busy = ctl(user, "attach", sid)  # one client at a time
        assert busy.returncode == 1
        assert f"session {sid} is attached to another client" in busy.stderr.decode()
        again.send(b"\x1d")
        assert again.wait() == 0
    finally:
        again.close()
    assert state_of(user, sid) == "running"
    r = ctl(user, "stop", "-k", sid)
    assert r.stdout.decode().strip() == f"session {sid}: killed SIGKILL", r.stderr


@pytest.mark.parametrize("how", ["hangup", "killed"])
def test_an_attach_that_drops_leaves_a_detached_session_running(
    boxy: Boxy, user: User, workdir: Path, how: str
) -> None:
    """`run -d`, then `attach` over ssh, and the ssh drops (the client's terminal hangs
    up: SIGHUP) or the client is killed: docker and tmux users expect the session to go
    on, detached; it was killed by the SIGHUP (issue 33 §2)."""
    script = "i=0; while :; do i=$((i+1)); echo tick$i; sleep 0.2; done"
    r = ctl(user, "run", "-d", "-w", str(workdir), "--net", "none", "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    term = Term(user, workdir, ["attach", sid])
    try:
        term.expect("tick")
        client = _client_waiting(term.proc, user)
        os.kill(client, signal.SIGHUP if how == "hangup" else signal.SIGKILL)
        status = term.proc.wait(timeout=20)
        if how == "hangup":
            assert status == 128 + signal.SIGHUP, term.seen
            term.expect(f"the terminal hung up; session {sid} goes on, detached")
    finally:
        term.close()
    deadline = time.monotonic() + 20  # boxyd sees the connection gone
    while json.loads(ctl(user, "show", "--json", sid).stdout)["attached"]:
        assert time.monotonic() < deadline, "still attached"
        time.sleep(0.05)
    assert state_of(user, sid) == "running"
    again = Term(user, workdir, ["attach", sid])  # and it is still ticking
    try:
        n = int(again.expect(r"tick(\d+)\r?\n").group(1))
        again.expect(rf"tick{n + 2}")
        again.send(b"\x1d")
        assert again.wait() == 0
    finally:
        again.close()
    r = ctl(user, "stop", "-k", sid)
    assert r.stdout.decode().strip() == f"session {sid}: killed SIGKILL", r.stderr


def test_attach_to_what_cannot_be_attached(boxy: Boxy, user: User, workdir: Path) -> None:
    r = ctl(user, "attach", "deadbeef")
    assert r.returncode == 1 and b"no session deadbeef" in r.stderr
    r = boxy.run("--", "true")
    assert r.returncode == 0
    sid = next(
        ln.split()[0]
        for ln in reversed(ctl(user, "ps", "-a").stdout.decode().splitlines())
        if ln.endswith(" true")
    )
    r = ctl(user, "attach", sid)
    assert r.returncode in (1, 2)
    assert f"session {sid} has ended" in r.stderr.decode() or b"no session" in r.stderr


def test_watch_on_a_terminal_repaints_the_board(boxy: Boxy, user: User, workdir: Path) -> None:
    r = ctl(
        user,
        "run",
        "-d",
        "-w",
        str(workdir),
        "--net",
        "none",
        "--",
        "sh",
        "-c",
        "while [ ! -e go ]; do sleep 0.05; done; exit 5",
    )
    sid = r.stdout.decode().strip()
    term = Term(user, workdir, ["watch", sid])
    try:
        term.expect(r"\x1b\[H\x1b\[J" + f"session {sid}  running  ")
        term.expect(r"0 destination\(s\)  0 connection\(s\)  0 denied   up 0B \(0B/s\)")
        term.expect("RECENT")
        (workdir / "go").touch()
        term.expect(r"state     exited 5")  # the summary once it ended
        assert term.wait() == 0
    finally:
        term.close()
        ctl(user, "stop", "-k", sid)  # (a no-op once it ended)
