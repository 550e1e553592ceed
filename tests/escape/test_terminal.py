"""Terminal escapes: no host terminal fd may enter the sandbox, and /dev/tty inside never
reaches the user's terminal (docs/design.md, "Daemon, sessions, APIs"; threat: keystroke
injection through TIOCSTI/TIOCLINUX into the shell that ran `boxyctl run`).

The test owns a real PTY (pty.openpty()) whose slave is the client's terminal; the
payload must only ever see a PTY of boxy's, told apart by its device number.
`run_on_pty` is also used by test_kernel.py (TIOCSTI on a real terminal).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox

Stream = Literal["pty", "pipe"]
HOST_RDEV = "@HOST_RDEV@"


@dataclass
class PtyRun:
    returncode: int
    tty: str  # everything written to the test's terminal, \r\n folded to \n
    stdout: str  # the stdout pipe when stdout was not the terminal
    stderr: str  # the stderr pipe when stderr was not the terminal
    slave_id: tuple[int, int]  # (st_dev, st_ino): the same file, whatever devpts it shows in
    slave_name: str


def run_on_pty(
    user: User,
    workdir: Path,
    flags: list[str],
    cmd: list[str],
    *,
    stdin: Stream = "pty",
    stdout: Stream = "pty",
    stderr: Stream = "pty",
    winsize: tuple[int, int] | None = None,
    send: bytes | None = None,
    send_after: str | None = None,
    send_delay: float = 0.0,
    stdin_data: bytes = b"",
    timeout: float = 30,
    wrap: Callable[[list[str]], list[str]] | None = None,
) -> PtyRun:
    """`boxyctl run FLAGS -- CMD` as the test user with the chosen fds on a fresh PTY.

    "@HOST_RDEV@" in CMD becomes the device number of the test's terminal (so the
    payload can recognise it). SEND is typed into the terminal SEND_DELAY seconds after
    SEND_AFTER has appeared on it. The run is over when the client has exited and the terminal has
    gone quiet."""
    master, slave = os.openpty()
    try:
        if winsize is not None:
            fcntl.ioctl(
                slave, termios.TIOCSWINSZ, struct.pack("HHHH", winsize[0], winsize[1], 0, 0)
            )
        st = os.fstat(slave)
        slave_name = os.ttyname(slave)
        cmd = [c.replace(HOST_RDEV, f"{st.st_dev}:{st.st_ino}") for c in cmd]
        argv = [str(BIN / "boxyctl"), "run", *flags, "--", *cmd]
        argv = wrap(argv) if wrap is not None else user.cmd(argv)
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            stdin=slave if stdin == "pty" else subprocess.PIPE,
            stdout=slave if stdout == "pty" else subprocess.PIPE,
            stderr=slave if stderr == "pty" else subprocess.PIPE,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # only the client (and boxyd's copy) hold it now
    if proc.stdin is not None:
        # a pipe, not the pytest process's own stdin (which may be a terminal)
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin_data)
        proc.stdin.close()
    out_fd = proc.stdout.fileno() if proc.stdout is not None else None
    err_fd = proc.stderr.fileno() if proc.stderr is not None else None
    bufs: dict[int, bytearray] = {
        fd: bytearray() for fd in (master, out_fd, err_fd) if fd is not None
    }
    open_fds = set(bufs)
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    send_at: float | None = None
    try:
        while open_fds:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(
                    f"boxyctl did not finish in {timeout}s; terminal so far: "
                    f"{bytes(bufs[master])!r}"
                )
            if proc.poll() is not None:
                # the client is gone; give the relay a moment to flush, then stop
                quiet_since = quiet_since or now
                if now - quiet_since > 1.0:
                    break
            if send is not None and send_at is not None and now >= send_at:
                os.write(master, send)
                send = None
            ready, _, _ = select.select(list(open_fds), [], [], 0.1)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: no slave left open
                    data = b""
                if not data:
                    open_fds.discard(fd)
                    continue
                quiet_since = None
                bufs[fd] += data
                if (
                    fd == master
                    and send_at is None
                    and send_after is not None
                    and send_after.encode() in bufs[master]
                ):
                    send_at = time.monotonic() + send_delay
        returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        os.close(master)

    def text(fd: int | None) -> str:
        return "" if fd is None else bufs[fd].decode(errors="replace").replace("\r\n", "\n")

    return PtyRun(
        returncode=returncode,
        tty=text(master),
        stdout=text(out_fd),
        stderr=text(err_fd),
        slave_id=(st.st_dev, st.st_ino),
        slave_name=slave_name,
    )


# Reports what fds 0-2 are, as one JSON line on stdout; prints ESCAPED if any of
# them is the test's own terminal (argv[1] is its "st_dev:st_ino": a device number
# alone would not do, the sandbox's own devpts numbers its PTYs from 0 too).
FD_REPORT = r"""
import json, os, stat, sys
host_id = tuple(int(v) for v in sys.argv[1].split(":"))
rep = {}
for fd in (0, 1, 2):
    st = os.fstat(fd)
    try:
        name = os.ttyname(fd)
    except OSError as e:
        name = "error:" + str(e.errno)
    rep[fd] = {"link": os.readlink(f"/proc/self/fd/{fd}"), "ttyname": name,
               "isatty": os.isatty(fd), "fifo": stat.S_ISFIFO(st.st_mode),
               "chr": stat.S_ISCHR(st.st_mode), "rdev": st.st_rdev,
               "id": [st.st_dev, st.st_ino]}
    if (st.st_dev, st.st_ino) == host_id:
        print(f"ESCAPED fd {fd} is the host terminal", file=sys.stderr, flush=True)
        os.write(1, f"ESCAPED fd {fd} is the host terminal\n".encode())
