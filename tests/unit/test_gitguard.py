"""The git guard on real repositories built with git: what is pinned, what is quarantined."""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar, cast

import pytest

from boxyd.gitguard import discover, hostgit, scan
from boxyd.gitguard.discover import Protection, prepare, protections
from boxyd.gitguard.quarantine import RUN_BYTES, Budget, _digest
from boxyd.kernel import walk
from tests.conftest import User
from tests.harness import toolshed

T = TypeVar("T")


class Git:
    """git with nothing of the host's configuration: no system config, a fresh HOME."""

    def __init__(self, home: Path) -> None:
        home.mkdir(exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1",
            # trees handed to the test user are built as root (CI) before the chown
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
        }

    def __call__(self, cwd: Path, *args: str) -> str:
        r = subprocess.run(
            ["git", *args], cwd=cwd, env=self.env, capture_output=True, text=True, check=False
        )
        assert r.returncode == 0, f"git {' '.join(args)}: {r.stderr}"
        return r.stdout.strip()

    def repo(self, path: Path, commit: bool = True) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        self(path, "init", "-q", "-b", "main")
        if commit:
            (path / "file").write_text("x\n")
            self(path, "add", "file")
            self(path, "commit", "-q", "-m", "init")
        return path


@pytest.fixture
def git(tmp_path: Path) -> Git:
    return Git(tmp_path / "home")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "work"


def rels(prots: list[Protection]) -> dict[str, tuple[str, bool, bool]]:
    return {p.rel: (p.kind, p.is_dir, p.symlink) for p in prots}


def assert_parents_first(prots: list[Protection]) -> None:
    seen: set[str] = set()
    for p in prots:
        parts = p.rel.split("/")
        for i in range(1, len(parts)):
            anc = "/".join(parts[:i])
            assert anc not in {q.rel for q in prots} or anc in seen, f"{anc} after {p.rel}"
        seen.add(p.rel)


SELF_DIR = ("self", True, False)
RO_DIR = ("ro", True, False)
RO_FILE = ("ro", False, False)
RO_LINK = ("ro", False, True)

# --- protections -------------------------------------------------------------------


def test_plain_repo(git: Git, root: Path) -> None:
    git.repo(root)
    prots = protections(str(root))
    assert rels(prots) == {".git": SELF_DIR, ".git/config": RO_FILE, ".git/hooks": RO_DIR}
    assert [p.rel for p in prots] == [".git", ".git/config", ".git/hooks"]


def test_not_a_repository(root: Path) -> None:
    (root / "src" / "node_modules" / "x").mkdir(parents=True)
    assert protections(str(root)) == []


def test_submodule(git: Git, root: Path) -> None:
    git.repo(root)
    git.repo(root / "other")
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", "./other", "sub")
    prots = protections(str(root))
    got = rels(prots)
    expected = {
        ".git": SELF_DIR,
        ".git/config": RO_FILE,
        ".git/hooks": RO_DIR,
        ".git/modules": SELF_DIR,
        ".git/modules/sub": SELF_DIR,
        ".git/modules/sub/config": RO_FILE,
        ".git/modules/sub/hooks": RO_DIR,
        "sub": SELF_DIR,
        "sub/.git": RO_FILE,  # the gitdir: pointer
        "other": SELF_DIR,  # the nested repository the submodule was cloned from
        "other/.git": SELF_DIR,
        "other/.git/config": RO_FILE,
        "other/.git/hooks": RO_DIR,
    }
    assert got == expected
    assert_parents_first(prots)


def test_nested_submodule_name_with_slash(git: Git, root: Path) -> None:
    git.repo(root)
    git.repo(root / "other")
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", "./other", "lib/deep")
    got = rels(protections(str(root)))
    for rel in (".git/modules/lib", ".git/modules/lib/deep", "lib", "lib/deep"):
        assert got[rel] == SELF_DIR
    assert got[".git/modules/lib/deep/config"] == RO_FILE
    assert got[".git/modules/lib/deep/hooks"] == RO_DIR
    assert got["lib/deep/.git"] == RO_FILE


def test_linked_worktrees(git: Git, tmp_path: Path, root: Path) -> None:
    git.repo(root)
    git(root, "worktree", "add", "-q", "inner")
    git(root, "worktree", "add", "-q", str(tmp_path / "outside"))
    got = rels(protections(str(root)))
    assert got[".git/worktrees"] == SELF_DIR
    for wt in ("inner", "outside"):
        assert got[f".git/worktrees/{wt}"] == SELF_DIR
        assert got[f".git/worktrees/{wt}/commondir"] == RO_FILE
        assert got[f".git/worktrees/{wt}/gitdir"] == RO_FILE
        # git reads hooks from the common dir: none is created in a worktree gitdir
        assert f".git/worktrees/{wt}/hooks" not in got
    assert got["inner"] == SELF_DIR
    assert got["inner/.git"] == RO_FILE
    assert not any(r.startswith("..") or r.startswith("/") for r in got)


def test_worktree_config(git: Git, root: Path) -> None:
    git.repo(root)
    git(root, "config", "extensions.worktreeConfig", "true")
    git(root, "config", "--worktree", "core.sparseCheckout", "false")
    assert rels(protections(str(root)))[".git/config.worktree"] == RO_FILE


