"""The live guard's policy (boxyd/plan/live.py) and the scan's side of it (adopt, restore)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from boxyd.gitguard import scan
from boxyd.gitguard.discover import Protection
from boxyd.gitguard.quarantine import overwrite
from boxyd.plan import credentials, live, worktree
from boxyd.plan.credentials import Action
from boxyd.plan.masking import Found
from tests.harness import toolshed

PIN = Protection(".git/config", "ro", False)
HOOKS = Protection(".git/hooks", "ro", True)
SELF = Protection(".git", "self", True)
ENV = Found("app/.env", "environment file", Action.EMPTY, False)


def tree(*, reveal: Iterable[str] = (), dirs: Iterable[str] = ()) -> live.Watched:
    return live.watched("/w", [PIN, HOOKS, SELF], [ENV], reveal, dirs)


def test_only_read_only_pins_are_watched() -> None:
    assert set(tree().pins) == {".git/config", ".git/hooks"}


def test_watch_dirs_put_the_covered_first_then_the_walk() -> None:
    w = tree(dirs=("", "src", "src/deep", "app", ".git"))
    assert live.watch_dirs(w) == [".git", "app", "", "src", "src/deep"]


def test_watch_dirs_are_bounded_and_the_rest_is_the_rescan_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live, "MAX_WATCHED", 3)
    w = tree(dirs=tuple(f"d{i}" for i in range(10)))
    assert live.watch_dirs(w)[:2] == [".git", "app"] and len(live.watch_dirs(w)) == 3
    past = live.past_budget(w)
    assert len(past) == 10 and set(past) | set(live.watch_dirs(w)) == {".git", "app", "", *w.dirs}
    w = live.watched("/w", [], [], (), ("",), unlisted=("big", "x/y"))
    assert live.watch_dirs(w) == [""] and live.past_budget(w) == ["big", "x/y"]


def test_the_walk_names_the_subtrees_past_the_watch_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree of more directories than the guard watches: the top of each subtree the
    walk stopped recording at is the rescan's (they were neither watched nor listed)."""
    monkeypatch.setattr(live, "MAX_WATCHED", 2)
    for d in ("a/b", "c/d", "node_modules/x"):
        (tmp_path / d).mkdir(parents=True)
    t = worktree.walk(str(tmp_path), git_guard=False)
    assert t.dirs[0] == "" and t.dirs[1] in ("a", "c") and len(t.dirs) == 2  # as listed
    kept = t.dirs[1]
    other = "c" if kept == "a" else "a"
    below = {"a": "a/b", "c": "c/d"}
    # the kept one's child and the other whole (its child is listed with it)
    assert sorted(t.unlisted) == sorted([below[kept], other])


@pytest.mark.parametrize(
    "dir_rel,name,is_dir,expect",
    [
        (".git", "config", False, ("pin", None)),  # git config renamed over the pin
        (".git", "hooks", True, ("pin", None)),
        (".git", "hooks", False, (None, None)),  # a file where the pinned directory was: the scan's
        ("app", ".env", False, (None, "mask")),
        ("", ".env", False, (None, "rule")),  # a new credential
        ("src", ".env.production", False, (None, "rule")),
        ("src", ".env.example", False, None),  # not a credential
        ("src", "id_ed25519", False, (None, "rule")),
        ("src", "id_ed25519.pub", False, None),
        ("", ".aws", True, (None, "rule")),
        ("node_modules/x", ".env", False, None),  # where no credential is looked for
        (".git/modules/a", ".npmrc", False, None),
        ("", "README", False, None),
    ],
)
def test_on_change(
    dir_rel: str, name: str, is_dir: bool, expect: tuple[str | None, str | None] | None
) -> None:
    redo = live.on_change(tree(), dir_rel, name, is_dir)
    if expect is None:
        assert redo is None
        return
    assert redo is not None and redo.rel == (f"{dir_rel}/{name}" if dir_rel else name)
    pin, what = expect
    assert (redo.pin is not None) == (pin == "pin")
    assert (redo.mask is not None) == (what == "mask")
    assert (redo.rule is not None) == (what == "rule")


def test_a_revealed_credential_is_not_covered_live() -> None:
    w = tree(reveal=("/w/src",))
    assert live.on_change(w, "src", ".env", False) is None
    assert live.on_change(w, "", ".env", False) is not None


