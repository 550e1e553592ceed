"""PtyRelay with a real PTY pair standing in for the client's terminal.

The test plays the terminal emulator on the pair's master (ctl_master); the
relay gets dups of the pair's slave (ctl_slave), as boxyd gets the client's fds.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxy import termsettings
from boxyctl.tty import on_winch, raw_mode, window_size
from boxyd.daemon import pty as pty_mod
from boxyd.daemon.pty import ASK_GRACE, QUESTION_RESET, RING, PtyRelay

MiB = 1 << 20


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    ctl_master, ctl_slave = os.openpty()
    fcntl.ioctl(ctl_slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    attrs = termios.tcgetattr(ctl_slave)
    attrs[6][termios.VERASE] = b"\x08"  # something the relay must copy
    termios.tcsetattr(ctl_slave, termios.TCSANOW, attrs)
    yield ctl_master, ctl_slave
    os.close(ctl_master)
    os.close(ctl_slave)


def nonblocking(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)


def read_exactly(fd: int, n: int, timeout: float = 10) -> bytes:
    out = bytearray()
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        out += os.read(fd, n - len(out))
    return bytes(out)


def start(target: object, *args: object) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
    t.start()
    return t


def attach_pair(relay: PtyRelay) -> int:
    """What PID 1 does in the sandbox's devpts: a pair with the client's settings,
    the master handed to the relay; returns the slave (the payload's side)."""
    master, slave = os.openpty()
    termsettings.apply(slave, relay.settings)
    relay.attach(master)
    return slave


async def test_typed_bytes_reach_the_payload_and_its_echo_comes_back(
    terminal: tuple[int, int],
) -> None:
    ctl_master, ctl_slave = terminal
    fd = os.dup(ctl_slave)
    relay = PtyRelay(fd, fd)  # stdin and stdout the same terminal fd
    slave = attach_pair(relay)
    try:
        tty.setraw(ctl_slave)  # as boxyctl does once the run started
        os.write(ctl_master, b"hello\n")
        got = await asyncio.to_thread(read_exactly, slave, 6)
        assert got == b"hello\n"
        # The PTY kept the client's cooked settings: it echoes, with ONLCR.
        assert await asyncio.to_thread(read_exactly, ctl_master, 7) == b"hello\r\n"
    finally:
        relay.close()
    assert not nonblocking(ctl_slave)


async def test_termios_and_window_size_copied_and_resize_applies(
    terminal: tuple[int, int],
) -> None:
    _, ctl_slave = terminal
    relay = PtyRelay(os.dup(ctl_slave), os.dup(ctl_slave))
    slave = attach_pair(relay)
    try:
        assert termios.tcgetattr(slave)[6][termios.VERASE] == b"\x08"
        assert window_size(slave) == (30, 120)
        relay.resize(40, 100)
        assert window_size(slave) == (40, 100)
        with pytest.raises(ValueError):
            relay.resize(-1, 70000)
    finally:
        relay.close()


async def test_one_mib_of_output_arrives_in_order_and_drain_follows_the_slave(
    terminal: tuple[int, int],
) -> None:
    ctl_master, ctl_slave = terminal
    tty.setraw(ctl_slave)
    relay = PtyRelay(os.dup(ctl_slave), os.dup(ctl_slave))
    relay.raw = True  # random bytes: the transport, not the terminal filter
    slave = attach_pair(relay)
    try:
        tty.setraw(slave)  # the payload's choice: bytes untouched
        payload = os.dup(slave)
        os.close(slave)
        data = os.urandom(MiB)

        def write_and_exit() -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(payload, view[:8192]) :]
            os.close(payload)

        start(write_and_exit)
        got = await asyncio.to_thread(read_exactly, ctl_master, MiB, 20)
        await asyncio.wait_for(relay.wait_drained(), 5)
        assert len(got) == MiB
        assert got == data
    finally:
        relay.close()
    assert not nonblocking(ctl_slave)


async def test_drain_waits_for_every_slave_holder(terminal: tuple[int, int]) -> None:
    _, ctl_slave = terminal
    relay = PtyRelay(None, os.dup(ctl_slave))
    slave = attach_pair(relay)
    try:
        payload = os.dup(slave)
        os.close(slave)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(relay.wait_drained(), 0.3)
        os.close(payload)
        await asyncio.wait_for(relay.wait_drained(), 5)
        assert relay.drained
    finally:
        relay.close()


def _writing_to(tid: int) -> int | None:
    """The fd thread TID of this process sits in write(2) on, if it does."""
    try:
        fields = Path(f"/proc/self/task/{tid}/syscall").read_text().split()
    except OSError:  # gone
        return None
    return int(fields[1], 16) if fields[0] == "1" else None


