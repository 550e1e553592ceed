"""A tool sandbox carried out through stage 2, driven synchronously from a worker thread.

boxyd.plan.tools decides what the sandbox holds; this starts it from the stage-2
template (through the event loop: the template's death signal follows the loop's
thread), sends it tool calls on a pipe and reads the answers back, bounded in
size and time. Everything read back is untrusted: it comes from inside a sandbox
whose trees the payload wrote. A ToolBox that failed once stays failed.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import socket
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from boxy import fdwait
from boxy.errors import BoxyError
from boxyd.config.hosttools import Answer, Exposure, ToolError
from boxyd.daemon.initreports import InitReports
from boxyd.daemon.stage2proc import plan_memfd
from boxyd.plan import ops, tools
from boxyd.plan.ops import Plan
from boxyd.plan.seccomp import build_filter
from boxyd.stage2 import protocol

START_TIMEOUT = 10.0  # the sandbox's own set-up, before the first call
HEAD_MAX = 4096
CALL_MAX = 1 << 20  # the tool server's own bound on a request line
GRACE = 2.0  # past a call's own timeout: the sandbox's answer that it killed the tool

Spawn = Callable[[], socket.socket]  # a control socket to a fresh outer stage 2


class ToolBox:
    """One tool sandbox: started by ``open``, closed (and killed) by ``close``. Every
    call shares the box's deadline, so all the checks of a run are one budget."""

    def __init__(
        self, ctl: socket.socket | None, to_box: int, from_box: int, status: int, deadline: float
    ) -> None:
        """CTL None: a box another process holds (``handles``): closing this one only
        lets go of its pipes."""
        self._ctl = ctl
        self._to = to_box
        self._from = from_box
        self._status = status  # PID 1's status pipe: its account of a set-up error
        self._deadline = deadline
        self._wait_until = deadline  # the current call's answer is awaited until then
        self._broken: str | None = None

    @classmethod
    def open(cls, spawn: Spawn, plan: Plan, budget: float) -> ToolBox:
        """Start a sandbox for PLAN with BUDGET seconds for everything done in it."""
        deadline = time.monotonic() + budget
        try:
            ctl = spawn()
        except (BoxyError, OSError, TimeoutError) as e:  # no template: said, never raised past
            raise ToolError(f"tool sandbox: stage 2 cannot be started ({e})") from None
        fds: list[int] = []
        try:
            req_r, req_w = os.pipe2(os.O_CLOEXEC)
            fds += [req_r, req_w]
            resp_r, resp_w = os.pipe2(os.O_CLOEXEC)
            fds += [resp_r, resp_w]
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            fds.append(null)
            plan_fd = plan_memfd(ops.to_wire(plan))
            try:
                protocol.send(ctl, protocol.PlanFds(), [plan_fd, req_r, resp_w, null])
            finally:
                os.close(plan_fd)
            for fd in (req_r, resp_w, null):  # the sandbox's now
                os.close(fd)
                fds.remove(fd)
            status = _handshake(ctl, min(deadline, time.monotonic() + START_TIMEOUT))
        except OSError as e:
            _close(ctl, fds)
            raise ToolError(f"tool sandbox: cannot start it: {e.strerror or e}") from None
        except ToolError:
            _close(ctl, fds)
            raise
        return cls(ctl, req_w, resp_r, status, deadline)

    def run(
        self, argv: Sequence[str], *, cwd: str, env: dict[str, str], timeout: float, limit: int
    ) -> Answer:
        """One call; its TIMEOUT is cut to what is left of the box's budget."""
        if self._broken is not None:
            raise ToolError(self._broken)
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise self._fail("the checks' time budget is spent")
        timeout = min(timeout, left)
        self._wait_until = time.monotonic() + timeout + GRACE
        req = protocol.ToolCall(tuple(argv), cwd, dict(env), timeout, limit)
        try:
            _write_all(self._to, protocol.encode(req, limit=CALL_MAX) + b"\n")
            head = self._head(limit)
            out = self._read_exact(head.size)
        except OSError as e:
            raise self._fail(f"the tool sandbox went away ({e.strerror or e})") from None
        except protocol.ProtocolError as e:  # ours: a call too large to send
            raise self._fail(f"the tool call cannot be sent ({e})") from None
        if head.error is not None:
            return Answer(rc=None, out=b"")
        return Answer(rc=head.rc, out=out, timed_out=head.timeout, truncated=head.truncated)

    def _head(self, limit: int) -> protocol.ToolAnswer:
        """The answer's header line, strictly (it comes from inside the sandbox); its
        size at most the LIMIT asked for."""
        line = bytearray()
        while not line.endswith(b"\n"):
            line += self._read(1 if len(line) < HEAD_MAX else 0)
        try:
            head = protocol.decode_tool_answer(bytes(line[:-1]))
        except protocol.ProtocolError:
            head = None
        if head is None or head.size > limit:
            raise self._fail("the tool sandbox sent an answer that cannot be read")
        return head

    def _read_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            out += self._read(n - len(out))
        return bytes(out)

    def _read(self, n: int) -> bytes:
        """Up to N bytes (N=0: the header is too long), within the box's deadline."""
        if n <= 0:
            raise self._fail("the tool sandbox sent an answer that cannot be read")
        left = self._wait_until - time.monotonic()
        if left <= 0 or not fdwait.readable(self._from, left):
            raise self._fail("the tool sandbox did not answer in time")
        chunk = os.read(self._from, min(n, 1 << 20))
        if not chunk:
            raise self._fail(f"the tool sandbox ended{self._why()}")
        return chunk

    def _why(self) -> str:
        """PID 1's own account of an early end (a set-up error), if it gave one: its
        status pipe, read until its end (it is gone: the answers' pipe ended)."""
        reports = InitReports()
        with contextlib.suppress(OSError):
            while fdwait.readable(self._status, 0.5) and (chunk := os.read(self._status, 65536)):
                reports.feed(chunk)
        failed = [e for e in reports.ends if isinstance(e, protocol.SetupFailed)]
        return f": {failed[-1].error[:300]}" if failed else ""

    def _fail(self, why: str) -> ToolError:
        self._broken = why
        self.close()
        return ToolError(why)

    def handles(self) -> tuple[list[int], float]:
        """Its pipes (to it, from it, PID 1's status) and its deadline, for a process
        boxyd lets call it (afterproc.py: the check after a run); dups, the caller's."""
        return [os.dup(fd) for fd in (self._to, self._from, self._status)], self._deadline

    def close(self) -> None:
        """Closing the control socket ends the sandbox: the outer stage 2, never sent
        Release, exits, and with it the last write end of PID 1's alive pipe."""
        _close(self._ctl, [self._to, self._from, self._status])
        self._to = self._from = self._status = -1

    def __enter__(self) -> ToolBox:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Toolshed:
    """The tool sandboxes of one purpose (a run's checks, one run's settings): every
    box it opens draws on one budget, so a tree that makes git slow costs its own
    run that budget and nothing more. Callable as a boxyd.config.hosttools.Opener."""

    def __init__(self, spawn: Spawn, budget: float) -> None:
        self._spawn = spawn
        self._deadline = time.monotonic() + budget

    def __call__(self, exposure: Exposure) -> ToolBox:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise ToolError("the checks' time budget is spent")
        return ToolBox.open(self._spawn, tools.plan(exposure, seccomp_bpf=_filter()), left)