def test_new_dirs_to_watch() -> None:
    assert live.new_dir(tree(), "", "config") == "config"
    assert live.new_dir(tree(), "a", "node_modules") is None
    assert live.new_dir(tree(), "", ".git") == ".git"  # a new repository's gitdir: its top
    assert live.new_dir(tree(), ".git", "objects") is None
    assert live.new_dir(tree(), "node_modules/p", ".git") is None


def test_what_git_would_read_is_checked_again_at_once() -> None:
    w = live.watched("/w", [], [], [], gitdirs=["", "sub/.git"][1:] + [".git"])
    assert live.on_change(w, ".git", "commondir", False) == live.Redo(".git/commondir", git=True)
    assert live.on_change(w, ".git", "index", False) is not None  # a gitlink may be in it
    assert live.on_change(w, ".git", "HEAD", False) is None  # what git writes as it works
    assert live.on_change(w, ".git", "index.lock", False) is None
    assert live.on_change(w, "src", ".git", True) is not None  # a new repository
    assert live.on_change(w, "src", "HEAD", False) is not None  # a bare one, perhaps
    assert live.on_change(w, "new/.git", "config", False) is not None  # made meanwhile
    assert live.on_change(w, ".git/modules/a/b", "config", False) is not None
    assert live.new_dir(w, ".git/modules", "a") == ".git/modules/a"
    assert live.new_dir(w, "new/.git", "hooks") == "new/.git/hooks"  # its hooks watched
    assert live.on_change(w, "new/.git/hooks", "pre-commit", False) is not None
    hooked = live.watched("/w", [], [], [], gitdirs=[".git"], hookdirs=[".githooks"])
    assert live.on_change(hooked, ".githooks", "pre-push", False) is not None
    assert ".githooks" in live.watch_dirs(hooked) and ".git/hooks" in live.watch_dirs(hooked)
    assert live.on_change(w, "src", "index.js", False) is None


def test_everything_redoes_each_pin_and_stand_in_once() -> None:
    redos = live.everything(tree())
    assert [r.rel for r in redos] == [".git/config", ".git/hooks", "app/.env"]
    assert redos[0].pin == PIN and redos[2].mask == ENV


def test_the_git_config_rule_is_credentials_own() -> None:
    assert credentials.GIT_CONFIG.action is Action.SCRUB


# --- adopt and restore, on a real repository -----------------------------------------

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent", "PATH": "/usr/bin:/bin"}


def _repo(path: Path, *config: tuple[str, str]) -> scan.Snapshot:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True, env=GIT_ENV)
    for key, value in config:
        subprocess.run(["git", "-C", str(path), "config", key, value], check=True, env=GIT_ENV)
    return scan.snapshot(str(path))


def _set(path: Path, key: str, value: str) -> None:
    subprocess.run(["git", "-C", str(path), "config", key, value], check=True, env=GIT_ENV)


def test_a_harmless_change_is_adopted(tmp_path: Path) -> None:
    work = tmp_path / "w"
    before = _repo(work)
    _set(work, "remote.origin.url", "https://example.test/x.git")
    after, why = scan.adopt(before, ".git/config")
    assert why is None
    assert after.records[".git/config"].fingerprint != before.records[".git/config"].fingerprint
    # the scan after the run then leaves the user's change where it is
    assert scan.scan(str(work), after, str(tmp_path / "q"), toolshed.opener()) == []


def test_keys_that_were_there_already_do_not_stop_an_adoption(tmp_path: Path) -> None:
    work = tmp_path / "w"
    before = _repo(work, ("core.editor", "vim"))
    assert before.records[".git/config"].keys == ("core.editor",)
    _set(work, "branch.main.remote", "origin")
    assert scan.adopt(before, ".git/config")[1] is None


def test_a_new_key_that_runs_commands_is_refused_and_restored(tmp_path: Path) -> None:
    work = tmp_path / "w"
    before = _repo(work, ("core.editor", "vim"))
    original = (work / ".git/config").read_bytes()
    _set(work, "core.fsmonitor", "touch /tmp/x")
    snap, why = scan.adopt(before, ".git/config")
    assert why is not None and "core.fsmonitor" in why and "core.editor" not in why
    assert snap is before
    dest, back = scan.restore(snap, ".git/config", str(tmp_path / "q"))
    assert back and (work / ".git/config").read_bytes() == original
    assert b"fsmonitor" in Path(dest).read_bytes()
    assert not [n for n in os.listdir(work / ".git") if n.startswith(".boxy-restore")]


