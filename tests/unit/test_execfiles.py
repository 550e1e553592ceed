"""execfiles: which of the tools' files a run created, changed or removed (real files
for the fingerprints, pure for the comparison)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from boxyd.execfiles import Watch, changes
from boxyd.gitguard import discover


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
    pkg.write_text(json.dumps({"name": "x", "dependencies": {"a": "^1"}, "scripts": {"test": "true"}}))
    assert changes(before, seen(tmp_path), "/w") == []  # npm install <pkg>: not a finding
    pkg.write_text(json.dumps({"name": "x", "scripts": {"test": "true", "prepare": "sh evil"}}))
    assert changes(before, seen(tmp_path), "/w") == [
        "changed the scripts of /w/package.json (npm runs its scripts): review it before your tools run it"]


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
    assert [ln.split(" (")[0] for ln in got] == ["created /w/.envrc", "created /w/.github/workflows",
                                                  "changed /w/a/b/.vscode"]


def test_mode_and_removal_count(tmp_path: Path) -> None:
    (tmp_path / ".envrc").write_text("x")
    before = seen(tmp_path)
    (tmp_path / ".envrc").chmod(0o755)
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == ["changed /w/.envrc"]
    (tmp_path / ".envrc").unlink()
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == ["removed /w/.envrc"]