rep["fds"] = sorted(os.listdir("/proc/self/fd"))
os.write(1, ("REPORT " + json.dumps(rep) + "\n").encode())
os.write(2, b"STDERR-LINE\n")
"""


def _report(text: str) -> dict[str | int, Any]:
    lines = [ln for ln in text.splitlines() if ln.startswith("REPORT ")]
    assert len(lines) == 1, f"no fd report from the payload: {text!r}"
    return {k if not k.isdigit() else int(k): v for k, v in json.loads(lines[0][7:]).items()}


def _is_pty(entry: dict[str, Any], host_id: tuple[int, int]) -> bool:
    # Unix98 PTY slaves have majors 136-143; boxy's must not be the client's own.
    return (
        entry["isatty"]
        and entry["chr"]
        and 136 <= os.major(entry["rdev"]) <= 143
        and tuple(entry["id"]) != host_id
    )


def test_dev_tty_is_enxio_without_a_pty(boxy: Boxy) -> None:
    payload = r"""
import errno, os
print("TTYS", [os.isatty(fd) for fd in (0, 1, 2)])
try:
    fd = os.open("/dev/tty", os.O_RDWR)
except OSError as e:
    print("TRIED open /dev/tty:", errno.errorcode.get(e.errno, e.errno))
else:
    print("ESCAPED /dev/tty opened:", os.ttyname(fd))
"""
    # input=b"": stdin is a pipe even when pytest itself runs on a terminal
    r = boxy.run("--net", "none", cmd=["python3", "-c", payload], input=b"", timeout=60)
    out = r.stdout.decode()
    assert "ESCAPED" not in out
    assert r.returncode == 0, r.stderr
    assert "TTYS [False, False, False]" in out
    assert "TRIED open /dev/tty: ENXIO" in out


def test_dev_tty_is_the_session_pty_and_the_payload_its_foreground(
    user: User, workdir: Path
) -> None:
    # A process gets a controlling terminal only by inheriting it (or as a session
    # leader): the payload's process is forked after PID 1 took it, so /dev/tty opens,
    # and job control (a shell's tcsetpgrp) works in the payload's session.
    payload = r"""
