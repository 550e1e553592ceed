"""--review with real projects (issue 35 §2): an agent's edit of a git project
reviewed, applied in part and the rest discarded, with `git status` on the host as
the judge; a real `npm install` under --profile node held, its manifest and lock
file applied apart from node_modules, and the package `require()`d by the host's
node afterwards; a host edit made while a session is held wins over the payload's.

The npm test is the only one that leaves the machine, as tests/integration/
test_registries_real.py's do: allowlist mode, the one host npm is configured with
(read from npm's config at test time; no host is named here).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Boxy
from tests.integration.reviewutil import ctl as _ctl
from tests.integration.reviewutil import nothing_held_after  # noqa: F401 (autouse)
from tests.integration.test_registries_real import (
    SMALL_NPM,
    TIMEOUT,
    both,
    ca_flags,
    cidr_flags,
    need_npm,
    registry,
)

pytestmark = pytest.mark.sandbox

APP = "def f():\n    return 1\n"
# the agent: a python edit of one file, a new file, a removed file
AGENT = (
    "python3 -c \"import pathlib; p = pathlib.Path('src/app.py'); "
    "p.write_text(p.read_text().replace('return 1', 'return 2'))\" "
    "&& printf 'def g():\\n    return 3\\n' > src/extra.py && rm old.txt"
)


def _git(boxy: Boxy, *args: str) -> str:
    r = boxy.user.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=boxy.workdir)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


def _held(r: subprocess.CompletedProcess[bytes]) -> str:
    """The id a --review run's last line names."""
    text = r.stderr.decode(errors="replace")
    assert r.returncode == 0, both(r)
    m = re.search(r"boxyctl diff (\w+)", text)
    assert m, text
    return m.group(1)


def _git_project(boxy: Boxy) -> None:
    w = boxy.workdir
    (w / "src").mkdir()
    (w / "src" / "app.py").write_text(APP)
    (w / "src" / "util.py").write_text("X = 1\n")
    (w / "old.txt").write_text("old\n")
    (w / "README.md").write_text("# proj\n")
    boxy.user.chown(w)
    _git(boxy, "init", "-q")
    _git(boxy, "add", "-A")
    _git(boxy, "commit", "-qm", "start")


def test_an_agent_edit_of_a_git_project_applied_in_part(boxy: Boxy) -> None:
    _git_project(boxy)
    sid = _held(boxy.sh(AGENT, "--review", input=b""))
    assert _git(boxy, "status", "--porcelain") == ""  # nothing reached the host yet
    d = _ctl(boxy, "diff", sid)
    text = d.stdout.decode()
    assert d.returncode == 0, d.stderr
    summary = text.split("\n\n", 1)[0].splitlines()
    assert sorted(summary[:-1]) == ["A src/extra.py  22B", "D old.txt  4B", "M src/app.py  22B"]
    assert summary[-1] == "1 added, 1 changed, 1 removed; 44B to land"
    assert "--- a/src/app.py\n+++ b/src/app.py\n" in text
    assert "-    return 1\n+    return 2\n" in text
    assert "--- /dev/null\n+++ b/src/extra.py\n" in text and "+def g():\n" in text
    a = _ctl(boxy, "apply", sid, "src/app.py")
    assert a.returncode == 0, a.stderr
    assert a.stdout.decode().strip() == f"session {sid}: 1 applied, 0 refused, 2 left held"
    assert _ctl(boxy, "discard", sid).returncode == 0
    assert _git(boxy, "status", "--porcelain") == " M src/app.py\n"
    assert "-    return 1\n+    return 2\n" in _git(boxy, "diff")
    assert not (boxy.workdir / "src" / "extra.py").exists()
    assert (boxy.workdir / "old.txt").read_text() == "old\n"


def test_a_host_edit_while_held_wins_and_the_rest_lands(boxy: Boxy) -> None:
    _git_project(boxy)
    sid = _held(boxy.sh(AGENT + " && echo 'X = 2' > src/util.py", "--review", input=b""))
    # the host edits a file the payload changed too, and one the payload left alone
    (boxy.workdir / "src" / "app.py").write_text("def f():\n    return 'host'\n")
    (boxy.workdir / "README.md").write_text("# proj, by the host\n")
    a = _ctl(boxy, "apply", sid)
    err = a.stderr.decode()
    assert a.returncode == 1, err
    assert err.strip() == "boxyctl: apply: src/app.py: refused: the host changed it meanwhile"
    assert (boxy.workdir / "src" / "app.py").read_text() == "def f():\n    return 'host'\n"
    assert (boxy.workdir / "README.md").read_text() == "# proj, by the host\n"
    assert (boxy.workdir / "src" / "util.py").read_text() == "X = 2\n"
    status = sorted(_git(boxy, "status", "--porcelain").splitlines())
    assert status == [" D old.txt", " M README.md", " M src/app.py", " M src/util.py",
                      "?? src/extra.py"]  # fmt: skip
    left = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)
    assert [c["path"] for c in left["changes"]] == ["src/app.py"]


