"""Git during the session (issue 31 §3): the payload changes what git reads while the
run goes on, and the user's shell prompt runs `git status` on the host meanwhile. A
change under a gitdir (or a new repository anywhere) has the git guard's discovery run
again at once and what it finds moved to the quarantine, live — not at the end. The
control (--allow-git-write) shows each plant does run on the host."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import User
from tests.escape.conftest import (
    GIT_FLAGS,
    boxy_argv,
    git,
    spawn,
    stop,
    wait_for,
    write_payload,
)

pytestmark = pytest.mark.sandbox

PLANT = r"""
import shutil, subprocess
marker, how = sys.argv[1], sys.argv[2]
def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True)
script = os.path.abspath("fsmon.sh")
with open(script, "w") as f:
    f.write(f"#!/bin/sh\ntouch {marker}\n")
os.chmod(script, 0o755)
if how == "commondir":  # the issue's: a common dir of the payload's, its config running it
    os.mkdir(".git-common")
    shutil.copy(".git/config", ".git-common/config")
    with open(".git-common/config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {script}\n")
    for name in ("objects", "refs"):
        os.symlink(f"../.git/{name}", f".git-common/{name}")
    with open(".git/commondir", "w") as f:
        f.write("../.git-common\n")
elif how == "nested-gitlink":  # a new repository, registered in the outer index
    sh("git", "init", "-q", "nested")
    with open("nested/f", "w") as f:
        f.write("x\n")
    sh("git", "-C", "nested", "add", "f")
    sh("git", "-C", "nested", "commit", "-q", "-m", "n")
    sh("git", "-C", "nested", "config", "core.fsmonitor", script)
    sha = subprocess.run(["git", "-C", "nested", "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()
    sh("git", "update-index", "--add", "--cacheinfo", f"160000,{sha},nested")
elif how == "modules":  # an absorbed submodule's gitdir, made in .git/modules
    os.makedirs(".git/modules", exist_ok=True)
    sh("git", "init", "-q", "--separate-git-dir", ".git/modules/sub", "sub")
    sh("git", "--git-dir=.git/modules/sub", "config", "core.fsmonitor", script)
    with open("sub/f", "w") as f:
        f.write("x\n")
    sh("git", "-C", "sub", "add", "f")
    sh("git", "-C", "sub", "commit", "-q", "-m", "s")
    sha = subprocess.run(["git", "-C", "sub", "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()
    sh("git", "update-index", "--add", "--cacheinfo", f"160000,{sha},sub")
time.sleep(0.5)  # the guard's moment: a prompt that runs within it is README's window
open("PLANTED", "w").close()
tried("planted", how)
time.sleep(float(sys.argv[3]))
"""

HOWS = ["commondir", "nested-gitlink", "modules"]


def _session(
    user: User, repo: Path, how: str, marker: Path, *flags: str
) -> subprocess.Popen[bytes]:
    from tests.conftest import Boxy

    write_payload(Boxy(user, repo), PLANT, "plant.py")
    argv = boxy_argv(*flags, *GIT_FLAGS, cmd=["python3", "plant.py", str(marker), how, "2.5"])
    return spawn(user, argv, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _prompt(user: User, repo: Path) -> None:
    """What a shell prompt does on the host while the session runs: git status, a few
    times over a second and a half."""
    wait_for(lambda: (repo / "PLANTED").exists(), 30, "the payload to plant")
    for _ in range(6):
        git(user, repo, "status", "--porcelain", check=False)
        time.sleep(0.25)


@pytest.mark.parametrize("how", HOWS)
def test_what_git_would_read_is_moved_while_the_session_runs(
    user: User, repo: Path, how: str
) -> None:
    marker = user.home / f".boxy-escape-live-git-{uuid.uuid4().hex[:8]}"
    proc = _session(user, repo, how, marker)
    try:
        _prompt(user, repo)
        ran = marker.exists()
        out, err = proc.communicate(timeout=60)
        said = err.decode()
        if ran:
            print(f"ESCAPED the host's git status ran the payload's fsmonitor ({how})")
        assert not ran, said
        assert "live guard: git guard: moved" in said, said
    finally:
        stop(proc)
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("how", HOWS)
def test_the_control_runs_on_the_host(user: User, repo: Path, how: str) -> None:
    marker = user.home / f".boxy-escape-live-git-{uuid.uuid4().hex[:8]}"
    proc = _session(user, repo, how, marker, "--allow-git-write")
    try:
        _prompt(user, repo)
        assert marker.exists(), "the attack did not reproduce: the guarded case proves nothing"
    finally:
        stop(proc)
        marker.unlink(missing_ok=True)
