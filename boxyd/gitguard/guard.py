"""The git guard for one run, as the daemon uses it: before the run, one walk per
writable tree gives both the mounts that pin its control entries and the baseline the
post-run check compares against; after it, the check. Both are blocking (tree walks,
git subprocesses): the daemon runs them in a worker thread, never on its event loop.

Sessions live at the same time on overlapping trees share the user's baseline: a new
session's baseline is, where the trees overlap, the one the live session took when it
started (scan.inherit), so one run cannot plant a file for another to launder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from boxyd.errors import SetupError
from boxyd.gitguard import discover, scan
from boxyd.gitguard.discover import Protection


@dataclass(frozen=True)
class Prepared:
    protections: dict[str, list[Protection]]  # by writable root
    baselines: dict[str, scan.Snapshot]  # by writable root


def prepare(roots: Sequence[str]) -> Prepared:
    """Walk each tree once: pin, create absent hooks directories, fingerprint."""
    protections: dict[str, list[Protection]] = {}
    baselines: dict[str, scan.Snapshot] = {}
    for root in roots:
        try:
            lay = discover.layout(root)
            protections[root] = discover.plan_protections(lay)
            discover.prepare(root, protections[root])
            own = scan.snapshot(root, lay)
        except discover.TooLarge as e:
            raise SetupError(f"git guard: {root} holds {e}, too many to check; narrow the work "
                             "directory, or run with --allow-git-write") from e
        except OSError as e:
            where = e.filename if isinstance(e.filename, str) else root
            raise SetupError(f"git guard: {where}: {e.strerror or e} (the tree changed while it "
                             "was being read?); run again") from e
        baselines[root] = own
    return Prepared(protections, baselines)


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
