"""boxyd/plan/tools.py: which binary answers, and what a tool sandbox shows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boxyd.config import hosttools
from boxyd.config.runspec import SYSTEM_TREES
from boxyd.plan import tools
from boxyd.plan.ops import Bind


def _exe(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_resolve_skips_path_entries_in_a_writable_tree(tmp_path: Path) -> None:
    project = tmp_path / "project"
    planted = _exe(project / ".venv/bin/npm")
    safe = _exe(tmp_path / "opt/bin/npm")
    path = f"{planted.parent}:{safe.parent}"
    assert hosttools.resolve("npm", path, [str(project)]) == str(safe)
    assert hosttools.resolve("npm", path, []) == str(planted)  # the control: first on PATH


def test_resolve_skips_a_symlink_into_a_writable_tree(tmp_path: Path) -> None:
    project = tmp_path / "project"
    planted = _exe(project / "npm")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/npm").symlink_to(planted)
    assert hosttools.resolve("npm", str(tmp_path / "bin"), [str(project)]) is None


def test_resolve_skips_a_writable_tree_spelt_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _exe(real / "bin/git")
    (tmp_path / "link").symlink_to(real)
    # the session's tree is named by its link; the PATH entry by its real path
    assert hosttools.resolve("git", str(real / "bin"), [str(tmp_path / "link")]) is None


@pytest.mark.parametrize("entry", ["", ".", "bin", "./bin"])
def test_resolve_never_takes_a_relative_entry(
    tmp_path: Path, entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _exe(tmp_path / "bin/npm")
    _exe(tmp_path / "npm")
    monkeypatch.chdir(tmp_path)
    assert hosttools.resolve("npm", entry, []) is None


def test_resolve_needs_an_executable_regular_file(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/npm").write_text("not executable")
    (tmp_path / "b/npm").mkdir(parents=True)
    good = _exe(tmp_path / "c/npm")
    path = ":".join(str(tmp_path / d) for d in "abc")
    assert hosttools.resolve("npm", path, []) == str(good)


def test_safe_path_keeps_order_and_drops_the_rest(tmp_path: Path) -> None:
    w = str(tmp_path / "w")
    path = f"/usr/bin:{w}/.venv/bin:relative::{w}:/bin"
    assert hosttools.safe_path(path, [w]) == "/usr/bin:/bin"


def test_hostile_holding_means_an_ancestor_too() -> None:
    assert not hosttools.hostile("/home/u", ["/home/u/proj"])
    assert hosttools.hostile("/home/u", ["/home/u/proj"], holding=True)
    assert hosttools.hostile("/home/u/proj/x", ["/home/u/proj"])
    assert not hosttools.hostile("/home/u/project", ["/home/u/proj"])


def test_installation_of_a_tool_outside_the_system_trees(tmp_path: Path) -> None:
    home = tmp_path / "home"
    prefix = home / ".nvm/versions/node/v20"
    npm = _exe(prefix / "lib/node_modules/npm/bin/npm-cli.js")
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin/npm").symlink_to(npm)
    got = hosttools.installation(str(prefix / "bin/npm"), str(home), [str(home / "proj")])
    assert got == (str(prefix), str(npm.parent.parent))


def test_installation_never_spans_the_home_or_a_writable_tree(tmp_path: Path) -> None:
    home = tmp_path / "home"
    tool = _exe(home / "bin/tool")  # ~/bin: its parent would be the whole home
    assert hosttools.installation(str(tool), str(home), []) == (str(home / "bin"),)
    inside = _exe(tmp_path / "opt/bin/tool")  # opt holds the writable tree opt/proj
    assert hosttools.installation(str(inside), str(home), [str(tmp_path / "opt/proj")]) == (
        str(tmp_path / "opt/bin"),
    )


def test_installation_of_a_system_tool_is_nothing() -> None:
    assert hosttools.installation("/usr/bin/git", "/home/u", ["/home/u/p"]) == ()


def test_plan_executes_only_from_the_system_and_the_tool(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config/pip").mkdir(parents=True)
    exposure = hosttools.Exposure(
        home=str(home),
        read=(str(tmp_path / "tree"),),
        files=(
            str(home / ".npmrc"),
            str(home / ".config/pip/pip.conf"),
            str(tmp_path / "absent/file"),
        ),
        execute=(str(tmp_path / "opt"),),
    )
    plan = tools.plan(exposure, seccomp_bpf="", uid=1000, gid=1000)
    assert plan.serve == "tools" and plan.net == "none" and plan.net_ruleset is None
    executable = {r.path for r in plan.landlock if r.access in ("ro", "rox", "rw")}
    assert executable - {"/etc", *SYSTEM_TREES} == {str(tmp_path / "opt")}
    access = {r.path: r.access for r in plan.landlock}
    assert access[str(tmp_path / "tree")] == "read"
    assert access[str(home)] == "read" and access["/tmp"] == "scratch"
    binds = {b.dst: b for b in plan.ops if isinstance(b, Bind)}
    tree = binds[str(tmp_path / "tree")]
    assert tree.ro and tree.noexec
    npmrc = binds[str(home / ".npmrc")]
    # a config file is opened beneath its directory, never through a symlink
    assert (npmrc.src_base, npmrc.src, npmrc.ro, npmrc.noexec, npmrc.optional) == (
        str(home),
        ".npmrc",
        True,
        True,
        True,
    )
    assert str(home / ".config/pip/pip.conf") in binds
    assert str(tmp_path / "absent/file") not in binds  # no directory: no file to show
    assert not binds[str(tmp_path / "opt")].noexec


def test_plan_holds_no_credentials_of_the_user() -> None:
    plan = tools.plan(hosttools.Exposure(home=os.path.expanduser("~")), seccomp_bpf="")
    paths = {getattr(op, "dst", "") for op in plan.ops}
    assert not any(p.startswith(os.path.expanduser("~")) for p in paths if p)
