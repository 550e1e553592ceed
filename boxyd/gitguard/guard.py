"""The git guard for one run, as the daemon uses it: the baselines of live sessions,
and the post-run check. (The walk before the run is boxyd/worktree.py: it serves the
credentials too.) The check is blocking (tree walks, git subprocesses): the daemon
runs it in a worker thread, never on its event loop.

Sessions live at the same time on overlapping trees share the user's baseline: a new
session's baseline is, where the trees overlap, the one the live session took when it
started (scan.inherit), so one run cannot plant a file for another to launder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from boxyd.gitguard import scan


def inherit_live(own: dict[str, scan.Snapshot], live: Sequence[scan.Snapshot]) -> dict[str, scan.Snapshot]:
    """OWN, where it overlaps a tree a live session runs on, replaced by that session's
    baseline. LIVE: oldest first. Taken once the walk is done, so that every session
    whose payload started before this walk ended is in it (a session sets its baselines
    before its payload starts)."""
    out = {}
    for root, snap in own.items():
        for older in reversed(live):  # newest first: the oldest live baseline wins
            snap = scan.inherit(snap, older)
        out[root] = snap
    return out


def check(baselines: dict[str, scan.Snapshot], quarantine: str, home: str) -> list[str]:
    """After the run: quarantine what would make the host's git run a command; one line
    per finding. Never raises: a tree that cannot be checked is itself a finding."""
    lines: list[str] = []
    for root, before in baselines.items():
        dest = os.path.join(quarantine, root.strip("/").replace("/", "_"))
        try:
            findings = scan.scan(root, before, dest, home)
        except OSError as e:
            lines.append(f"git guard: {root} could not be checked ({e}); check it before running "
                         "git there")
            continue
        lines.extend(scan.describe(findings))
    return lines
