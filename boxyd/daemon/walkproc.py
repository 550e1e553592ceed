"""The walks before a run, in a process of their own.

A walk of a large tree is Python bytecode per entry: in a thread of boxyd it holds
the GIL that every other session's start-up needs (another session's start-up took
170 ms instead of 53 ms during a 300,000-directory walk on a loaded 2-core machine).
So boxyd keeps a walk template (``python -I -m boxyd.daemon.walkproc``, started with the
first run that walks; boxyd/stage2/template.py) that has imported the walk once and
forks one child per run's walk.

The wire, on the request's stream socket: boxyd sends one frame (8-byte length, then
JSON {"roots", "git_guard", "created", "user_hooks", "secrets"}); the child answers
one frame: {"trees": {root: walkwire.encode(tree)}} or {"error": line}.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from boxy.errors import SetupError
from boxyd.config import parsedoor
from boxyd.daemon import afterproc, livewatch, parseproc
from boxyd.daemon.frames import FRAME as FRAME
from boxyd.daemon.frames import recv_frame, send_frame
from boxyd.plan import walkwire, worktree
from boxyd.stage2 import template

REQUEST_MAX = 1 << 30  # boxyd's own: an after-run check carries the run's baselines
REPLY_MAX = 1 << 30  # a tree of 3,000 nested repositories is a few MiB


def walk(req: dict[str, Any]) -> dict[str, Any]:
    """One run's walk; a refusal (a tree too large, a race) comes back as its line."""
    try:
        trees = worktree.prepare(
            [str(r) for r in req["roots"]],
            git_guard=bool(req["git_guard"]),
            created=[str(c) for c in req["created"]],
            user_hooks=req["user_hooks"],
            secrets=[str(s) for s in req["secrets"]],
        )
    except SetupError as e:
        return {"error": str(e)}
    return {"trees": {root: walkwire.encode(tree) for root, tree in trees.items()}}


# A walk of a big tree is CPU for seconds; other sessions' start-ups, tens of
# milliseconds each, come first (nice 10: the walk still gets a core when they idle).
WALK_NICENESS = 10


PARSE = {"serve": "parse"}  # the request that makes a child a parse child (parseproc.py)


def child(conn: socket.socket) -> int:
    req: Any = None
    try:
        req = recv_frame(conn, REQUEST_MAX)
        if req == PARSE:  # boxyd's walk in its own thread parses through this child
            return parseproc.serve(conn)
        if "rescan" in req:  # the live guard's (livewatch.py): its window, not niced
            reply = livewatch.rescan_reply(req["rescan"])
            send_frame(conn, reply)
            return 0
        if "after" in req:  # the check after a run: a wire of its own (afterproc.py);
            # not niced: the run's end waits for it, as it waited for it in boxyd
            afterproc.child(conn, req["after"])
            conn.recv(1)  # boxyd closes first: the pid it was told stays this process's
            return 0
        os.setpriority(os.PRIO_PROCESS, 0, WALK_NICENESS)
        reply = _walk_apart(req)
    except Exception as e:  # a bug, not a refusal: said as one, rather than a silent end
        reply = {"error": f"the walk: internal error: {type(e).__name__}: {e}"}
    try:
        send_frame(conn, reply)
        if isinstance(req, dict) and "after" in req:  # its error, after its hello
            conn.recv(1)
    except OSError:
        return 1
    return 0


def _walk_apart(req: dict[str, Any]) -> dict[str, Any]:
    """walk(), its parses in a child of ours, each job within its budget."""
    parser = parseproc.Apart(parseproc.fork_child)
    try:
        with parsedoor.using(parser):
            return walk(req)
    finally:
        parser.close()
        parseproc.reap_children()


if __name__ == "__main__":
    os._exit(template.main(child))
