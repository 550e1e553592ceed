"""execfiles: which of the tools' files a run created, changed or removed (real files
for the fingerprints, pure for the comparison)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from boxyd.gitguard import discover
from boxyd.plan.execfiles import Watch, changes


def seen(root: Path) -> dict[str, tuple[str, str]]:
    watch = Watch()
    fd = discover.open_root(str(root))
    try:
        discover.Walker(str(root), fd, observer=watch).run()
    finally:
        os.close(fd)
    return watch.seen


def test_package_json_scripts_only(tmp_path: Path) -> None:
    pkg = tmp_path / "package.json"
    pkg.write_text(json.dumps({"name": "x", "dependencies": {}, "scripts": {"test": "true"}}))
    before = seen(tmp_path)
    pkg.write_text(
        json.dumps({"name": "x", "dependencies": {"a": "^1"}, "scripts": {"test": "true"}})
    )
    assert changes(before, seen(tmp_path), "/w") == []  # npm install <pkg>: not a finding
    pkg.write_text(json.dumps({"name": "x", "scripts": {"test": "true", "prepare": "sh evil"}}))
    assert changes(before, seen(tmp_path), "/w") == [
        "changed the scripts of /w/package.json (npm runs its scripts): review it before your tools run it"
    ]


def test_directories_any_depth_and_node_modules_skipped(tmp_path: Path) -> None:
    (tmp_path / "a/b/.vscode").mkdir(parents=True)
    (tmp_path / "node_modules/p/.vscode").mkdir(parents=True)
    before = seen(tmp_path)
    assert set(before) == {"a/b/.vscode"}
    (tmp_path / "a/b/.vscode/tasks.json").write_text("{}")
    (tmp_path / "node_modules/p/.vscode/tasks.json").write_text("{}")
    (tmp_path / ".github/workflows").mkdir(parents=True)
    (tmp_path / ".envrc").write_text("x")
    got = changes(before, seen(tmp_path), "/w")
    assert [ln.split(" (")[0] for ln in got] == [
        "created /w/.envrc",
        "created /w/.github/workflows",
        "changed /w/a/b/.vscode",
    ]


def test_mode_and_removal_count(tmp_path: Path) -> None:
    (tmp_path / ".envrc").write_text("x")
    before = seen(tmp_path)
    (tmp_path / ".envrc").chmod(0o755)
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == [
        "changed /w/.envrc"
    ]
    (tmp_path / ".envrc").unlink()
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == [
        "removed /w/.envrc"
    ]


def test_tool_configs_by_the_keys_that_run_something(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / ".npmrc").write_text("//r.example/:_authToken=x\n")
    (tmp_path / "pkg/.yarnrc.yml").write_text("yarnPath: .yarn/releases/y.cjs\n")
    before = seen(tmp_path)
    assert set(before) == {"pkg/.yarnrc.yml"}  # an auth line alone runs nothing
    (tmp_path / ".npmrc").write_text("//r.example/:_authToken=y\n")
    assert changes(before, seen(tmp_path), "/w") == []  # a new token: nothing to review
    (tmp_path / ".npmrc").write_text("//r.example/:_authToken=y\nnode-options=--require=./h.js\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv/pip.conf").write_text(
        "[global]\npython = /tmp/p\nindex-url = https://i.example/\n"
    )
    (tmp_path / ".pnpmfile.cjs").write_text("module.exports = {}\n")
    assert changes(before, seen(tmp_path), "/w") == [
        "created /w/.npmrc (npm runs or installs what node-options says): review it before your tools run it",
        "created /w/.pnpmfile.cjs (pnpm runs it on every install): review it before your tools run it",
        "created /w/.venv/pip.conf (pip runs or installs what python, index-url say): review it before "
        "your tools run it",
    ]
    middle = seen(tmp_path)
    (tmp_path / "pkg/.yarnrc.yml").write_text("yarnPath: .yarn/releases/other.cjs\n")
    (tmp_path / ".npmrc").write_text("fund=false\n")  # the keys gone: nothing to review
    assert changes(middle, seen(tmp_path), "/w") == [
        "changed /w/pkg/.yarnrc.yml (yarn runs or installs what yarnPath says): review it before your "
        "tools run it"
    ]


def test_a_tool_config_symlink_is_reported(tmp_path: Path) -> None:
    before = seen(tmp_path)
    (tmp_path / "x").write_text("node-options=--require=./h.js\n")
    os.symlink("x", tmp_path / ".npmrc")
    got = changes(before, seen(tmp_path), "/w")
    assert got == [
        "created /w/.npmrc (npm reads it as its config): review it before your tools run it"
    ]


def test_node_modules_configs_are_not_watched(tmp_path: Path) -> None:
    (tmp_path / "node_modules/p").mkdir(parents=True)
    (tmp_path / "node_modules/p/.npmrc").write_text("node-options=x\n")
    assert seen(tmp_path) == {}
