"""Start stage 2 for one run and talk to it over its control socket.

Stage 2 is forked per run from one template process (``python -I -m
boxyd.stage2``): a freshly exec'd, single-threaded interpreter with an empty
environment that has already imported everything a run needs (see
boxyd/stage2/__main__.py). unshare(CLONE_NEWUSER) fails in a multithreaded process,
and forking the asyncio daemon itself is unsafe. The template is spawned from the
event-loop thread, so its PR_SET_PDEATHSIG (which follows the parent *thread*)
fires exactly when boxyd dies, and each run's fires when the template does.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass

from boxy import fdwait
from boxy.errors import SetupError
from boxyd.plan import ops
from boxyd.plan.ops import Plan
from boxyd.stage2 import protocol

log = logging.getLogger("boxyd")


class Template:
    """The pre-imported stage-2 process. Started at most once at a time; restarted on
    the next run if it died."""

    def __init__(
        self, module: str = "boxyd.stage2", kind: int = socket.SOCK_SEQPACKET, spare: bool = False
    ) -> None:
        self.module = module  # boxyd.stage2, or boxyd.daemon.walkproc (the walks before a run)
        self.kind = kind  # of each request's socket
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        # SPARE: a child forked ahead, waiting for its request, so that a run does not
        # wait for the fork (a fresh child of the template like any other: it learns
        # nothing of a session before its plan comes). One per kind of start: a spare
        # told to prepare (its network, ahead: docs/design.md, "A run, step by step")
        # is kept apart from a plain one, the first made at the first such start.
        self._keep_spare = spare
        self._spares: dict[bool, socket.socket | None] = {False: None}

    def start(self) -> None:
        """Must run on the event-loop thread (the death signal follows the thread)."""
        self.close()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-m", self.module, str(os.getpid()), str(child.fileno())],
                env={},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
                start_new_session=True,  # setsid(): the host terminal is never its controlling tty
            )
        except OSError as e:
            parent.close()
            raise SetupError(
                f"{self.module}: cannot start {sys.executable}: {e.strerror}"
            ) from None
        finally:
            child.close()
        self._ctl = parent

    def spawn(self, prepared: bool = False) -> socket.socket:
        """A control socket to a freshly forked child waiting for its request: the one
        forked ahead if it is still there, and another one ahead for the next call.
        PREPARED: a child told to prepare (protocol.Prepare) before its plan; one
        forked now for the call is not (it would do the same work, only later)."""
        ready, self._spares[prepared] = self._spares.get(prepared), None
        if ready is not None and not _waiting(ready):  # it died, or its preparing failed
            ready.close()
            ready = None
        if ready is None:
            ready = self._fork_one()
        self.prime(prepared)
        return ready

    def prime(self, prepared: bool = False) -> None:
        """Fork the spare child of that kind (with spare=True), if there is none."""
        if not self._keep_spare or self._spares.get(prepared) is not None:
            return
        try:
            self._spares[prepared] = self._fork_one(prepare=prepared)
        except SetupError as e:  # the next call forks its own
            log.warning("%s", e)

    def _fork_one(self, prepare: bool = False) -> socket.socket:
        """A control socket to a freshly forked child; PREPARE: sent Prepare at once."""
        for attempt in (1, 2):
            if self._ctl is None or self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:
                    log.warning(
                        "%s template exited (status %s); restarting it",
                        self.module,
                        self._proc.returncode,
                    )
                self.start()
            assert self._ctl is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, self.kind)
            try:
                socket.send_fds(self._ctl, [b"run"], [theirs.fileno()])
            except OSError as e:
                ours.close()
                if attempt == 2:
                    raise SetupError(
                        f"{self.module}: the template does not answer: {e.strerror}"
                    ) from None
                self.close()
                continue
            finally:
                theirs.close()
            if prepare:  # if it died at once, the spawn that takes it sees so
                with contextlib.suppress(OSError):
                    protocol.send(ours, protocol.Prepare())
            return ours
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Closing its socket ends the template — and, by their death signal, every
        sandbox it forked: only for a restart after it died, or when boxyd stops."""
        for kind, spare in self._spares.items():
            if spare is not None:
                spare.close()
            self._spares[kind] = None
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=2)
            if self._proc.returncode is None:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def _waiting(sock: socket.socket) -> bool:
    """The child at the other end still waits for its request (nothing to read: a child
    that died, with its template or by a signal, reads as end of file)."""
    try:
        return not fdwait.readable(sock, 0)
    except (OSError, ValueError):
        return False


