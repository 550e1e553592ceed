"""Session records and quarantines do not grow forever: the newest KEEP stay, and none
older than MAX_AGE. The directories are boxyd's own ($XDG_STATE_HOME/boxy), never a
tree the payload writes; pruning runs in a worker thread after a run."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path

DAY = 86400.0
RECORDS = (500, 30 * DAY)  # sessions/<id>: how many, how old
QUARANTINE = (500, 90 * DAY)  # quarantine/<id>: evidence of an attack, kept longer


def expired(
    entries: Iterable[tuple[str, float]], now: float, keep: int, max_age: float
) -> list[str]:
    """Pure: the names to remove from (name, mtime) pairs — beyond the KEEP newest, or
    older than MAX_AGE."""
    ordered = sorted(entries, key=lambda e: e[1], reverse=True)
    return [name for i, (name, mtime) in enumerate(ordered) if i >= keep or now - mtime > max_age]


def prune(directory: Path, keep: int, max_age: float, *, now: float | None = None) -> list[str]:
    """Remove the expired entries of DIRECTORY (directories only; nothing followed)."""
    try:
        with os.scandir(directory) as it:
            entries = [
                (e.name, e.stat(follow_symlinks=False).st_mtime)
                for e in it
                if stat.S_ISDIR(e.stat(follow_symlinks=False).st_mode)
            ]
    except OSError:
        return []
    gone = expired(entries, time.time() if now is None else now, keep, max_age)
    for name in gone:
        with contextlib.suppress(OSError):
            shutil.rmtree(directory / name)  # fd-based: a symlink inside is not followed
    return gone


def prune_state(state: Path) -> None:
    prune(state / "sessions", *RECORDS)
    prune(state / "quarantine", *QUARANTINE)
