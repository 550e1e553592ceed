"""hostrun: which entries of a writable tree a host program obeys unasked (pure)."""

from __future__ import annotations

import pytest

from boxyd.config import hostrun
from boxyd.config.hostrun import Judge
from boxyd.plan import toolconfig


@pytest.mark.parametrize(
    "rel",
    [
        ".claude",
        ".mcp.json",
        "pkg/a/.mcp.json",  # any depth: a harness started in a package of a monorepo
        ".cursor",
        ".gemini",
        ".codex",
        ".qwen",
        ".vscode",
        "proj.code-workspace",
        ".idea",
        ".devcontainer",
        ".devcontainer.json",
        ".nvim.lua",
        ".dir-locals.el",
        ".envrc",
        "mise.toml",
        ".config/mise.toml",
        ".config/mise",
        "mise/config.toml",
        ".husky",
        ".pre-commit-config.yaml",
        "lefthook.yml",
        ".config/lefthook-local.yaml",
        ".lintstagedrc.json",
        "lint-staged.config.mjs",
        "commitlint.config.ts",
        ".simple-git-hooks.json",
        ".npmrc",
        "sub/.yarnrc.yml",
        ".pnpmfile.cjs",
        ".env.yarn",
        ".yarn/releases",
        "w/.yarn/plugins",
        "bunfig.toml",
        ".cargo/config.toml",
        "rust-toolchain.toml",
        ".mvn",
        "gradle/wrapper/gradle-wrapper.properties",
        ".bundle/config",
        ".github/hooks",
        ".python-version",
        ".tool-versions",
    ],
)
def test_members_are_held(rel: str) -> None:
    assert hostrun.match(rel) is not None


@pytest.mark.parametrize(
    "rel",
    [
        "node_modules/p/.claude",  # an install's output
        "a/node_modules/.npmrc",
        ".git/.vscode",  # the git guard's
        "CLAUDE.md",  # instructions, not a command
        "AGENTS.md",
        "package.json",  # reported: npm runs its scripts when you run them
        "Makefile",
        ".github/workflows",  # CI: reported
        "src/config",
        "releases",
        ".code-workspace",  # the bare suffix is no workspace file
        ".claude/settings.json",  # held through its directory: held_above
        "",
    ],
)
def test_others_are_not(rel: str) -> None:
    assert hostrun.match(rel) is None


def test_a_held_directory_holds_what_is_beneath_it() -> None:
    assert hostrun.held_above(".claude/settings.json") == ".claude"
    assert hostrun.held_above("a/.vscode/tasks.json") == "a/.vscode"
    assert hostrun.held_above("x/.yarn/releases/yarn.cjs") == "x/.yarn/releases"
    assert hostrun.held_above(".claude") is None
    assert hostrun.held_above("src/index.js") is None
    assert hostrun.held_above("node_modules/.claude/x") is None


def test_the_package_managers_configs_are_judged_by_their_keys() -> None:
    keyed = {n for n, h in hostrun.NAMES.items() if h.judge is Judge.KEYS}
    assert keyed == set(toolconfig.TOOLS)


def test_edit_config_leaves_the_entry_and_what_is_beneath_it_only() -> None:
    edit = [".claude"]
    assert hostrun.edited(".claude", edit)
    assert hostrun.edited(".claude/settings.json", edit)
    assert not hostrun.edited(".claudex", edit)
    assert not hostrun.edited(".claude", [".claude/settings.local.json"])  # never widened
    assert not hostrun.edited(".vscode", [])


def test_the_skipped_directories_are_the_credentials_own() -> None:
    from boxyd.plan import credentials

    assert hostrun.SKIP_DIRS == credentials.SKIP_DIRS


def test_every_member_says_who_obeys_it_and_how() -> None:
    for held in [*hostrun.NAMES.values(), *hostrun.PATHS.values(), *hostrun.SUFFIXES.values()]:
        assert held.tool and held.runs and held.why().startswith(held.tool)


@pytest.mark.parametrize(
    "rel",
    [".cargo", "a/.cargo", "gradle", "gradle/wrapper", "x/gradle/wrapper", ".config", "mise",
     ".bundle", "tools", ".yarn", ".github"],
)  # fmt: skip
def test_every_directory_on_the_way_to_a_held_path_is_held_as_a_symlink(rel: str) -> None:
    held = hostrun.as_link(rel)
    assert held is not None and held.judge is hostrun.Judge.SYMLINK, rel
    assert hostrun.match(rel) is None  # a real directory of that name is not held whole


def test_the_links_table_is_every_prefix_of_every_path() -> None:
    prefixes = {k[:n] for k in hostrun.PATHS for n in range(1, len(k))}
    assert set(hostrun.LINKS) == prefixes


@pytest.mark.parametrize("rel", ["docs", "node_modules/.cargo", ".git/gradle", "wrapper", "cargo"])
def test_other_symlinks_are_not_held(rel: str) -> None:
    assert hostrun.as_link(rel) is None


def test_what_a_held_symlink_leads_to_is_held_whole() -> None:
    got = hostrun.held_as("docs/build-notes", ".cargo")
    assert got is not None and got[0].judge is hostrun.Judge.ANY
    assert hostrun.held_as(".cargo", link=True) is not None
    assert hostrun.held_as(".cargo") is None