def test_restore_never_writes_through_a_planted_name(tmp_path: Path) -> None:
    work = tmp_path / "w"
    before = _repo(work)
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    (work / ".git/config").unlink()
    (work / ".git/config").symlink_to(victim)
    assert scan.adopt(before, ".git/config")[1] is not None  # a symlink: refused
    scan.restore(before, ".git/config", str(tmp_path / "q"))
    assert victim.read_text() == "mine\n"
    assert not (work / ".git/config").is_symlink()


EXT4, SEC = 0xEF53, 1_000_000_000


@pytest.mark.parametrize(
    "fs,dev,ctime,now,kept",
    [
        (EXT4, 5, 10 * SEC, 20 * SEC, True),
        (EXT4, 5, 10 * SEC, 11 * SEC + 1, True),  # just past RACY_NS
        (EXT4, 5, 10 * SEC, 11 * SEC, False),  # within it: a change may share its tick
        (EXT4, 5, 30 * SEC, 20 * SEC, False),  # after the walk's clock
        (0x6969, 5, 10 * SEC, 20 * SEC, False),  # NFS: the server's clock
        (0x65735546, 5, 10 * SEC, 20 * SEC, False),  # FUSE
        (EXT4, 6, 10 * SEC, 20 * SEC, False),  # a mount beneath the root
    ],
)
def test_a_stamp_only_where_it_proves_a_directory_unchanged(
    fs: int, dev: int, ctime: int, now: int, kept: bool
) -> None:
    st = (dev, 42, ctime)
    assert (live.stamp(fs, 5, st, now) == st) is kept


def test_unchanged_is_the_same_device_inode_and_ctime() -> None:
    w = live.watched("/w", [], [], (), stamps={"a": (5, 42, 10)})
    assert live.unchanged(w, "a", (5, 42, 10))
    assert not live.unchanged(w, "a", (5, 42, 11))
    assert not live.unchanged(w, "a", (5, 43, 10))  # another directory renamed in its place
    assert not live.unchanged(w, "b", (5, 42, 10))  # the walk gave none: listed


@pytest.mark.parametrize(
    "value,found", [("../../..", True), ("/etc", True), ("..", False), ("../sub", False)]
)
def test_core_worktree_outside_the_tree_is_a_finding(
    tmp_path: Path, value: str, found: bool
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "pkg/sub").mkdir(parents=True)
    before = scan.snapshot(str(work))
    subprocess.run(["git", "init", "-q", str(work / "pkg")], check=True, env=GIT_ENV)
    _set(work / "pkg", "core.worktree", value)
    findings = scan.scan(str(work), before, str(tmp_path / "q"), toolshed.opener())
    hits = [f for f in findings if f.rel == "pkg/.git/config"]
    assert bool(hits) == found, findings
    if found:
        assert hits[0].keys == ("core.worktree",) and hits[0].dest


NPMRC = Found(".npmrc", "npm config", Action.SCRUB, False, b"registry=x\n")


def test_on_write_remakes_a_scrubbed_copy_and_covers_what_was_created_empty() -> None:
    w = live.watched("/w", [PIN], [ENV, NPMRC], ())
    assert live.on_write(w, "", ".npmrc") == live.Redo(".npmrc", mask=NPMRC)
    assert (
        live.on_write(w, "app", ".env") is None
    )  # an empty stand-in: the content is nothing to it
    assert live.on_write(w, ".git", "config") is None  # a pin: only a rename detaches it
    new = live.on_write(w, "sub", ".npmrc")
    assert new is not None and new.rule is not None and new.rule.needs_content
    assert live.on_write(w, "sub", ".env") is None  # covered when it appeared, whatever it holds
    assert live.on_write(w, "", "README") is None


def test_protected_files_are_pinned_again_too() -> None:
    w = live.watched(
        "/w", [PIN], [], (), protect=["/w/.npmrc", "/w/.vscode", "/other/x", "/w/.git/config"]
    )
    assert set(w.pins) == {".git/config", ".npmrc", ".vscode"}
    redo = live.on_change(w, "", ".npmrc", False)
    assert redo is not None and redo.pin == Protection(".npmrc", "ro", False)
    dir_redo = live.on_change(w, "", ".vscode", True)  # a directory renamed over: not re-pinned
    assert dir_redo is not None and dir_redo.pin is None and dir_redo.mask is None


