"""A writable tree on what host programs obey unasked (issue 33 §2): config/hostconfig.py
(the places of your home) and config/filesystem.py's check_host_config (the refusal,
--allow-host-config, and a --rw on a project's held entry itself)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from boxy.errors import UsageError
from boxy.request import RunOptions
from boxyd.config import filesystem, hostconfig
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import PathEntry

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("XDG_DATA_HOME", "ZDOTDIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    h = tmp_path / "home"
    for d in ("proj/.claude", ".ssh", ".local/share/applications", ".cargo/registry", "dots"):
        (h / d).mkdir(parents=True)
    (h / "dots/bashrc").write_text("# mine\n")
    return h


def decide(home: Path, notes: list[str] | None = None, **kw: Any) -> filesystem.Filesystem:
    profile = Profile(name="p", source="p.yaml", **kw.pop("profile_kw", {}))
    return filesystem.decide(
        RunOptions(**kw), profile,
        cwd=str(home / "proj"), workdir=str(home / "proj"), home=str(home), uid=os.getuid(),
        client_env={}, notes=[] if notes is None else notes,
    )  # fmt: skip


def refused(home: Path, **kw: Any) -> str:
    with pytest.raises(UsageError) as e:
        decide(home, **kw)
    return str(e.value)


def test_the_class_holds_what_the_issue_and_the_tools_docs_name(home: Path) -> None:
    got = {p.path[len(str(home)) + 1 :]: p for p in hostconfig.places(str(home), [{}])}
    for rel in (
        ".ssh", ".bashrc", ".profile", ".bash_logout", ".zshrc", ".zshenv", ".xprofile",
        ".pam_environment", ".gitconfig", ".npmrc", ".pip", ".docker/config.json",
        ".local/bin", ".local/lib", ".local/share/applications", ".cargo/config.toml",
    ):  # fmt: skip
        assert rel in got, rel
    assert got[".ssh"].tool == "ssh and sshd" and "ProxyCommand" in got[".ssh"].runs
    # where the environment puts them: $ZDOTDIR's rc files, $XDG_DATA_HOME's applications
    env = {"ZDOTDIR": "/z", "XDG_DATA_HOME": "/d", "HOME": "/ignored"}
    paths = {p.path for p in hostconfig.places(str(home), [env])}
    assert {"/z/.zshrc", "/d/applications", f"{home}/.zshrc"} <= paths
    assert hostconfig.places("/", [{}]) == []


def test_the_readme_names_every_member() -> None:
    text = README.read_text()
    section = text[text.index("**In your home directory**") :]
    section = section[: section.index("\n\n")]
    for rel, _, _ in (*hostconfig.HOME, *hostconfig.DATA):
        assert f"`{rel}" in section or f"`~/{rel}" in section or f"/{rel}`" in section, rel
    for name in hostconfig.ZDOT:
        assert name in section, name


def test_is_lies_in_and_holds(home: Path) -> None:
    known = hostconfig.resolved(hostconfig.places(str(home), [{}]))
    verbs = {
        tree: sorted(
            {(v, p.path[len(str(home)) + 1 :]) for v, p in hostconfig.touched(tree, known)}
        )
        for tree in (f"{home}/.ssh", f"{home}/.ssh/conf.d", f"{home}/.cargo", f"{home}/proj")
    }
    assert verbs[f"{home}/.ssh"] == [("is", ".ssh")]
    assert verbs[f"{home}/.ssh/conf.d"] == [("lies in", ".ssh")]
    assert ("holds", ".cargo/bin") in verbs[f"{home}/.cargo"]
    assert ("holds", ".cargo/config.toml") in verbs[f"{home}/.cargo"]
    assert verbs[f"{home}/proj"] == []


def test_a_rw_on_ssh_is_refused_naming_what_runs_and_the_flag(home: Path) -> None:
    line = refused(home, rw=[f"{home}/.ssh"])
    assert line == (
        f"--rw {home}/.ssh: is {home}/.ssh, and ssh and sshd run the commands its config "
        "names (ProxyCommand, LocalCommand, Match exec), its rc at each login, and take "
        "authorized_keys and environment: the host would obey what the run writes there; "
        f"--allow-host-config {home}/.ssh allows it"
    )
    assert "\n" not in line


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"mkdir": ["~/.cargo"]}, "--mkdir {home}/.cargo: holds {home}/.cargo/bin, and your shell"),
        ({"rw": ["~/.local/share/applications"]}, "is {home}/.local/share/applications, and your desktop"),
        ({"mkdir": ["~/.local/share/applications/x"]}, "lies in {home}/.local/share/applications"),
        ({"rw": ["~/.ssh"], "allow_host_config": ["~/.sshx"]}, "--rw {home}/.ssh: is"),
        # a project's held entry itself as a tree of its own: its walk would hold nothing
        ({"rw": ["~/proj/.claude"]}, "--rw {home}/proj/.claude: is {home}/proj/.claude, and Claude Code"),
        ({"profile_kw": {"rw": [PathEntry("{home}/.ssh")]}}, "profile p.yaml: filesystem.rw {home}/.ssh: is"),
    ],
)  # fmt: skip
def test_each_kind_of_writable_tree_is_refused(home: Path, kw: dict[str, Any], words: str) -> None:
    kw = _expand(kw, home)
    assert words.format(home=home) in refused(home, **kw)


def _expand(value: Any, home: Path) -> Any:
    if isinstance(value, str):
        return value.replace("~", str(home)).replace("{home}", str(home))
    if isinstance(value, PathEntry):
        return PathEntry(_expand(value.path, home), value.optional)
    if isinstance(value, dict):
        return {k: _expand(v, home) for k, v in value.items()}
    return [_expand(v, home) for v in value]


def test_a_dotfiles_repository_holding_your_bashrc_is_refused(home: Path) -> None:
    (home / ".bashrc").symlink_to(home / "dots/bashrc")
    line = refused(home, rw=[f"{home}/dots"])
    assert line.startswith(f"--rw {home}/dots: holds {home}/.bashrc, and bash runs it")


def test_the_workdir_too(home: Path) -> None:
    with pytest.raises(UsageError) as e:
        filesystem.decide(
            RunOptions(), Profile(name="p", source="p.yaml"), cwd=str(home), workdir=f"{home}/.ssh",
            home=str(home), uid=os.getuid(), client_env={}, notes=[],
        )  # fmt: skip
    assert str(e.value).startswith(f"workdir {home}/.ssh: is {home}/.ssh, and ssh")


def test_allow_host_config_allows_it_and_says_so(home: Path) -> None:
    notes: list[str] = []
    got = decide(home, notes, rw=[f"{home}/.ssh"], allow_host_config=[f"{home}/.ssh"])
    assert got.rw == [PathEntry(f"{home}/.ssh")]
    assert got.allow_host_config == [f"{home}/.ssh"]
    assert notes == [
        f"--allow-host-config: the run may write {home}/.ssh, where ssh and sshd run the "
        "commands its config names (ProxyCommand, LocalCommand, Match exec), its rc at each "
        "login, and take authorized_keys and environment"
    ]
    # naming the place a wider tree holds allows that place, and only it
    got = decide(home, mkdir=[f"{home}/.cargo"], allow_host_config=[f"{home}/.cargo"])
    assert got.allow_host_config == [f"{home}/.cargo"]
    line = refused(home, mkdir=[f"{home}/.cargo"], allow_host_config=[f"{home}/.cargo/bin"])
    assert line.startswith(f"--mkdir {home}/.cargo: holds {home}/.cargo/env, and your shell")


def test_an_allow_that_allows_nothing_is_a_typo(home: Path) -> None:
    assert refused(home, rw=[f"{home}/.cargo/registry"], allow_host_config=[f"{home}/.cargo/registry"]) == (
        f"--allow-host-config {home}/.cargo/registry: allows nothing (no writable tree of this "
        "run is, lies in or holds a place whose files host programs obey)"
    )  # fmt: skip


def test_what_is_not_of_the_class_stays_writable(home: Path) -> None:
    """A cache beside a member (~/.cargo/registry beside ~/.cargo/bin), the claude
    preset's transcripts (~/.claude/projects/<slug>: exposure's exception)."""
    got = decide(home, rw=[f"{home}/.cargo/registry"], mkdir=[f"{home}/.claude/projects/x"])
    assert got.rw == [PathEntry(f"{home}/.cargo/registry")] and got.allow_host_config == []
