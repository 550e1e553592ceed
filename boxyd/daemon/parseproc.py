"""Parsing apart (docs/design.md, "Nothing the payload wrote is parsed in boxyd's
process"): the parse child, and Apart, the Parser that asks it (config/parsedoor.py).

The child is a fresh child of the walk template (boxyd's walks in its worker threads)
or of a walk child itself (a large tree's walk, forked there: that process is
single-threaded). It serves one run's jobs in order over a stream socket and then
exits at its end. Its limits: RLIMIT_CPU (CPU_LIMIT s of CPU in all: SIGXCPU ends
it) and RLIMIT_AS. Apart gives each job JOB_BUDGET seconds of wall time and the run
RUN_BUDGET in all; a job past its budget, or a child that dies on it, is Hostile and
the child is killed (by pidfd: a regex deep in C never sees a signal handler), and
the next job gets a fresh child. Nothing a job does can hold boxyd: it waits on a
socket, without the interpreter lock.

The wire, both ways: a frame header (two lengths), a JSON head, then raw bytes.
Requests: {"kind", "arg"} + the file's bytes. Replies: the first is {"pid"}; then
{"ok": result} (bytes results as the raw part, "raw": true) or {"error": line}.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, TypeVar

from boxyd.config import parsedoor as pp
from boxyd.config import projectconfig  # noqa: F401  (registers the spec's jobs)
from boxyd.plan import payloadparse  # noqa: F401  (registers the plan's and guard's jobs)

T = TypeVar("T")
HEAD = struct.Struct("!II")
# a verdict is the head's JSON: a git config of CONFIG_MAX (1 MiB) parses to ~3 MiB of
# it (a head of 1 MiB made every large config, harmless or not, Hostile)
HEAD_MAX = 64 << 20
DATA_MAX = 64 << 20
JOB_BUDGET = 2.0  # seconds of wall time one job may take (a linear parse of 4 MiB: ~0.1 s)
RUN_BUDGET = 10.0  # seconds of wall time all of one run's jobs may take
CPU_LIMIT = 10  # seconds of CPU a parse child may use in all (RLIMIT_CPU)
AS_LIMIT = 2 << 30  # bytes of address space (a YAML bomb's memory)


# -- the child -------------------------------------------------------------------------


def serve(sock: socket.socket) -> int:
    """The parse child's loop: limits, hello, then one reply per job until EOF."""
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT + 1))
    with contextlib.suppress(ValueError, OSError):  # a lower hard limit stays as it is
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    pp.allow_local()  # this process is the one apart
    sock.setblocking(True)
    send(sock, {"pid": os.getpid()})
    while True:
        try:
            head, data = recv(sock)
        except EOFError:
            return 0
        send(sock, *_answer(head, data))


def _answer(head: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
    try:
        job = pp.Job(pp.Kind(head["kind"]), str(head["arg"]), data)
        result = pp.run(job)
    except Exception as e:  # a parser that refuses its input: the file is hostile
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}, b""
    if isinstance(result, bytes):
        return {"ok": None, "raw": True}, result
    return {"ok": result}, b""


def send(sock: socket.socket, head: dict[str, Any], data: bytes = b"") -> None:
    text = json.dumps(head, separators=(",", ":")).encode()
    sock.sendall(HEAD.pack(len(text), len(data)) + text + data)


def recv(sock: socket.socket, deadline: float | None = None) -> tuple[dict[str, Any], bytes]:
    """One frame: (head, raw bytes); EOFError at the end, ValueError if malformed,
    TimeoutError when DEADLINE (time.monotonic) passes first."""
    head_len, data_len = HEAD.unpack(_exactly(sock, HEAD.size, deadline))
    if head_len > HEAD_MAX or data_len > DATA_MAX:
        raise ValueError(f"a frame of {head_len} + {data_len} bytes")
    head = json.loads(_exactly(sock, head_len, deadline))
    if not isinstance(head, dict):
        raise ValueError("a frame whose head is not an object")
    return head, _exactly(sock, data_len, deadline)


def _exactly(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer in time")
            sock.settimeout(left)
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed")
        out += chunk
    return bytes(out)


# -- boxyd's side: the Parser --------------------------------------------------------

Spawn = Callable[[], socket.socket]  # a socket to a fresh child already serving


class Apart:
    """The Parser of one run: jobs to a child, each within its budget."""

    def __init__(
        self, spawn: Spawn, *, job_budget: float = JOB_BUDGET, run_budget: float = RUN_BUDGET
    ) -> None:
        self._spawn = spawn
        self.job_budget, self.run_budget = job_budget, run_budget
        self.spent = 0.0  # wall seconds the run's jobs took
        self._sock: socket.socket | None = None
        self._pidfd = -1
        self.overruns: list[str] = []  # one line per job that came back Hostile

    def parse(self, job: pp.Job) -> object | pp.Hostile:
        left = self.run_budget - self.spent
        if left <= 0:
            return self._hostile(f"the run's parse budget ({self.run_budget:g} s) is spent")
        budget = min(self.job_budget, left)
        t0 = time.monotonic()
        try:
            sock = self._child()
            send(sock, {"kind": job.kind.value, "arg": job.arg}, job.data)
            head, data = self._reply(sock, t0 + budget)
        except TimeoutError:
            self._kill()
            return self._hostile(f"its parse ran over {budget:g} s")
        except Exception as e:  # no child, or one that broke: the job is not judged
            self._kill()
            return self._hostile(f"the parse process failed ({type(e).__name__}: {e})")
        finally:
            self.spent += time.monotonic() - t0
        if "error" in head:
            return self._hostile(f"the parser refused it ({head['error']})")
        return data if head.get("raw") else head.get("ok")

    def _hostile(self, why: str) -> pp.Hostile:
        self.overruns.append(why)
        return pp.Hostile(why)

    def _child(self) -> socket.socket:
        if self._sock is None:
            sock = self._spawn()
            try:
                head, _ = self._reply(sock, time.monotonic() + self.job_budget)
                self._pidfd = os.pidfd_open(int(head["pid"]))
            except BaseException:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    @staticmethod
    def _reply(sock: socket.socket, deadline: float) -> tuple[dict[str, Any], bytes]:
        """One frame, read before DEADLINE (TimeoutError after it; socket.timeout is
        TimeoutError since Python 3.10)."""
        return recv(sock, deadline)

    def _kill(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        """The child exits at its socket's end (or was killed)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def call_apart(apart: Callable[[], Apart], fn: Callable[[], T]) -> T:
    """FN() with a fresh Parser from APART in force (in a worker thread), closed after:
    every parse of payload bytes FN makes goes to a child of its own."""
    parser = apart()
    try:
        return call_with(parser, fn)
    finally:
        parser.close()


def call_with(parser: Apart, fn: Callable[[], T]) -> T:
    """FN() with PARSER in force (in a worker thread); the caller closes it (a run's
    spec and walk share one: one child, one budget)."""
    with pp.using(parser):
        return fn()


def fork_child() -> socket.socket:
    """Spawn for a single-threaded process (a walk child): a forked parse child that
    dies with its parent. Its exit is reaped by reap_children()."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            ours.close()
            _die_with_parent()
            status = serve(theirs)
        finally:
            os._exit(status)
    theirs.close()
    return ours


def reap_children() -> None:
    """Reap the forked parse children that have ended (none waits)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _die_with_parent() -> None:
    from boxyd.stage2 import caps

    caps.die_with_parent(signal.SIGKILL)