def _blocked_on(terminal: int, but: int | None = None) -> bool:
    """Does a thread of ours (not BUT) sit in write(2) to the client's TERMINAL: the
    relay's output thread, the terminal stopped?"""
    tty_path = os.readlink(f"/proc/self/fd/{terminal}")
    for tid in map(int, os.listdir("/proc/self/task")):
        fd = _writing_to(tid)
        if tid != but and fd is not None:
            with contextlib.suppress(OSError):  # (closed meanwhile)
                if os.readlink(f"/proc/self/fd/{fd}") == tty_path:
                    return True
    return False


def _stalled(writer: int, payload: int, terminal: int) -> bool:
    """WRITER blocks writing to PAYLOAD, and the relay blocks writing to the client's
    TERMINAL: the stopped state, whole."""
    return _writing_to(writer) == payload and _blocked_on(terminal, but=writer)


async def test_stopped_terminal_back_pressures_the_payload_not_the_loop(
    terminal: tuple[int, int],
) -> None:
    """Nobody reads the client terminal (Ctrl-S): the payload blocks, the relay
    buffers one chunk at most, the event loop stays free, and nothing is lost."""
    ctl_master, ctl_slave = terminal
    tty.setraw(ctl_slave)
    fds_before = len(os.listdir("/proc/self/fd"))
    relay = PtyRelay(os.dup(ctl_slave), os.dup(ctl_slave))
    relay.raw = True  # random bytes: the transport, not the terminal filter
    slave = attach_pair(relay)
    tty.setraw(slave)
    payload = os.dup(slave)
    os.close(slave)
    data = os.urandom(4 * MiB)
    progress = [0]

    def write_and_exit() -> None:
        view = memoryview(data)
        while view:
            n = os.write(payload, view[:4096])
            progress[0] += n
            view = view[n:]
        os.close(payload)

    writer = start(write_and_exit)
    assert writer.native_id is not None
    deadline = time.monotonic() + 30
    # The loop keeps turning while both ends are stuck in write(2) (a timeout, not a
    # bound: a writer that never blocks fails here).
    while not _stalled(writer.native_id, payload, ctl_slave):
        assert time.monotonic() < deadline and writer.is_alive(), "the payload never blocked"
        await asyncio.sleep(0.01)
    relay.resize(10, 20)  # and the relay still answers
    assert writer.is_alive()
    assert progress[0] < MiB, f"{progress[0]} bytes accepted while the terminal is stopped"
    got = await asyncio.to_thread(read_exactly, ctl_master, 4 * MiB, 30)
    await asyncio.wait_for(relay.wait_drained(), 5)
    assert got == data
    relay.close()
    writer.join(5)
    assert not nonblocking(ctl_slave)
    deadline = time.monotonic() + 5  # the threads close their own fds as they exit
    while len(os.listdir("/proc/self/fd")) != fds_before and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(os.listdir("/proc/self/fd")) == fds_before


async def test_close_does_not_wait_for_a_stopped_terminal(terminal: tuple[int, int]) -> None:
    ctl_master, ctl_slave = terminal
    tty.setraw(ctl_slave)
    relay = PtyRelay(os.dup(ctl_slave), os.dup(ctl_slave))
    slave = attach_pair(relay)
    tty.setraw(slave)
    payload = os.dup(slave)
    os.set_blocking(payload, False)
    deadline = time.monotonic() + 30
    while not _blocked_on(ctl_slave):  # fill everything up to the payload
        assert time.monotonic() < deadline, "the relay never blocked on the terminal"
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(payload, b"x" * 4096)
        await asyncio.sleep(0.01)  # (a poll: the relay's thread moves what it can)
    relay.close()
    # Released while the terminal still sits on output nobody read: close did not
    # wait for it (30 s: the timeout that turns such a wait into a failure).
    await asyncio.wait_for(relay.wait_drained(), 30)
    assert select.select([ctl_master], [], [], 0)[0], "the terminal was read meanwhile"
    os.close(payload)
    assert not nonblocking(ctl_slave)


# What the payload prints that would make the terminal act: OSC 52 (clipboard), a
# cursor report, a title report, DECRQSS; and what is harmless: a colour, a title.
HOSTILE = b"\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[6n\x1b[21t\x1bP$qm\x1b\\"
HARMLESS = b"\x1b[31mred\x1b]2;boxy title\x07\x1b[0m"


