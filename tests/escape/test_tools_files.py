"""Files the host's tools run when you run them, outside git (.github/workflows/,
.gitlab-ci.yml, the scripts and hook keys of a package.json): a run that created or
changed one is reported, one line each, and in the audit log (fs.exec). What host
programs obey unasked is held instead (test_held_files.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import assert_contained, describe, run_py

pytestmark = pytest.mark.sandbox

PLANT = """set -e
mkdir -p .github/workflows
printf 'on: push\\n' > .github/workflows/ci.yml
printf 'x: 1\\n' > .gitlab-ci.yml
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
        "created .github/workflows",
        "created .gitlab-ci.yml",
        "changed the scripts or hook keys of package.json",
    }, describe(r)
    records = [json.loads(x) for x in (workdir / "audit.jsonl").read_text().splitlines()]
    assert len([x for x in records if x["layer"] == "fs.exec"]) == 3
    # a plain second run changes nothing and says nothing
    r2 = boxy.sh("true")
    assert "tools' files" not in r2.stderr.decode(), describe(r2)


# §4: a tool's own config, under the install presets too (held in every run)
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
