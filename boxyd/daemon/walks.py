"""The walks before a run: a small tree walked in the daemon's walk pool, a larger one
asked of the walk process (boxyd/daemon/walkproc.py) from the event loop — a request socket
from the walk template, one frame out, one frame back.

If the walk template cannot be started, the walk runs in the daemon's walk pool as
before (slower for other sessions while it lasts, never less checked), and that is
logged.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
from collections.abc import Sequence
from typing import Any, NamedTuple

from boxy.errors import SetupError
from boxyd.daemon import afterproc, frames, livewatch, parseproc, pools, walkproc
from boxyd.daemon.stage2proc import Template
from boxyd.gitguard import userconfig
from boxyd.plan import walkwire, worktree
from boxyd.plan.live import Watched
from boxyd.plan.worktree import Tree

log = logging.getLogger("boxyd")
SMALL = 2000  # directories a walk may have in a thread (~20 ms of GIL): past it, a process


class Walked(NamedTuple):
    user_hooks: str | None  # the user's global core.hooksPath (userconfig.hooks_path)
    trees: dict[str, Tree]


MODULE = "boxyd.daemon.walkproc"
SPARE_AFTER = 0.25  # seconds after a spare is taken before the next is forked
RESCAN_TIMEOUT = 10.0  # seconds for one listing of the live guard's (50,000 entries: ~0.1 s)
RESCAN_REPLY_MAX = 16 << 20  # its paths (livewatch.FOUND_MAX of them)


class Walks:
    def __init__(self, module: str = MODULE) -> None:
        """MODULE: the walk template's (BOXY_WALK_MODULE: a test's own, whose parse
        children misbehave on purpose: tests/harness/hangwalk.py)."""
        # a child forked ahead: a run's parse child (or walk) takes it at once
        self.template = Template(module, socket.SOCK_STREAM, spare=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """On the event loop's thread (the template's death signal follows it)."""
        self._loop = asyncio.get_event_loop()
        try:
            self.template.start()
            self.template.prime()
        except SetupError as e:
            log.warning("%s", e)

    def _child(self) -> socket.socket:
        """For a worker thread: a fresh child of the walk template, waiting for its
        request. The template is only ever (re)started on the loop's thread."""
        if self._loop is None:
            raise SetupError("the walk template has not been started")

        async def spawn() -> socket.socket:
            # the next spare once this run's start is past (stage2proc.py's rule: a fork
            # takes a core the start needs)
            asyncio.get_running_loop().call_later(SPARE_AFTER, self.template.prime)
            return self.template.spawn(prime=False)

        conn = asyncio.run_coroutine_threadsafe(spawn(), self._loop).result(timeout=10)
        conn.setblocking(True)
        return conn

    def parse_child(self) -> socket.socket:
        """For a worker thread: a child serving parse jobs (parseproc.py)."""
        conn = self._child()
        frames.send_frame(conn, walkproc.PARSE)
        return conn

    def rescan(self, w: Watched, rels: list[str], limit: int) -> livewatch.Rescan:
        """For a worker thread: the live guard's listing of the directories it could not
        watch (livewatch.rescan), in a child; in this thread, logged, if the template
        cannot start. Raises OSError or SetupError when the child does not answer."""
        try:
            conn = self._child()
        except SetupError as e:
            log.warning("%s; listing in the daemon", e)
            return livewatch.rescan(w, rels, limit)
        with conn:
            conn.settimeout(RESCAN_TIMEOUT)
            frames.send_frame(conn, livewatch.rescan_request(w, rels, limit))
            reply = frames.recv_frame(conn, RESCAN_REPLY_MAX)
        if not isinstance(reply, dict) or "found" not in reply:
            why = reply.get("error") if isinstance(reply, dict) else None
            raise SetupError(f"the live guard's listing failed: {why or 'no answer'}")
        return livewatch.rescan_answer(w, reply)

    def after(self, check: afterproc.Check) -> tuple[list[str], list[str]]:
        """For a worker thread: the check after a run (worktree.after), in a child
        (afterproc.py); in this thread, logged, if the template cannot start."""
        try:
            conn = self._child()
        except SetupError as e:
            log.warning("%s; checking in the daemon", e)
            return check.here()
        return afterproc.check(conn, check)

    def apart(self) -> parseproc.Apart:
        """A Parser for one run's (or one check's) jobs, in worker threads."""
        return parseproc.Apart(self.parse_child)

    def close(self) -> None:
        self.template.close()

    async def prepare(
        self,
        roots: Sequence[str],
        *,
        home: str,
        git_guard: bool,
        created: Sequence[str],
        secrets: Sequence[str],
        parser: parseproc.Apart,
        small: int = SMALL,
    ) -> Walked:
        """HOME's user's hooks path and worktree.prepare: a small tree in the walk pool
        with it, in one round through the pool (each round is wake-ups of a thread and
        the loop: ~0.3 ms of a start), a larger one in a child of the walk template (a
        fork and its reply cost more than a small walk). Raises SetupError as it does."""
        user_hooks, small_trees = await pools.run(
            pools.WALKS, _small_walk, parser, home, roots, git_guard, created, secrets, small
        )
        if small_trees is not None:
            return Walked(user_hooks, small_trees)
        trees = await self._walk_apart(roots, git_guard, created, user_hooks, secrets, parser)
        return Walked(user_hooks, trees)

    async def _walk_apart(
        self,
        roots: Sequence[str],
        git_guard: bool,
        created: Sequence[str],
        user_hooks: str | None,
        secrets: Sequence[str],
        parser: parseproc.Apart,
    ) -> dict[str, Tree]:
        """A larger tree, walked in a child of the walk template (in the walk pool if
        the template cannot start)."""
        req = {
            "roots": list(roots),
            "git_guard": git_guard,
            "created": list(created),
            "user_hooks": user_hooks,
            "secrets": list(secrets),
        }
        try:
            conn = self.template.spawn()
        except SetupError as e:
            log.warning("%s; walking in the daemon", e)
            return await pools.run(
                pools.WALKS, _walk_here, parser, roots, git_guard, created, user_hooks, secrets
            )
        with conn:
            conn.setblocking(False)
            loop = asyncio.get_running_loop()
            data = json.dumps(req).encode()
            await loop.sock_sendall(conn, frames.FRAME.pack(len(data)) + data)
            reply = await _frame(loop, conn)
        if not isinstance(reply, dict) or "error" in reply:
            why = reply.get("error") if isinstance(reply, dict) else None
            raise SetupError(str(why or "the walk process gave no answer"))
        try:
            return await pools.run(pools.WALKS, _decode, reply["trees"])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise SetupError(f"the walk process gave an answer that cannot be read ({e})") from None