async def _relay_output(terminal: tuple[int, int], raw: bool, data: bytes) -> bytes:
    """DATA written by the payload; what reached the client's terminal."""
    ctl_master, ctl_slave = terminal
    tty.setraw(ctl_slave)
    relay = PtyRelay(None, os.dup(ctl_slave))
    relay.raw = raw
    slave = attach_pair(relay)
    try:
        tty.setraw(slave)
        os.write(slave, data + b"END")
        os.close(slave)
        await asyncio.wait_for(relay.wait_drained(), 5)
        return await asyncio.to_thread(read_until, ctl_master, b"END")
    finally:
        relay.close()


def read_until(fd: int, end: bytes, timeout: float = 10) -> bytes:
    out = bytearray()
    deadline = time.monotonic() + timeout
    while not out.endswith(end):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        out += os.read(fd, 65536)
    return bytes(out)


async def test_output_to_the_client_is_filtered(terminal: tuple[int, int]) -> None:
    got = await _relay_output(terminal, False, b"a" + HOSTILE + HARMLESS + b"\x05z")
    assert got == b"a" + HARMLESS + b"zEND"


async def test_tty_raw_passes_everything(terminal: tuple[int, int]) -> None:
    got = await _relay_output(terminal, True, b"a" + HOSTILE + HARMLESS + b"\x05z")
    assert got == b"a" + HOSTILE + HARMLESS + b"\x05zEND"


def _logged_relay(tmp_path: Path) -> tuple[PtyRelay, Path, int]:
    """A detached session's relay, its output log in TMP_PATH; the payload's side raw."""
    relay = PtyRelay(None, None, settings=termsettings.defaults())
    log = tmp_path / "output.log"
    relay.log_to(os.open(log, os.O_WRONLY | os.O_CREAT, 0o600))
    slave = attach_pair(relay)
    tty.setraw(slave)
    return relay, log, slave


async def test_replay_and_log_are_filtered(terminal: tuple[int, int], tmp_path: Path) -> None:
    """A detached session's output: the log and the replay to the next client hold no
    hostile sequence, and a ring cut inside a character (before its 0x9b byte, CSI
    to a terminal outside UTF-8) does not make one."""
    ctl_master, ctl_slave = terminal
    tty.setraw(ctl_slave)
    relay, log, slave = _logged_relay(tmp_path)
    try:
        tail = b"\x9b6n" + b"b" * (RING - 3)  # the last RING bytes the ring keeps
        os.write(slave, HOSTILE + HARMLESS)
        await asyncio.to_thread(os.write, slave, b"\xe2\x80" + tail)
        deadline = time.monotonic() + 10
        while bytes(relay._ring) != tail and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert bytes(relay._ring) == tail
        relay.connect(None, os.dup(ctl_slave))
        assert await asyncio.to_thread(read_exactly, ctl_master, RING - 1) == tail[1:]
        os.close(slave)
        await asyncio.wait_for(relay.wait_drained(), 5)
    finally:
        relay.close()
    assert log.read_bytes() == HARMLESS + b"\xe2\x80" + tail


async def test_a_full_output_log_is_cut_and_says_so(
    terminal: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pty_mod, "MAX_LOG", 10)
    relay, log, slave = _logged_relay(tmp_path)
    try:
        os.write(slave, b"0123456789abcdef")
        os.close(slave)
        await asyncio.wait_for(relay.wait_drained(), 5)
    finally:
        relay.close()
    assert log.read_bytes() == b"0123456789" and relay.log_cut


def test_refuses_fds_that_are_not_terminals() -> None:
    r, w = os.pipe()
    with pytest.raises(ValueError):
        PtyRelay(r, w)
    with pytest.raises(OSError):  # the relay owned them and closed them
        os.fstat(w)
    with pytest.raises(OSError):
        os.fstat(r)
    with pytest.raises(ValueError):
        PtyRelay(None, None)


# --- boxyctl.tty: the client's own terminal ----------------------------------------


def test_raw_mode_restores_the_terminal(terminal: tuple[int, int]) -> None:
    _, ctl_slave = terminal
    before = termios.tcgetattr(ctl_slave)
    with raw_mode(ctl_slave):
        lflag = termios.tcgetattr(ctl_slave)[3]
        assert not lflag & (termios.ICANON | termios.ECHO | termios.ISIG)
    assert termios.tcgetattr(ctl_slave) == before


# Stays in raw mode until the test says so (a line on stdin), not for a time of its
# own: a fixed 2 s let a busy machine see the terminal restored before it looked.
RAW_CHILD = """
import os, signal, sys
from boxyctl.tty import raw_mode
fd = int(sys.argv[1])
if sys.argv[2] == "forward":
    signal.signal(signal.SIGTERM, lambda *_: print("forwarded", flush=True))
with raw_mode(fd):
    print("raw", flush=True)
    sys.stdin.readline()
"""


