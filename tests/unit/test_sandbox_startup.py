"""StageSandbox's start-up against a scripted stage 2 (the other end of its control
socket): start() returns once the scope is placed, the network attached, PID 1
forked and the terminal handed over; events() then only yields what happened."""

from __future__ import annotations

import asyncio
import os
import pty
import signal
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from boxy import termsettings
from boxy.request import RunRequest
from boxyd.config.runspec import RunSpec
from boxyd.config.spec import build_spec
from boxyd.daemon.parseproc import Apart
from boxyd.daemon.pty import PtyRelay
from boxyd.daemon.sandbox import StageSandbox
from boxyd.daemon.scopes import Placement
from boxyd.daemon.seam import Exit, SandboxEvent, Started, Stopped
from boxyd.daemon.stage2proc import Stage2
from boxyd.plan.hostfile import Outputs
from boxyd.stage2 import protocol as p


class FakeScopes:
    def __init__(self) -> None:
        self.placed: list[tuple[int, ...]] = []

    async def place(self, sid: str, pids: Sequence[int], spec: RunSpec) -> Placement:
        self.placed.append(tuple(pids))
        return Placement(reason="a test")


class FakeLauncher:
    def __init__(self) -> None:
        self.scopes = FakeScopes()
        self._dns = object()
        self.live: set[StageSandbox] = set()


class FakeSink:
    id = "t1"

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def record(self, layer: str, **fields: object) -> None:
        self.records.append((layer, fields))

    def notice(self, text: str) -> None:
        pass

    def detach_requested(self) -> None:
        pass


class FakeNet:
    warnings: list[str] = []

    def __init__(self) -> None:
        self.attached: list[str] = []

    def attach(self, sockets: dict[str, socket.socket], dns: object) -> None:
        self.attached = list(sockets)
        for sock in sockets.values():
            sock.close()

    def discard(self) -> None:
        pass

    def started(self, userns: int) -> None:
        self.userns = userns  # (the real one names who asked with it: --ask)


@pytest.fixture
def spec(tmp_path: Path) -> RunSpec:
    wd = tmp_path / "home" / "w"
    wd.mkdir(parents=True)
    req = RunRequest.from_wire({"argv": ["true"], "cwd": str(wd), "options": {}})
    return build_spec(req, uid=os.getuid(), user="u", home=str(tmp_path / "home"))


def _no_parse() -> Apart:
    """A Parser whose child cannot be made (these tests walk nothing that needs one)."""

    def spawn() -> socket.socket:
        raise OSError("no parse child in this test")

    return Apart(spawn)


def _sandbox(spec: RunSpec, net: FakeNet | None) -> tuple[StageSandbox, FakeLauncher, FakeSink]:
    launcher, sink = FakeLauncher(), FakeSink()
    # the fakes stand in for the stage launcher and the network
    sb = StageSandbox(launcher, spec, [], Outputs(), net, sink, None, parser=_no_parse())  # type: ignore[arg-type]
    return sb, launcher, sink


async def _drain(sb: StageSandbox) -> list[SandboxEvent]:
    return [e async for e in sb.events()]


def _peer(sb: StageSandbox) -> socket.socket:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    sb.stage2 = Stage2(ours)
    return theirs


async def _script(peer: socket.socket, frames: list[tuple[p._Message, list[int]]]) -> None:
    """What stage 2 says, each after the previous one was read; Pid waits for Placed."""
    for msg, fds in frames:
        p.send(peer, msg, fds)
        if isinstance(msg, p.Pid):
            answer = await asyncio.get_running_loop().sock_recv(peer, p.MAX_FRAME)
            assert p.decode_request(answer) == p.Placed(in_scope=False)
    peer.close()


def _pid1(status_w: int, pty_sock: socket.socket, master: int) -> int:
    """A stand-in PID 1 (a child): Confined, the PTY's master on its socket, a stop,
    then its end; it exits once the test has read them all (SIGUSR1)."""
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        os.write(status_w, p.encode(p.Confined(("a note",))) + b"\n")
        p.send(pty_sock, p.Pty(), [master])
        os.write(status_w, p.encode(p.Stopped(20)) + b"\n")
        os.write(status_w, p.encode(p.Exited(3)) + b"\n")
        signal.sigtimedwait([signal.SIGUSR1], 5)
        os._exit(0)
    return pid


async def test_start_returns_placed_attached_and_started(spec: RunSpec) -> None:
    net = FakeNet()
    sb, launcher, sink = _sandbox(spec, net)
    sb.pty = PtyRelay(None, None, settings=termsettings.defaults())
    peer = _peer(sb)
    peer.setblocking(False)
    a, b = socket.socketpair()
    master, slave = pty.openpty()
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()
    pty_ours, pty_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = _pid1(status_w, pty_theirs, master)
    ns = [os.open(f"/proc/self/ns/{n}", os.O_RDONLY) for n in ("user", "mnt", "net")]
    handed = [os.pidfd_open(pid), status_r, alive_w, *ns, pty_ours.fileno()]
    script = asyncio.create_task(
        _script(
            peer,
            [
                (p.Pid(99, 100), []),
                (p.Listeners(("tcp4", "dns")), [a.fileno(), b.fileno()]),
                (p.Started(pid, pty=True), handed),
            ],
        )
    )
    warnings: list[str] = []
    await asyncio.wait_for(sb._come_up(warnings), 5)
    await script
    for fd in (status_w, alive_r, master, *handed):  # the sandbox has its own copies
        os.close(fd)
    a.close()
    b.close()
    pty_theirs.close()
    # placed, attached and the terminal handed over before start() returned
    assert launcher.scopes.placed == [(99, 100)] and net.attached == ["tcp4", "dns"]
    assert sb.pty.master_fd is not None and sb._events.get_nowait() == Started()
    os.close(slave)
    drained = asyncio.create_task(_drain(sb))
    await asyncio.sleep(0.1)
    os.kill(pid, signal.SIGUSR1)
    assert await asyncio.wait_for(drained, 5) == [Stopped(20), Exit(code=3)]
    os.waitpid(pid, 0)
    assert ("landlock", {"note": "a note"}) in sink.records
    sb.close()


async def test_an_early_end_is_the_only_event(spec: RunSpec) -> None:
    """Stage 2 fails in its namespaces: no Started, the Exit says why."""
    sb, launcher, _ = _sandbox(spec, FakeNet())
    peer = _peer(sb)
    peer.setblocking(False)
    script = asyncio.create_task(
        _script(peer, [(p.Pid(7, 8), []), (p.Done(p.SetupFailed("no user namespace")), [])])
    )
    await asyncio.wait_for(sb._come_up([]), 5)
    await script
    assert await asyncio.wait_for(_drain(sb), 5) == [Exit(error="no user namespace")]
    sb.close()


async def test_a_broken_frame_is_dropped_and_a_silent_end_is_an_empty_exit(
    spec: RunSpec,
) -> None:
    sb, _, _ = _sandbox(spec, None)
    peer = _peer(sb)
    peer.send(b'{"pid": 1}')  # the old key-sniffed form: dropped
    peer.close()
    await asyncio.wait_for(sb._come_up([]), 5)
    assert await asyncio.wait_for(_drain(sb), 5) == [Exit()]
    sb.close()


async def test_a_stop_before_stage_2_exists_reaches_it(spec: RunSpec) -> None:
    sb, _, _ = _sandbox(spec, None)
    sb.signal(9)  # start() is still walking the trees
    assert sb._kill_early
