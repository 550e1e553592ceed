"""The core of `diff`, `apply` and `discard` (docs/design.md, "Changes held for
review"): a held session's review found, the session checked to have ended, the
work given to the review child (reviewproc), the layers dropped once nothing is
left. Both front ends call these through the Manager; no wire format here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from boxy.errors import UsageError
from boxyd.daemon import pools, review, reviewproc
from boxyd.daemon.review import Review

# one review's apply or discard at a time: two applies of one session would race
_locks: dict[str, asyncio.Lock] = {}


async def held(sid: str, running: bool) -> Review:
    """Session SID's review; refused in one line while it runs or when it has none."""
    if running:
        raise UsageError(f"session {sid} still runs: its changes are reviewed once it ends")
    found = await pools.run(pools.RECORDS, review.get, sid)
    if found is None:
        raise UsageError(
            f"session {sid} holds no changes for review (run without --review, or "
            "already applied or discarded)"
        )
    return found


def _request(r: Review, op: str, **more: Any) -> dict[str, Any]:
    ctx = {
        "generated": r.generated,
        "allow_git_write": r.allow_git_write,
        "edit_config": r.edit_config,
    }
    return {
        "op": op,
        "upper": r.upper,
        "workdir": r.workdir,
        "ident": r.ident,
        "ctx": ctx,
        **more,
    }


async def diff(r: Review, text: bool = True) -> dict[str, Any]:
    """{"changes": [...], "text": the unified diff} (reviewtree.Change.to_wire each)."""
    return await reviewproc.call(_request(r, "diff", text=text))


async def apply(r: Review, paths: list[str] | None) -> dict[str, Any]:
    """Land PATHS (None: all) of the review; {"applied", "refused": [[path, why]],
    "left", "closed"}: closed when nothing is left and the layers are gone."""
    async with _locks.setdefault(r.id, asyncio.Lock()):
        got = await reviewproc.call(_request(r, "apply", paths=paths, since_ns=r.since_ns))
        got["closed"] = got["left"] == 0
        if got["closed"]:
            await pools.run(pools.ASKED, review.discard, r.id)
    return got


async def discard(r: Review) -> None:
    async with _locks.setdefault(r.id, asyncio.Lock()):
        await pools.run(pools.ASKED, review.discard, r.id)
