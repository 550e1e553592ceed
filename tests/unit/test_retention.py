"""retention: which session records and quarantines go (pure), and pruning real ones."""

from __future__ import annotations

import os
from pathlib import Path

from boxyd.daemon.retention import DAY, expired, prune


def test_expired_keeps_the_newest_and_the_young() -> None:
    now = 1000 * DAY
    entries = [(f"s{i}", now - i * DAY) for i in range(10)]
    assert expired(entries, now, keep=5, max_age=100 * DAY) == ["s5", "s6", "s7", "s8", "s9"]
    assert expired(entries, now, keep=100, max_age=3.5 * DAY) == [
        "s4",
        "s5",
        "s6",
        "s7",
        "s8",
        "s9",
    ]
    assert expired([], now, keep=1, max_age=DAY) == []


def test_prune_removes_directories_only_and_follows_nothing(tmp_path: Path) -> None:
    d = tmp_path / "sessions"
    d.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    for i in range(4):
        (d / f"s{i}").mkdir()
        (d / f"s{i}" / "meta.json").write_text("{}")
    (d / "s0" / "link").symlink_to(outside)
    for i in range(4):
        os.utime(d / f"s{i}", (i * DAY, i * DAY))
    (d / "stray-file").write_text("not a record")
    assert sorted(prune(d, keep=2, max_age=1e9 * DAY, now=10 * DAY)) == ["s0", "s1"]
    assert sorted(p.name for p in d.iterdir()) == ["s2", "s3", "stray-file"]
    assert (outside / "keep").exists()
