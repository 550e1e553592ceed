"""boxyd runs nothing the payload wrote. The daemon runs unsandboxed as the user, and
it runs tools over the payload's trees: the host's git for the guard's second
opinion, npm and pip for their registry settings. Each case plants what would make
such a tool run the payload's program on the host, and takes the verdict from a
marker file only a host process could write (the sandbox's $HOME is a tmpfs).
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.escape.conftest import GIT_FLAGS, HOST_GIT_ENV, describe, findings, run_py

pytestmark = pytest.mark.sandbox

# A nested repository whose sparse index names a directory whose tree object is gone,
# with a promisor remote: git fills the gap by fetching, through the upload-pack
# program the config names — which the payload wrote. Any git command that expands
# the index (ls-files without --sparse) does it.
PLANT_LAZY_FETCH = """
import subprocess
marker, where = sys.argv[1], sys.argv[2]
def sh(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True, cwd=where)
    if check and r.returncode:
        print("FAILED", argv, r.stderr, flush=True)
        sys.exit(3)
    return r.stdout.strip()
os.makedirs(where + "/sub")
os.makedirs(where + "/other")
for path, text in (("sub/f", "1\\n"), ("other/g", "2\\n")):
    with open(f"{where}/{path}", "w") as f:
        f.write(text)
sh("git", "init", "-q")
sh("git", "add", ".")
sh("git", "commit", "-q", "-m", "x")
sh("git", "sparse-checkout", "init", "--cone")
sh("git", "config", "index.sparse", "true")
sh("git", "sparse-checkout", "set", "other")
tree = sh("git", "rev-parse", "HEAD:sub")
os.unlink(f"{where}/.git/objects/{tree[:2]}/{tree[2:]}")
run = os.path.abspath(where + "/../run.sh")
with open(run, "w") as f:
    f.write(f"#!/bin/sh\\ntouch {marker}\\nexit 1\\n")
os.chmod(run, 0o755)
for key, value in (("core.repositoryformatversion", "1"), ("extensions.partialClone", "origin"),
                   ("remote.origin.url", "file:///nonexistent"), ("remote.origin.promisor", "true"),
                   ("remote.origin.uploadpack", run)):
    sh("git", "config", key, value)
tried("planted", tree)
"""


def _plant(boxy: Boxy, marker: Path, *flags: str) -> subprocess.CompletedProcess[bytes]:
    return run_py(
        boxy, PLANT_LAZY_FETCH, *flags, *GIT_FLAGS, args=(str(marker), "node_modules/.cache/lib")
    )


def test_guard_git_never_runs_a_planted_upload_pack(boxy: Boxy, user: User) -> None:
    marker = user.home / f".boxy-escape-uploadpack-{uuid.uuid4().hex[:8]}"
    try:
        r = _plant(boxy, marker)
        assert b"TRIED planted" in r.stdout, describe(r)
        if marker.exists():
            print("ESCAPED the guard's own git ran the payload's upload-pack on the host")
        assert not marker.exists(), describe(r)
        lines = findings(r)
        assert any(
            "node_modules/.cache/lib/.git/config" in ln and "remote.origin.uploadpack" in ln
            for ln in lines
        ), describe(r)
    finally:
        marker.unlink(missing_ok=True)


def test_upload_pack_attack_is_real_against_host_git(boxy: Boxy, user: User) -> None:
    """Control for the case above: the planted repository does make the host's git run
    the payload's program (the guard's old `ls-files`), so the guarded case is not
    passing vacuously. --allow-git-write keeps the guard from moving the config."""
    marker = user.home / f".boxy-escape-uploadpack-{uuid.uuid4().hex[:8]}"
    try:
        r = _plant(boxy, marker, "--allow-git-write")
        assert b"TRIED planted" in r.stdout, describe(r)
        assert not marker.exists()
        user.run(
            ["git", "-c", "safe.directory=*", "ls-files", "-s", "--", ":/"],
            cwd=boxy.workdir / "node_modules/.cache/lib",
            extra_env=HOST_GIT_ENV,
        )
        assert marker.exists(), "the attack did not reproduce: the guarded test proves nothing"
    finally:
        marker.unlink(missing_ok=True)


PLANTED_TOOL = '#!/bin/sh\ntouch {marker}\nexec /usr/bin/{name} "$@"\n'


@pytest.mark.parametrize("profile,tool", [("node", "npm"), ("python", "python3")])
def test_settings_never_run_a_tool_from_a_writable_tree(
    boxy: Boxy, user: User, profile: str, tool: str
) -> None:
    """A project venv on the client's PATH: the payload wrote .venv/bin/npm (python3)
    in one run; the next run's registry settings must not be asked of it."""
    marker = user.home / f".boxy-escape-tool-{uuid.uuid4().hex[:8]}"
    venv_bin = boxy.workdir / ".venv/bin"
    try:
        r = run_py(
            boxy,
            """
name, text = sys.argv[1], sys.argv[2]
os.makedirs(".venv/bin", exist_ok=True)
with open(".venv/bin/" + name, "w") as f:
    f.write(text)
os.chmod(".venv/bin/" + name, 0o755)
tried("planted", name)
""",
            args=(tool, PLANTED_TOOL.format(marker=marker, name=tool)),
        )
        assert b"TRIED planted" in r.stdout, describe(r)
        path = f"{venv_bin}:{BIN}:/usr/local/bin:/usr/bin:/bin"
        r = boxy.run("--net", "none", "-p", profile, "-v", cmd=["true"], extra_env={"PATH": path})
        if marker.exists():
            print(f"ESCAPED boxyd ran the payload's {tool} on the host")
        assert not marker.exists(), describe(r)
        assert r.returncode == 0, describe(r)
        said = r.stderr.decode()
        asked = re.findall(rf"{tool} settings: asked (/\S+), in a tool sandbox", said)
        assert asked and not asked[0].startswith(str(boxy.workdir)), said  # -v names it
        # the control: the planted program is a real one, run from that PATH on the host
        user.run([tool, "--version"], extra_env={"PATH": path}, cwd=boxy.workdir)
        assert marker.exists(), "the planted tool did not run from PATH: the case proves nothing"
    finally:
        marker.unlink(missing_ok=True)
