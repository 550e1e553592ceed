"""Git's rules where they reach past the repository: a work tree pointed outside the
work directory, and the user's own global configuration making a project directory
the hooks directory. Each case takes its verdict from what the host's git does
afterwards, with a control (--allow-git-write) proving the attack real.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import GIT_FLAGS, describe, findings, git, init_repo, run_py

pytestmark = pytest.mark.sandbox

# A repository in a package directory with no .git of its own, whose HEAD holds the
# file NAME and whose core.worktree names the directory above the work directory:
# the user's `git reset --hard` there writes NAME outside the work directory.
PLANT_WORKTREE = """
import subprocess
name = sys.argv[1]
os.makedirs("packages/app")
def sh(*argv, stdin=None):
    r = subprocess.run(argv, capture_output=True, text=True, input=stdin, cwd="packages/app")
    if r.returncode:
        print("FAILED", argv, r.stderr, flush=True)
        sys.exit(3)
    return r.stdout.strip()
sh("git", "init", "-q")
blob = sh("git", "hash-object", "-w", "--stdin", stdin="written by the payload\\n")
sh("git", "update-index", "--add", "--cacheinfo", f"100644,{blob},{name}")
commit = sh("git", "commit-tree", sh("git", "write-tree"), "-m", "x")
sh("git", "update-ref", "HEAD", commit)
sh("git", "config", "core.worktree", "../../../..")
tried("planted", commit)
"""


def test_a_work_tree_outside_the_work_directory_is_a_finding(boxy: Boxy, user: User) -> None:
    name = f".boxy-escape-worktree-{uuid.uuid4().hex[:8]}"
    outside = boxy.workdir.parent / name
    try:
        r = run_py(boxy, PLANT_WORKTREE, *GIT_FLAGS, args=(name,))
        assert b"TRIED planted" in r.stdout, describe(r)
        git(user, boxy.workdir / "packages/app", "reset", "-q", "--hard", check=False)
        if outside.exists():
            print(f"ESCAPED the host's git reset wrote {outside}")
        assert not outside.exists(), describe(r)
        assert any(
            "packages/app/.git/config" in ln and "core.worktree" in ln for ln in findings(r)
        ), describe(r)
    finally:
        outside.unlink(missing_ok=True)


def test_the_work_tree_attack_is_real_without_the_guard(boxy: Boxy, user: User) -> None:
    name = f".boxy-escape-worktree-{uuid.uuid4().hex[:8]}"
    outside = boxy.workdir.parent / name
    try:
        r = run_py(boxy, PLANT_WORKTREE, "--allow-git-write", *GIT_FLAGS, args=(name,))
        assert b"TRIED planted" in r.stdout, describe(r)
        git(user, boxy.workdir / "packages/app", "reset", "-q", "--hard", check=False)
        assert outside.exists(), "the attack did not reproduce: the guarded test proves nothing"
    finally:
        outside.unlink(missing_ok=True)


@pytest.fixture
def global_hooks_path(user: User) -> Iterator[None]:
    """The user's own ~/.gitconfig sets a relative core.hooksPath (as many setups do)."""
    gitconfig = user.home / ".gitconfig"
    saved = gitconfig.read_bytes() if gitconfig.exists() else None
    gitconfig.write_text("[core]\n\thooksPath = .githooks\n")
    user.chown(gitconfig)
    try:
        yield
    finally:
        if saved is None:
            gitconfig.unlink(missing_ok=True)
        else:
            gitconfig.write_bytes(saved)


PLANT_HOOK = """
marker = sys.argv[1]
os.makedirs(".githooks", exist_ok=True)
with open(".githooks/pre-commit", "w") as f:
    f.write(f"#!/bin/sh\\ntouch {marker}\\n")
os.chmod(".githooks/pre-commit", 0o755)
tried("planted", ".githooks/pre-commit")
"""


def _commit(user: User, repo: Path) -> None:
    (repo / "more").write_text("x\n")
    user.chown(repo / "more")
    git(user, repo, "add", "more")
    git(user, repo, "commit", "-q", "-m", "more", check=False)


def test_the_users_global_hooks_path_is_guarded(
    boxy: Boxy, user: User, workdir: Path, global_hooks_path: None
) -> None:
    repo = init_repo(user, workdir)
    marker = user.home / f".boxy-escape-globalhooks-{uuid.uuid4().hex[:8]}"
    try:
        r = run_py(boxy, PLANT_HOOK, args=(str(marker),))
        assert b"TRIED planted" in r.stdout, describe(r)
        _commit(user, repo)
        if marker.exists():
            print("ESCAPED the host's git commit ran the payload's .githooks/pre-commit")
        assert not marker.exists(), describe(r)
        assert any(".githooks/pre-commit" in ln for ln in findings(r)), describe(r)
    finally:
        marker.unlink(missing_ok=True)


def test_the_global_hooks_path_attack_is_real_without_the_guard(
    boxy: Boxy, user: User, workdir: Path, global_hooks_path: None
) -> None:
    repo = init_repo(user, workdir)
    marker = user.home / f".boxy-escape-globalhooks-{uuid.uuid4().hex[:8]}"
    try:
        r = run_py(boxy, PLANT_HOOK, "--allow-git-write", args=(str(marker),))
        assert b"TRIED planted" in r.stdout, describe(r)
        _commit(user, repo)
        assert marker.exists(), "the attack did not reproduce: the guarded test proves nothing"
    finally:
        marker.unlink(missing_ok=True)
