"""The check after a run (plan/worktree.py ``after``), in a child of the walk template.

That check walks the whole tree the payload wrote, hashes its control files, and
reads what the host's git says of it: megabytes of output for an index of a
million gitlinks, seconds of Python per hundred thousand directories. In a thread
of boxyd all of it held the GIL every other session needs (docs/design.md,
"Nothing the payload wrote is parsed in boxyd's process"). In the child it costs
only its own session's end, within AFTER_BUDGET.

The host's git still runs in a tool sandbox of boxyd's own (the child cannot make
one): the child asks for it over its socket, and boxyd relays bytes, never parses
them. The wire, frames.py's (8-byte length, then JSON):

  boxyd -> child   {"after": {"tools", "baselines", "quarantine", "home", "user_hooks"}}
  child -> boxyd   {"pid": n}, then any number of
                   {"open": exposure}                  -> {"box": id} | {"error": line}
                   {"run": {"box", "argv", "cwd", "env", "timeout", "limit"}}
                        -> {"rc", "timed_out", "truncated", "size"}, then SIZE raw bytes
                                                          | {"error": line}
                   {"close": id}                      (no answer)
  and at last      {"done": {"git": size, "tools": size}}, then the lines of each,
                   NUL-separated, raw: a flood of findings (100,000 hooks: 30 MB) is
                   split in one C call, never decoded as JSON  | {"error": line}
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from boxy.errors import BoxyError
from boxyd.config import parsedoor
from boxyd.config.hosttools import Answer, Box, Exposure, Opener, ToolError
from boxyd.daemon import frames, parseproc
from boxyd.gitguard.scan import Snapshot
from boxyd.plan import walkwire, worktree
from boxyd.plan.worktree import Tree

AFTER_BUDGET = 300.0  # seconds for one run's check (its end waits that long at most)
LINES_MAX = 64 << 20  # bytes of the lines of each kind (more: counted in one line)
FRAME_MAX = 16 << 20  # a frame from the child (its lines are capped above)
Lines = tuple[list[str], list[str]]


# --- the child -------------------------------------------------------------------------


class _RemoteBox:
    """A tool sandbox boxyd holds for this child (hosttools.Box)."""

    def __init__(self, conn: socket.socket, ident: int) -> None:
        self._conn, self._id = conn, ident

    def run(
        self, argv: Sequence[str], *, cwd: str, env: dict[str, str], timeout: float, limit: int
    ) -> Answer:
        frames.send_frame(
            self._conn,
            {
                "run": {
                    "box": self._id,
                    "argv": list(argv),
                    "cwd": cwd,
                    "env": env,
                    "timeout": timeout,
                    "limit": limit,
                }
            },
        )
        head = frames.recv_frame(self._conn, FRAME_MAX)
        if "error" in head:
            raise ToolError(str(head["error"]))
        size = int(head["size"])
        if not 0 <= size <= limit:
            raise ToolError(f"an answer of {size} bytes (more than {limit})")
        out = frames.recv_exact(self._conn, size)
        rc = head["rc"]
        return Answer(
            None if rc is None else int(rc),
            out,
            bool(head["timed_out"]),
            bool(head["truncated"]),
        )

    def close(self) -> None:
        frames.send_frame(self._conn, {"close": self._id})


def _remote_tools(conn: socket.socket) -> Opener:
    def open_box(exposure: Exposure) -> Box:
        frames.send_frame(conn, {"open": asdict(exposure)})
        reply = frames.recv_frame(conn, FRAME_MAX)
        if "error" in reply:
            raise ToolError(str(reply["error"]))
        return _RemoteBox(conn, int(reply["box"]))

    return open_box


def _blob(lines: list[str], what: str) -> bytes:
    """LINES, NUL-separated (no path holds a NUL), at most LINES_MAX bytes."""
    out, size = [], 0
    for i, line in enumerate(lines):
        b = line.encode("utf-8", "surrogateescape")
        if size + len(b) + 1 > LINES_MAX - 256:
            out.append(f"… and {len(lines) - i:,} more {what}, not kept".encode())
            break
        out.append(b)
        size += len(b) + 1
    return b"\0".join(out)


def _lines(blob: bytes) -> list[str]:
    return blob.decode("utf-8", "surrogateescape").split("\0") if blob else []


def child(conn: socket.socket, req: dict[str, Any]) -> None:
    """The check, in the walk template's child: what it parses, in a child of its own;
    its lines sent as the wire says."""
    frames.send_frame(conn, {"pid": os.getpid()})
    # of each tree, the check needs what the walk saw of the tools' files
    trees = {str(r): Tree(tools=walkwire.decode_tools(t)) for r, t in req["tools"].items()}
    baselines = {str(r): walkwire.decode_snapshot(s) for r, s in req["baselines"].items()}
    parser = parseproc.Apart(parseproc.fork_child)
    try:
        with parsedoor.using(parser):
            git, tools = worktree.after(
                trees,
                baselines,
                str(req["quarantine"]),
                str(req["home"]),
                _remote_tools(conn),
                req["user_hooks"],
            )
    finally:
        parser.close()
        parseproc.reap_children()
    git_b, tools_b = _blob(git, "findings"), _blob(tools, "tools' files")
    frames.send_frame(conn, {"done": {"git": len(git_b), "tools": len(tools_b)}})
    conn.sendall(git_b + tools_b)


# --- boxyd's side (a worker thread) -----------------------------------------------------


class _Serving:
    """The tool sandboxes one child asked for, until it is done."""

    def __init__(self, conn: socket.socket, tools: Opener) -> None:
        self._conn, self._tools = conn, tools
        self._boxes: dict[int, Box] = {}

    def answer(self, msg: dict[str, Any]) -> Lines | None:
        """One frame of the child's; the lines once it is done."""
        if "done" in msg:
            sizes = int(msg["done"]["git"]), int(msg["done"]["tools"])
            if not all(0 <= n <= LINES_MAX for n in sizes):
                raise BoxyError(f"lines of {sizes} bytes (more than {LINES_MAX})")
            git_b = frames.recv_exact(self._conn, sizes[0])
            return _lines(git_b), _lines(frames.recv_exact(self._conn, sizes[1]))
        if "error" in msg:
            raise BoxyError(str(msg["error"]))
        if "open" in msg:
            self._open(msg["open"])
        elif "run" in msg:
            self._run(msg["run"])
        elif "close" in msg:
            box = self._boxes.pop(int(msg["close"]), None)
            if box is not None:
                box.close()
        return None

    def _open(self, exp: dict[str, Any]) -> None:
        try:
            exposure = Exposure(
                str(exp["home"]),
                tuple(str(p) for p in exp["read"]),
                tuple(str(p) for p in exp["files"]),
                tuple(str(p) for p in exp["execute"]),
            )
            box = self._tools(exposure)
        except (ToolError, BoxyError, OSError) as e:
            frames.send_frame(self._conn, {"error": str(e)})
            return
        self._boxes[len(self._boxes) + 1] = box
        frames.send_frame(self._conn, {"box": len(self._boxes)})

    def _run(self, call: dict[str, Any]) -> None:
        box = self._boxes.get(int(call["box"]))
        try:
            if box is None:
                raise ToolError("no such tool sandbox")
            got = box.run(
                [str(a) for a in call["argv"]],
                cwd=str(call["cwd"]),
                env={str(k): str(v) for k, v in call["env"].items()},
                timeout=float(call["timeout"]),
                limit=int(call["limit"]),
            )
        except (ToolError, BoxyError, OSError) as e:
            frames.send_frame(self._conn, {"error": str(e)})
            return
        head = {
            "rc": got.rc,
            "timed_out": got.timed_out,
            "truncated": got.truncated,
            "size": len(got.out),
        }
        frames.send_frame(self._conn, head)
        self._conn.sendall(got.out)  # relayed as it came: boxyd never reads it

    def close(self) -> None:
        for box in self._boxes.values():
            box.close()
        self._boxes.clear()


