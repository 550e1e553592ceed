"""--mkdir's directory is made by the walk before the run (worktree.make_missing), so
the live guard watches it from the start; never through a symlink."""

from __future__ import annotations

from pathlib import Path

import pytest

from boxy.errors import SetupError
from boxyd.plan import worktree


def test_a_missing_directory_and_its_parents_are_made_and_walked_empty(tmp_path: Path) -> None:
    new = tmp_path / "a" / "b" / "made"
    trees = worktree.prepare([str(new)], git_guard=True, created=[str(new)])
    assert new.is_dir() and not any(new.iterdir())
    tree = trees[str(new)]
    assert tree.baseline is not None and not tree.credentials
    assert "" in tree.dirs  # the live guard's: the directory itself is watched


def test_a_symlink_on_the_way_is_refused_and_nothing_is_made_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(SetupError, match="--mkdir"):
        worktree.make_missing(str(tmp_path / "link" / "made"))
    assert not any(elsewhere.iterdir())
