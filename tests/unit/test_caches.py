"""caches: one cache per (profile, work directory), bounded (pure parts and real dirs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boxy import caches
from boxy.caches import Entry, evictable


def test_one_cache_per_project_and_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    a = caches.project_dir(None, "node", "/home/u/a")
    b = caches.project_dir(None, "node", "/home/u/b")
    a_py = caches.project_dir(None, "python", "/home/u/a")
    same_name = caches.project_dir(None, "node", "/srv/a")  # same last name, other project
    assert len({a, b, a_py, same_name}) == 4
    assert a == caches.project_dir(None, "node", "/home/u/a")  # stable
    assert caches.project_dir(None, "/etc/../x/my.yaml", "/w").split("/")[-2] == "my"
    assert all(caches.is_cache(p) for p in (a, b, a_py)) and not caches.is_cache("/home/u/a")


def test_prepare_refuses_a_symlink_in_boxys_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = caches.project_dir(None, "node", "/home/u/a")
    caches.prepare(path, "/home/u/a")
    assert os.path.isdir(path) and (os.stat(path).st_mode & 0o777) == 0o700
    [entry] = caches.entries()
    assert entry.workdir == "/home/u/a" and entry.profile == "node"
    os.rmdir(path)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(Exception, match="symlink|not a directory"):
        caches.prepare(path, "/home/u/a")


def _e(name: str, used: float, size: int) -> Entry:
    return Entry("node", f"/c/{name}", f"/w/{name}", used, size)


def test_oldest_projects_go_first_until_the_rest_fits() -> None:
    now = 100 * 86400.0
    items = [
        _e("old", now - 40 * 86400, 1),
        _e("a", now - 3, 6),
        _e("b", now - 2, 6),
        _e("c", now - 1, 6),
    ]
    assert [e.path for e in evictable(items, now, max_bytes=12, max_age=30 * 86400)] == [
        "/c/old",
        "/c/a",
    ]
    assert evictable(items[1:], now, max_bytes=100, max_age=30 * 86400) == []
