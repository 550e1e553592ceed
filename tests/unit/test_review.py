"""--review's pure parts: which tree a path is generated in, what apply holds by the
guards' path rules, the choice of paths, and `diff`'s summary text (the overlay
itself is tested on the real kernel: tests/integration/test_review.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from boxyctl.review import summary_lines
from boxyd.plan.reviewland import select
from boxyd.plan.reviewtree import Change, Context, ReviewError, generated_root, held


def test_a_generated_tree_is_found_by_name_at_any_depth_or_by_path_from_the_top() -> None:
    globs = ["node_modules", "build/out", "*.egg-info"]
    assert generated_root("node_modules/a/index.js", globs) == "node_modules"
    assert generated_root("pkg/node_modules/b.js", globs) == "pkg/node_modules"
    assert generated_root("build/out/x.o", globs) == "build/out"
    assert generated_root("src/build/out/x.o", globs) == ""
    assert generated_root("boxy.egg-info/PKG-INFO", globs) == "boxy.egg-info"
    assert generated_root("src/app.py", globs) == ""


def test_apply_holds_what_the_guards_hold() -> None:
    ctx = Context()
    assert "device node, FIFO" in held("pipe", "special", ctx)
    assert "git control file" in held("sub/.git/hooks/post-checkout", "file", ctx)
    assert held("sub/.git/hooks/post-checkout", "file", Context(allow_git_write=True)) == ""
    assert "host programs obey" in held(".claude/settings.json", "file", ctx)
    assert "host programs obey" in held(".envrc", "file", ctx)
    assert held(".envrc", "file", Context(edit_config=[".envrc"])) == ""
    assert held("src/app.py", "file", ctx) == ""


def test_paths_choose_entries_with_the_directories_they_need() -> None:
    ch = [
        Change("src", "added", "dir"),
        Change("src/a.py", "added", "file"),
        Change("src/b.py", "added", "file"),
        Change("README", "changed", "file"),
    ]
    assert [c.path for c in select(ch, ["./src/a.py"])] == ["src", "src/a.py"]
    assert [c.path for c in select(ch, ["src"])] == ["src", "src/a.py", "src/b.py"]
    assert len(select(ch, None)) == len(select(ch, ["."])) == 4
    with pytest.raises(ReviewError, match="not among the session's changes"):
        select(ch, ["nope"])
    with pytest.raises(ReviewError, match="not inside the work directory"):
        select(ch, ["../etc/passwd"])


def test_the_summary_folds_a_generated_tree_into_one_line() -> None:
    changes: list[dict[str, Any]] = [
        {"path": "src/app.py", "kind": "changed", "type": "file", "size": 24},
        {"path": "old.txt", "kind": "removed", "type": "file", "size": 4},
        {"path": "leak", "kind": "added", "type": "symlink", "size": 9, "target": "/etc/x"},
        *(
            {"path": f"node_modules/m{i}.js", "kind": "added", "type": "file", "size": 100,
             "generated": "node_modules"}
            for i in range(3)
        ),
        {"path": "pipe", "kind": "added", "type": "special", "held": "a FIFO: never applied"},
    ]  # fmt: skip
    lines = summary_lines(changes)
    assert "M src/app.py  24B" in lines
    assert "D old.txt  4B" in lines
    assert "A leak -> /etc/x  9B" in lines
    assert any(x.startswith("A pipe") and "[held: a FIFO: never applied]" in x for x in lines)
    assert [x for x in lines if "node_modules" in x] == [
        "G node_modules/  3 entries added, 300B (generated: listed, not diffed)"
    ]
    assert lines[-1] == "5 added, 1 changed, 1 removed; 333B to land"
    assert summary_lines([]) == ["no changes"]


def test_a_layer_footprint_counts_what_apply_would_write(tmp_path: Path) -> None:
    """A sparse file counts its length (apply writes all of it), each hard link as a
    file of its own (apply writes every name), a symlink is not followed, and the
    walk stops past its cap."""
    from boxyd.plan.reviewtree import footprint

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * 10_000)
    os.link(tmp_path / "d" / "a", tmp_path / "d" / "b")
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)
    (tmp_path / "out").symlink_to("/usr")
    size, entries = footprint(str(tmp_path))
    assert entries == 5
    assert (1 << 30) + 20_000 <= size < (1 << 30) + 200_000, size
    _, capped = footprint(str(tmp_path), cap=1)
    assert capped < entries


def test_a_watched_layer_says_which_bound_it_passed() -> None:
    from boxyd.daemon.reviewwatch import ReviewWatch
    from boxyd.plan.reviewtree import MAX_ENTRIES

    w = ReviewWatch("/nowhere", 1 << 20, lambda line: None)
    assert w.over(1 << 20, 10) is None
    assert w.over((1 << 20) + 1, 10) == (
        "--review: its layer holds 1.0MiB, past its limit of 1.0MiB (--review-limit)"
    )
    assert w.over(0, MAX_ENTRIES + 1) == (
        f"--review: its layer holds more than {MAX_ENTRIES:,} entries, past what a review reads"
    )


def test_git_working_state_is_folded_into_one_held_line_per_gitdir() -> None:
    """A commit in a reviewed run writes dozens of entries under .git, all held: one
    line for them per gitdir; a hook or config keeps its own line."""
    from boxyctl.review import folded_git, git_work

    assert git_work(".git/objects/ab/cdef") == ".git"
    assert git_work("sub/.git/refs/heads/main") == "sub/.git"
    assert git_work(".git/HEAD") == ".git" and git_work(".git/index") == ".git"
    assert git_work(".git/hooks/pre-commit") == "" and git_work(".git/config") == ""
    assert git_work(".git/objects") == ".git" and git_work(".git") == ""
    assert git_work("src/objects/x") == ""
    held = "a git control file"
    changes = [
        {"path": f".git/objects/0{i}/x", "kind": "added", "type": "file", "held": held}
        for i in range(5)
    ] + [
        {"path": ".git/hooks/pre-commit", "kind": "added", "type": "file", "held": held},
        {"path": "src/app.py", "kind": "changed", "type": "file"},
    ]
    lines = summary_lines(changes)
    assert [x.split("  ")[0] for x in lines[:-1]] == [
        "A .git/hooks/pre-commit",
        "M src/app.py",
        "H .git/",
    ]
    assert "5 entries git writes as it works" in lines[2]
    rest, by_dir = folded_git([(c["path"], c.get("held", "")) for c in changes])
    assert by_dir == {".git": 5} and [p for p, _ in rest] == [".git/hooks/pre-commit", "src/app.py"]
