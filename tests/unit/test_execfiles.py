"""execfiles: which of the tools' files a run created, changed or removed (real files
for the fingerprints, pure for the comparison)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from boxyd.gitguard import discover
from boxyd.kernel import walk
from boxyd.plan.execfiles import Watch, changes


def seen(root: Path) -> dict[str, tuple[str, str]]:
    watch = Watch()
    fd = walk.open_root(str(root))
    try:
        discover.Walker(str(root), fd, observer=watch).run()
    finally:
        os.close(fd)
    return watch.seen


def test_package_json_scripts_and_hook_keys_only(tmp_path: Path) -> None:
    pkg = tmp_path / "package.json"
    pkg.write_text(json.dumps({"name": "x", "dependencies": {}, "scripts": {"test": "true"}}))
    before = seen(tmp_path)
    pkg.write_text(
        json.dumps({"name": "x", "dependencies": {"a": "^1"}, "scripts": {"test": "true"}})
    )
    assert changes(before, seen(tmp_path), "/w") == []  # npm install <pkg>: not a finding
    pkg.write_text(json.dumps({"name": "x", "scripts": {"test": "true", "prepare": "sh evil"}}))
    assert changes(before, seen(tmp_path), "/w") == [
        "changed the scripts or hook keys of /w/package.json (npm runs its scripts, and git "
        "hook managers the commands it names): review it before your tools run it"
    ]
    for key in (
        "husky",
        "simple-git-hooks",
        "lint-staged",
        "pre-commit",
        "gitHooks",
        "config",
        "bin",
    ):
        pkg.write_text(json.dumps({"name": "x", "scripts": {"test": "true"}, key: {"a": "sh"}}))
        assert len(changes(before, seen(tmp_path), "/w")) == 1, key


def test_ci_files_any_depth_and_node_modules_skipped(tmp_path: Path) -> None:
    (tmp_path / "a/.github/workflows").mkdir(parents=True)
    (tmp_path / "node_modules/p/.github/workflows").mkdir(parents=True)
    before = seen(tmp_path)
    assert set(before) == {"a/.github/workflows"}
    (tmp_path / "a/.github/workflows/ci.yml").write_text("on: push")
    (tmp_path / "node_modules/p/.github/workflows/ci.yml").write_text("{}")
    (tmp_path / ".gitlab-ci.yml").write_text("x")
    got = changes(before, seen(tmp_path), "/w")
    assert [ln.split(" (")[0] for ln in got] == [
        "created /w/.gitlab-ci.yml",
        "changed /w/a/.github/workflows",
    ]


def test_mode_and_removal_count(tmp_path: Path) -> None:
    (tmp_path / ".gitlab-ci.yml").write_text("x")
    before = seen(tmp_path)
    (tmp_path / ".gitlab-ci.yml").chmod(0o755)
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == [
        "changed /w/.gitlab-ci.yml"
    ]
    (tmp_path / ".gitlab-ci.yml").unlink()
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == [
        "removed /w/.gitlab-ci.yml"
    ]


def test_held_files_are_not_reported_here(tmp_path: Path) -> None:
    """What host programs obey unasked is held (heldfiles.py), not reported."""
    before = seen(tmp_path)
    for name in (".vscode", ".claude", ".husky"):
        (tmp_path / name).mkdir()
    for name in (".envrc", ".npmrc", ".pnpmfile.cjs", ".mcp.json"):
        (tmp_path / name).write_text("node-options=--require=./h.js\n")
    assert changes(before, seen(tmp_path), "/w") == []
