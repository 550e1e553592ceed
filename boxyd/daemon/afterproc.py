"""The check after a run (plan/worktree.py ``after``), in a child of the walk template.

That check walks the whole tree the payload wrote, hashes its control files, and
reads what the host's git says of it: megabytes of output for an index of a
million gitlinks, seconds of Python per hundred thousand directories. In a thread
of boxyd all of it held the GIL every other session needs (docs/design.md,
"Nothing the payload wrote is parsed in boxyd's process"). In the child it costs
only its own session's end, within AFTER_BUDGET.

Two things stay boxyd's, and the child asks for them over its socket:
- the host's git runs in a tool sandbox, which only boxyd can start: boxyd starts
  it and hands the child its three pipes (it keeps the control socket, whose close
  ends the sandbox), so git's answers go to the child alone;
- a parse goes through boxyd's door (parsedoor.parse): a verdict kept since the
  walk before the run is found again, and a miss goes to the run's parse child
  within the run's budget; boxyd hashes and relays the bytes, never parses them.

The wire, frames.py's (8-byte length, then JSON):

  boxyd -> child   {"after": {"tools", "held", "edit", "baselines", "quarantine", "home",
                              "user_hooks"}}
  child -> boxyd   {"pid": n}, then any number of
                   {"open": exposure}  -> {"box": id, "deadline": t} with the box's
                        three pipes (SCM_RIGHTS on the frame's first bytes)
                                       |  {"error": line}
                   {"close": id}       (no answer)
                   {"parse": {"kind", "arg", "size"}}, then SIZE bytes
                                       -> {"ok": value} | {"raw": n}, then N bytes
                                                        | {"hostile": why}
  and at last      {"done": {"git": size, "tools": size}}, then the lines of each,
                   NUL-separated, raw: a flood of findings (100,000 hooks: 30 MB) is
                   split in one C call, never decoded as JSON  | {"error": line}
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from boxy.errors import BoxyError
from boxyd.config import parsedoor
from boxyd.config.hosttools import Box, Exposure, Opener, ToolError
from boxyd.daemon import frames, parseproc
from boxyd.daemon.toolbox import ToolBox
from boxyd.gitguard.scan import Snapshot
from boxyd.plan import walkwire, worktree
from boxyd.plan.worktree import Tree

AFTER_BUDGET = 300.0  # seconds for one run's check (its end waits that long at most)
LINES_MAX = 64 << 20  # bytes of the lines of each kind (more: counted in one line)
FRAME_MAX = 16 << 20  # a frame from the child (its lines are capped above)
Lines = tuple[list[str], list[str]]


# --- the child -------------------------------------------------------------------------


class _HeldBox(ToolBox):
    """A tool sandbox boxyd holds for this child, called here through its pipes;
    ended by boxyd when the child closes it."""

    def __init__(self, conn: socket.socket, ident: int, fds: list[int], deadline: float) -> None:
        super().__init__(None, fds[0], fds[1], fds[2], deadline)
        self._conn, self._id = conn, ident

    def close(self) -> None:
        super().close()
        if self._id >= 0:
            self._id, ident = -1, self._id
            frames.send_frame(self._conn, {"close": ident})


def _remote_tools(conn: socket.socket) -> Opener:
    def open_box(exposure: Exposure) -> Box:
        frames.send_frame(conn, {"open": asdict(exposure)})
        got, fds, _, _ = socket.recv_fds(conn, frames.FRAME.size, 3)
        try:
            (size,) = frames.FRAME.unpack(frames.recv_exact_after(conn, got, frames.FRAME.size))
            reply = json.loads(frames.recv_exact(conn, size))
            if "error" in reply:
                raise ToolError(str(reply["error"]))
            if len(fds) != 3:
                raise ToolError("the tool sandbox's pipes did not come")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return _HeldBox(conn, int(reply["box"]), fds, float(reply["deadline"]))

    return open_box


class _DoorParser:
    """This child's Parser: every job through boxyd's door (parsedoor.parse)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn

    def parse(self, job: parsedoor.Job) -> object | parsedoor.Hostile:
        head = {"kind": job.kind.value, "arg": job.arg, "size": len(job.data)}
        frames.send_frame(self._conn, {"parse": head})
        self._conn.sendall(job.data)
        reply = frames.recv_frame(self._conn, FRAME_MAX)
        if "hostile" in reply:
            return parsedoor.Hostile(str(reply["hostile"]))
        if "raw" in reply:
            return frames.recv_exact(self._conn, int(reply["raw"]))
        value: object = reply["ok"]
        return value


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
    """The check, in the walk template's child; its lines sent as the wire says."""
    frames.send_frame(conn, {"pid": os.getpid()})
    # of each tree, the check needs what the walk saw of the tools' and the held files
    trees = {
        str(r): Tree(tools=walkwire.decode_tools(t), held=walkwire.decode_held(req["held"][r]))
        for r, t in req["tools"].items()
    }
    baselines = {str(r): walkwire.decode_snapshot(s) for r, s in req["baselines"].items()}
    edit = {str(r): [str(e) for e in rels] for r, rels in req["edit"].items()}
    with parsedoor.using(_DoorParser(conn)):
        git, tools = worktree.after(
            trees,
            baselines,
            str(req["quarantine"]),
            str(req["home"]),
            _remote_tools(conn),
            req["user_hooks"],
            edit,
        )
    git_b, tools_b = _blob(git, "findings"), _blob(tools, "tools' files")
    frames.send_frame(conn, {"done": {"git": len(git_b), "tools": len(tools_b)}})
    conn.sendall(git_b + tools_b)