def plan_memfd(data: bytes) -> int:
    """The plan in a sealed memfd: a datagram caps it at the socket's buffer (a tree of
    3,000 nested repositories or a 200 KB argv did not fit), a memfd at nothing a
    payload can reach. Sealed, so what stage 2 reads is what was written."""
    fd = os.memfd_create("boxy-plan", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(
            fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE,
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


class Stage2:
    """One outer stage 2 as boxyd sees it: typed reports in, typed requests out."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self._queue: asyncio.Queue[Received | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(ctl.fileno(), self._readable)
        self._closed = False

    @classmethod
    def start(cls, template: Template, plan: Plan, stdio: list[int]) -> Stage2:
        # a networked run takes a spare whose network is made already
        ctl = template.spawn(prepared=plan.net != "none")
        ctl.setblocking(False)
        stage2 = cls(ctl)
        try:
            plan_fd = plan_memfd(ops.to_wire(plan))
        except OSError as e:
            stage2.close()
            raise SetupError(f"stage 2: cannot hold the plan: {e.strerror}") from None
        try:
            protocol.send(ctl, protocol.PlanFds(), [plan_fd, *stdio])
        except OSError as e:
            stage2.close()
            raise SetupError(f"stage 2: cannot send the plan: {e.strerror}") from None
        finally:
            os.close(plan_fd)
        return stage2

    def _readable(self) -> None:
        """One report. Only Listeners (the gateway's sockets, in the order of its names)
        and Pty (the session PTY's master) carry fds; a frame that breaks the protocol
        is logged and dropped, its fds closed."""
        try:
            data, fds = protocol.receive(self.ctl)
        except BlockingIOError:
            return
        except protocol.ProtocolError as e:
            log.warning("stage 2: %s (dropped)", e)
            return
        except OSError:
            data, fds = b"", []
        if not data:
            protocol.close(fds)
            asyncio.get_running_loop().remove_reader(self.ctl.fileno())
            self._queue.put_nowait(None)
            return
        try:
            self._queue.put_nowait(_received(protocol.decode_report(data, len(fds)), fds))
        except protocol.ProtocolError as e:
            protocol.close(fds)
            log.warning("stage 2: %s (dropped)", e)

    async def next(self) -> Received | None:
        """The next report (with what it carried); None once stage 2 is gone."""
        msg = await self._queue.get()
        if msg is None:
            self._queue.put_nowait(None)  # and for every later call
        return msg

    def signal(self, sig: int) -> None:
        self.send(protocol.Signal(sig))

    def send(self, msg: protocol.Request) -> None:
        """One message to the outer stage 2 (a signal, the scope's placement, a live
        request); one that cannot be sent is logged (stage 2's end is heard on its own)."""
        if self._closed:
            return
        try:
            protocol.send(self.ctl, msg)
        except protocol.ProtocolError as e:
            log.warning("stage 2: not sent: %s", e)
        except OSError:
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self.ctl.fileno())
            self.ctl.close()


@dataclass(frozen=True)
class Gateway:
    """Listeners, received: the gateway's sockets by name (ours to close)."""

    sockets: dict[str, socket.socket]


@dataclass(frozen=True)
class PtyMaster:
    """Pty, received: the session PTY's master (ours to close)."""

    master: int


@dataclass(frozen=True)
class NewSocket:
    """SocketMade, received: the socket asked for (ours to close), or why there is none."""

    id: int
    sock: socket.socket | None
    error: str | None


Received = (
    protocol.Pid
    | Gateway
    | protocol.Started
    | PtyMaster
    | NewSocket
    | protocol.LiveDone
    | protocol.Confined
    | protocol.Stopped
    | protocol.Done
)


def _received(msg: protocol.Report, fds: list[int]) -> Received:
    """MSG with its fds made into what they are; a listener that is no socket, or a Pty
    whose fd is no terminal, is a protocol error too (the caller closes the fds)."""
    match msg:
        case protocol.Listeners(names=names):
            if not all(stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in fds):
                raise protocol.ProtocolError("listeners: an fd that is not a socket")
            return Gateway({n: socket.socket(fileno=fd) for n, fd in zip(names, fds, strict=True)})
        case protocol.Pty():
            if not os.isatty(fds[0]):
                raise protocol.ProtocolError("pty: its fd is not a terminal")
            return PtyMaster(fds[0])
        case protocol.SocketMade(id=ident, error=error):
            if fds and not stat.S_ISSOCK(os.fstat(fds[0]).st_mode):
                raise protocol.ProtocolError("socket-made: its fd is not a socket")
            return NewSocket(ident, socket.socket(fileno=fds[0]) if fds else None, error)
        case _:
            return msg