import os
fd = os.open("/dev/tty", os.O_RDWR)
print("CTTY", os.ttyname(0), os.tcgetpgrp(fd) == os.getpgrp(), os.getsid(0) == 1)
os.tcsetpgrp(fd, os.getpgrp())
print("TCSETPGRP ok")
"""
    r = run_on_pty(user, workdir, ["--net", "none"], ["python3", "-c", payload])
    assert r.returncode == 0, r.tty
    assert "CTTY /dev/pts/0 True True" in r.tty and "TCSETPGRP ok" in r.tty, r.tty


def test_no_host_terminal_fd_enters(user: User, workdir: Path) -> None:
    # All three fds on the test's terminal: the payload must see one PTY of boxy's.
    r = run_on_pty(user, workdir, ["--net", "none"], ["python3", "-c", FD_REPORT, HOST_RDEV])
    assert "ESCAPED" not in r.tty
    assert r.returncode == 0, r.tty
    rep = _report(r.tty)
    for fd in (0, 1, 2):
        assert _is_pty(rep[fd], r.slave_id), (fd, rep[fd], r.slave_id)
        # the sandbox's own devpts: ttyname() finds it (it names /dev/pts/N inside)
        assert rep[fd]["ttyname"] == rep[fd]["link"], rep[fd]
        assert rep[fd]["ttyname"].startswith("/dev/pts/"), rep[fd]
    assert rep[0]["id"] == rep[1]["id"] == rep[2]["id"], "one session PTY for all three"
    assert rep["fds"] == ["0", "1", "2", "3"], rep["fds"]  # 3: the listing itself
    assert "STDERR-LINE" in r.tty


def test_stdout_pipe_stdin_stderr_pty(user: User, workdir: Path) -> None:
    # `boxyctl run ... | less`: fd 1 passes through as the pipe, 0 and 2 are boxy's PTY.
    r = run_on_pty(
        user, workdir, ["--net", "none"], ["python3", "-c", FD_REPORT, HOST_RDEV], stdout="pipe"
    )
    assert "ESCAPED" not in r.stdout + r.tty
    assert r.returncode == 0, r.tty
    rep = _report(r.stdout)
    assert rep[1]["fifo"] and not rep[1]["isatty"], rep[1]
    assert _is_pty(rep[0], r.slave_id), rep[0]
    assert _is_pty(rep[2], r.slave_id), rep[2]
    assert "STDERR-LINE" in r.tty and "STDERR-LINE" not in r.stdout


def test_stderr_only_on_terminal(user: User, workdir: Path) -> None:
    r = run_on_pty(
        user,
        workdir,
        ["--net", "none"],
        ["python3", "-c", FD_REPORT, HOST_RDEV],
        stdin="pipe",
        stdout="pipe",
    )
    assert "ESCAPED" not in r.stdout + r.tty
    assert r.returncode == 0, r.tty
    rep = _report(r.stdout)
    assert rep[0]["fifo"] and not rep[0]["isatty"], rep[0]
    assert rep[1]["fifo"] and not rep[1]["isatty"], rep[1]
    assert _is_pty(rep[2], r.slave_id), rep[2]
    assert "STDERR-LINE" in r.tty


def test_typed_input_reaches_payload(user: User, workdir: Path) -> None:
    # READY first, so the line is typed while `head -1` is reading the session PTY;
    # GOT: tells the payload's copy apart from any terminal echo.
    r = run_on_pty(
        user,
        workdir,
        ["--net", "none"],
        ["sh", "-c", "echo READY; head -1 | sed 's/^/GOT:/'"],
        send=b"hello\n",
        send_after="READY",
        timeout=30,
    )
    assert r.returncode == 0, r.tty
    assert "GOT:hello" in r.tty.splitlines(), r.tty


def test_window_size_propagated(user: User, workdir: Path) -> None:
    r = run_on_pty(user, workdir, ["--net", "none"], ["stty", "size"], winsize=(33, 111))
    assert r.returncode == 0, r.tty
    assert "33 111" in r.tty.splitlines(), r.tty


@pytest.mark.parametrize(("script", "status"), [("echo x; exit 42", 42), ("kill -TERM $$", 143)])
def test_exit_status_through_pty(user: User, workdir: Path, script: str, status: int) -> None:
    r = run_on_pty(user, workdir, ["--net", "none"], ["sh", "-c", script])
    assert r.returncode == status, r.tty


def test_first_lines_never_race_raw_mode(user: User, workdir: Path) -> None:
    """The client is raw before the payload can write: output from its very first
    instant comes out as the sandbox's PTY wrote it (\\r\\n), never the host
    terminal's own translation on top (\\r\\r\\n; about one run in seven before)."""
    for _ in range(12):
        r = run_on_pty(user, workdir, ["--net", "none"], ["printf", "a\\nb\\n"])
        assert r.returncode == 0, r.tty
        # run_on_pty folds \r\n to \n: a doubled \r would be left over
        assert "a\nb\n" in r.tty and "\r" not in r.tty, repr(r.tty)