@dataclass(frozen=True)
class Check:
    """What the check after a run is given (worktree.after's arguments)."""

    trees: dict[str, Tree]
    baselines: dict[str, Snapshot]
    quarantine: str
    home: str
    tools: Opener
    user_hooks: str | None

    def here(self) -> Lines:
        """In this thread (no walk template): what it parses, apart all the same."""
        return worktree.after(
            self.trees, self.baselines, self.quarantine, self.home, self.tools, self.user_hooks
        )


def check(conn: socket.socket, c: Check, budget: float = AFTER_BUDGET) -> Lines:
    """worktree.after in the child at the other end of CONN (a worker thread's call;
    CONN is closed after). Never raises: a check that failed or ran over BUDGET is one
    line per tree, as a tree not checked."""
    trees, tools = c.trees, c.tools
    deadline = time.monotonic() + budget
    req = {
        "after": {
            "tools": {r: {k: list(v) for k, v in t.tools.items()} for r, t in trees.items()},
            "baselines": {r: walkwire.encode_snapshot(s) for r, s in c.baselines.items()},
            "quarantine": c.quarantine,
            "home": c.home,
            "user_hooks": c.user_hooks,
        }
    }
    pidfd = -1
    serving = _Serving(conn, tools)
    try:
        frames.send_frame(conn, req)
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        hello = frames.recv_frame(conn, FRAME_MAX)
        if "pid" not in hello:
            raise BoxyError(str(hello.get("error", "no hello")))
        # the child keeps its pid until we close (walkproc.child): ours to kill
        pidfd = os.pidfd_open(int(hello["pid"]))
        while True:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            lines = serving.answer(frames.recv_frame(conn, FRAME_MAX))
            if lines is not None:
                return lines
    except TimeoutError:
        return _unchecked(trees, f"the check ran over its {budget:g}s budget")
    except (BoxyError, OSError, EOFError, ValueError, KeyError, TypeError) as e:
        return _unchecked(trees, f"the check failed: {e}")
    finally:
        serving.close()
        if pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        conn.close()


def _unchecked(trees: dict[str, Tree], why: str) -> Lines:
    return [
        f"git guard: {root} could not be checked ({why}); check it before running git there"
        for root in trees
    ], []
