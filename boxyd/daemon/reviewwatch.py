"""The --review layer's own limit (--review-limit; docs/design.md, "Changes held for
review"). No controller bounds what one directory holds on a disk an unprivileged
user shares, so the limit is checked, not enforced by the kernel: the review child
measures the upper layer (reviewtree.footprint) again and again while the payload
runs, and past the limit, or past the entries a review can read, the run is stopped
and what it wrote stays held. Between two checks the payload can write past it by
what it writes in that time; the README says so. A walk is no snapshot: a payload
that keeps moving a directory could keep it from every walk, so where the run has a
cgroup it is frozen while it is measured (scopes.freeze_own), and the walk is exact.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from boxy import values
from boxy.errors import BoxyError
from boxyd.daemon import reviewproc
from boxyd.plan.reviewtree import MAX_ENTRIES

log = logging.getLogger(__name__)

FIRST = 1.0  # seconds before the first check
SHARE = 0.05  # the checks take at most this share of the time (wall) ...
LONGEST = 15.0  # ... and wait at most this long between two
BUDGET = 30.0  # seconds one measure may take: past it the run is stopped


Freezer = Callable[[bool], Awaitable[bool]]  # freeze (True) or thaw the run: done?


class ReviewWatch:
    """Measures UPPER while the run lasts; STOP(line) ends the run past LIMIT bytes.
    FREEZE: the run's cgroup frozen for each measure, where it has one."""

    def __init__(
        self, upper: str, limit: int, stop: Callable[[str], None], freeze: Freezer | None = None
    ) -> None:
        self.upper, self.limit, self._stop, self._freeze = upper, limit, stop, freeze
        self.stopped: str | None = None  # the line said when it stopped the run
        self.frozen = 0  # measures made with the run frozen (the audit log's)

    async def measure(self, running: bool = True) -> tuple[int, int]:
        """(bytes, entries) of the layer; RUNNING: the payload may still write, so its
        cgroup is frozen meanwhile where it can be, and thawed whatever happens."""
        freeze = self._freeze if running else None
        if freeze is not None and await freeze(True):
            self.frozen += 1
        try:
            got = await reviewproc.call({"op": "size", "upper": self.upper}, budget=BUDGET)
        finally:
            if freeze is not None:
                await self._thaw(freeze)
        return int(got["bytes"]), int(got["entries"])

    async def _thaw(self, freeze: Freezer) -> None:
        """Thawed even when the watch is cancelled meanwhile; a run that cannot be
        thawed is stopped (it would hang frozen)."""
        for _ in range(3):
            if await asyncio.shield(freeze(False)):
                return
        self._end("its run could not be thawed after a measure: the run was stopped")

    async def run(self) -> None:
        """Until the run ends (cancelled) or it stopped the run."""
        wait = FIRST
        while self.stopped is None:
            await asyncio.sleep(wait)
            began = time.monotonic()
            try:
                size, entries = await self.measure()
            except BoxyError as e:  # fails closed: a layer it cannot measure is stopped
                self._end(f"its layer could not be measured ({e}): the run was stopped")
                return
            if self.stopped is not None:  # (not thawed)
                return
            line = self.over(size, entries)
            if line is not None:
                self._end(f"{line}: the run was stopped")
                return
            wait = min(LONGEST, max(FIRST, (time.monotonic() - began) / SHARE))

    def over(self, size: int, entries: int) -> str | None:
        """The line for a layer past its limit, or None."""
        if size > self.limit:
            return (
                f"--review: its layer holds {values.format_size(size)}, past its limit of "
                f"{values.format_size(self.limit)} (--review-limit)"
            )
        if entries > MAX_ENTRIES:
            return f"--review: its layer holds more than {MAX_ENTRIES:,} entries, past what a review reads"
        return None

    def _end(self, line: str) -> None:
        self.stopped = line if line.startswith("--review") else f"--review: {line}"
        log.info("%s", self.stopped)
        self._stop(self.stopped)
