"""The review child (docs/design.md, "Nothing the payload wrote is parsed in boxyd's
process"): `diff` and `apply` read the upper layer, the payload's writing, so they
run in a process of their own (``python -I -m boxyd.daemon.reviewproc``) under
RLIMIT_CPU and RLIMIT_AS, with a wall budget boxyd enforces by killing it. One JSON
request on stdin, one JSON reply on stdout ({"error": line} when it refuses).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sys
from typing import Any

from boxy.errors import SetupError, UsageError
from boxyd.daemon import reviewgit
from boxyd.plan import reviewdiff, reviewland, reviewtree
from boxyd.plan.reviewtree import Context, ReviewError
from boxyd.stage2 import caps, namespaces

CPU_LIMIT = 120  # seconds of CPU one review call may use
AS_LIMIT = 2 << 30
BUDGET = 300.0  # seconds of wall time (a 10,000-file apply takes a few)
OUT_MAX = 256 << 20  # bytes of a reply boxyd reads


def _handle(req: dict[str, Any]) -> dict[str, Any]:
    if req["op"] == "size":  # the watch of a running review (daemon/reviewwatch.py)
        size, entries = reviewtree.footprint(req["upper"])
        return {"bytes": size, "entries": entries}
    ctx = Context(**req["ctx"])
    # every open of the host's work directory is checked to be the one the run held
    # (reviewtree.open_workdir); this first one says so before anything is judged
    workdir, ident = req["workdir"], _ident(req.get("ident"))
    os.close(reviewtree.open_workdir(workdir, ident))
    if not ctx.allow_git_write:  # what the host's git would obey once it landed
        ctx.git = reviewgit.places(req["upper"], workdir, ident)
    changes = reviewtree.read(req["upper"], workdir, ctx, ident)
    if req["op"] == "diff":
        text = ""
        if req.get("text", True):
            ufd = os.open(req["upper"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            hfd = reviewtree.open_workdir(workdir, ident)
            try:
                text = reviewdiff.diffs(ufd, hfd, changes)
            finally:
                os.close(ufd)
                os.close(hfd)
        return {"changes": [c.to_wire() for c in changes], "text": text}
    chosen = reviewland.select(changes, req.get("paths"))
    landed = reviewland.land(req["upper"], workdir, chosen, int(req["since_ns"]), ident)
    left = len(reviewtree.read(req["upper"], workdir, ctx, ident))
    return {"applied": landed.applied, "refused": landed.refused, "left": left}


def _ident(raw: object) -> tuple[int, int] | None:
    """review.json's [st_dev, st_ino] of the work directory, or None (an older review)."""
    if isinstance(raw, list) and len(raw) == 2 and all(isinstance(n, int) for n in raw):
        return raw[0], raw[1]
    return None


def _as_the_layers_owner() -> None:
    """The layer is the user's, but its modes are the payload's: a directory of mode
    000 kept what it held from the measure (past --review-limit unseen) and made
    diff fail. In a user namespace of its own, with CAP_DAC_READ_SEARCH alone, this
    process reads and searches what the user owns whatever its mode: no mode of the
    layer is changed (it is what is reviewed, and the payload's while it runs), and it
    writes nowhere the user could not (no CAP_DAC_OVERRIDE: apply still cannot write
    into a directory the user made read-only)."""
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    # reviewgit's child maps the user to itself again in a namespace of its own: for
    # uid 0 (boxyd's core under the suite's in-process tests, as root) the kernel
    # wants CAP_SETFCAP for that (Linux 5.12 on); a user's boxyd never holds it
    root = (caps.CAP_SETFCAP,) if os.getuid() == 0 else ()
    caps.keep_only(caps.CAP_DAC_READ_SEARCH, *root)


def main() -> int:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT + 1))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    req = json.loads(sys.stdin.buffer.read())
    try:
        _as_the_layers_owner()
        reply = _handle(req)
    except (ReviewError, OSError, SetupError) as e:
        what = f"{e.filename}: " if isinstance(e, OSError) and e.filename else ""
        reply = {"error": f"{what}{e.strerror if isinstance(e, OSError) else e}"}
    sys.stdout.write(json.dumps(reply))
    return 0


async def call(req: dict[str, Any], budget: float = BUDGET) -> dict[str, Any]:
    """REQ answered by a fresh child; a child past BUDGET is killed and that said."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-m", "boxyd.daemon.reviewproc",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={}, cwd="/", limit=OUT_MAX,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(json.dumps(req).encode()), budget)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SetupError(f"review: gave no answer within {budget:g} s (stopped)") from None
    if proc.returncode != 0 or len(out) > OUT_MAX:
        raise SetupError(f"review: its child ended with status {proc.returncode}")
    reply: dict[str, Any] = json.loads(out)
    if "error" in reply:
        raise UsageError(f"review: {reply['error']}")
    return reply


_overlay: tuple[bool, str] | None = None


async def overlay_works() -> tuple[bool, str]:
    """Whether this kernel gives --review its overlay (the doctor's probe, in a child;
    asked once per daemon: the kernel does not change under it)."""
    global _overlay
    if _overlay is None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-m", "boxyd.daemon.doctor", "--overlay",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, cwd="/",
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 10.0)
            got = json.loads(out)
            _overlay = bool(got["ok"]), str(got["why"])
        except (TimeoutError, ValueError, KeyError):
            if proc.returncode is None:
                proc.kill()
            return False, "the overlay probe gave no answer"
    return _overlay


if __name__ == "__main__":
    sys.exit(main())
