"""A project's .boxy.yaml applies only as approved: reading it as hostile input,
approvals by content hash, and what build_spec does with approved and unapproved
content."""

from __future__ import annotations

import os

import pytest

from boxy.errors import UsageError
from boxy.request import RunRequest
from boxyd import projectconfig as pc
from boxyd.spec import build_spec


@pytest.fixture
def project(tmp_path, monkeypatch):
    home = tmp_path / "home"
    wd = home / "proj"
    wd.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return {"home": str(home), "wd": str(wd), "config": str(tmp_path / "config")}


def build(p, **options):
    req = RunRequest.from_wire({"argv": ["true"], "cwd": p["wd"], "options": options})
    return build_spec(req, uid=os.getuid(), user="u", home=p["home"], registry=lambda n: None)


def test_read_refuses_what_is_not_a_small_regular_file(project, tmp_path):
    wd = project["wd"]
    assert pc.read(wd) is None
    os.symlink(str(tmp_path / "elsewhere.yaml"), os.path.join(wd, pc.NAME))
    with pytest.raises(UsageError, match="a symlink"):
        pc.read(wd)
    os.unlink(os.path.join(wd, pc.NAME))
    os.mkfifo(os.path.join(wd, pc.NAME))  # would block a plain open for ever
    with pytest.raises(UsageError, match="not a regular file"):
        pc.read(wd)
    os.unlink(os.path.join(wd, pc.NAME))
    with open(os.path.join(wd, pc.NAME), "w") as f:
        f.write("x" * (pc.MAX_SIZE + 1))
    with pytest.raises(UsageError, match="larger than"):
        pc.read(wd)


def test_an_approval_is_for_this_content_in_this_directory(project):
    wd, config = project["wd"], project["config"]
    with open(os.path.join(wd, pc.NAME), "w") as f:
        f.write("env: {A: '1'}\n")
    cfg = pc.read(wd)
    assert not pc.is_trusted(cfg, config)
    pc.approve(cfg, config)
    assert pc.is_trusted(cfg, config)
    assert not pc.is_trusted(pc.ProjectConfig(wd, cfg.content + b"#"), config)  # changed
    assert not pc.is_trusted(pc.ProjectConfig(wd + "-other", cfg.content), config)  # elsewhere
    assert [r["workdir"] for r in pc.approvals(config)] == [wd]
    assert oct(os.stat(pc.trust_dir(config)).st_mode & 0o777) == "0o700"
    assert pc.revoke(wd, config) == 1 and not pc.is_trusted(cfg, config)


def test_unapproved_content_is_held_back_whole_and_said(project):
    with open(os.path.join(project["wd"], pc.NAME), "w") as f:
        f.write("profile: offline\nnet: public\nenv: {FROM_PROJECT: 'yes'}\n")
    spec = build(project)
    assert spec.profile == "generic" and "FROM_PROJECT" not in spec.env
    assert spec.warnings == [f"{project['wd']}/.boxy.yaml: not approved, so ignored (env, net, "
                             f"profile); `boxyctl trust` in {project['wd']} approves this content"]


def test_approved_content_applies_on_its_profile(project):
    with open(os.path.join(project["wd"], pc.NAME), "w") as f:
        f.write("profile: offline\nenv: {FROM_PROJECT: 'yes'}\nlimits: {pids: 100}\n")
    pc.approve(pc.read(project["wd"]), project["config"])
    spec = build(project)
    assert (spec.profile, spec.net, spec.pids, spec.env["FROM_PROJECT"]) == ("offline", "none", 100, "yes")
    assert spec.warnings == []
    assert build(project, profile="generic").net == "public"  # the flag still wins


def test_an_approved_file_may_not_extend(project):
    with open(os.path.join(project["wd"], pc.NAME), "w") as f:
        f.write("extends: node\n")
    pc.approve(pc.read(project["wd"]), project["config"])
    with pytest.raises(UsageError, match="a project names its profile with profile: NAME"):
        build(project)
