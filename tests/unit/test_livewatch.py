"""The live guard's watches (boxyd/daemon/livewatch.py) on a real inotify instance and
real directories: what is watched, what is listed, what comes back to be covered."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxyd.daemon import livewatch
from boxyd.daemon.livewatch import Watches
from boxyd.plan import live, worktree

_libc = ctypes.CDLL(None, use_errno=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def watches() -> Iterator[Watches]:
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0
    yield Watches(fd)
    os.close(fd)


def _watched(root: Path, **kw: object) -> live.Watched:
    t = worktree.walk(str(root), git_guard=False)
    return live.watched(str(root), [], t.credentials, (), t.dirs, stamps=kw.get("stamps", t.stamps))  # type: ignore[arg-type]


def _stamps(root: Path, rels: list[str]) -> dict[str, live.Stamp]:
    """As the walk would record them had it run more than RACY_NS ago."""
    out = {}
    for rel in rels:
        st = os.stat(root / rel if rel else root)
        out[rel] = (st.st_dev, st.st_ino, st.st_ctime_ns)
    return out


def _rels(found: object) -> list[str]:
    return sorted(r.rel for r in found.redos)  # type: ignore[attr-defined]


def test_a_tree_moved_in_is_watched_and_judged_at_every_depth(
    tmp_path: Path, watches: Watches
) -> None:
    (tmp_path / "w").mkdir()
    w = _watched(tmp_path / "w")
    drop = tmp_path / "drop"
    (drop / "deep" / "er").mkdir(parents=True)
    (drop / ".env").write_text("A=1")
    (drop / "deep" / "er" / ".npmrc").write_text("//h/:_authToken=x\n")
    (drop / "deep" / "node_modules").mkdir()  # never looked in (credentials.SKIP_DIRS)
    (drop / "deep" / "node_modules" / ".env").write_text("B=2")
    drop.rename(tmp_path / "w" / "in")
    found = watches.enter(w, ["in"])
    assert _rels(found) == ["in/.env", "in/deep/er/.npmrc"]
    assert {rel for _, rel in watches.names.values()} == {"in", "in/deep", "in/deep/er"}


def test_the_start_lists_only_what_changed_since_the_walk(tmp_path: Path, watches: Watches) -> None:
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    w = _watched(tmp_path, stamps=_stamps(tmp_path, ["", "a", "b"]))
    (tmp_path / "b" / ".env").write_text("late")  # after the walk, before the watch
    found = watches.start(w)
    assert _rels(found) == ["b/.env"]
    assert {rel for _, rel in watches.names.values()} == {"", "a", "b"}


def test_without_stamps_every_directory_is_listed(tmp_path: Path, watches: Watches) -> None:
    """A tree just written (its ctimes racy) or on a network filesystem: no stamp."""
    (tmp_path / "a").mkdir()
    w = _watched(tmp_path)
    assert w.stamps == {}  # made a moment ago: racy
    (tmp_path / "a" / ".env").write_text("late")
    assert _rels(watches.start(w)) == ["a/.env"]


def test_a_directory_seen_at_the_start_and_not_walked_is_entered(
    tmp_path: Path, watches: Watches
) -> None:
    w = _watched(tmp_path, stamps={})
    (tmp_path / "new" / "sub").mkdir(parents=True)
    (tmp_path / "new" / "sub" / ".env").write_text("x")
    assert _rels(watches.start(w)) == ["new/sub/.env"]


def test_symlinks_are_never_followed(tmp_path: Path, watches: Watches) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / ".env").write_text("x")
    w = _watched(tmp_path / "w")
    (tmp_path / "w" / "link").symlink_to(tmp_path / "outside")
    assert _rels(watches.enter(w, ["link"])) == []
    assert watches.names == {}


def test_a_directory_gone_and_made_again_is_entered_anew(tmp_path: Path, watches: Watches) -> None:
    (tmp_path / "d").mkdir()
    w = _watched(tmp_path, stamps={})
    watches.enter(w, ["d"])
    (wd,) = watches.names
    (tmp_path / "d").rmdir()
    time.sleep(0.05)
    watches.forget(wd)  # what the loop does on IN_IGNORED
    (tmp_path / "d" / "x").mkdir(parents=True)
    (tmp_path / "d" / "x" / ".env").write_text("y")
    assert _rels(watches.enter(w, ["d"])) == ["d/x/.env"]


def test_the_watches_are_bounded(
    tmp_path: Path, watches: Watches, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "MAX_WATCHED", 2)
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    found = watches.start(_watched(tmp_path, stamps={}))
    assert len(watches.names) == 2
    assert [n for n in found.notes if "more than 2 directories" in n]

    assert sorted(found.unwatched) == ["b", "c"]  # listed again instead (LiveGuard's rescan)


def test_the_unwatched_directories_are_listed_at_every_depth_within_a_bound(
    tmp_path: Path, watches: Watches
) -> None:
    """A budget the payload filled: what the host saves in a directory that could not
    be watched, or below one, is found by the rescan; SKIP_DIRS are not looked in; a
    covered one is not redone; past the bound it stops and says so."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".env").write_text("C=3")
    w = _watched(tmp_path, stamps={})  # the walk covers d/.env
    for d in ("c/deep/er", "c/node_modules"):  # made during the run, unwatched
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "c" / ".env").write_text("A=1")
    (tmp_path / "c" / "deep" / "er" / ".npmrc").write_text("//h/:_authToken=x\n")
    (tmp_path / "c" / "node_modules" / ".env").write_text("B=2")
    got = livewatch.rescan(w, ["c", "d"], limit=1000)
    assert sorted(r.rel for r in got.redos) == ["c/.env", "c/deep/er/.npmrc"]  # not d/.env
    assert sorted(got.dirs) == ["c/deep", "c/deep/er"] and not got.over
    assert livewatch.rescan(w, ["c", "d"], limit=2).over
    # the same through the wire of its child, which knows nothing of what is covered
    req = json.loads(json.dumps(livewatch.rescan_request(w, ["c", "d"], 1000)))["rescan"]
    reply = json.loads(json.dumps(livewatch.rescan_reply(req)))
    assert "d/.env" in reply["found"]
    got = livewatch.rescan_answer(w, reply)
    assert sorted(r.rel for r in got.redos) == ["c/.env", "c/deep/er/.npmrc"] and not got.over


