"""Start stage 2 for one run and talk to it over its control socket.

stage 2 is a freshly exec'd, single-threaded interpreter (``python -I -m
boxyd.stage2``) with an empty environment: unshare(CLONE_NEWUSER) fails in a
multithreaded process, and forking the asyncio daemon itself is unsafe. It is
spawned from the event-loop thread, so its PR_SET_PDEATHSIG (which follows the
parent *thread*) fires exactly when boxyd dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

from boxyd.plan import Plan

MAX_MSG = 1 << 16


class Stage2:
    def __init__(self, proc: subprocess.Popen[bytes], ctl: socket.socket) -> None:
        self.proc = proc
        self.ctl = ctl
        self._queue: asyncio.Queue[dict | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(ctl.fileno(), self._readable)
        self._closed = False

    @classmethod
    async def start(cls, plan: Plan, stdio: list[int]) -> Stage2:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.setblocking(False)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "boxyd.stage2", str(os.getpid()), str(child.fileno())],
                env={},
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
                start_new_session=True,  # setsid(): the host terminal is never its controlling tty
            )
        finally:
            child.close()
        stage2 = cls(proc, parent)
        payload = json.dumps(plan.to_json()).encode()
        socket.send_fds(parent, [payload], stdio)
        return stage2

    def _readable(self) -> None:
        try:
            data = self.ctl.recv(MAX_MSG)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.ctl.fileno())
            self._queue.put_nowait(None)
            return
        try:
            msg = json.loads(data)
        except ValueError:
            return
        if isinstance(msg, dict):
            self._queue.put_nowait(msg)

    async def messages(self) -> AsyncIterator[dict]:
        while (msg := await self._queue.get()) is not None:
            yield msg

    def signal(self, sig: int) -> None:
        if self._closed:
            return
        with contextlib.suppress(OSError):
            self.ctl.send(json.dumps({"signal": sig}).encode())

    async def wait(self) -> int:
        """Reap stage 2 (it exits right after its last message): a pidfd turns
        readable when it has exited, without a child watcher thread or polling."""
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(self.proc.pid)
        exited = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        try:
            await asyncio.wait_for(exited, 10)
        except TimeoutError:
            self.proc.kill()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return self.proc.wait()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self.ctl.fileno())
            self.ctl.close()
