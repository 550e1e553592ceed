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
import enum
import fcntl
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import typing
from dataclasses import dataclass

from boxy import fdwait
from boxy.errors import SetupError
from boxyd.daemon import initreports, joinproc
from boxyd.daemon.insiders import INSIDERS
from boxyd.daemon.joinproc import Joiner
from boxyd.plan import ops
from boxyd.plan.ops import Plan
from boxyd.stage2 import protocol

log = logging.getLogger("boxyd")
# Prepared spares that loaded a ruleset ahead, one per ruleset of the last networked
# runs (bench/startup.py alternates three kinds of run): each holds a user namespace,
# two network namespaces and its sockets while it waits.
RULED_SPARES = 3
# The next networked run's spare is forked when this one ends, or this long after it
# started if it still runs: its steps 1-3 and its ruleset (~8 ms of a core) then take
# nothing from this run's start-up (2 cores: they did, beside it).
PRIME_AFTER = 0.25


class Spare(enum.Enum):
    """What a child forked ahead made before its request (docs/design.md, "A run, step
    by step"): each kind is kept apart, the first made at the first start of its kind."""

    PLAIN = "plain"  # nothing: a joiner (it enters a sandbox's namespaces), a walk
    LOOPBACK = "loopback"  # step 1 and --net none's network (~0.7 ms of each such start)
    GATEWAY = "gateway"  # steps 1-3: the user namespace, the gateway's and the payload's netns


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
        # nothing of a session before its plan comes). One per kind (Spare).
        self._keep_spare = spare
        self._spares: dict[Spare, socket.socket | None] = {Spare.PLAIN: None}
        # and prepared spares that loaded the last networked runs' rulesets ahead, by
        # the text the daemon sent (oldest first): a run with that very ruleset takes it
        self._ruled: dict[str, socket.socket] = {}

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

    def spawn(
        self, kind: Spare = Spare.PLAIN, *, ruleset: str | None = None, prime: bool = True
    ) -> socket.socket:
        """A control socket to a freshly forked child waiting for its request: the
        spare of KIND if it is still there, and (PRIME) another one ahead for the next
        call. A spare not PLAIN was told to prepare (protocol.Prepare) before its plan;
        one forked now for the call is not (it would do the same work, only later); a
        GATEWAY spare that loaded RULESET ahead, if there is one, before any other."""
        ruled = self._take_ruled(ruleset) if kind is Spare.GATEWAY and ruleset else None
        if ruled is not None:
            return ruled
        ready, self._spares[kind] = self._spares.get(kind), None
        if ready is not None and not _waiting(ready):  # it died, or its preparing failed
            ready.close()
            ready = None
        if ready is None:
            ready = self._fork_one()
        if prime:
            self.prime(kind)
        return ready

    def _take_ruled(self, ruleset: str) -> socket.socket | None:
        """The spare that loaded RULESET ahead, still waiting; None if there is none."""
        ready = self._ruled.pop(ruleset, None)
        if ready is None:
            return None
        if _waiting(ready):
            return ready
        ready.close()  # it died, or its preparing failed (its ruleset refused)
        return None

    def prime(self, kind: Spare = Spare.PLAIN) -> None:
        """Fork the spare child of KIND (with spare=True), if there is none; none once
        the template is closed (boxyd stops: a run that ends then restarts none)."""
        if not self._keep_spare or self._ctl is None or self._spares.get(kind) is not None:
            return
        try:
            self._spares[kind] = self._fork_one(kind)
        except SetupError as e:  # the next call forks its own
            log.warning("%s", e)

    def prime_ruled(self, ruleset: str) -> None:
        """Fork the spare that loads RULESET ahead (with spare=True), if there is none,
        in place of the one whose ruleset was least recently run when RULED_SPARES
        wait already; a run with a ruleset no spare loaded takes the bare prepared one."""
        if not self._keep_spare or self._ctl is None:
            return
        if ruleset in self._ruled:
            self._ruled[ruleset] = self._ruled.pop(ruleset)  # the most recent now
            return
        while len(self._ruled) >= RULED_SPARES:
            self._ruled.pop(next(iter(self._ruled))).close()  # it exits, never used
        try:
            self._ruled[ruleset] = self._fork_one(Spare.GATEWAY, ruleset)
        except SetupError as e:  # the next such run takes the bare one
            log.warning("%s", e)

    def _fork_one(self, kind: Spare = Spare.PLAIN, ruleset: str | None = None) -> socket.socket:
        """A control socket to a freshly forked child; of a KIND not PLAIN: sent Prepare
        at once (a GATEWAY one with RULESET in a sealed memfd, if any)."""
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
            if kind is not Spare.PLAIN:  # if it died at once, the spawn that takes it sees so
                _prepare(ours, kind is Spare.GATEWAY, ruleset)
            return ours
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Closing its socket ends the template — and, by their death signal, every
        sandbox it forked: only for a restart after it died, or when boxyd stops."""
        for kind, spare in self._spares.items():
            if spare is not None:
                spare.close()
            self._spares[kind] = None
        for ruled in self._ruled.values():
            ruled.close()
        self._ruled.clear()
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


def _prepare(ctl: socket.socket, gateway: bool, ruleset: str | None) -> None:
    """Prepare, to a spare just forked (GATEWAY: the network of a networked run, or
    --net none's): a ruleset that cannot be sent is left for the plan (the spare loads
    the plan's); a spare that died is seen when it is taken."""
    fds: list[int] = []
    with contextlib.suppress(OSError):
        if gateway and ruleset is not None:
            fds.append(plan_memfd(ruleset.encode(), "boxy-ruleset"))
    try:
        with contextlib.suppress(OSError):
            protocol.send(ctl, protocol.Prepare(ruleset=bool(fds), gateway=gateway), fds)
    finally:
        protocol.close(fds)


def plan_memfd(data: bytes, name: str = "boxy-plan") -> int:
    """The plan in a sealed memfd: a datagram caps it at the socket's buffer (a tree of
    3,000 nested repositories or a 200 KB argv did not fit), a memfd at nothing a
    payload can reach. Sealed, so what stage 2 reads is what was written."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
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


Held = protocol.LiveCover | protocol.LivePin | protocol.OpenSocket


class Stage2:
    """One sandbox as boxyd sees it: typed reports in, typed requests out. Up to
    Started they travel over the outer stage 2's socket; Started hands PID 1 over
    (docs/design.md, "Processes") and the outer stage 2 exits. From then on boxyd
    holds PID 1 itself: its pidfd (signals, and its end), its status pipe (reports,
    boxyd/daemon/initreports.py), the socket its PTY's master comes on, the pipe
    whose hang-up ends it, and the namespaces a joiner enters for the live guard's
    and the published ports' requests (Joiner)."""

    def __init__(self, ctl: socket.socket, template: Template | None = None) -> None:
        self.ctl = ctl
        self._template = template
        self._queue: asyncio.Queue[Received | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(ctl.fileno(), self._readable)
        self._closed = False
        self._init: _Init | None = None
        self._reports = initreports.InitReports()
        self._held: list[Held] = []  # until handed over (and, for the guard's, rooted)
        self._rooted = False  # PID 1 confined in the sandbox's root: paths resolve there
        self._killed = False  # a SIGKILL sent: PID 1 dead without a word was ours
        self._joiner: Joiner | None = None
        # the next spare is yet to be forked (prime_next): a GATEWAY one (and one with
        # this ruleset) after a networked run, a LOOPBACK one after a run without network
        self._prime = False
        self._kind = Spare.PLAIN
        self._ruleset: str | None = None
        self._prime_timer: asyncio.TimerHandle | None = None
        self._starting = -1  # INSIDERS.pending's token, from step 0 until Started

    @classmethod
    def start(cls, template: Template, plan: Plan, stdio: list[int]) -> Stage2:
        # A run takes a spare whose network is made already (and its ruleset loaded, if
        # a spare loaded this one). The next spare is forked later (prime_next): it
        # forks its zygote at once, which took a core from this start.
        kind = Spare.LOOPBACK if plan.net == "none" else Spare.GATEWAY
        ctl = template.spawn(kind, ruleset=plan.net_ruleset, prime=False)
        ctl.setblocking(False)
        stage2 = cls(ctl, template)
        stage2._prime, stage2._kind, stage2._ruleset = True, kind, plan.net_ruleset
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
        """One report of the outer stage 2's. Only Listeners (the gateway's sockets, in
        the order of its names), Started (PID 1's handles) and, from PID 1, Pty carry
        fds; a frame that breaks the protocol is logged and dropped, its fds closed."""
        got = _receive(self.ctl)
        if got is None:
            return
        data, fds = got
        if not data:
            protocol.close(fds)
            self._loop.remove_reader(self.ctl.fileno())
            if self._init is None:  # the outer stage 2 ended the run itself (its Done)
                self._queue.put_nowait(None)
            return
        try:
            msg = protocol.decode_report(data, len(fds))
            if isinstance(msg, protocol.Started):
                self._take_over(msg, _Init.of(fds, msg.pty))
                self._not_starting()  # (registered by _Init: insiders.py)
                return
            if isinstance(msg, protocol.Pid) and self._starting < 0:
                self._starting_now(msg.pid)
            self._queue.put_nowait(_received(msg, fds))
        except protocol.ProtocolError as e:
            protocol.close(fds)
            log.warning("stage 2: %s (dropped)", e)

    def _take_over(self, msg: protocol.Started, init: _Init) -> None:
        """PID 1 is ours: the outer stage 2 is released (after the signals sent before
        this, which it passes on), and what waited for PID 1 goes now."""
        self._init = init
        self.send(protocol.Release())
        self._loop.remove_reader(self.ctl.fileno())
        self.ctl.close()
        self._loop.add_reader(init.status, self._status_readable)
        self._loop.add_reader(init.pidfd, self._pid1_gone)
        if init.pty is not None:
            self._loop.add_reader(init.pty.fileno(), self._pty_readable)
        self._queue.put_nowait(msg)
        held, self._held = self._held, []
        for request in held:
            self.send(request)
        if self._prime:
            self._prime_timer = self._loop.call_later(PRIME_AFTER, self.prime_next)

    def userns(self) -> int | None:
        """The sandbox's user namespace (an nsfs fd, borrowed) once Started sent it."""
        return self._init.ns[0] if self._init is not None and not self._init.closed else None

    def prime_next(self) -> None:
        """The spares for the next run of this kind, once this one has ended (or failed,
        or run PRIME_AFTER): the one of its kind if it was taken, and after
        a networked run the one that loads this run's ruleset ahead."""
        if self._prime_timer is not None:
            self._prime_timer.cancel()
            self._prime_timer = None
        if self._prime and self._template is not None:
            self._prime = False
            self._template.prime(self._kind)
            if self._kind is Spare.GATEWAY and self._ruleset is not None:
                self._template.prime_ruled(self._ruleset)

    def _status_readable(self) -> None:
        assert self._init is not None
        try:
            chunk = os.read(self._init.status, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # PID 1 is exiting: its pidfd says when it is gone
            self._loop.remove_reader(self._init.status)
            return
        self._believe(chunk)

    def _believe(self, chunk: bytes) -> None:
        for status in self._reports.feed(chunk):
            if isinstance(
                status,
                protocol.Confined
                | protocol.Stopped
                | protocol.Refused
                | protocol.Refusals
                | protocol.PortRefused,
            ):
                self._queue.put_nowait(status)
            if isinstance(status, protocol.Confined) and not self._rooted:
                self._rooted = True
                held, self._held = self._held, []
                for request in held:
                    self.send(request)

    def _pty_readable(self) -> None:
        """PID 1's one message on its socket: the session PTY's master."""
        assert self._init is not None and self._init.pty is not None
        sock, self._init.pty = self._init.pty, None
        self._loop.remove_reader(sock.fileno())
        with sock:
            got = _receive(sock)
        if got is None or not got[0]:
            return
        data, fds = got
        try:
            msg = protocol.decode(data, len(fds), (protocol.Pty,))
            self._queue.put_nowait(_received(typing.cast(protocol.Pty, msg), fds))
        except protocol.ProtocolError as e:
            protocol.close(fds)
            log.warning("sandbox init: %s (dropped)", e)

    def _pid1_gone(self) -> None:
        """PID 1 has exited, and with it every process of the sandbox (its PID
        namespace is torn down before its pidfd says so): its last reports, then the
        run's end."""
        assert self._init is not None
        self._loop.remove_reader(self._init.pidfd)
        with contextlib.suppress(ValueError):  # (already at its end)
            self._loop.remove_reader(self._init.status)
        while chunk := _read_nonblocking(self._init.status):
            self._believe(chunk)
        end = initreports.ending(self._reports.ends, self._killed)
        self._queue.put_nowait(protocol.Done(end))
        self._queue.put_nowait(None)
        self._let_go()
        self.prime_next()

    async def next(self) -> Received | None:
        """The next report (with what it carried); None once the sandbox is gone."""
        msg = await self._queue.get()
        if msg is None:
            self._queue.put_nowait(None)  # and for every later call
        return msg

    def killing(self) -> None:
        """A SIGKILL is on its way by another road (scopes.kill_frozen): PID 1 dead
        without a word is ours."""
        self._killed = True

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self._killed = True
        if self._init is None:
            self.send(protocol.Signal(sig))
        elif not self._init.closed:  # (closed: PID 1 is gone, its number may be reused)
            with contextlib.suppress(OSError):  # gone meanwhile: its pidfd says so
                signal.pidfd_send_signal(self._init.pidfd, sig)

    def send(self, msg: protocol.Request) -> None:
        """One message: to the outer stage 2 (the scope's placement, a signal) until
        PID 1 is handed over, a live or port request to a joiner (held until then);
        one that cannot be sent is logged (the sandbox's end is heard on its own)."""
        if self._closed:
            return
        if isinstance(msg, Held):
            if self._init is not None and self._init.closed:  # its nsfs numbers are stale
                answer = (
                    protocol.SocketMade
                    if isinstance(msg, protocol.OpenSocket)
                    else protocol.LiveDone
                )
                self._answered(answer(msg.id, "the sandbox has ended"), [])
                return
            ready = self._init is not None and (
                self._rooted or isinstance(msg, protocol.OpenSocket)
            )
            if not ready:
                self._held.append(msg)
            else:
                self._joiner_for().ask(msg)
            return
        try:
            protocol.send(self.ctl, msg)
        except protocol.ProtocolError as e:
            log.warning("stage 2: not sent: %s", e)
        except OSError:
            pass

    def _joiner_for(self) -> Joiner:
        if self._joiner is None:
            assert self._init is not None
            template = self._template

            def spawn() -> socket.socket:
                if template is None:
                    raise SetupError("no stage-2 template to fork a joiner from")
                return template.spawn()

            self._joiner = Joiner(spawn, self._init.ns, self._answered)
        return self._joiner

    def _answered(self, msg: joinproc.Answer, fds: list[int]) -> None:
        try:
            self._queue.put_nowait(_received(msg, fds))
        except protocol.ProtocolError as e:
            protocol.close(fds)
            log.warning("joiner: %s (dropped)", e)

    def _let_go(self) -> None:
        if self._joiner is not None:
            self._joiner.close()
            self._joiner = None
        if self._init is not None:
            self._init.close(self._loop)

    def _starting_now(self, pid: int) -> None:
        """Step 0: the outer stage 2 stands for its sandbox's user namespace until
        Started registers it (insiders.py: PID 1 does not wait for boxyd to read that)."""
        try:
            self._starting = INSIDERS.pending(pid)
        except OSError as e:  # gone already: the run ends by itself
            log.warning("stage 2: pid %d: %s", pid, e.strerror)

    def _not_starting(self) -> None:
        if self._starting >= 0:
            INSIDERS.pending_done(self._starting)
            self._starting = -1

    def close(self) -> None:
        self.prime_next()
        self._not_starting()
        if not self._closed:
            self._closed = True
            with contextlib.suppress(RuntimeError, ValueError):
                self._loop.remove_reader(self.ctl.fileno())
            self.ctl.close()
            self._let_go()


class _Init:
    """What boxyd holds of a sandbox's PID 1 once Started handed it over (ours to
    close): its pidfd, its status pipe's read end, the alive pipe's write end (PID 1
    ends when it hangs up: boxyd's death), the nsfs fds a joiner enters, and the
    socket its PTY's master comes on (until it has)."""

    def __init__(self, fds: list[int], pty: bool) -> None:
        self.pidfd, self.status, self.alive = fds[0], fds[1], fds[2]
        self.ns = fds[3:6]
        self.pty = socket.socket(fileno=fds[6]) if pty else None
        os.set_blocking(self.status, False)
        self.closed = False
        # its user namespace names the sandbox: no call from inside is taken (insiders.py)
        self.userns = INSIDERS.add(self.ns[0])

    @classmethod
    def of(cls, fds: list[int], pty: bool) -> _Init:
        """FDS as Started sent them, each checked to be what it must (ProtocolError)."""
        # (a pidfd reads "pidfd:[…]" on kernels that may name pidfs files so)
        kinds: list[tuple[str, ...]] = [
            ("anon_inode:[pidfd]", "pidfd:"),
            *[(k,) for k in ("pipe:", "pipe:", "user:", "mnt:", "net:", "socket:")],
        ]
        for fd, kind in zip(fds, kinds, strict=False):
            if not os.readlink(f"/proc/self/fd/{fd}").startswith(kind):
                raise protocol.ProtocolError(f"started: an fd that is not a {kind}")
        return cls(fds, pty)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Once: after it, these numbers may be any other fd of boxyd's."""
        if self.closed:
            return
        self.closed = True
        INSIDERS.discard(self.userns)
        for fd in (self.pidfd, self.status):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_reader(fd)
        if self.pty is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_reader(self.pty.fileno())
            self.pty.close()
            self.pty = None
        protocol.close([self.pidfd, self.status, self.alive, *self.ns])


def _receive(sock: socket.socket) -> tuple[bytes, list[int]] | None:
    """One datagram and its fds; (b"", []) at the end; None when there is nothing
    yet or it broke the protocol (logged, its fds closed)."""
    try:
        return protocol.receive(sock)
    except BlockingIOError:
        return None
    except protocol.ProtocolError as e:
        log.warning("stage 2: %s (dropped)", e)
        return None
    except OSError:
        return b"", []


def _read_nonblocking(fd: int) -> bytes:
    """What FD has now; b"" at its end or when there is nothing more."""
    try:
        return os.read(fd, 65536)
    except OSError:  # BlockingIOError included
        return b""


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
    | protocol.Refused
    | protocol.Refusals
    | protocol.PortRefused
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