@pytest.mark.parametrize("mode", ["default", "forward"])
def test_sigterm_in_raw_mode(terminal: tuple[int, int], mode: str) -> None:
    """SIGTERM with the default action restores the terminal, then kills the client
    by that signal; a handler the client installed first gets the signal instead."""
    _, ctl_slave = terminal
    before = termios.tcgetattr(ctl_slave)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", RAW_CHILD, str(ctl_slave), mode],
        pass_fds=[ctl_slave],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == b"raw\n"
        assert not termios.tcgetattr(ctl_slave)[3] & termios.ICANON
        proc.send_signal(signal.SIGTERM)
        if mode == "default":
            assert proc.wait(30) == -signal.SIGTERM
        else:
            assert proc.stdout.readline() == b"forwarded\n"
            assert not termios.tcgetattr(ctl_slave)[3] & termios.ICANON  # still raw
            proc.stdin.close()  # now leave raw mode
            assert proc.wait(30) == 0
        assert termios.tcgetattr(ctl_slave) == before
    finally:
        proc.kill()
        proc.wait()


def test_on_winch_reports_the_new_size(terminal: tuple[int, int]) -> None:
    _, ctl_slave = terminal
    seen: list[tuple[int, int]] = []
    undo = on_winch(lambda rows, cols: seen.append((rows, cols)), ctl_slave)
    try:
        fcntl.ioctl(ctl_slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
        signal.raise_signal(signal.SIGWINCH)
        assert seen == [(50, 160)]
    finally:
        undo()
    assert signal.getsignal(signal.SIGWINCH) == signal.SIG_DFL
    r, w = os.pipe()
    assert window_size(r) is None
    os.close(r)
    os.close(w)


async def test_resize_before_the_master_arrives_is_applied_on_attach(
    terminal: tuple[int, int],
) -> None:
    _, ctl_slave = terminal
    relay = PtyRelay(os.dup(ctl_slave), os.dup(ctl_slave))
    try:
        assert not relay.attached
        relay.resize(50, 90)  # the client's SIGWINCH while PID 1 still builds the root
        slave = attach_pair(relay)
        assert window_size(slave) == (50, 90)
        os.close(slave)
    finally:
        relay.close()


def test_never_attached_relay_closes_the_client_fds(terminal: tuple[int, int]) -> None:
    _, ctl_slave = terminal
    fd = os.dup(ctl_slave)
    relay = PtyRelay(fd, None)
    relay.close()
    assert relay.drained
    with pytest.raises(OSError):
        os.fstat(fd)


async def test_a_question_on_the_terminal_takes_the_next_key_and_the_payload_never_sees_it(
    terminal: tuple[int, int],
) -> None:
    """--ask's prompt (issue 34 §2): said on the client's terminal, answered by the
    first of its keys typed; what is typed meanwhile is the question's, never the
    payload's; afterwards typing reaches the payload again."""
    ctl_master, ctl_slave = terminal
    fd = os.dup(ctl_slave)
    relay = PtyRelay(fd, fd)
    slave = attach_pair(relay)
    relay.connect(os.dup(ctl_slave), os.dup(ctl_slave), replay=False)
    try:
        tty.setraw(ctl_slave)
        assert relay.can_ask()
        answer = relay.ask(
            "boxy: reach api.example? [s]ession [d]eny ", {"s": "session", "d": "deny"}
        )
        with pytest.raises(ValueError):
            relay.ask("a second one", {"s": "session"})
        said = await asyncio.to_thread(read_until, ctl_master, b"[d]eny ")
        assert said.endswith(QUESTION_RESET + b"boxy: reach api.example? [s]ession [d]eny "), said
        await asyncio.sleep(ASK_GRACE + 0.2)  # (keys typed sooner are no answer)
        os.write(ctl_master, b"xS")  # x is no answer; S is, as s
        assert await asyncio.wait_for(answer, 10) == "session"
        assert (await asyncio.to_thread(read_until, ctl_master, b"s\r\n")).endswith(b"s\r\n")
        os.write(ctl_master, b"ok\n")
        assert await asyncio.to_thread(read_exactly, slave, 3) == b"ok\n"  # not "xS"
        relay.end_question("")  # what came of it said (nothing here): the next may come
        unanswered = relay.ask("again? [d]eny ", {"d": "deny"})
        await asyncio.to_thread(read_until, ctl_master, b"[d]eny ")
        relay.end_question("(no answer: refused)")
        assert unanswered.cancelled()
        said = await asyncio.to_thread(read_until, ctl_master, b"refused)\r\n")
        # (the echo of "ok", held while the question was open, may follow in the same read)
        assert said.startswith(b"(no answer: refused)\r\n"), said
    finally:
        relay.close()
        os.close(slave)