def test_ctrl_z_stops_the_client_and_fg_continues_the_payload(user: User, workdir: Path) -> None:
    """Job control is transparent, as with sudo or bwrap, under a real interactive bash:
    ^Z on a payload that is not a shell stops it inside, the client gives the terminal
    back and stops itself (bash prints its prompt, and what is typed then is bash's);
    `fg` continues the client, which goes raw again and continues the payload."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # what a terminal emulator does for its shell
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    shell = subprocess.Popen(
        user.cmd(["bash", "--norc", "--noprofile", "-i"], {"PS1": "PROMPT$ ", "TERM": "dumb"}),
        cwd=workdir,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=controlling_terminal,
    )
    seen = bytearray()

    pos = [0]  # where the next marker is looked for

    def until(marker: bytes, timeout: float = 30) -> None:
        """Read the terminal until MARKER appears after the previous one."""
        deadline = time.monotonic() + timeout
        while (found := seen.find(marker, pos[0])) < 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {marker!r} on the terminal: {bytes(seen)!r}")
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):
                    seen.extend(os.read(master, 4096))
        pos[0] = found + len(marker)

    try:
        until(b"PROMPT$ ")
        os.write(
            master,
            f"{BIN / 'boxyctl'} run --net none -- sh -c "
            "'echo READY; read line; echo GOT:$line'\r".encode(),
        )
        until(b"\nREADY")
        os.write(master, b"\x1a")  # ^Z
        until(b"Stopped")
        until(b"PROMPT$ ")
        os.write(master, b"echo SHELL-GOT-THIS\r")  # typed while stopped: the shell's
        until(b"\nSHELL-GOT-THIS")
        os.write(master, b"fg\r")
        time.sleep(1)
        os.write(master, b"hello\r")
        until(b"GOT:hello")
        until(b"PROMPT$ ")
        assert b"GOT:echo" not in seen, f"the payload read the shell's input: {bytes(seen)!r}"
    finally:
        shell.kill()
        shell.wait()
        os.close(master)
        os.close(slave)


# What a payload prints to make the user's terminal act (docs/design.md, "Threat model"): set
# the clipboard, and queries whose answers the terminal would type into the user's
# shell once the payload has gone: the cursor position, the title (after setting it),
# a setting (DECRQSS). And what it may print: a colour, a title.
HOSTILE = {
    "OSC 52 (clipboard)": b"\x1b]52;c;ZWNobyBwd25lZAo=\x07",
    "CSI 6 n (cursor report)": b"\x1b[6n",
    "CSI 21 t (title report)": b"\x1b[21t",
    "DECRQSS": b"\x1bP$qm\x1b\\",
}
HARMLESS = b"\x1b[31mRED\x1b[0m\x1b]2;boxy-title\x07"
# prints the sequences between BEGIN and END; reads a line first when argv[1] is "wait"
PRINT_SEQUENCES = r"""
import sys
if sys.argv[1] == "wait":
    print("READY", flush=True)
    sys.stdin.readline()
out = sys.stdout.buffer
out.write(b"BEGIN" + b"".join(bytes.fromhex(h) for h in sys.argv[2:]) + b"END\n")
out.flush()
if sys.argv[1] == "wait":
    sys.stdin.readline()
"""


def print_sequences_cmd(wait: bool = False) -> list[str]:
    return [
        "python3",
        "-c",
        PRINT_SEQUENCES,
        "wait" if wait else "now",
        *(s.hex() for s in HOSTILE.values()),
        HARMLESS.hex(),
    ]


def reached(seen: bytes) -> list[str]:
    """The hostile sequences that reached the terminal."""
    return [f"ESCAPED: {name} reached the terminal" for name, seq in HOSTILE.items() if seq in seen]


def test_clipboard_and_queries_never_reach_the_terminal(user: User, workdir: Path) -> None:
    r = run_on_pty(user, workdir, ["--net", "none"], print_sequences_cmd())
    assert r.returncode == 0, r.tty
    seen = r.tty.encode()
    assert reached(seen) == []
    assert b"BEGIN" + HARMLESS + b"END" in seen  # what draws passes, exactly


def test_tty_raw_passes_them_and_says_so(user: User, workdir: Path) -> None:
    """The control: the same output with --tty-raw reaches the terminal whole."""
    r = run_on_pty(user, workdir, ["--net", "none", "--tty-raw", "-v"], print_sequences_cmd())
    assert r.returncode == 0, r.tty
    assert b"BEGIN" + b"".join(HOSTILE.values()) + HARMLESS + b"END" in r.tty.encode()
    assert "--tty-raw: the payload's output reaches the terminal unfiltered" in r.tty