def test_the_rescan_judges_a_directory_past_list_max(
    tmp_path: Path, watches: Watches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory of more entries than one listing judges (LIST_MAX) is listed whole by
    the rescan, up to its own bound (a .env sorted past the first LIST_MAX was missed)."""
    monkeypatch.setattr(live, "LIST_MAX", 5)
    w = _watched(tmp_path, stamps={})
    (tmp_path / "big").mkdir()
    for i in range(40):
        (tmp_path / "big" / f"f{i:02}").write_text("x")
    (tmp_path / "big" / ".env").write_text("A=1")
    got = livewatch.rescan(w, ["big"], limit=1000)
    assert [r.rel for r in got.redos] == ["big/.env"] and not got.over
    assert livewatch.rescan(w, ["big"], limit=20).over  # past the pass's bound: said


def test_nothing_is_watched_once_closed(tmp_path: Path) -> None:
    """A worker still entering directories as the session ends adds no watch to
    whatever instance reuses the descriptor's number."""
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    watches = Watches(fd)
    (tmp_path / "d").mkdir()
    watches.close()
    other = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)  # takes the number
    try:
        assert other == fd
        found = watches.enter(_watched(tmp_path, stamps={}), ["d"])
        assert watches.names == {} and found.redos == []
        assert _libc.inotify_rm_watch(other, 1) == -1  # no watch 1 in the new instance
    finally:
        os.close(other)


def test_watches_used_up_are_said(tmp_path: Path) -> None:
    """The user's inotify watches run out (ENOSPC): said, not silently unwatched. In a
    user namespace of its own whose limit is 2 (the limit is per user namespace)."""
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    code = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {str(REPO)!r})
        with open("/proc/sys/user/max_inotify_watches", "w") as f:
            f.write("2")
        from boxyd.daemon.livewatch import Watches
        from boxyd.plan import live
        libc = ctypes.CDLL(None, use_errno=True)
        w = Watches(libc.inotify_init1(os.O_CLOEXEC))
        found = w.start(live.watched({str(tmp_path)!r}, [], [], (), ("a", "b", "c")))
        print(len(w.names), found.notes)
    """)
    r = subprocess.run(
        ["unshare", "-Ur", sys.executable, "-I", "-c", code], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    count, notes = r.stdout.split(" ", 1)
    assert count == "2" and "No space left on device; not watched" in notes, r.stdout