@functools.cache
def _filter() -> str:
    """The payload's own strict filter, compiled once."""
    return base64.b64encode(build_filter("strict")).decode()


def _handshake(ctl: socket.socket, deadline: float) -> int:
    """Step 0 gets no scope (a tool sandbox is boxyd's, bounded by its own limits),
    then wait until PID 1 runs; a set-up error is said as stage 2 gave it. PID 1's
    status pipe, of what Started handed over (the outer stage 2 keeps the alive
    pipe's other copy until the control socket closes: no Release)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ToolError("tool sandbox: it did not start in time")
        ctl.settimeout(left)
        try:
            msg, fds = _report_with_fds(ctl)
        except TimeoutError:
            continue
        if isinstance(msg, protocol.Started):
            protocol.close(fds[:1] + fds[2:])
            return fds[1]
        protocol.close(fds)
        match msg:
            case None:
                raise ToolError("tool sandbox: stage 2 ended before it started")
            case protocol.Pid():
                protocol.send(ctl, protocol.Placed(in_scope=False))
            case protocol.Done(end=end):
                why = end.error if isinstance(end, protocol.SetupFailed) else "it ended at once"
                raise ToolError(f"tool sandbox: {why[:300]}")
            case _:  # a report with fds (the box has no network or terminal), or unreadable
                pass


def _report_with_fds(
    ctl: socket.socket,
) -> tuple[protocol.Report | protocol.ProtocolError | None, list[int]]:
    """Stage 2's next report (None: it ended) and the fds it carried (the caller's)."""
    try:
        data, fds = protocol.receive(ctl)
    except protocol.ProtocolError as e:
        return e, []
    if not data:
        return None, fds
    try:
        return protocol.decode_report(data, len(fds)), fds
    except protocol.ProtocolError as e:
        return e, fds


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(ctl: socket.socket | None, fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    if ctl is not None:
        ctl.close()
