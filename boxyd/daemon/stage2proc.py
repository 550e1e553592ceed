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
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

from boxy.errors import SetupError
from boxyd.plan.ops import Plan

log = logging.getLogger("boxyd")
MAX_MSG = 1 << 16
MAX_FDS = 32  # the gateway sends 15 with --pcap


class Template:
    """The pre-imported stage-2 process. Started at most once at a time; restarted on
    the next run if it died."""

    def __init__(self, module: str = "boxyd.stage2", kind: int = socket.SOCK_SEQPACKET) -> None:
        self.module = module  # boxyd.stage2, or boxyd.daemon.walkproc (the walks before a run)
        self.kind = kind  # of each request's socket
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None

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

    def spawn(self) -> socket.socket:
        """A control socket to a freshly forked outer stage 2."""
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
            return ours
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Closing its socket ends the template — and, by their death signal, every
        sandbox it forked: only for a restart after it died, or when boxyd stops."""
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
    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self._queue: asyncio.Queue[dict | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(ctl.fileno(), self._readable)
        self._closed = False

    @classmethod
    def start(cls, template: Template, plan: Plan, stdio: list[int]) -> Stage2:
        ctl = template.spawn()
        ctl.setblocking(False)
        stage2 = cls(ctl)
        try:
            plan_fd = plan_memfd(json.dumps(plan.to_json()).encode())
        except OSError as e:
            stage2.close()
            raise SetupError(f"stage 2: cannot hold the plan: {e.strerror}") from None
        try:
            socket.send_fds(ctl, [b"plan"], [plan_fd, *stdio])
        except OSError as e:
            stage2.close()
            raise SetupError(f"stage 2: cannot send the plan: {e.strerror}") from None
        finally:
            os.close(plan_fd)
        return stage2

    def _readable(self) -> None:
        """One message; only "listeners" (the gateway's sockets, in the order of its
        list of names) and "pty" (the session PTY's master) may carry fds, and
        anything else sent along is closed."""
        try:
            data, fds, _, _ = socket.recv_fds(self.ctl, MAX_MSG, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            asyncio.get_running_loop().remove_reader(self.ctl.fileno())
            self._queue.put_nowait(None)
            return
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if isinstance(msg, dict) and "listeners" in msg:
            names = msg.get("listeners")
            if isinstance(names, list) and len(names) == len(fds):
                msg["sockets"] = {
                    str(n): socket.socket(fileno=fd) for n, fd in zip(names, fds, strict=True)
                }
                self._queue.put_nowait(msg)
                return
            msg = None
        if isinstance(msg, dict) and msg.get("pty") is True and len(fds) == 1 and os.isatty(fds[0]):
            self._queue.put_nowait({"pty": True, "pty_fd": fds[0]})
            return
        for fd in fds:
            os.close(fd)
        if isinstance(msg, dict) and "pty" not in msg:
            self._queue.put_nowait(msg)

    async def messages(self) -> AsyncIterator[dict]:
        while (msg := await self._queue.get()) is not None:
            yield msg

    def signal(self, sig: int) -> None:
        self.send({"signal": sig})

    def send(self, msg: dict) -> None:
        """One message to the outer stage 2 (a signal, the scope's placement)."""
        if self._closed:
            return
        with contextlib.suppress(OSError):
            self.ctl.send(json.dumps(msg).encode())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self.ctl.fileno())
            self.ctl.close()