def test_overwrite_keeps_the_inode_and_what_it_held(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    f = tmp_path / "d/.envrc"
    f.write_text("payload line\n")
    ino = f.stat().st_ino
    dest = overwrite(str(tmp_path), "d/.envrc", b"the user's\n", str(tmp_path / "q"))
    assert dest is not None and Path(dest).read_text() == "payload line\n"
    assert f.read_text() == "the user's\n" and f.stat().st_ino == ino  # a pin on it stays


def test_overwrite_refuses_a_second_name_and_a_symlink(tmp_path: Path) -> None:
    other = tmp_path / "src.py"
    other.write_text("code\n")
    os.link(other, tmp_path / ".envrc")
    assert overwrite(str(tmp_path), ".envrc", b"x", str(tmp_path / "q")) is None
    assert other.read_text() == "code\n"
    (tmp_path / ".envrc").unlink()
    (tmp_path / ".envrc").symlink_to(other)
    assert overwrite(str(tmp_path), ".envrc", b"x", str(tmp_path / "q")) is None
    assert other.read_text() == "code\n"


def test_the_profiles_own_patterns_are_covered_live() -> None:
    w = live.watched("/w", [], [], (), secrets=["*.secret", "conf/prod.yml"])
    redo = live.on_change(w, "a/b", "db.secret", False)
    assert redo is not None and redo.rule is not None and redo.rule.kind == credentials.USER_KIND
    assert live.on_change(w, "conf", "prod.yml", False) is not None
    assert live.on_change(w, "other", "prod.yml", False) is None


def test_a_lock_file_left_behind_is_named_and_left(tmp_path: Path) -> None:
    """A payload that leaves .git/config.lock makes the host's `git config` fail
    ("could not lock config file"): said, never removed (the user's git may hold it)."""
    work = tmp_path / "w"
    before = _repo(work)
    (work / ".git/config.lock").write_text("")
    findings = scan.scan(str(work), before, str(tmp_path / "q"), toolshed.opener())
    (lock,) = [f for f in findings if f.rel == ".git/config.lock"]
    assert lock.dest == "" and "lock file" in lock.reason
    assert (work / ".git/config.lock").exists()
    r = subprocess.run(
        ["git", "-C", str(work), "config", "a.b", "c"], env=GIT_ENV, capture_output=True
    )
    assert r.returncode != 0  # the control: the host's git really is stuck


# --- the backlog: what the payload can make one session's guard do --------------------

NEW = live.Redo("a/.env", rule=credentials.rule_for("a", ".env", False))


def test_the_backlog_gives_the_oldest_change_first() -> None:
    b = live.Backlog()
    assert b.add("/w", live.Redo("x", mask=ENV), 2.0) is None
    assert b.add("/w", NEW, 1.0) is None
    assert b.take(2.5) == ("/w", NEW, 1.0)
    assert b.take(2.5) == ("/w", live.Redo("x", mask=ENV), 2.0)
    assert b.take(2.5) is None and len(b) == 0


def test_a_second_change_to_a_waiting_entry_joins_it() -> None:
    b = live.Backlog()
    b.add("/w", live.Redo(".git/config", pin=PIN), 1.0)
    b.add("/w", live.Redo(".git/config", mask=ENV), 3.0)
    assert len(b) == 1
    # both parts kept, and the window said from the first change
    assert b.take(3.0) == ("/w", live.Redo(".git/config", pin=PIN, mask=ENV), 1.0)
    b.add("/v", live.Redo(".git/config", pin=PIN), 1.0)  # another tree: another entry
    b.add("/w", live.Redo(".git/config", pin=PIN), 1.0)
    assert len(b) == 2


def test_new_credentials_past_the_budget_are_refused() -> None:
    b = live.Backlog(new_max=3)
    for i in range(3):
        assert b.add("/w", live.Redo(f"{i}/.env", rule=NEW.rule), 0.0) is None
    assert b.add("/w", live.Redo("1/.env", rule=NEW.rule), 0.0) is None  # one seen before
    assert b.add("/w", live.Redo("x", mask=ENV), 0.0) is None  # not new: a re-cover
    why = b.add("/w", live.Redo("3/.env", rule=NEW.rule), 0.0)
    assert why is not None and "more than 3 new credentials" in why
    # counted over the session, not over what waits: taking them frees nothing
    while isinstance(b.take(0.0), tuple):
        pass
    assert b.add("/w", live.Redo("4/.env", rule=NEW.rule), 0.0) is not None


def test_a_change_that_waited_too_long_is_refused() -> None:
    b = live.Backlog(lag_max=10.0)
    b.add("/w", NEW, 100.0)
    b.add("/w", live.Redo("x", mask=ENV), 105.0)
    why = b.take(110.5)
    assert isinstance(why, str) and "waited 10.5s" in why
    assert len(b) == 2  # nothing taken: the guard is over
    assert b.take(110.0) == ("/w", NEW, 100.0)  # exactly the budget: still in time


def _held_tree() -> live.Watched:
    pins = [Protection(".vscode", "ro", True), Protection("pkg/.npmrc", "ro", False)]
    return live.watched(
        "/w", pins, [], [], symlinks={".envrc": "shared/envrc"}, edit=["tools/.husky"]
    )


@pytest.mark.parametrize(
    ("dir_rel", "name", "is_dir", "rel", "held_by"),
    [
        ("", ".claude", True, ".claude", "Claude Code"),
        ("", ".mcp.json", False, ".mcp.json", "Claude Code"),
        ("a/b", ".cursor", True, "a/b/.cursor", "Cursor"),
        (".claude", "settings.json", False, ".claude", "Claude Code"),  # its directory, whole
        ("x/.yarn/releases", "y.cjs", False, "x/.yarn/releases", "yarn"),
        ("", ".envrc", False, ".envrc", "direnv"),  # a symlink at the start: replaced
        ("", ".npmrc", False, ".npmrc", "npm"),  # judged by its keys when it is moved
    ],
)
def test_a_held_entry_the_payload_makes_is_moved(
    dir_rel: str, name: str, is_dir: bool, rel: str, held_by: str
) -> None:
    redo = live.on_change(_held_tree(), dir_rel, name, is_dir)
    assert redo is not None and redo.rel == rel and redo.hold is not None
    assert redo.hold.tool == held_by and redo.pin is None


@pytest.mark.parametrize(
    ("dir_rel", "name", "is_dir"),
    [
        (".vscode", "tasks.json", False),  # beneath a pin: only the host writes there
        ("node_modules/p", ".claude", True),  # an install's output
        ("tools", ".husky", True),  # --edit-config
        ("tools/.husky", "pre-commit", False),
        ("src", "index.js", False),
    ],
)
def test_what_is_not_held_live(dir_rel: str, name: str, is_dir: bool) -> None:
    redo = live.on_change(_held_tree(), dir_rel, name, is_dir)
    assert redo is None or redo.hold is None


def test_a_pinned_held_file_is_pinned_again_not_moved() -> None:
    redo = live.on_change(_held_tree(), "pkg", ".npmrc", False)
    assert redo is not None and redo.pin is not None and redo.hold is None


def test_a_held_config_written_in_place_is_judged_again() -> None:
    """An .npmrc made empty (nothing to hold), then written with node-options."""
    redo = live.on_write(_held_tree(), "", ".npmrc")
    assert redo is not None and redo.hold is not None
    assert live.on_write(_held_tree(), ".vscode", "tasks.json") is None  # pinned: the host's


def test_a_credential_that_is_held_too_keeps_its_cover_rule() -> None:
    redo = live.on_change(_held_tree(), "sub", ".npmrc", False)
    assert redo is not None and redo.hold is not None and redo.rule is not None


def test_a_socket_that_appears_is_covered_unless_revealed(tmp_path: Path) -> None:
    import socket

    from boxyd.daemon.livewatch import sockets_in
    from boxyd.plan import masking

    (tmp_path / "run").mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "run/wd.sock"))
    (tmp_path / "run/file").write_text("x")
    os.mkfifo(tmp_path / "run/fifo")
    try:
        assert sockets_in(str(tmp_path), "run") == ["wd.sock"]
    finally:
        s.close()
    w = live.watched(str(tmp_path), [], [], [str(tmp_path / "run/shown.sock")])
    redo = live.socket_redo(w, "run", "wd.sock")
    assert redo == live.Redo("run/wd.sock", rule=masking.SOCKET)
    assert live.socket_redo(w, "run", "shown.sock") is None  # --reveal