# --- a real npm install ------------------------------------------------------------------


def _snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry beneath ROOT: its type, mode and bytes (a symlink: its text)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath, name)
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", st.st_mode)
            else:
                out[rel] = ("f", st.st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _npm(boxy: Boxy, *args: str) -> subprocess.CompletedProcess[bytes]:
    host = registry(boxy.user, "npm_registry")
    assert host, "npm has no registry configured (`npm config get registry`)"
    flags = ["--profile", "node", "--review", *cidr_flags([host]), *ca_flags(boxy, "npm")]
    cmd = ["npm", *args, "--no-audit", "--no-fund"]
    return boxy.run(*flags, cmd=cmd, timeout=TIMEOUT, input=b"")


def _require(boxy: Boxy) -> subprocess.CompletedProcess[bytes]:
    js = f"console.log(require('{SMALL_NPM}')(5), require('{SMALL_NPM}')('x'))"
    return boxy.user.run(["node", "-e", js], cwd=boxy.workdir)


def test_a_real_npm_install_held_applied_in_two_steps_then_one_discarded(boxy: Boxy) -> None:
    need_npm()
    manifest = {"name": "boxy-review-npm", "version": "1.0.0", "private": True}
    (boxy.workdir / "package.json").write_text(json.dumps(manifest) + "\n")
    boxy.user.chown(boxy.workdir)
    sid = _held(_npm(boxy, "install", SMALL_NPM))
    assert sorted(p.name for p in boxy.workdir.iterdir()) == ["package.json"]
    stat_lines = _ctl(boxy, "diff", "--stat", sid).stdout.decode().splitlines()
    assert "M package.json" in "\n".join(stat_lines) and "A package-lock.json" in "\n".join(
        stat_lines
    )
    assert any(
        x.startswith("G node_modules/ ") and "(generated: listed, not diffed)" in x
        for x in stat_lines
    ), stat_lines
    changes = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)["changes"]
    by = {c["path"]: c for c in changes}
    assert f"node_modules/{SMALL_NPM}/package.json" in by
    assert all(c.get("generated") == "node_modules" for p, c in by.items() if p != "package.json"
               and p != "package-lock.json"), by  # fmt: skip
    assert "generated" not in by["package.json"] and "generated" not in by["package-lock.json"]
    text = _ctl(boxy, "diff", sid).stdout.decode()
    assert "+++ b/package.json" in text and "+++ b/package-lock.json" in text
    assert "+++ b/node_modules/" not in text  # listed, not diffed
    a = _ctl(boxy, "apply", sid, "package.json", "package-lock.json")
    assert a.returncode == 0, a.stderr
    assert SMALL_NPM in json.loads((boxy.workdir / "package.json").read_text())["dependencies"]
    assert not (boxy.workdir / "node_modules").exists()
    assert _require(boxy).returncode != 0  # not installed on the host yet
    a = _ctl(boxy, "apply", sid, "node_modules")
    assert a.returncode == 0, a.stderr
    assert a.stdout.decode().strip().endswith("nothing left; the review is closed")
    r = _require(boxy)
    assert r.returncode == 0 and r.stdout == b"true false\n", both(r)
    # another run, reviewed and discarded: the tree stays byte for byte as it was
    before = _snapshot(boxy.workdir)
    sid = _held(_npm(boxy, "uninstall", SMALL_NPM))
    listed = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)["changes"]
    assert {"path": f"node_modules/{SMALL_NPM}", "kind": "removed"}.items() <= next(
        c for c in listed if c["path"] == f"node_modules/{SMALL_NPM}"
    ).items()
    assert _ctl(boxy, "discard", sid).returncode == 0
    assert _snapshot(boxy.workdir) == before
    assert _require(boxy).stdout == b"true false\n"
