"""Both ends of the control socket with the typed messages: the outer stage 2's
reading of boxyd's requests, boxyd's reading of PID 1's reports, and boxyd's reader
(Stage2), which drops a frame that breaks the protocol and closes what it carried,
and holds PID 1 once the outer stage 2 has handed it over."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import socket

import pytest

from boxyd.daemon.initreports import MAX_PENDING, InitReports, ending, parse_status
from boxyd.daemon.sandbox import _exit
from boxyd.daemon.seam import Exit
from boxyd.daemon.stage2proc import Gateway, PtyMaster, Stage2
from boxyd.stage2 import __main__ as outer
from boxyd.stage2 import protocol as p


def test_the_end_prefers_a_failed_layer_then_a_failed_exec_then_the_last_exit() -> None:
    assert ending([p.Exited(1), p.Exited(0)], False) == p.Exited(0)
    assert ending([p.ExecFailed(2, "x"), p.Exited(127)], False) == p.ExecFailed(2, "x")
    assert ending([p.SetupFailed("e"), p.Killed(9)], True) == p.SetupFailed("e")
    assert ending([p.Killed(15)], True) == p.Killed(15)  # PID 1 said it: believed


def test_pid1_dead_without_a_word_is_a_kill_only_when_boxyd_sent_one() -> None:
    assert ending([], True) == p.Killed(signal.SIGKILL)
    end = ending([], False)
    assert isinstance(end, p.SetupFailed) and "without a report" in end.error


@pytest.mark.parametrize(
    "line",
    [
        b'{"exit": 0}',  # the old, key-sniffed form
        b'{"kind": "exited", "code": true}',
        b'{"kind": "exited", "code": 0, "also": 1}',
        b'{"kind": "pid", "pid": 1}',  # a report PID 1 may not make
        b'{"kind": "stopped", "signal": 99}',
        b"\xff",
        b"",
    ],
)
def test_a_bad_line_from_pid1_is_not_believed(line: bytes) -> None:
    assert parse_status(line) is None
    reports = InitReports()
    assert reports.feed(line + b"\n") == [] and reports.ends == []


def test_reports_are_lines_however_they_are_cut() -> None:
    reports = InitReports()
    lines = [p.Confined(()), p.Stopped(20), p.Exited(0)]
    data = b"".join(p.encode(s) + b"\n" for s in lines)
    got = [s for i in range(len(data)) for s in reports.feed(data[i : i + 1])]
    assert got == lines and reports.ends == [p.Exited(0)]
    assert reports.feed(b'{"kind": "exi') == []  # an incomplete line waits for its end
    assert reports.feed(b'ted", "code": 3}\n') == [p.Exited(3)]


def test_a_line_past_the_bound_is_dropped_whole() -> None:
    reports = InitReports()
    assert reports.feed(b"x" * (MAX_PENDING + 1)) == []
    assert reports.feed(p.encode(p.Exited(4)) + b"\n") == [p.Exited(4)]


def test_requests_from_boxyd() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    p.send(theirs, p.Signal(15))
    assert outer.request(ours) == p.Signal(15)
    theirs.send(b'{"signal": 15}')  # key-sniffed: refused, said as the error
    assert isinstance(outer.request(ours), p.ProtocolError)
    r, w = os.pipe()
    socket.send_fds(theirs, [p.encode(p.Signal(1))], [r])  # fds with a request: refused
    got = outer.request(ours)
    assert isinstance(got, p.ProtocolError) and "carries 0 fds, not 1" in str(got)
    os.close(r)
    os.close(w)
    theirs.close()
    assert outer.request(ours) is None
    ours.close()


def _ns_fds() -> list[int]:
    return [os.open(f"/proc/self/ns/{ns}", os.O_RDONLY) for ns in ("user", "mnt", "net")]


async def test_boxyd_holds_pid1_once_handed_over() -> None:
    """Started hands PID 1 over: boxyd releases the outer stage 2, relays PID 1's stops
    at once, signals it by its pidfd, and ends the run when its pidfd says it is gone,
    with the end PID 1 reported; reading its closed pipe does not spin meanwhile."""
    before = _open_fds()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # "PID 1": a stop, waits for SIGUSR1, its end, its pipe closed, a slow exit
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGALRM])
        os.write(status_w, p.encode(p.Stopped(20)) + b"\n")
        signal.sigtimedwait([signal.SIGUSR1], 5)
        os.write(status_w, p.encode(p.Exited(7)) + b"\n")
        os.close(status_w)
        signal.sigtimedwait([signal.SIGALRM], 0.3)
        os._exit(0)
    os.close(status_w)
    os.close(alive_r)
    stage2 = Stage2(ours)
    reads = 0
    read = os.read

    def counted(fd: int, n: int) -> bytes:
        nonlocal reads
        if fd == status_r:
            reads += 1
        return read(fd, n)

    fds = [os.pidfd_open(pid), status_r, alive_w, *_ns_fds()]
    socket.send_fds(theirs, [p.encode(p.Started(pid), len(fds))], fds)
    for fd in fds:
        os.close(fd)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "read", counted)
        assert await asyncio.wait_for(stage2.next(), 2) == p.Started(pid)
        assert p.decode_request(theirs.recv(p.MAX_FRAME)) == p.Release()
        assert await asyncio.wait_for(stage2.next(), 2) == p.Stopped(20)
        stage2.signal(signal.SIGUSR1)
        assert await asyncio.wait_for(stage2.next(), 2) == p.Done(p.Exited(7))
        assert await stage2.next() is None
    assert reads <= 4  # the reports, EOF, the drain at the end: never a spin
    os.waitpid(pid, 0)
    # the numbers of PID 1's fds are free now, and are soon other fds of boxyd's (a
    # gateway's sockets): nothing is closed or signalled by number again
    reused = [os.open(os.devnull, os.O_RDONLY) for _ in range(10)]
    stage2.signal(signal.SIGTERM)
    stage2.send(p.OpenSocket(1, socket.AF_INET))  # no joiner of stale namespaces
    stage2.close()
    for fd in reused:
        os.fstat(fd)
        os.close(fd)
    theirs.close()
    assert _open_fds() <= before  # every fd handed over was closed


async def test_a_started_whose_fds_are_not_pid1s_is_dropped() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    stage2 = Stage2(ours)
    r, w = os.pipe()
    fds = [r, r, w, *_ns_fds()]  # a pipe where the pidfd goes
    socket.send_fds(theirs, [p.encode(p.Started(5), len(fds))], fds)
    for fd in {*fds}:
        os.close(fd)
    theirs.close()
    assert await asyncio.wait_for(stage2.next(), 2) is None
    stage2.close()


async def _reports(frames: list[tuple[bytes, list[int]]]) -> list[object]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    stage2 = Stage2(ours)
    for data, fds in frames:
        if fds:
            socket.send_fds(theirs, [data], fds)
        else:
            theirs.send(data)
    theirs.close()
    got: list[object] = []
    while (msg := await asyncio.wait_for(stage2.next(), 2)) is not None:
        got.append(msg)
    assert await stage2.next() is None  # and for every later call
    stage2.close()
    return got


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


async def test_boxyd_reads_typed_reports_and_drops_bad_frames() -> None:
    before = _open_fds()
    r, w = os.pipe()
    a, b = socket.socketpair()
    master, slave = pty.openpty()
    frames = [
        (p.encode(p.Pid(5, 6)), []),
        (b'{"pid": 5}', []),  # the old form
        (p.encode(p.Listeners(("tcp4", "dns")), 2), [r, w]),  # pipes, not sockets: dropped
        (p.encode(p.Listeners(("tcp4", "dns")), 2), [a.fileno(), b.fileno()]),
        (p.encode(p.Listeners(("tcp4",)), 1), [r, w]),  # one name, two fds: dropped
        (p.encode(p.Pty(), 1), [r]),  # a pipe, not a terminal: dropped
        (p.encode(p.Pty(), 1), [master]),
        (p.encode(p.Done(p.Exited(0))), []),
    ]
    got = await _reports(frames)
    for fd in (r, w, master, slave):
        os.close(fd)
    a.close()
    b.close()
    assert got[0] == p.Pid(5, 6)
    gateway = got[1]
    assert isinstance(gateway, Gateway) and list(gateway.sockets) == ["tcp4", "dns"]
    for sock in gateway.sockets.values():
        sock.close()
    terminal = got[2]
    assert isinstance(terminal, PtyMaster) and os.isatty(terminal.master)
    os.close(terminal.master)
    assert got[3:] == [p.Done(p.Exited(0))]
    assert _open_fds() <= before  # every fd received was closed or handed over


@pytest.mark.parametrize(
    ("end", "exit"),
    [
        (p.Exited(3), Exit(code=3)),
        (p.Killed(9, core=True), Exit(signal=9)),
        (p.ExecFailed(2, "x"), Exit(exec_errno=2, cmd="x")),
        (p.SetupFailed("no"), Exit(error="no")),
        (None, Exit()),
    ],
)
def test_the_end_as_the_seams_value(end: p.End | None, exit: Exit) -> None:
    assert _exit(end) == exit


@pytest.mark.parametrize("hostname", ["box", "h" * 5000])  # a first line past HEAD_READ too
def test_the_outer_stage_2_reads_its_line_and_leaves_pid1s_part_in_the_memfd(
    hostname: str,
) -> None:
    from boxy import wirejson
    from boxyd.plan.ops import Outer

    line = Outer(7, 8, hostname, "none", None, pcap=False, pty=False)
    rest = b'{"PID 1\'s line": 1}\n{"the plan": [2]}'
    fd = os.memfd_create("plan")
    os.write(fd, wirejson.dumps(line.__dict__).encode() + b"\n" + rest)
    got, left, stdio = outer.read_plan([fd])
    try:
        assert got == line and stdio == []
        assert os.pread(left.fd, len(rest) + 1, left.offset) == rest
    finally:
        left.close()
