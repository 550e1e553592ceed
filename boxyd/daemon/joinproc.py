"""A running sandbox's joiner as boxyd sees it (the process: boxyd/stage2/joiner.py).

Forked from the stage-2 template when a request needs it (the live guard's cover or
pin, a published port's socket), sent Join with the sandbox's namespaces, and let go
once it has been idle for IDLE seconds: no process stays beside a session that needs
none (docs/design.md, "Processes"). Every request is answered, by the joiner or,
when it cannot be started or dies, here with the reason, so no caller waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

from boxy.errors import SetupError
from boxyd.stage2 import protocol as p

log = logging.getLogger("boxyd")

IDLE = 10.0  # seconds without a request before the joiner is let go
Ask = p.LiveCover | p.LivePin | p.OpenSocket
Answer = p.LiveDone | p.SocketMade
Deliver = Callable[[Answer, list[int]], None]  # an answer and its fds (the receiver's)


class Joiner:
    """One sandbox's joiner, started on demand by SPAWN (a fresh child of the template)
    with the nsfs fds NS (user, mount, network; the caller's, not closed here);
    answers go to DELIVER."""

    def __init__(self, spawn: Callable[[], socket.socket], ns: list[int], deliver: Deliver):
        self._spawn, self._ns, self._deliver = spawn, ns, deliver
        self._loop = asyncio.get_running_loop()
        self._ctl: socket.socket | None = None
        self._live: set[int] = set()  # ids asked and not answered
        self._sockets: set[int] = set()
        self._idle: asyncio.TimerHandle | None = None

    def ask(self, msg: Ask) -> None:
        (self._sockets if isinstance(msg, p.OpenSocket) else self._live).add(msg.id)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            ctl = self._ctl if self._ctl is not None else self._start()
            p.send(ctl, msg)
        except (SetupError, OSError, p.ProtocolError) as e:
            self._fail(f"joiner: {e.strerror if isinstance(e, OSError) else e}")

    def _start(self) -> socket.socket:
        ctl = self._spawn()
        try:
            ctl.setblocking(False)
            p.send(ctl, p.Join(), self._ns)
        except BaseException:
            ctl.close()
            raise
        self._ctl = ctl
        self._loop.add_reader(ctl.fileno(), self._readable)
        return ctl

    def _readable(self) -> None:
        assert self._ctl is not None
        try:
            data, fds = p.receive(self._ctl)
        except BlockingIOError:
            return
        except p.ProtocolError as e:
            log.warning("joiner: %s (dropped)", e)
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self._fail("joiner: it ended")
            return
        try:
            msg = p.decode_report(data, len(fds))
        except p.ProtocolError as e:
            p.close(fds)
            log.warning("joiner: %s (dropped)", e)
            return
        match msg:
            case p.LiveDone(id=ident) if ident in self._live:
                self._live.discard(ident)
            case p.SocketMade(id=ident) if ident in self._sockets:
                self._sockets.discard(ident)
            case p.Done(end=p.SetupFailed(error=why)):  # its join failed
                self._fail(why)
                return
            case _:
                p.close(fds)
                log.warning("joiner: %s not asked for (dropped)", msg.KIND)
                return
        self._deliver(msg, fds)
        if not (self._live or self._sockets):
            self._idle = self._loop.call_later(IDLE, self.close)

    def _fail(self, why: str) -> None:
        """The joiner is gone or never came: every request waiting is answered WHY."""
        self.close()
        live, sockets = self._live, self._sockets
        self._live, self._sockets = set(), set()
        for ident in sorted(live):
            self._deliver(p.LiveDone(ident, why[: p.MAX_TEXT]), [])
        for ident in sorted(sockets):
            self._deliver(p.SocketMade(ident, why[: p.MAX_TEXT]), [])

    def close(self) -> None:
        """Let the joiner go (it exits at its socket's end); a later ask starts another."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._ctl is not None:
            with contextlib.suppress(ValueError, RuntimeError):
                self._loop.remove_reader(self._ctl.fileno())
            self._ctl.close()
            self._ctl = None