# --- boxyd's side (a worker thread) -----------------------------------------------------


class _Serving:
    """What one child asks of boxyd, until it is done: tool sandboxes, parses."""

    def __init__(self, conn: socket.socket, tools: Opener, parser: parseproc.Apart) -> None:
        self._conn, self._tools, self._parser = conn, tools, parser
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
        elif "parse" in msg:
            self._parse(msg["parse"])
        elif "close" in msg:
            box = self._boxes.pop(int(msg["close"]), None)
            if box is not None:
                box.close()
        return None

    def _open(self, exp: dict[str, Any]) -> None:
        """A tool sandbox for the child: its pipes go there (SCM_RIGHTS, on the
        frame's first bytes); boxyd keeps its control socket, and ends it."""
        try:
            box = self._tools(
                Exposure(
                    str(exp["home"]),
                    tuple(str(p) for p in exp["read"]),
                    tuple(str(p) for p in exp["files"]),
                    tuple(str(p) for p in exp["execute"]),
                )
            )
        except (ToolError, BoxyError, OSError) as e:
            socket.send_fds(self._conn, [frames.frame({"error": str(e)})], [])
            return
        if not isinstance(box, ToolBox):
            box.close()
            socket.send_fds(self._conn, [frames.frame({"error": "not a tool sandbox"})], [])
            return
        ident = len(self._boxes) + 1
        self._boxes[ident] = box
        fds, deadline = box.handles()
        try:
            socket.send_fds(self._conn, [frames.frame({"box": ident, "deadline": deadline})], fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _parse(self, head: dict[str, Any]) -> None:
        """A job of the child's through boxyd's door; its bytes hashed and relayed."""
        size = int(head["size"])
        if not 0 <= size <= parseproc.DATA_MAX:
            raise BoxyError(f"a parse job of {size} bytes")
        kind, arg = parsedoor.Kind(head["kind"]), str(head["arg"])
        job = parsedoor.Job(kind, arg, frames.recv_exact(self._conn, size))
        got = parseproc.call_with(self._parser, functools.partial(parsedoor.parse, job))
        if isinstance(got, parsedoor.Hostile):
            frames.send_frame(self._conn, {"hostile": got.why})
        elif isinstance(got, bytes):
            frames.send_frame(self._conn, {"raw": len(got)})
            self._conn.sendall(got)
        else:
            frames.send_frame(self._conn, {"ok": got})

    def close(self) -> None:
        for box in self._boxes.values():
            box.close()
        self._boxes.clear()
        self._parser.close()


@dataclass(frozen=True)
class Check:
    """What the check after a run is given (worktree.after's arguments)."""

    trees: dict[str, Tree]
    baselines: dict[str, Snapshot]
    quarantine: str
    home: str
    tools: Opener
    user_hooks: str | None
    parser: Callable[[], parseproc.Apart]  # the run's parse child, for a miss
    edit: dict[str, list[str]]  # --edit-config's rels, by tree

    def here(self) -> Lines:
        """In this thread (no walk template): what it parses, apart all the same."""
        return parseproc.call_apart(
            self.parser,
            functools.partial(
                worktree.after,
                self.trees,
                self.baselines,
                self.quarantine,
                self.home,
                self.tools,
                self.user_hooks,
                self.edit,
            ),
        )


def check(conn: socket.socket, c: Check, budget: float = AFTER_BUDGET) -> Lines:
    """worktree.after in the child at the other end of CONN (a worker thread's call;
    CONN is closed after). Never raises: a check that failed or ran over BUDGET is one
    line per tree, as a tree not checked."""
    deadline = time.monotonic() + budget
    req = {
        "after": {
            "tools": {r: {k: list(v) for k, v in t.tools.items()} for r, t in c.trees.items()},
            "held": {r: walkwire.encode_held(t.held) for r, t in c.trees.items()},
            "edit": c.edit,
            "baselines": {r: walkwire.encode_snapshot(s) for r, s in c.baselines.items()},
            "quarantine": c.quarantine,
            "home": c.home,
            "user_hooks": c.user_hooks,
        }
    }
    pidfd = -1
    serving = _Serving(conn, c.tools, c.parser())
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
        return _unchecked(c.trees, f"the check ran over its {budget:g}s budget")
    except (BoxyError, OSError, EOFError, ValueError, KeyError, TypeError) as e:
        return _unchecked(c.trees, f"the check failed: {e}")
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
