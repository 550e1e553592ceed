"""boxyd's worker pools, one per purpose, each bounded.

asyncio's default executor used to run every blocking step of every session: the
spec build (which asks npm and pip in tool sandboxes), the walks before a run, the
checks after one (the host's git in tool sandboxes, up to CHECKS_BUDGET each) and
the records. Three sessions whose after-run checks were slow then held every worker,
and an unrelated run waited minutes to start. Here each purpose has workers of its
own: a run's start waits only on other starts (each bounded by its budget), never on
another session's walks or checks.

- START: a run's spec (registry settings), opening its host outputs, small reads on
  the way to the payload (the scope's counters);
- WALKS: the walk of each writable tree before the payload starts;
- CHECKS: the git guard's scan and the tools' files after a run (worktree.after);
- WATCHES: the live guard's watches and listings (a session's start, new directories:
  never behind another session's walk);
- LIVE: the live guard's redos, whose time is the payload's window on a changed file
  (small reads; never behind a listing);
- RECORDS: session records, pruning, the full lists beside a record;
- CLOSING: descriptors whose close(2) waits on the kernel (an inotify instance's
  close waits for an RCU grace period: ~10 ms, never on the event loop);
- WHO: which program in a sandbox sent a flow --ask asks about (a bounded walk of
  /proc: boxyd/daemon/who.py), never behind a client's question;
- ASKED: a client's questions that take work (doctor's checks, `profile show`,
  `trust`), each in a process or sandbox of its own and bounded.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# workers per pool: enough for a few sessions at once on a 2-core machine; threads are
# made only when needed
START = ThreadPoolExecutor(max_workers=8, thread_name_prefix="boxyd-start")
WALKS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="boxyd-walk")
CHECK_WORKERS = 4  # the after-run checks at once (the rest wait their turn)
CHECKS = ThreadPoolExecutor(max_workers=CHECK_WORKERS, thread_name_prefix="boxyd-checks")
WATCHES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="boxyd-watches")
LIVE = ThreadPoolExecutor(max_workers=2, thread_name_prefix="boxyd-live")
RECORDS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="boxyd-records")
CLOSING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="boxyd-closing")
ASKED = ThreadPoolExecutor(max_workers=2, thread_name_prefix="boxyd-asked")
WHO = ThreadPoolExecutor(max_workers=2, thread_name_prefix="boxyd-who")


def submit(
    pool: ThreadPoolExecutor, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> asyncio.Future[R]:
    """FN(*ARGS, **KWARGS) in POOL, as a future of the running loop (the caller's
    context variables go with it, as with asyncio.to_thread)."""
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)
    return asyncio.get_running_loop().run_in_executor(pool, call)


async def run(pool: ThreadPoolExecutor, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """asyncio.to_thread, in POOL."""
    return await submit(pool, fn, *args, **kwargs)
