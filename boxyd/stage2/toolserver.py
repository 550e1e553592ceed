"""Inside a tool sandbox: run the tool calls boxyd sends, one at a time.

boxyd never runs a tool (git, npm, pip) over a tree the payload could write on the
host (docs/design.md, "Tools boxyd runs"): it starts a sandbox of its own — the
trees read-only and not executable, no network, a deadline — whose payload's
process (boxyd/stage2/pid1.py) runs this loop instead of executing a payload. The
loop is confined exactly like a payload (capabilities gone, Landlock, seccomp) and
is not dumpable (PID 1's, inherited), so nothing a tool starts can reach its
descriptors through /proc.

The wire, on fds 0 and 1 (pipes to boxyd; boxyd/stage2/protocol.py):
  request:  one line, a ToolCall (argv, cwd, env, timeout seconds, limit bytes)
  response: one line, a ToolAnswer (rc, timeout, error, size, truncated), then
            size bytes of the tool's stdout.
boxyd treats every response as untrusted (it comes from inside a sandbox).

A tool starts with fork and exec, not subprocess: subprocess imports threading,
whose hook after every fork runs in every child of the stage-2 template (each outer
stage 2 and each PID 1), copying about 400 KiB of the template's pages in each.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

from boxyd.stage2.protocol import (
    MAX_TEXT,
    ProtocolError,
    ToolAnswer,
    ToolCall,
    decode_tool_call,
    encode,
)

REQUEST_MAX = 1 << 20
LIMIT_MAX = 64 << 20


def _read_line(fd: int, buf: bytearray) -> bytes | None:
    """The next request line; None at EOF (boxyd is done) or on an oversized one."""
    while b"\n" not in buf:
        chunk = os.read(fd, 65536)
        if not chunk or len(buf) > REQUEST_MAX:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _spawn(req: ToolCall) -> tuple[int, int]:
    """(pid, the read end of its stdout): REQ's tool in a session of its own, in REQ.cwd
    with exactly REQ.env (whose PATH finds it), stdin and stderr on /dev/null. OSError
    when it cannot start: the child's errno, through a pipe that exec closes."""
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.chdir(req.cwd)
            for fd, target in ((null, 0), (out_w, 1), (null, 2)):
                os.dup2(fd, target)
            os.execvpe(req.argv[0], list(req.argv), req.env)
        except OSError as e:
            os.write(err_w, str(e.errno or 0).encode())
        os._exit(127)
    for fd in (out_w, err_w, null):
        os.close(fd)
    err = os.read(err_r, 16)
    os.close(err_r)
    if err:
        os.close(out_r)
        os.waitpid(pid, 0)
        raise OSError(int(err), os.strerror(int(err)))
    return pid, out_r


def _collect(pid: int, fd: int, timeout: float, limit: int) -> tuple[bytes, bool, bool]:
    """(stdout, timed out, truncated): read until EOF, the deadline or the limit; a tool
    past either is killed with its whole process group."""
    out = bytearray()
    end = time.monotonic() + timeout
    timed_out = truncated = False
    while True:
        left = end - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        out += chunk
        if len(out) > limit:
            truncated = True
            del out[limit:]
            break
    if timed_out or truncated:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    return bytes(out), timed_out, truncated


def _answer(
    rc: int | None,
    error: str | None,
    out: bytes = b"",
    *,
    timed_out: bool = False,
    truncated: bool = False,
) -> ToolAnswer:
    """The header that goes before OUT (boxyd reads exactly its size after it)."""
    return ToolAnswer(rc, timed_out, error, len(out), truncated)


def call(req: ToolCall) -> tuple[ToolAnswer, bytes]:
    """One tool call: the answer's header and the tool's stdout."""
    try:
        pid, fd = _spawn(req)
    except OSError as e:
        return _answer(None, f"{req.argv[0]}: {e.strerror}"[:MAX_TEXT]), b""
    try:
        out, timed_out, truncated = _collect(pid, fd, req.timeout, min(req.limit, LIMIT_MAX))
    finally:
        os.close(fd)
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return _answer(rc, None, out, timed_out=timed_out, truncated=truncated), out


def serve() -> int:
    """Answer requests on fd 0 with responses on fd 1 until boxyd closes fd 0."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    buf = bytearray()
    while (line := _read_line(0, buf)) is not None:
        try:
            req = decode_tool_call(line, REQUEST_MAX)
        except ProtocolError:
            head, out = _answer(None, "malformed request"), b""
        else:
            head, out = call(req)
        _write_all(1, encode(head) + b"\n" + out)
    return 0
