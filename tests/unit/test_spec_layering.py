"""boxyd.config.layering: which profile a run takes, with the project's .boxy.yaml
on top as its approval allows; and what `boxyctl trust` says of it (the same layering)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from boxy import caches
from boxy.errors import ProfileError
from boxyd.config import layering
from boxyd.config import projectconfig as pc


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    home = tmp_path / "home"
    wd = home / "proj"
    wd.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return {"home": str(home), "wd": str(wd), "config": str(tmp_path / "config")}


def layer(
    p: dict[str, str], requested: str | None = None, registry: Any = None
) -> tuple[layering.Layers, list[str], list[str]]:
    notes: list[str] = []
    held: list[str] = []
    got = layering.layer(
        requested, cwd=p["wd"], workdir=p["wd"], home=p["home"], user="u",
        client_env={}, registry=registry, notes=notes, held=held,
    )  # fmt: skip
    return got, notes, held


def write(p: dict[str, str], name: str, text: str) -> None:
    Path(p["wd"], name).write_text(text)


def approve(p: dict[str, str]) -> None:
    pc.approve(pc.read(p["wd"], pc.run_env(p["home"], "u", {})), p["config"])


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("node", "node"),  # a preset or a user profile: looked up by name
        ("~/p.yaml", "/home/u/p.yaml"),
        ("~", "~"),  # a name: only a path is expanded
        ("~/", "/home/u"),
        ("p.yaml", "/w/p.yaml"),
        ("../x/p.yml", "/x/p.yml"),
        ("/a/./b.yaml", "/a/b.yaml"),
        ("~x/p.yaml", "/w/~x/p.yaml"),  # only ~ and ~/ are the home
    ],
)
def test_profile_ref(name: str, want: str) -> None:
    assert layering.profile_ref(name, "/home/u", "/w") == want


def test_profile_context_holds_the_profiles_own_cache() -> None:
    got = layering.profile_context("/w", "/home/u", "node")
    assert got == {"workdir": "/w", "home": "/home/u", "cache": caches.project_dir("/home/u", "node", "/w")}  # fmt: skip


def test_without_a_project_the_profile_asked_for_or_the_default(project: dict[str, str]) -> None:
    got, notes, held = layer(project)
    assert (got.name, got.profile.name, got.trusted) == ("generic", "generic", False)
    assert got.project.empty and notes == held == []
    got, _, _ = layer(project, "offline")
    assert (got.name, got.profile.net) == ("offline", "none")


def test_the_project_names_the_profile_and_widening_is_held_back(project: dict[str, str]) -> None:
    write(project, pc.NAME, "profile: offline\ntty: true\nseccomp: compat\nenv: {A: b}\n")
    got, notes, held = layer(project)
    assert got.name == "offline" and not got.trusted
    assert got.profile.net == "none"  # offline's own
    assert (got.profile.tty, got.profile.seccomp) == (None, None)  # generic's
    assert got.profile.env == {"A": "b"}  # never wider
    assert notes == [] and held == [f"seccomp (compat), tty of {project['wd']}/{pc.NAME}"]


def test_the_flag_beats_the_projects_profile(project: dict[str, str]) -> None:
    write(project, pc.NAME, "profile: node\n")
    got, _, held = layer(project, "offline")
    assert got.name == "offline" and held == []


def test_an_approved_project_applies_whole(project: dict[str, str]) -> None:
    write(project, pc.NAME, "profile: offline\nnet: public\n")
    approve(project)
    got, notes, held = layer(project)
    assert got.trusted and got.name == "offline" and got.profile.net == "public"
    assert notes == [f"{project['wd']}/{pc.NAME}: approved; applied on top of profile offline"]
    assert held == []
    assert got.profile.source == f"offline + {project['wd']}/{pc.NAME}"


def test_an_invalid_project_file_is_held_back_unless_approved(project: dict[str, str]) -> None:
    write(project, pc.NAME, "net: [\n")
    got, _, held = layer(project)
    assert got.name == "generic" and held == []
    # said as invalid, where: never as "not approved" (trust would refuse it)
    assert got.invalid[0].startswith(
        f"{project['wd']}/{pc.NAME}: not valid, so ignored (none of it applies): invalid YAML at line 2"
    )
    assert got.invalid[0].endswith("; fix it and run again")
    approve(project)
    with pytest.raises(ProfileError, match="invalid YAML"):
        layer(project)


def test_an_unapproved_project_that_does_not_load_leaves_the_base(project: dict[str, str]) -> None:
    write(project, pc.NAME, "profile: nosuch\n")
    got, _, held = layer(project)
    assert got.name == "generic" and got.profile.name == "generic"
    assert held == [] and len(got.invalid) == 1
    assert "not valid, so ignored (none of it applies): unknown profile 'nosuch'" in got.invalid[0]


def test_an_unknown_key_is_said_with_the_file_and_the_key(project: dict[str, str]) -> None:
    write(project, pc.NAME, "net: bogus\n")
    got, _, held = layer(project)
    assert held == []
    assert got.invalid == [
        f"{project['wd']}/{pc.NAME}: not valid, so ignored (none of it applies): "
        "key net: expected one of: public, allowlist, none; fix it and run again"
    ]


def test_approved_registries_come_first_in_the_resolver(project: dict[str, str]) -> None:
    write(project, ".npmrc", "registry=https://mirror.test/\n")
    got, notes, _ = layer(project, registry={"npm_registry": "user.test"}.get)
    assert got.registry is not None and got.registry("npm_registry") == "user.test"
    approve(project)
    got, notes, _ = layer(project, registry={"npm_registry": "user.test"}.get)
    assert got.registry is not None and got.registry("npm_registry") == "mirror.test"
    assert notes == [f"{project['wd']}: approved registries: mirror.test"]


def test_project_widening_is_what_trust_says(project: dict[str, str]) -> None:
    empty = pc.read(project["wd"])
    assert layering.project_widening(empty, project["home"]) == []
    write(project, pc.NAME, "profile: offline\nallow_hosts: [a.test]\nlimits: {pids: 99999}\n")
    got = layering.project_widening(pc.read(project["wd"]), project["home"])
    # offline is narrower than generic in net; its allow_hosts (allowlist only) is not
    assert [str(h) for h in got] == ["limits.pids"]
    write(project, pc.NAME, "net: public\nseccomp: compat\n")
    got = layering.project_widening(pc.read(project["wd"]), project["home"])
    assert [str(h) for h in got] == ["seccomp (compat)"]


def test_project_widening_refuses_what_does_not_load(project: dict[str, str]) -> None:
    write(project, pc.NAME, "profile: nosuch\n")
    with pytest.raises(ProfileError, match="unknown profile 'nosuch'"):
        layering.project_widening(pc.read(project["wd"]), project["home"])
    write(project, pc.NAME, "filesystem: {ro: [relative]}\n")
    with pytest.raises(ProfileError, match="is not an absolute path"):
        layering.project_widening(pc.read(project["wd"]), project["home"])
    assert os.listdir(project["wd"]) == [pc.NAME]  # nothing made


def test_trust_says_an_invalid_file_is_invalid_and_where(project: dict[str, str]) -> None:
    write(project, pc.NAME, "filesystem: {ro: 3}\n")
    with pytest.raises(ProfileError) as e:
        layering.project_widening(pc.read(project["wd"]), project["home"])
    assert str(e.value) == (
        f"{project['wd']}/{pc.NAME}: not valid, so not approved: key filesystem.ro: "
        "expected a list; fix it and run `boxyctl trust` again"
    )
