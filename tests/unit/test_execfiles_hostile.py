"""execfiles on files the payload wrote to be unreadable: no exception escapes the walk
(a package.json of 100000 '[' raised RecursionError, and the run ended in "internal
error"), and what cannot be read is compared whole, as bad JSON always was."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from boxy.digest import sha256
from boxyd.plan.execfiles import READ_MAX, SCRIPTS, changes
from tests.unit.test_execfiles import seen

BIG_INT = b'{"scripts": {"t": "x"}, "n": ' + b"7" * 4400 + b"}"
UNPARSABLE = {
    "brackets": b"[" * 100_000,
    "objects": b'{"a":' * 100_000,
    "closed_brackets": b"[" * 100_000 + b"]" * 100_000,
    "scripts_deep": b'{"scripts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "big_int": BIG_INT,
    "not_utf8": b'{"scripts": {"t": "\xff"}}',
    "not_json": b"{scripts: {}}",
}


def _whole(path: Path) -> str:
    """The fingerprint of a package.json compared whole (as bad JSON is)."""
    mode = f"{path.stat().st_mode & 0o7777:o}"
    return f"file{mode}:{sha256(path.read_bytes()).hexdigest()}"


def test_the_premises() -> None:
    with pytest.raises(RecursionError):
        json.loads(UNPARSABLE["brackets"])
    with pytest.raises(ValueError, match="4300"):
        json.loads(BIG_INT)


@pytest.mark.parametrize("name", UNPARSABLE)
def test_unparsable_package_json_is_compared_whole(tmp_path: Path, name: str) -> None:
    pkg = tmp_path / "package.json"
    pkg.write_bytes(UNPARSABLE[name])
    before = seen(tmp_path)
    assert before == {"package.json": (SCRIPTS, _whole(pkg))}
    assert changes(before, seen(tmp_path), "/w") == []
    pkg.write_bytes(UNPARSABLE[name] + b" ")  # any change at all is one to review
    assert changes(before, seen(tmp_path), "/w") == [
        f"changed the scripts or hook keys of /w/package.json ({SCRIPTS}): review it before "
        "your tools run it"
    ]


def _at_depth(frames: int, call: Callable[[], Any]) -> Any:
    """CALL with FRAMES more Python frames under it: where a parse stops at the
    recursion limit depends on how deep the stack already is."""
    return call() if frames <= 0 else _at_depth(frames - 1, call)


def test_scripts_nested_near_the_recursion_limit_never_raise(tmp_path: Path) -> None:
    pkg = tmp_path / "package.json"
    limit = sys.getrecursionlimit()
    for depth in range(limit - 80, limit + 10, 3):
        pkg.write_bytes(b'{"scripts": ' + b"[" * depth + b"]" * depth + b"}")
        for frames in (0, 17, 40):
            got = _at_depth(frames, lambda: seen(tmp_path))
            assert set(got) == {"package.json"}, (depth, frames)


def test_a_parsable_package_json_still_compares_its_scripts_only(tmp_path: Path) -> None:
    pkg = tmp_path / "package.json"
    pkg.write_bytes(b'{"scripts": {"t": "x"}, "n": ' + b"7" * 4000 + b"}")
    before = seen(tmp_path)
    pkg.write_bytes(b'{"scripts": {"t": "x"}, "n": 8}')
    assert changes(before, seen(tmp_path), "/w") == []


def test_a_change_past_what_is_read_is_reported(tmp_path: Path) -> None:
    """A file is read up to READ_MAX: past that, what changes is seen by its ctime."""
    envrc, pkg = tmp_path / ".gitlab-ci.yml", tmp_path / "package.json"
    envrc.write_bytes(b"#" * READ_MAX + b"\necho a\n")
    head = b'{"scripts": {"t": "x"}, "pad": "' + b"a" * READ_MAX + b'", "s": '
    pkg.write_bytes(head + b'"x"}')
    before = seen(tmp_path)
    assert changes(before, seen(tmp_path), "/w") == []
    time.sleep(0.05)  # past the clock tick the kernel stamps ctime with
    envrc.write_bytes(b"#" * READ_MAX + b"\necho b\n")  # the same size, the same head
    pkg.write_bytes(head + b'"y"}')
    assert [ln.split(" (")[0] for ln in changes(before, seen(tmp_path), "/w")] == [
        "changed /w/.gitlab-ci.yml",
        "changed the scripts or hook keys of /w/package.json",
    ]
