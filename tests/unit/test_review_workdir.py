"""reviewtree.open_workdir on real directories: diff and apply open the host's work
directory by its path, no symlink followed, and only when it is the directory the
session ran in (docs/design.md, "Apply lands in the directory the run held")."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from boxyd.plan import reviewland, reviewtree
from boxyd.plan.reviewtree import Context, ReviewError


def _ident(p: Path) -> tuple[int, int]:
    st = os.stat(p)
    return st.st_dev, st.st_ino


def _held(tmp_path: Path) -> tuple[Path, Path, tuple[int, int]]:
    upper, work = tmp_path / "upper", tmp_path / "a" / "proj"
    upper.mkdir()
    work.mkdir(parents=True)
    (upper / "planted.sh").write_text("evil\n")
    return upper, work, _ident(work)


def test_the_directory_the_run_held_is_read_and_landed(tmp_path: Path) -> None:
    upper, work, ident = _held(tmp_path)
    changes = reviewtree.read(str(upper), str(work), Context(), ident)
    got = reviewland.land(str(upper), str(work), changes, time.time_ns(), ident)
    assert got.applied == ["planted.sh"] and (work / "planted.sh").exists()


@pytest.mark.parametrize("swap", ["symlink", "directory"])
def test_a_directory_swapped_in_at_its_path_is_refused(tmp_path: Path, swap: str) -> None:
    """The directory above moved away, a symlink to another directory (or another
    directory) left at the work directory's path: read and land refuse, nothing lands."""
    upper, work, ident = _held(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "a").rename(tmp_path / "b")
    (tmp_path / "a").mkdir()
    if swap == "symlink":
        work.symlink_to(elsewhere)
    else:
        work.mkdir()
    with pytest.raises(ReviewError, match="not the one the session ran in"):
        reviewtree.read(str(upper), str(work), Context(), ident)
    changes = reviewtree.read(str(upper), str(tmp_path / "b" / "proj"), Context())
    with pytest.raises(ReviewError, match="not the one the session ran in"):
        reviewland.land(str(upper), str(work), changes, time.time_ns(), ident)
    assert os.listdir(elsewhere) == [] and os.listdir(work) == []
