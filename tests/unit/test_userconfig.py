"""The user's own git configuration, read by the pure parser (gitguard/userconfig.py)."""

from __future__ import annotations

import os
from pathlib import Path

from boxyd.gitguard import discover, userconfig


def test_no_config_no_hooks_path(tmp_path: Path) -> None:
    assert userconfig.hooks_path(str(tmp_path), {}) is None


def test_global_then_xdg_order_the_global_file_wins(tmp_path: Path) -> None:
    (tmp_path / ".config/git").mkdir(parents=True)
    (tmp_path / ".config/git/config").write_text("[core]\n\thooksPath = from-xdg\n")
    assert userconfig.hooks_path(str(tmp_path), {}) == "from-xdg"
    (tmp_path / ".gitconfig").write_text("[core]\n\thooksPath = .githooks\n")
    assert userconfig.hooks_path(str(tmp_path), {}) == ".githooks"


def test_xdg_config_home_is_honoured(tmp_path: Path) -> None:
    (tmp_path / "x/git").mkdir(parents=True)
    (tmp_path / "x/git/config").write_text("[core]\nhookspath=h\n")
    assert userconfig.hooks_path(str(tmp_path), {"XDG_CONFIG_HOME": str(tmp_path / "x")}) == "h"


def test_tilde_is_the_home(tmp_path: Path) -> None:
    (tmp_path / ".gitconfig").write_text("[core]\n\thooksPath = ~/hooks\n")
    assert userconfig.hooks_path(str(tmp_path), {}) == str(tmp_path / "hooks")


def test_includes_and_include_ifs_are_followed(tmp_path: Path) -> None:
    (tmp_path / "inc").write_text("[core]\n\thooksPath = via-include\n")
    (tmp_path / ".gitconfig").write_text("[include]\n\tpath = inc\n")
    assert userconfig.hooks_path(str(tmp_path), {}) == "via-include"
    (tmp_path / "work.inc").write_text("[core]\n\thooksPath = via-includeif\n")
    (tmp_path / ".gitconfig").write_text('[includeIf "gitdir:~/work/"]\n\tpath = ~/work.inc\n')
    assert userconfig.hooks_path(str(tmp_path), {}) == "via-includeif"


def test_an_include_loop_ends(tmp_path: Path) -> None:
    (tmp_path / ".gitconfig").write_text(
        "[include]\n\tpath = .gitconfig\n[core]\n\thooksPath = x\n"
    )
    assert userconfig.hooks_path(str(tmp_path), {}) == "x"


def test_a_fifo_is_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / ".gitconfig")
    assert userconfig.hooks_path(str(tmp_path), {}) is None  # returns: nothing blocked


def test_the_walker_takes_a_relative_global_hooks_path_from_each_work_tree(tmp_path: Path) -> None:
    import subprocess

    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    for repo in ("w", "w/nested"):
        (tmp_path / repo).mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(tmp_path / repo)], check=True, env=env)
        (tmp_path / repo / ".githooks").mkdir()
        (tmp_path / repo / ".githooks/pre-commit").write_text("#!/bin/sh\n")
    lay = discover.layout(str(tmp_path / "w"), user_hooks=".githooks")
    roles = {c.rel: c.role for c in lay.controls}
    assert roles.get(".githooks") == "hookspath"
    assert roles.get("nested/.githooks") == "hookspath"
    assert roles.get(".githooks/pre-commit") == "hook"
    without = {c.rel for c in discover.layout(str(tmp_path / "w")).controls}
    assert ".githooks" not in without