def test_nested_repo_two_levels_deep(git: Git, root: Path) -> None:
    git.repo(root)
    git.repo(root / "a" / "b")
    prots = protections(str(root))
    got = rels(prots)
    assert got["a"] == SELF_DIR
    assert got["a/b"] == SELF_DIR
    assert got["a/b/.git"] == SELF_DIR
    assert got["a/b/.git/config"] == RO_FILE
    assert got["a/b/.git/hooks"] == RO_DIR
    assert_parents_first(prots)


def test_nested_repo_without_outer_repo(git: Git, root: Path) -> None:
    git.repo(root / "x" / "y" / "z")
    got = rels(protections(str(root)))
    assert [r for r, v in got.items() if v == SELF_DIR] == ["x", "x/y", "x/y/z", "x/y/z/.git"]


def test_bare_repository_in_tree(git: Git, root: Path) -> None:
    root.mkdir()
    git(root, "init", "-q", "--bare", "fixture.git")
    got = rels(protections(str(root)))
    assert got["fixture.git"] == SELF_DIR
    assert got["fixture.git/config"] == RO_FILE
    assert got["fixture.git/hooks"] == RO_DIR


def test_lookalike_bare_directory_is_not_a_repository(root: Path) -> None:
    d = root / "proj"
    (d / "objects").mkdir(parents=True)
    (d / "refs").mkdir()
    (d / "HEAD").write_text("not a ref\n")
    assert protections(str(root)) == []