def _small_walk(
    parser: parseproc.Apart,
    home: str,
    roots: Sequence[str],
    git_guard: bool,
    created: Sequence[str],
    secrets: Sequence[str],
    limit: int,
) -> tuple[str | None, dict[str, Tree] | None]:
    """In the walk pool: HOME's user's hooks path, and the trees if none has more than
    LIMIT directories (None: walk them apart)."""
    user_hooks = userconfig.hooks_path(home)  # the user's own ~/.gitconfig: no payload's
    try:
        trees = _walk_here(parser, roots, git_guard, created, user_hooks, secrets, limit)
    except worktree.LargerThan:
        return user_hooks, None
    return user_hooks, trees


def _walk_here(
    parser: parseproc.Apart,
    roots: Sequence[str],
    git_guard: bool,
    created: Sequence[str],
    user_hooks: str | None,
    secrets: Sequence[str],
    limit: int | None = None,
) -> dict[str, Tree]:
    """worktree.prepare in this thread, what it parses of the payload's through PARSER."""
    return parseproc.call_with(
        parser,
        functools.partial(
            worktree.prepare,
            roots,
            git_guard=git_guard,
            created=created,
            user_hooks=user_hooks,
            secrets=secrets,
            **({"limit": limit} if limit is not None else {}),
        ),
    )


async def _frame(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> Any:
    async def exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = await loop.sock_recv(conn, min(n - len(out), 1 << 20))
            if not chunk:
                raise SetupError("the walk process ended without an answer")
            out += chunk
        return bytes(out)

    (size,) = frames.FRAME.unpack(await exactly(frames.FRAME.size))
    if size > walkproc.REPLY_MAX:
        raise SetupError(
            f"the walk process answered {size} bytes (more than {walkproc.REPLY_MAX >> 20} MiB)"
        )
    return json.loads(await exactly(size))


def _decode(trees: dict[str, Any]) -> dict[str, Tree]:
    return {str(root): walkwire.decode(t) for root, t in trees.items()}
