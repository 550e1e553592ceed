"""The baselines of sessions live on overlapping trees (the walks before and after a
run are boxyd/worktree.py: they serve the credentials and the tools' files too).

Sessions live at the same time on overlapping trees share the user's baseline: a new
session's baseline is, where the trees overlap, the one the live session took when it
started (scan.inherit), so one run cannot plant a file for another to launder.
"""

from __future__ import annotations

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