def test_dotgit_file_pointing_outside_is_not_followed(git: Git, tmp_path: Path, root: Path) -> None:
    outside = git.repo(tmp_path / "outside")
    root.mkdir()
    (root / "x").mkdir()
    (root / "x" / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    (root / "y").mkdir()
    (root / "y" / ".git").write_text("gitdir: ../../outside/.git\n")
    lay = discover.layout(str(root))
    assert [g.rel for g in lay.gitdirs] == []
    assert rels(protections(str(root))) == {
        "x": SELF_DIR,
        "x/.git": RO_FILE,
        "y": SELF_DIR,
        "y/.git": RO_FILE,
    }


def test_dotgit_file_through_a_symlink_is_not_followed(
    git: Git, tmp_path: Path, root: Path
) -> None:
    git.repo(tmp_path / "outside")
    root.mkdir()
    (root / "link").symlink_to(tmp_path / "outside")
    (root / "x").mkdir()
    (root / "x" / ".git").write_text("gitdir: ../link/.git\n")
    assert [g.rel for g in discover.layout(str(root)).gitdirs] == []


def test_dotgit_file_inside_root_is_followed(git: Git, root: Path) -> None:
    git.repo(root)
    (root / "store").mkdir()
    git(root / "store", "init", "-q", "--bare", "g")
    (root / "w").mkdir()
    (root / "w" / ".git").write_text("gitdir: ../store/g\n")
    got = rels(protections(str(root)))
    assert got["store/g"] == SELF_DIR
    assert got["store/g/config"] == RO_FILE


def test_symlinked_hooks_reported_not_followed(git: Git, tmp_path: Path, root: Path) -> None:
    git.repo(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "post-checkout").write_text("#!/bin/sh\n")
    shutil.rmtree(root / ".git" / "hooks")
    (root / ".git" / "hooks").symlink_to(elsewhere)
    got = rels(protections(str(root)))
    assert got[".git/hooks"] == RO_LINK
    lay = discover.layout(str(root))
    assert not any(c.rel.startswith(".git/hooks/") for c in lay.controls)


def test_symlinked_dotgit_reported(git: Git, tmp_path: Path, root: Path) -> None:
    repo = git.repo(tmp_path / "real")
    root.mkdir()
    (root / "sub").mkdir()
    (root / "sub" / ".git").symlink_to(repo / ".git")
    got = rels(protections(str(root)))
    assert got == {"sub": SELF_DIR, "sub/.git": RO_LINK}


def test_prepare_creates_hooks(git: Git, root: Path) -> None:
    git.repo(root)
    shutil.rmtree(root / ".git" / "hooks")
    prots = protections(str(root))
    assert rels(prots)[".git/hooks"] == RO_DIR
    old = os.umask(0o077)
    try:
        assert prepare(str(root), prots) == [".git/hooks"]
    finally:
        os.umask(old)
    hooks = root / ".git" / "hooks"
    st = os.lstat(hooks)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755
    assert list(hooks.iterdir()) == []
    assert prepare(str(root)) == []  # present now


def test_prepare_never_goes_through_a_symlink(tmp_path: Path, root: Path) -> None:
    root.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (root / "link").symlink_to(target)
    with pytest.raises(OSError):
        prepare(str(root), [Protection("link/hooks", "ro", True)])
    assert not (target / "hooks").exists()


def test_node_modules_sized_tree_is_walked(git: Git, root: Path) -> None:
    """A wide tree with one git dependency deep inside it: found, and nothing else."""
    git.repo(root)
    nm = root / "node_modules"
    for i in range(300):
        d = nm / f"pkg{i}" / "lib"
        d.mkdir(parents=True)
        for j in range(10):
            (d / f"f{j}.js").write_text("")
    git.repo(nm / "pkg7" / "vendor" / "dep")
    got = rels(protections(str(root)))
    assert {r for r in got if r.startswith("node_modules")} == {
        "node_modules",
        "node_modules/pkg7",
        "node_modules/pkg7/vendor",
        "node_modules/pkg7/vendor/dep",
        "node_modules/pkg7/vendor/dep/.git",
        "node_modules/pkg7/vendor/dep/.git/config",
        "node_modules/pkg7/vendor/dep/.git/hooks",
    }


# --- snapshot / scan ---------------------------------------------------------------


@pytest.fixture
def quarantine(tmp_path: Path) -> Path:
    return tmp_path / "quarantine"


def hook_script(path: Path, marker: Path) -> None:
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(0o755)


def test_unchanged_tree_has_no_findings(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    assert ".git/config" in before.records
    assert ".git/hooks/pre-commit.sample" in before.records
    assert scan.scan(str(root), before, str(quarantine), toolshed.opener()) == []


def test_planted_hook_is_moved(git: Git, tmp_path: Path, root: Path, quarantine: Path) -> None:
    git.repo(root)
    git(root, "branch", "other")
    before = scan.snapshot(str(root))
    marker = tmp_path / "marker"
    hook_script(root / ".git" / "hooks" / "post-checkout", marker)
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [(f.rel, f.dest) for f in findings] == [
        (".git/hooks/post-checkout", str(quarantine / ".git" / "hooks" / "post-checkout"))
    ]
    assert not (root / ".git" / "hooks" / "post-checkout").exists()
    assert (quarantine / ".git" / "hooks" / "post-checkout").read_text().startswith("#!/bin/sh")
    assert stat.S_IMODE(os.stat(quarantine / ".git").st_mode) == 0o700
    git(root, "checkout", "-q", "other")
    assert not marker.exists()


def test_changed_hook_is_moved(git: Git, tmp_path: Path, root: Path, quarantine: Path) -> None:
    git.repo(root)
    hook = root / ".git" / "hooks" / "pre-commit"
    hook_script(hook, tmp_path / "mine")
    before = scan.snapshot(str(root))
    hook_script(hook, tmp_path / "theirs")
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [f.rel for f in findings] == [".git/hooks/pre-commit"]
    assert "theirs" in (quarantine / ".git" / "hooks" / "pre-commit").read_text()


def test_hook_made_executable_is_moved(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o644)  # git does not run it
    before = scan.snapshot(str(root))
    hook.chmod(0o755)
    assert [f.rel for f in scan.scan(str(root), before, str(quarantine), toolshed.opener())] == [
        ".git/hooks/pre-commit"
    ]


def test_unchanged_hook_and_changed_sample_stay(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    hook_script(root / ".git" / "hooks" / "pre-commit", tmp_path / "mine")
    before = scan.snapshot(str(root))
    (root / ".git" / "hooks" / "pre-push.sample").write_text("changed\n")
    assert scan.scan(str(root), before, str(quarantine), toolshed.opener()) == []
    assert (root / ".git" / "hooks" / "pre-commit").exists()


def test_fsmonitor_in_new_config_worktree(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    (root / ".git" / "config.worktree").write_text("[core]\n\tfsmonitor = ./evil\n")
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [(f.rel, f.keys) for f in findings] == [(".git/config.worktree", ("core.fsmonitor",))]
    assert not (root / ".git" / "config.worktree").exists()


def test_benign_config_change_stays(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    git(root, "config", "user.name", "someone")
    assert scan.scan(str(root), before, str(quarantine), toolshed.opener()) == []


def test_unparseable_config_is_moved(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    with open(root / ".git" / "config", "a") as f:
        f.write("[core\n")
    (finding,) = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert finding.rel == ".git/config" and "parse" in finding.reason


def test_user_dangerous_config_before_snapshot_stays(
    git: Git, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    git(root, "config", "core.pager", "less -R")
    git(root, "config", "alias.lg", "!git log --graph")
    before = scan.snapshot(str(root))
    assert scan.scan(str(root), before, str(quarantine), toolshed.opener()) == []
    assert "less -R" in (root / ".git" / "config").read_text()


def test_planted_commondir(git: Git, tmp_path: Path, root: Path, quarantine: Path) -> None:
    git.repo(root)
    evil = git.repo(tmp_path / "evil")
    before = scan.snapshot(str(root))
    (root / ".git" / "commondir").write_text(f"{evil / '.git'}\n")
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [f.rel for f in findings] == [".git/commondir"]
    assert "outside" in findings[0].reason
    assert not (root / ".git" / "commondir").exists()


def test_commondir_inside_root_leads_to_its_config(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    git(root, "worktree", "add", "-q", "wt")
    before = scan.snapshot(str(root))
    common = root / "stash"
    (common / "hooks").mkdir(parents=True)
    (common / "config").write_text("[core]\n\tpager = evil\n")
    (root / ".git" / "worktrees" / "wt" / "commondir").write_text("../../../stash\n")
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [(f.rel, f.keys) for f in findings] == [("stash/config", ("core.pager",))]


def test_new_dotgit_file_pointing_outside(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    outside = git.repo(tmp_path / "outside")
    before = scan.snapshot(str(root))
    (root / "d").mkdir()
    (root / "d" / ".git").write_text(f"gitdir: {outside / '.git'}\n")
    assert [f.rel for f in scan.scan(str(root), before, str(quarantine), toolshed.opener())] == [
        "d/.git"
    ]


def test_new_symlinked_dotgit_is_moved(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    outside = git.repo(tmp_path / "outside")
    before = scan.snapshot(str(root))
    (root / "d").mkdir()
    (root / "d" / ".git").symlink_to(outside / ".git")
    (finding,) = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert finding.rel == "d/.git" and "symlink" in finding.reason
    assert os.readlink(quarantine / "d" / ".git") == str(outside / ".git")
    assert (outside / ".git" / "config").exists()  # the target was not touched


def test_symlink_replacing_config_is_moved(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    (root / "notes.txt").write_text("[core]\n\tpager = evil\n")
    cfg = root / ".git" / "config"
    cfg.unlink()
    cfg.symlink_to("../notes.txt")
    (finding,) = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert finding.rel == ".git/config" and "symlink" in finding.reason
    assert (root / "notes.txt").exists()


def test_new_benign_nested_repo_is_left_alone(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    git.repo(root / "node_modules" / "dep")
    assert scan.scan(str(root), before, str(quarantine), toolshed.opener()) == []


def test_new_submodule_gitdir_with_hook(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    git.repo(root / "other")
    before = scan.snapshot(str(root))
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", "./other", "sub")
    hook_script(root / ".git" / "modules" / "sub" / "hooks" / "post-checkout", tmp_path / "m")
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [f.rel for f in findings] == [".git/modules/sub/hooks/post-checkout"]


def test_quarantine_keeps_earlier_copies(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    cw = root / ".git" / "config.worktree"
    for n in range(2):
        before = scan.snapshot(str(root))
        cw.write_text(f"[core]\n\tpager = evil{n}\n")
        assert len(scan.scan(str(root), before, str(quarantine), toolshed.opener())) == 1
    assert (quarantine / ".git" / "config.worktree").read_text().endswith("evil0\n")
    assert (quarantine / ".git" / "config.worktree.1").read_text().endswith("evil1\n")


def test_move_across_filesystems(git: Git, root: Path, tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to move to")
    git.repo(root)
    q = Path(shm) / f"boxy-test-quarantine-{os.getpid()}"
    try:
        before = scan.snapshot(str(root))
        (root / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
        (root / "d").mkdir()
        (root / "d" / ".git").symlink_to("/etc")
        findings = scan.scan(str(root), before, str(q), toolshed.opener())
        assert sorted(f.rel for f in findings) == [".git/hooks/pre-commit", "d/.git"]
        assert (q / ".git" / "hooks" / "pre-commit").read_text() == "#!/bin/sh\n"
        assert os.readlink(q / "d" / ".git") == "/etc"
        assert not (root / ".git" / "hooks" / "pre-commit").exists()
        assert not os.path.lexists(root / "d" / ".git")
    finally:
        shutil.rmtree(q, ignore_errors=True)


def test_too_deep_is_reported(
    root: Path, quarantine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root.mkdir()
    before = scan.snapshot(str(root))
    monkeypatch.setattr(walk, "MAX_DEPTH", 4)
    (root / "a" / "b" / "c" / "d" / "e").mkdir(parents=True)
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [(f.rel, f.dest) for f in findings] == [("a/b/c/d", str(quarantine / "a/b/c/d"))]
    assert "not checked" in scan.describe(findings)[0]
    assert not (root / "a/b/c/d").exists()  # moved whole: nothing in it was judged


def test_describe(git: Git, root: Path, quarantine: Path) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    (root / ".git" / "config.worktree").write_text("[core]\n\tfsmonitor = x\n[alias]\n\ty = !z\n")
    (line,) = scan.describe(scan.scan(str(root), before, str(quarantine), toolshed.opener()))
    assert ".git/config.worktree" in line
    assert str(quarantine / ".git" / "config.worktree") in line
    assert "core.fsmonitor, alias.y" in line


# --- the attack, end to end --------------------------------------------------------


def plant_nested_fsmonitor(git: Git, tmp_path: Path, root: Path) -> Path:
    """What a payload can do with a writable work tree and no access to .git/config:
    a new repository with core.fsmonitor, registered as a gitlink in the outer index
    (the index is not a control file), so the host's next `git status` recurses into it.
    Returns the marker the fsmonitor hook creates."""
    sub = git.repo(root / "sub")
    marker = tmp_path / "marker"
    hook = root / "fsmon.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\nprintf '\\0'\n")
    hook.chmod(0o755)
    git(sub, "config", "core.fsmonitor", str(hook))
    sha = git(sub, "rev-parse", "HEAD")
    git(root, "update-index", "--add", "--cacheinfo", f"160000,{sha},sub")
    return marker


def test_nested_repo_attack_is_real(git: Git, tmp_path: Path, root: Path) -> None:
    git.repo(root)
    marker = plant_nested_fsmonitor(git, tmp_path, root)
    marker.unlink(missing_ok=True)
    git(root, "status", "--short")
    assert marker.exists()  # without the guard, the host runs the payload's program


def test_nested_repo_attack_is_quarantined(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    marker = plant_nested_fsmonitor(git, tmp_path, root)
    marker.unlink(missing_ok=True)
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [(f.rel, f.keys) for f in findings] == [("sub/.git/config", ("core.fsmonitor",))]
    git(root, "status", "--short")
    assert not marker.exists()


def test_hooks_path_inside_tree_is_a_mount_point_and_scanned(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    """husky: the user's config points core.hooksPath into the work tree. The directory
    (and its parents) become mount points, so it cannot be swapped for a symlink; its
    files stay writable and are scanned."""
    git.repo(root)
    git(root, "config", "core.hooksPath", ".husky/_")
    husky = root / ".husky" / "_"
    husky.mkdir(parents=True)
    hook_script(husky / "pre-commit", tmp_path / "mine")
    (husky / "h").write_text("# sourced by every hook\n")
    husky_prots = {k: v for k, v in rels(protections(str(root))).items() if k.startswith(".husky")}
    assert husky_prots == {".husky": SELF_DIR, ".husky/_": SELF_DIR}
    before = scan.snapshot(str(root))
    assert scan.scan(str(root), before, str(quarantine), toolshed.opener()) == []
    (husky / "h").write_text("touch /tmp/pwned\n")
    hook_script(husky / "post-checkout", tmp_path / "theirs")
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert sorted(f.rel for f in findings) == [".husky/_/h", ".husky/_/post-checkout"]
    assert (husky / "pre-commit").exists()


# --- git's own rules: what git accepts as a repository, what its config pulls in ----------


def fake_bare(d: Path, tmp_path: Path, objects_file: bool = True) -> Path:
    """Reproduction 1 of the review: a directory git takes for a bare repository although
    `objects` is an executable *file* (git checks only access(X_OK)). Returns the marker
    its core.fsmonitor touches."""
    (d / "HEAD").write_text("ref: refs/heads/main\n")
    if objects_file:
        (d / "objects").write_text("#!/bin/sh\n")
        (d / "objects").chmod(0o755)
    else:
        (d / "objects").mkdir()
    (d / "refs").mkdir(exist_ok=True)
    marker = tmp_path / f"marker-{d.name}"
    hook_script(d / "fsmon.sh", marker)
    (d / "config").write_text(f"[core]\n\tworktree = .\n\tfsmonitor = {d / 'fsmon.sh'}\n")
    return marker


def as_user(user: User, fn: Callable[[], T]) -> T:
    """FN's result, computed as the unprivileged test user: access(X_OK) and unlistable
    directories mean nothing to root, which the suite runs as in CI."""
    if os.getuid() == user.uid:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            os.setgroups([])
            os.setresgid(user.gid, user.gid, user.gid)
            os.setresuid(user.uid, user.uid, user.uid)
            data = pickle.dumps((True, fn()))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            data = pickle.dumps((False, repr(e)))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        ok, value = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert ok, value
    return cast(T, value)


def user_git(user: User, cwd: Path, *args: str) -> str:
    r = user.run(["git", *args], cwd=cwd, extra_env={"GIT_CONFIG_NOSYSTEM": "1"})
    return r.stdout.decode().strip() if r.returncode == 0 else f"rc={r.returncode}"


def test_executable_file_as_objects_makes_a_bare_repository(
    git: Git, tmp_path: Path, user: User, workdir: Path
) -> None:
    git.repo(workdir)
    fake_bare(workdir, tmp_path)
    (workdir / ".git/refs").chmod(0o644)  # git now rejects .git and falls back to root itself
    user.chown(workdir)
    # the premise, from git itself: it really takes the directory for the repository
    assert user_git(user, workdir, "rev-parse", "--absolute-git-dir") == str(workdir)
    lay = as_user(user, lambda: discover.layout(str(workdir)))
    assert "" in {g.rel for g in lay.gitdirs}
    assert {c.rel: c.role for c in lay.controls}["config"] == "config"


@pytest.mark.parametrize(
    "head,valid",
    [
        (b"ref: refs/heads/main\n", True),
        (b"ref:\t \n refs/x", True),
        (b"0123456789abcdef0123456789ABCDEF01234567 and anything after", True),
        (b"0123456789abcdef0123456789abcdef0123456", False),  # 39 digits
        (b"ref: heads/main\n", False),
        (b"ref:\0refs/heads/main", False),
        (b"", False),
    ],
    ids=["ref", "ref-spaces", "oid-prefix", "short-oid", "not-refs", "nul", "empty"],
)
def test_head_is_validated_as_git_does(git: Git, tmp_path: Path, head: bytes, valid: bool) -> None:
    d = tmp_path / "cand"
    d.mkdir()
    fake_bare(d, tmp_path, objects_file=False)
    (d / "HEAD").write_bytes(head)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert discover.is_git_directory(fd, {n: "file" for n in os.listdir(d)}) is valid
    finally:
        os.close(fd)
    r = subprocess.run(
        ["git", "rev-parse", "--absolute-git-dir"],
        cwd=d,
        env=git.env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (r.returncode == 0 and r.stdout.strip() == str(d)) is valid, r.stderr  # git agrees


def test_head_and_commondir_make_a_repository(git: Git, tmp_path: Path, root: Path) -> None:
    common = tmp_path / "work" / "common"
    common.mkdir(parents=True)
    fake_bare(common, tmp_path, objects_file=False)
    sub = root / "sub"
    sub.mkdir()
    (sub / "HEAD").write_text("ref: refs/heads/main\n")
    (sub / "commondir").write_text("../common\n")
    assert git(sub, "rev-parse", "--absolute-git-dir") == str(sub)
    assert {"sub", "common"} <= {g.rel for g in discover.layout(str(root)).gitdirs}


def test_unlistable_directory_is_reported_not_chmoded(git: Git, user: User, workdir: Path) -> None:
    git.repo(workdir)
    locked = workdir / "locked"
    locked.mkdir()
    user.chown(workdir)
    locked.chmod(0o111)
    lay = as_user(user, lambda: discover.layout(str(workdir)))
    assert "locked" in lay.unreadable
    assert stat.S_IMODE(locked.stat().st_mode) == 0o111  # the host tree is not changed
    locked.chmod(0o755)


def test_included_files_are_pinned_and_judged(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    """Reproduction 3: include.path to a file in the work tree, transitively, and every
    includeIf whatever its condition."""
    git.repo(root)
    (root / "shared").mkdir()
    (root / ".gitconfig").write_text("[include]\n\tpath = shared/more\n")
    (root / "shared/more").write_text("[user]\n\tname = x\n")
    (root / "cond").write_text("")
    git(root, "config", "include.path", "../.gitconfig")
    git(root, "config", "includeIf.onbranch:nope.path", "../cond")
    prots = rels(protections(str(root)))
    assert prots[".gitconfig"] == RO_FILE and prots["shared/more"] == RO_FILE
    assert prots["cond"] == RO_FILE and prots["shared"] == SELF_DIR
    before = scan.snapshot(str(root))
    marker = tmp_path / "marker"
    hook_script(tmp_path / "fsmon.sh", marker)
    with (root / "shared/more").open("a") as f:  # what the bind stops inside the sandbox
        f.write(f"[core]\n\tfsmonitor = {tmp_path / 'fsmon.sh'}\n")
    assert git(root, "config", "core.fsmonitor") == str(tmp_path / "fsmon.sh")  # git reads it
    found = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [(f.rel, f.keys) for f in found] == [("shared/more", ("core.fsmonitor",))]
    git(root, "status", "--short")
    assert not marker.exists()


def test_include_through_a_symlink_is_refused(git: Git, root: Path) -> None:
    git.repo(root)
    (root / "real").mkdir()
    (root / "real/inc").write_text("")
    (root / "link").symlink_to("real")
    git(root, "config", "include.path", "../link/inc")
    assert rels(protections(str(root)))["link"] == RO_LINK


def test_hooks_path_symlink_is_refused_and_judged(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    """Reproduction 4: core.hooksPath's directory swapped for a symlink to hooks elsewhere."""
    git.repo(root)
    git(root, "config", "core.hooksPath", ".githooks")
    (root / ".githooks").mkdir()
    before = scan.snapshot(str(root))
    (root / ".githooks").rmdir()  # what the mount point stops inside the sandbox
    (root / "evil").mkdir()
    hook_script(root / "evil/pre-commit", tmp_path / "marker")
    (root / ".githooks").symlink_to("evil")
    assert rels(protections(str(root)))[".githooks"] == RO_LINK
    found = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert [f.rel for f in found] == [".githooks"]
    git(root, "commit", "-q", "--allow-empty", "-m", "x")
    assert not (tmp_path / "marker").exists()


# --- baselines of sessions live on an overlapping tree -------------------------------------


def _snap(root: str, *rels: str, unreadable: tuple[str, ...] = ()) -> scan.Snapshot:
    return scan.Snapshot(
        root, {r: scan.Record("config", "file", (root, r)) for r in rels}, frozenset(unreadable)
    )


@pytest.mark.parametrize(
    "own_root,older_root,want",
    [
        # the same tree: the older baseline, whole (what it lacks is new to both)
        ("/w", "/w", {"a/config": ("/w", "a/config")}),
        # this tree inside the older one: its part of the older baseline, re-keyed
        ("/w/sub", "/w", {"x/config": ("/w", "sub/x/config")}),
        # the older tree inside this one: that part from the older baseline, the rest ours
        (
            "/w",
            "/w/sub",
            {"top/config": ("/w", "top/config"), "sub/y/config": ("/w/sub", "y/config")},
        ),
        # disjoint (a sibling sharing a prefix of the name): ours
        (
            "/w",
            "/w2",
            {
                "top/config": ("/w", "top/config"),
                "sub/planted/config": ("/w", "sub/planted/config"),
                "sub/x/config": ("/w", "sub/x/config"),
            },
        ),
    ],
    ids=["same", "inside", "contains", "disjoint"],
)
def test_inherit_takes_the_live_sessions_baseline(
    own_root: str, older_root: str, want: dict[str, tuple[str, str]]
) -> None:
    own = {
        "/w": _snap("/w", "top/config", "sub/planted/config", "sub/x/config"),
        "/w/sub": _snap("/w/sub", "planted/config", "x/config"),
    }[own_root]
    older = {
        "/w": _snap("/w", "a/config") if own_root == "/w" else _snap("/w", "sub/x/config"),
        "/w/sub": _snap("/w/sub", "y/config"),
        "/w2": _snap("/w2", "other/config"),
    }[older_root]
    got = scan.inherit(own, older)
    assert got.root == own.root
    assert {k: v.fingerprint for k, v in got.records.items()} == want


def test_inherit_carries_unreadable_directories() -> None:
    got = scan.inherit(
        _snap("/w", unreadable=("mine", "sub/theirs-now")), _snap("/w/sub", unreadable=("old",))
    )
    assert got.unreadable == {"mine", "sub/old"}


def test_two_runs_cannot_launder_a_planted_config(
    git: Git, tmp_path: Path, root: Path, quarantine: Path
) -> None:
    """Reproduction 2: run A plants x/.git/config; run B starts while it exists; A deletes
    it; B re-creates it byte-identical. B's baseline is A's, so B's scan sees it as new."""
    git.repo(root)
    a_base = scan.snapshot(str(root))  # A starts
    planted = root / "x/.git"
    git.repo(root / "x", commit=False)
    (planted / "config").write_text("[core]\n\tfsmonitor = touch /tmp/x\n")
    b_own = scan.snapshot(str(root))  # B starts while it exists
    assert "x/.git/config" in b_own.records  # on its own, B would call it the user's
    b_base = scan.inherit(b_own, a_base)
    data = (planted / "config").read_bytes()
    (planted / "config").unlink()
    assert (
        scan.scan(str(root), a_base, str(quarantine / "a"), toolshed.opener()) == []
    )  # A ends: nothing there
    (planted / "config").write_bytes(data)  # B re-creates it, identical
    found = scan.scan(str(root), b_base, str(quarantine / "b"), toolshed.opener())
    assert [(f.rel, f.keys) for f in found] == [("x/.git/config", ("core.fsmonitor",))]


def _bytes_read() -> int:
    """What this thread has read so far (read(2) and the like), by the kernel's count."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/thread-self/io")


def test_a_16_mib_config_is_too_large_to_check(git: Git, root: Path, quarantine: Path) -> None:
    """The issue: the 64 MiB cap let a 16 MiB config of 'b' lines hold the next run
    34 s and boxyd at 1.2 GB. Past CONFIG_MAX (1 MiB) it is not parsed at all, and
    reading it to find that out reads CONFIG_MAX + 1 bytes (the kernel's count of
    what this thread read: not a time)."""
    git.repo(root)
    before = scan.snapshot(str(root))
    (root / ".git" / "config").write_bytes(b"b\n" * (8 << 20))
    fd = os.open(root / ".git", os.O_PATH | os.O_DIRECTORY)
    try:
        read_before = _bytes_read()
        assert walk.read_small(fd, "config", discover.CONFIG_MAX) is None
        read = _bytes_read() - read_before
        assert read <= discover.CONFIG_MAX + (64 << 10), f"{read} bytes read"
    finally:
        os.close(fd)
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    assert any(
        f.rel == ".git/config"
        and f.reason.startswith("a git config file too large or unreadable to check")
        for f in findings
    ), findings


# --- FIFOs where git expects a file ------------------------------------------------


def plant_fifo_heads(root: Path, n: int) -> list[str]:
    """N nested repositories whose HEAD is a FIFO: the host's git (and the user's
    `git status` at the root) would block on each."""
    rels = []
    for i in range(n):
        gitdir = root / "vendor" / f"x{i}" / ".git"
        (gitdir / "objects").mkdir(parents=True)
        (gitdir / "refs").mkdir()
        os.mkfifo(gitdir / "HEAD")
        rels.append(f"vendor/x{i}/.git/HEAD")
    return rels


def test_fifo_heads_are_no_candidates_and_are_moved(
    git: Git, root: Path, quarantine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    git.repo(root)
    before = scan.snapshot(str(root))
    heads = plant_fifo_heads(root, 300)
    os.mkfifo(root / "HEAD")  # where git looks for a bare repository: the root itself
    (root / "sub").mkdir()
    os.mkfifo(root / "sub" / ".git")
    fd = walk.open_root(str(root))
    try:
        walker = discover.Walker(str(root), fd)
        walker.run()
    finally:
        os.close(fd)
    assert "vendor/x0" in walker.candidates and not walker.askable()  # the root blocks all
    os.unlink(root / "HEAD")
    asked: list[str] = []
    ask = hostgit.ask

    def counted(runner: object, cwd: str, env: dict[str, str]) -> object:
        asked.append(os.path.relpath(cwd, os.path.realpath(root)))
        return ask(runner, cwd, env)  # type: ignore[arg-type]

    monkeypatch.setattr(hostgit, "ask", counted)
    findings = scan.scan(str(root), before, str(quarantine), toolshed.opener())
    moved = {f.rel: f for f in findings}
    assert set(heads) | {"sub/.git"} <= set(moved), sorted(moved)[:5]
    assert "not a regular file where git expects a HEAD" in moved[heads[0]].reason
    assert all(moved[h].dest for h in heads)
    assert not any(os.path.lexists(root / h) for h in heads)
    # git is never asked where it would block on a FIFO (300 such asks took the whole
    # checks budget): not asked there, and no ask that timed out or found it spent
    assert not [a for a in asked if a.startswith(("vendor/x", "sub"))], asked[:5]
    unanswered = [f for f in findings if "could not be asked" in f.reason]
    assert not unanswered, unanswered[:3]
    r = subprocess.run(
        ["git", "status", "--porcelain"],
        cwd=root,
        env=git.env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stderr


def test_a_fifo_head_blocks_the_directories_below_it(root: Path) -> None:
    (root / "a" / "b" / ".git").mkdir(parents=True)
    (root / "c" / ".git").mkdir(parents=True)
    os.mkfifo(root / "a" / "HEAD")
    fd = walk.open_root(str(root))
    try:
        walker = discover.Walker(str(root), fd)
        lay = walker.run()
    finally:
        os.close(fd)
    assert lay.candidates == ("c",)  # git run in a/b discovers upwards through a/HEAD
    assert discover.Control("a/HEAD", "head", "other") in lay.controls


# --- the quarantine's budget ---------------------------------------------------------


@pytest.fixture
def shm_root(tmp_path: Path) -> Iterator[Path]:
    """A work tree on a tmpfs while the quarantine is on tmp_path's disk: every move
    is a copy across filesystems."""
    base = Path("/dev/shm") / f"boxy-test-{os.getpid()}-{tmp_path.name}"
    assert os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev
    try:
        yield base / "work"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_sparse_hook_is_copied_sparse_across_filesystems(
    git: Git, shm_root: Path, quarantine: Path
) -> None:
    """A 1 GiB hook of holes used to become 1.1 GiB in the quarantine (kept 90 days)."""
    git.repo(shm_root)
    before = scan.snapshot(str(shm_root))
    hook = shm_root / ".git" / "hooks" / "pre-commit"
    with open(hook, "wb") as f:
        f.write(b"#!/bin/sh\necho planted\n")
        f.seek(512 << 20)
        f.write(b"middle")
        f.truncate(1 << 30)
    (finding,) = scan.scan(str(shm_root), before, str(quarantine), toolshed.opener())
    kept = Path(finding.dest)
    assert kept == quarantine / ".git" / "hooks" / "pre-commit" and not hook.exists()
    st = kept.stat()
    assert st.st_size == 1 << 30 and st.st_blocks * 512 < 1 << 20, st
    with open(kept, "rb") as f:
        assert f.read(23) == b"#!/bin/sh\necho planted\n"
        f.seek(512 << 20)
        assert f.read(6) == b"middle"


def test_past_the_budget_only_metadata_and_a_hash_are_kept(
    git: Git, shm_root: Path, quarantine: Path
) -> None:
    git.repo(shm_root)
    before = scan.snapshot(str(shm_root))
    hooks = shm_root / ".git" / "hooks"
    data = os.urandom(1 << 20) * (RUN_BYTES // (1 << 20) + 6)  # 70 MiB, no holes
    (hooks / "post-checkout").write_bytes(data)
    (hooks / "pre-push").write_text("#!/bin/sh\n")
    found = {f.rel: f for f in scan.scan(str(shm_root), before, str(quarantine), toolshed.opener())}
    big = found[".git/hooks/post-checkout"]
    digest = hashlib.sha256(data).hexdigest()
    assert "over the quarantine's budget" in big.reason and f"sha256 {digest}" in big.reason
    assert big.dest == str(quarantine / ".git" / "hooks" / "post-checkout.removed")
    assert digest in Path(big.dest).read_text() and not (hooks / "post-checkout").exists()
    assert (quarantine / ".git" / "hooks" / "pre-push").read_text() == "#!/bin/sh\n"
    assert "budget" not in found[".git/hooks/pre-push"].reason
    assert sum(p.stat().st_size for p in quarantine.rglob("*") if p.is_file()) < 1 << 20


def test_the_total_budget_counts_what_the_quarantine_holds(
    git: Git, root: Path, tmp_path: Path
) -> None:
    top = tmp_path / "q"
    (top / "older").mkdir(parents=True)
    (top / "older" / "kept").write_bytes(b"x" * (3 << 20))
    git.repo(root)
    before = scan.snapshot(str(root))
    (root / ".git" / "hooks" / "pre-commit").write_bytes(b"#!/bin/sh\n" + b"y" * (2 << 20))
    budget = Budget(str(top), total=4 << 20)
    (f,) = scan.scan(str(root), before, str(top / "now"), toolshed.opener(), budget=budget)
    assert "over the quarantine's budget (4 MiB in all" in f.reason and f.dest.endswith(".removed")


def test_empty_files_count_as_entries_and_past_them_nothing_is_kept(
    git: Git, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty file takes no block: 100,000 empty hooks a run filled the quarantine
    with a million entries. Past RUN_ENTRIES a hook is removed, and its finding's line
    (with its sha256) is all that is kept: no file at all."""
    monkeypatch.setattr("boxyd.gitguard.quarantine.RUN_ENTRIES", 3)
    git.repo(root)
    before = scan.snapshot(str(root))
    for i in range(5):
        (root / ".git" / "hooks" / f"post-{i}").write_bytes(b"")
    top = tmp_path / "q"
    found = scan.scan(str(root), before, str(top / "now"), toolshed.opener())
    kept = [f for f in found if "budget" not in f.reason]
    gone = [f for f in found if "not kept, it was 0 bytes" in f.reason]
    assert len(kept) == 3 and len(gone) == 2, [f.reason for f in found]
    assert all("sha256 " in f.reason for f in gone)
    assert len([p for p in top.rglob("*") if p.is_file()]) == 3
    assert not any((root / ".git" / "hooks" / f"post-{i}").exists() for i in range(5))


def test_the_total_entries_count_what_the_quarantine_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("boxyd.gitguard.quarantine.TOTAL_ENTRIES", 10)
    top = tmp_path / "q"
    (top / "older").mkdir(parents=True)
    for i in range(8):
        (top / "older" / f"e{i}").write_bytes(b"")
    budget = Budget(str(top))
    assert budget.take(0) and not budget.take(0)  # 9 entries, then 10: full
    assert budget.used_entries == 10


def test_the_hash_of_a_sparse_file_is_its_content_s(tmp_path: Path) -> None:
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.seek(3 << 20)
        f.write(b"a" * 1000)
        f.seek(7 << 20)
        f.write(b"b")
        f.truncate(9 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = _digest(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    assert got == f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}"
