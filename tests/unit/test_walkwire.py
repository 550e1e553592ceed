"""The walk's result as data (boxyd/plan/walkwire.py), and the walk process end to end."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from boxy.errors import SetupError
from boxyd.daemon.walks import Walked, Walks
from boxyd.plan import live, walkwire, worktree

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent", "PATH": "/usr/bin:/bin"}


def _tree(tmp_path: Path) -> Path:
    work = tmp_path / "w"
    (work / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(work)], check=True, env=GIT_ENV)
    subprocess.run(
        ["git", "-C", str(work), "config", "core.editor", "vim"], check=True, env=GIT_ENV
    )
    (work / ".env").write_text("KEY=1\n")
    (work / ".npmrc").write_text(
        "//r.example.test/:_authToken=t\nregistry=https://r.example.test/\n"
    )
    (work / ".vscode").mkdir()
    (work / ".vscode/tasks.json").write_text("{}")
    (work / ".github/workflows").mkdir(parents=True)
    (work / ".mcp.json").symlink_to(".vscode/tasks.json")  # held, and its target too
    os.mkfifo(work / "sub/fifo")
    return work


def test_a_tree_survives_the_wire_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = _tree(tmp_path)
    monkeypatch.setattr(live, "RACY_NS", 0)  # stamps for a tree made a moment ago
    monkeypatch.setattr(live, "MAX_WATCHED", 2)  # and subtrees past the watch budget
    tree = worktree.prepare([str(work)], git_guard=True, secrets=["*.secret"])[str(work)]
    assert tree.protections and tree.baseline and tree.credentials and tree.tools and tree.dirs
    assert tree.stamps and tree.unlisted and tree.held[".mcp.json"].target
    import json

    back = walkwire.decode(json.loads(json.dumps(walkwire.encode(tree))))
    assert back == tree  # fingerprints are tuples again: the scan compares them with ==


def test_malformed_data_raises_a_value_error() -> None:
    with pytest.raises((KeyError, IndexError, TypeError, ValueError, AttributeError)):
        walkwire.decode(
            {"protections": [["x"]], "baseline": None, "credentials": [], "tools": {}, "dirs": []}
        )
    with pytest.raises((KeyError, IndexError, TypeError, ValueError, AttributeError)):
        walkwire.decode(
            {
                "protections": [],
                "baseline": None,
                "credentials": [["a", "k", "nonsense", False, None, "", ""]],
                "tools": {},
                "dirs": [],
            }
        )


async def _prepare(root: Path, home: Path, small: int) -> Walked:
    """ROOT walked as a run's start does (SMALL: 0, always the walk process)."""
    walks = Walks()
    walks.start()
    try:
        return await walks.prepare(
            [str(root)],
            home=str(home),
            git_guard=True,
            created=[],
            secrets=[],
            parser=walks.apart(),
            small=small,
        )
    finally:
        walks.close()


def test_the_walk_process_walks_as_the_daemon_would(tmp_path: Path) -> None:
    work = _tree(tmp_path)
    walked = asyncio.run(_prepare(work, tmp_path, 0))  # always the process
    assert walked.user_hooks is None  # (no git config in that home)
    assert walked.trees == worktree.prepare([str(work)], git_guard=True)


def test_a_refusal_of_the_walk_process_is_its_line(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match="gone"):
        asyncio.run(_prepare(tmp_path / "gone", tmp_path, 0))


def test_a_small_tree_is_walked_without_the_process_a_larger_one_with_it(tmp_path: Path) -> None:
    work = tmp_path / "w"
    for i in range(30):
        (work / f"d{i}").mkdir(parents=True)
    with pytest.raises(worktree.LargerThan):
        worktree.prepare([str(work)], git_guard=True, limit=10)
    assert not (work / ".git").exists()  # stopped before anything was made

    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[core]\n\thooksPath = ~/hooks\n")

    def go(small: int) -> dict[str, worktree.Tree]:
        walked = asyncio.run(_prepare(work, home, small))
        # the user's hooks path comes with the walk either way (one round through the pool)
        assert walked.user_hooks == str(home / "hooks")
        return walked.trees

    hooks = str(home / "hooks")
    assert go(10) == go(1000) == worktree.prepare([str(work)], git_guard=True, user_hooks=hooks)
