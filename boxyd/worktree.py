"""The run's one walk of each writable tree, before the payload starts: what the git
guard pins and fingerprints, and which credentials are covered. Blocking (a tree can
hold hundreds of thousands of directories): the daemon runs it in a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from boxyd.errors import SetupError
from boxyd.gitguard import discover, scan
from boxyd.gitguard.discover import Protection
from boxyd.masking import Finder, Found


@dataclass(frozen=True)
class Tree:
    protections: list[Protection] = field(default_factory=list)  # empty with --allow-git-write
    baseline: scan.Snapshot | None = None  # None with --allow-git-write
    credentials: list[Found] = field(default_factory=list)


def walk(root: str, *, git_guard: bool) -> Tree:
    """One walk of ROOT: the git layout (pinned, absent hooks directories created, then
    fingerprinted) and the credentials found on the way."""
    try:
        root_fd = discover.open_root(root)
        try:
            finder = Finder(root_fd, [os.path.abspath(root), os.path.realpath(root)])
            lay = discover.Walker(root, root_fd, observer=finder).run()
            finder.git_configs(lay)
        finally:
            os.close(root_fd)
        found = sorted(finder.found.values(), key=lambda f: f.rel)
        if not git_guard:
            return Tree(credentials=found)
        prots = discover.plan_protections(lay)
        discover.prepare(root, prots)
        return Tree(prots, scan.snapshot(root, lay), found)
    except discover.TooLarge as e:
        raise SetupError(f"{root} holds {e}, too many to check; narrow the work directory") from e
    except OSError as e:
        where = e.filename if isinstance(e.filename, str) else root
        raise SetupError(f"{where}: {e.strerror or e} (the tree changed while it was being read?); "
                         "run again") from e


def prepare(roots: Sequence[str], *, git_guard: bool) -> dict[str, Tree]:
    return {root: walk(root, git_guard=git_guard) for root in roots}
