"""Both ends of the control socket with the typed messages: the outer stage 2's
reading of PID 1's reports and of boxyd's requests, and boxyd's reader (Stage2),
which drops a frame that breaks the protocol and closes what it carried."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import socket

import pytest

from boxyd.daemon.sandbox import _exit
from boxyd.daemon.seam import Exit
from boxyd.daemon.stage2proc import Gateway, PtyMaster, Stage2
from boxyd.stage2 import __main__ as outer
from boxyd.stage2 import protocol as p


def test_the_end_prefers_a_failed_layer_then_a_failed_exec_then_the_last_exit() -> None:
    ok = 0  # a wait status of exit 0 (not used: PID 1 reported)
    assert outer.ending([p.Exited(1), p.Exited(0)], ok) == p.Exited(0)
    assert outer.ending([p.ExecFailed(2, "x"), p.Exited(127)], ok) == p.ExecFailed(2, "x")
    assert outer.ending([p.Confined(()), p.SetupFailed("e"), p.Killed(9)], ok) == p.SetupFailed("e")
    assert outer.ending([p.Stopped(20), p.Killed(15)], ok) == p.Killed(15)


def test_pid1_dead_without_a_word_is_said_from_its_wait_status() -> None:
    killed = signal.SIGKILL  # WIFSIGNALED: the low 7 bits
    assert outer.ending([p.Confined(())], killed) == p.Killed(signal.SIGKILL)
    assert outer.ending([], 3 << 8) == p.SetupFailed(
        "sandbox init exited with status 3 without a report"
    )


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
    assert outer.parse_status(line) is None


def test_stops_are_relayed_at_once_and_the_rest_kept_for_the_end() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    requests = outer.LiveRequests(ours)
    lines = [p.Confined(()), p.Stopped(20), p.Exited(0)]
    buf = b"".join(p.encode(s) + b"\n" for s in lines) + b'{"kind": "exi'
    rest = outer._relay_stops(ours, buf, requests)
    assert requests.rooted  # Confined: live requests may be carried out now
    assert p.decode_report(theirs.recv(p.MAX_FRAME)) == p.Stopped(20)
    kept = rest.split(b"\n")
    assert [outer.parse_status(x) for x in kept[:-1]] == [p.Confined(()), p.Exited(0)]
    assert kept[-1] == b'{"kind": "exi'  # an incomplete line waits for its end
    ours.close()
    theirs.close()


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


def test_the_supervisor_waits_for_pid1_without_spinning_on_its_closed_pipe() -> None:
    """PID 1 closes its status pipe as it exits, and is reaped only after its teardown:
    meanwhile the pipe at EOF must not be polled again (it spun thousands of times)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # "PID 1": a report, its end of the pipe closed, then a slow exit
        os.write(status_w, p.encode(p.Exited(7)) + b"\n")
        os.close(status_w)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        signal.sigtimedwait([signal.SIGALRM], 0.3)
        os._exit(0)
    os.close(status_w)
    supervisor = outer.Supervisor(ours, pid, status_r)
    reads = 0
    read = supervisor.from_pid1

    def counted() -> None:
        nonlocal reads
        reads += 1
        read()

    supervisor.from_pid1 = counted  # type: ignore[method-assign]
    supervisor.loop(None)
    supervisor.finish()
    assert reads <= 3  # the report, EOF (and a short read between), never a spin
    assert p.decode_report(theirs.recv(p.MAX_FRAME)) == p.Done(p.Exited(7))
    for s in (ours, theirs):
        s.close()
    os.close(status_r)


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
        (p.encode(p.Pid(5)), []),
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
    assert got[0] == p.Pid(5)
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
