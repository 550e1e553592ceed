"""Inside a tool sandbox: run the tool calls boxyd sends, one at a time.

boxyd never runs a tool (git, npm, pip) over a tree the payload could write on the
host (docs/design.md, "Tools boxyd runs"): it starts a sandbox of its own — the
trees read-only and not executable, no network, a deadline — whose PID 1 forks
this loop instead of executing a payload. The loop is confined exactly like a
payload (capabilities gone, Landlock, seccomp) and is not dumpable, so nothing a
tool starts can reach its descriptors through /proc.

The wire, on fds 0 and 1 (pipes to boxyd):
  request:  one JSON line {"argv": [...], "cwd": str, "env": {str: str},
            "timeout": seconds, "limit": bytes}
  response: one JSON line {"rc": int | null, "timeout": bool, "error": str | null,
            "size": n, "truncated": bool}, then n bytes of the tool's stdout.
boxyd treats every response as untrusted (it comes from inside a sandbox).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time

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


def _collect(proc: subprocess.Popen[bytes], timeout: float, limit: int) -> tuple[bytes, bool, bool]:
    """(stdout, timed out, truncated): read until EOF, the deadline or the limit; a tool
    past either is killed with its whole process group."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
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
            os.killpg(proc.pid, signal.SIGKILL)
    return bytes(out), timed_out, truncated


def call(req: dict[str, object]) -> tuple[dict[str, object], bytes]:
    """One tool call: the response header and the tool's stdout."""
    argv, cwd, env = req.get("argv"), req.get("cwd"), req.get("env")
    timeout, limit = req.get("timeout"), req.get("limit")
    if (
        not isinstance(argv, list)
        or not argv
        or not all(isinstance(a, str) for a in argv)
        or not isinstance(cwd, str)
        or not isinstance(env, dict)
        or not isinstance(timeout, (int, float))
        or not isinstance(limit, int)
    ):
        return {
            "rc": None,
            "timeout": False,
            "error": "malformed request",
            "size": 0,
            "truncated": False,
        }, b""
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env={str(k): str(v) for k, v in env.items()},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:
        return {
            "rc": None,
            "timeout": False,
            "error": f"{argv[0]}: {e.strerror}",
            "size": 0,
            "truncated": False,
        }, b""
    with proc:
        out, timed_out, truncated = _collect(proc, float(timeout), min(limit, LIMIT_MAX))
        rc = proc.wait()
    return {
        "rc": rc,
        "timeout": timed_out,
        "error": None,
        "size": len(out),
        "truncated": truncated,
    }, out


def serve() -> int:
    """Answer requests on fd 0 with responses on fd 1 until boxyd closes fd 0."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    buf = bytearray()
    while (line := _read_line(0, buf)) is not None:
        try:
            req = json.loads(line)
        except ValueError:
            return 2
        if not isinstance(req, dict):
            return 2
        head, out = call(req)
        _write_all(1, json.dumps(head).encode() + b"\n" + out)
    return 0
