"""A project's .boxy.yaml applies only as approved: reading it as hostile input,
approvals by content hash, and what build_spec does with approved and unapproved
content."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boxy.errors import UsageError
from boxy.request import RunRequest
from boxyd.config import projectconfig as pc
from boxyd.config.profiles import Registry
from boxyd.config.runspec import RunSpec
from boxyd.config.spec import build_spec


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    home = tmp_path / "home"
    wd = home / "proj"
    wd.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return {"home": str(home), "wd": str(wd), "config": str(tmp_path / "config")}


def build(p: dict[str, str], **options: object) -> RunSpec:
    req = RunRequest.from_wire({"argv": ["true"], "cwd": p["wd"], "options": options})
    return build_spec(req, uid=os.getuid(), user="u", home=p["home"], registry=lambda n: None)


def write(p: dict[str, str], name: str, text: str) -> str:
    path = os.path.join(p["wd"], name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def test_read_refuses_what_is_not_a_small_regular_file(
    project: dict[str, str], tmp_path: Path
) -> None:
    wd = project["wd"]
    assert pc.read(wd).empty
    os.symlink(str(tmp_path / "elsewhere.yaml"), os.path.join(wd, pc.NAME))
    with pytest.raises(UsageError, match="a symlink"):
        pc.read(wd)
    os.unlink(os.path.join(wd, pc.NAME))
    os.mkfifo(os.path.join(wd, pc.NAME))  # would block a plain open for ever
    with pytest.raises(UsageError, match="not a regular file"):
        pc.read(wd)
    os.unlink(os.path.join(wd, pc.NAME))
    write(project, pc.NAME, "x" * (pc.MAX_SIZE + 1))
    with pytest.raises(UsageError, match="larger than"):
        pc.read(wd)


def test_registry_files_are_read_only_as_data(project: dict[str, str], tmp_path: Path) -> None:
    wd = project["wd"]
    (tmp_path / "npmrc").write_text("registry=https://elsewhere.test/\n")
    os.symlink(str(tmp_path / "npmrc"), os.path.join(wd, ".npmrc"))
    os.makedirs(os.path.join(wd, "venv"))
    os.symlink(str(tmp_path / "npmrc"), os.path.join(wd, "venv", "pip.conf"))
    write(project, "venv/pyvenv.cfg", "home = /usr/bin\n")
    os.mkfifo(os.path.join(wd, "pip.conf"))  # not a venv's: never opened
    assert pc.read(wd).registries == ()  # symlinks are not followed, and say nothing
    os.unlink(os.path.join(wd, ".npmrc"))
    os.mkfifo(os.path.join(wd, ".npmrc"))
    assert pc.read(wd).registries == ()
    os.unlink(os.path.join(wd, ".npmrc"))
    write(project, ".npmrc", "registry=https://r.test/\n@corp:registry=${HOME}\n")
    os.unlink(os.path.join(wd, "venv", "pip.conf"))
    write(project, "venv/pip.conf", "[global]\nindex-url = https://i.test/simple\n")
    write(project, "deep/env/pyvenv.cfg", "")
    write(project, "deep/env/pip.conf", "[global]\nindex-url = https://deep.test/simple\n")
    regs = pc.read(wd, {"HOME": "https://home.test"}).registries
    assert [(r.key, r.url, r.family) for r in regs] == [
        ("registry", "https://r.test/", "npm"),
        ("@corp:registry", "https://home.test", "npm"),
        ("global.index-url", "https://i.test/simple", "pip"),
    ]
    regs = pc.read(wd, {"VIRTUAL_ENV": os.path.join(wd, "deep", "env")}).registries
    assert regs[-1].url == "https://deep.test/simple" and regs[-1].source.endswith(
        "deep/env/pip.conf"
    )


def test_an_approval_is_for_this_content_in_this_directory(project: dict[str, str]) -> None:
    wd, config = project["wd"], project["config"]
    write(project, pc.NAME, "net: public\nenv: {A: '1'}\n")
    cfg = pc.read(wd)
    assert not pc.is_trusted(cfg, config)
    pc.approve(cfg, config)
    assert pc.is_trusted(cfg, config)
    # what cannot widen may change without a new approval; anything else may not
    write(project, pc.NAME, "# a comment\nnet: public\nenv: {A: '2'}\ndescription: x\n")
    assert pc.is_trusted(pc.read(wd), config)
    write(project, pc.NAME, "net: public\nlimits: {pids: 10}\n")
    assert not pc.is_trusted(pc.read(wd), config)
    write(project, pc.NAME, "net: public\nenv: {A: '1'}\n")
    write(project, ".npmrc", "registry=https://r.test/\n")
    assert not pc.is_trusted(pc.read(wd), config)  # a registry named beside it
    assert not pc.is_trusted(pc.Project(wd + "-other", cfg.config, (), cfg.view), config)
    assert [r["workdir"] for r in pc.approvals(config)] == [wd]
    assert oct(os.stat(pc.trust_dir(config)).st_mode & 0o777) == "0o700"
    assert pc.revoke(wd, config) == 1 and not pc.is_trusted(cfg, config)


def test_unapproved_content_applies_only_what_is_no_wider(project: dict[str, str]) -> None:
    write(
        project,
        pc.NAME,
        "profile: offline\nenv: {FROM_PROJECT: 'yes'}\n"
        "limits: {pids: 100, memory: 64GiB}\nfilesystem: {ro: [~/.ssh]}\n",
    )
    ssh = os.path.join(project["home"], ".ssh")
    os.makedirs(ssh)
    spec = build(project)
    # offline (no network) and the lower pids apply; more memory and ~/.ssh do not
    assert (spec.profile, spec.net, spec.pids, spec.memory) == ("offline", "none", 100, 2 << 30)
    assert spec.env["FROM_PROJECT"] == "yes" and spec.ro == []
    wd = project["wd"]
    assert spec.warnings == [
        f"{wd}: not approved, so held back: filesystem.ro ({ssh}), "
        f"limits.memory of {wd}/.boxy.yaml; `boxyctl trust` in {wd} approves it"
    ]
    # against -p offline, a network is a widening too
    write(project, pc.NAME, "net: public\n")
    spec = build(project, profile="offline")
    assert spec.net == "none" and "held back: net (public) of" in spec.warnings[0]


def test_unapproved_content_that_does_not_load_is_ignored_and_said(project: dict[str, str]) -> None:
    for text, why in (
        ("profile: nonexistent\n", "unknown profile 'nonexistent'"),
        ("netw: public\n", "unknown key 'netw'"),
        ("profile: ./mine.yaml\n", "not a path"),
        ("[unclosed\n", "invalid YAML"),
    ):
        write(project, pc.NAME, text)
        spec = build(project)
        assert spec.profile == "generic" and spec.net == "public"
        assert len(spec.warnings) == 1 and why in spec.warnings[0], (text, spec.warnings)


def test_approved_content_applies_on_its_profile(project: dict[str, str]) -> None:
    write(
        project,
        pc.NAME,
        "profile: offline\nenv: {FROM_PROJECT: 'yes'}\nlimits: {pids: 100}\nseccomp: compat\n",
    )
    pc.approve(pc.read(project["wd"]), project["config"])
    spec = build(project)
    assert (spec.profile, spec.net, spec.pids, spec.seccomp, spec.env["FROM_PROJECT"]) == (
        "offline",
        "none",
        100,
        "compat",
        "yes",
    )
    assert spec.warnings == []
    assert build(project, profile="generic").net == "public"  # the flag still wins


def test_an_approved_file_may_not_extend_or_name_a_file(project: dict[str, str]) -> None:
    for text, why in (
        ("extends: node\n", "a project names its profile with profile: NAME"),
        ("profile: ./p.yaml\n", "not a path"),
    ):
        write(project, pc.NAME, text)
        pc.approve(pc.read(project["wd"]), project["config"])
        with pytest.raises(UsageError, match=why):
            build(project)


def build_node(p: dict[str, str], registry: Registry) -> RunSpec:
    req = RunRequest.from_wire({"argv": ["true"], "cwd": p["wd"], "options": {"profile": "node"}})
    return build_spec(req, uid=os.getuid(), user="u", home=p["home"], registry=registry)


USER_REGISTRY = {"npm_registry": "user.test", "npm_registry_url": "https://user.test/"}.get


def test_a_project_npmrc_registry_widens_only_once_approved(project: dict[str, str]) -> None:
    write(
        project,
        ".npmrc",
        "registry=https://project.test/\n@corp:registry=https://corp.test/\n"
        "@same:registry=https://user.test/x/\n",
    )
    spec = build_node(project, USER_REGISTRY)
    assert spec.allow_hosts == ["user.test"]
    assert spec.env["npm_config_registry"] == "https://user.test/"  # overrides the file's
    assert spec.warnings == [
        f"{project['wd']}: not approved, so held back: registry project.test "
        f"of {project['wd']}/.npmrc; @corp:registry corp.test of "
        f"{project['wd']}/.npmrc; `boxyctl trust` in {project['wd']} approves it"
    ]
    pc.approve(pc.read(project["wd"], pc.run_env(project["home"], "u", {})), project["config"])
    spec = build_node(project, USER_REGISTRY)
    assert spec.allow_hosts == ["project.test", "corp.test", "user.test"] and spec.warnings == []
    assert spec.env["npm_config_registry"] == "https://project.test/"
    # the generic profile reaches everything anyway: nothing to hold back or add
    assert build(project).warnings == []


PIP_USER = {"pip_index": "pypi.test", "pip_files": "files.test"}.get


def test_a_venv_pip_conf_index_widens_only_once_approved(project: dict[str, str]) -> None:
    write(project, ".venv/pyvenv.cfg", "home = /usr/bin\n")
    write(
        project,
        ".venv/pip.conf",
        "[global]\nindex-url = https://mirror.test/simple\n"
        "extra-index-url = https://extra.test/simple\n",
    )
    req = RunRequest.from_wire(
        {"argv": ["true"], "cwd": project["wd"], "options": {"profile": "python"}}
    )

    def spec() -> RunSpec:
        return build_spec(req, uid=os.getuid(), user="u", home=project["home"], registry=PIP_USER)

    s = spec()
    assert s.allow_hosts == ["pypi.test", "files.test"] and "PIP_INDEX_URL" not in s.env
    assert "global.index-url mirror.test of" in s.warnings[0]
    assert "global.extra-index-url extra.test of" in s.warnings[0]
    pc.approve(pc.read(project["wd"], pc.run_env(project["home"], "u", {})), project["config"])
    s = spec()
    assert s.allow_hosts == ["mirror.test", "files.test", "extra.test"] and s.warnings == []
    assert s.env["PIP_INDEX_URL"] == "https://mirror.test/simple"
    # the user's PIP_INDEX_URL beats the project's file, as in pip
    req.client_env["PIP_INDEX_URL"] = "https://env.test/simple"
    assert spec().allow_hosts[0] != "mirror.test"


@pytest.mark.parametrize("text", [
    "x: !!int y\n", "a: !!float x\n", "a: 2001-13-45\n", "a: " + "1" * 5000 + "\n",
    "? [a]\n: 1\n", "env: " + "[" * 3000, "net: &n public\nx: *n\n",
])  # fmt: skip
def test_a_yaml_file_pyyaml_chokes_on_is_named_and_the_run_goes_on(
    project: dict[str, str], text: str
) -> None:
    """The issue's files: each made every later run "internal error in boxyd", and
    `boxyctl trust` crash, until someone deleted it."""
    from boxy.errors import ProfileError
    from boxyd.config.layering import project_widening

    write(project, pc.NAME, text)
    project_ = pc.read(project["wd"])
    assert "unparsed" in project_.view  # an approval would commit to the bytes
    spec = build(project)
    assert spec.profile == "generic" and len(spec.warnings) == 1
    assert "not valid, so ignored" in spec.warnings[0] and "invalid YAML" in spec.warnings[0]
    with pytest.raises(ProfileError, match="invalid YAML at line") as e:  # trust says it, once
        project_widening(project_, project["home"])
    assert "\n" not in str(e.value)
