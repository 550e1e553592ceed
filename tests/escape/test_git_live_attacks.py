"""Attacks on the live git guard (issue 31 §3) its own tests do not cover (found by an
attack on the class): each plant makes the host's `git status` (a shell prompt's) run
the payload's core.fsmonitor DURING the session. Each has a control (--allow-git-write).
Where no event tells of the plant (a repository made in node_modules, a config written
through a hard link in objects/) the periodic check finds it within GIT_EVERY (2 s)
and its own time; a check made slow by the payload's ballast is its time late: the
README states both windows, and the prompt here comes after them."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import GIT_FLAGS, boxy_argv, git, spawn, stop, wait_for, write_payload

pytestmark = pytest.mark.sandbox

PLANT = r"""
import shutil, subprocess
marker, how = sys.argv[1], sys.argv[2]
def sh(*argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout.strip()
script = os.path.abspath("fsmon.sh")
with open(script, "w") as f:
    f.write(f"#!/bin/sh\ntouch {marker}\n")
os.chmod(script, 0o755)
line = f"[core]\n\tfsmonitor = {script}\n"

def gitlinked_repo(path):
    # a repository at PATH with one commit, registered as a gitlink in the outer index
    sh("git", "init", "-q", path)
    with open(f"{path}/f", "w") as f:
        f.write("x\n")
    sh("git", "-C", path, "add", "f")
    sh("git", "-C", path, "commit", "-q", "-m", "s")
    sh("git", "update-index", "--add", "--cacheinfo", f"160000,{sh('git', '-C', path, 'rev-parse', 'HEAD')},{path}")

if how == "node_modules":
    # the gitlink first (its index write has a check run: nothing to find yet), then the
    # repository in node_modules: no directory there is watched, no check runs again
    os.makedirs("/tmp/s")
    sh("git", "init", "-q", "/tmp/s/r")  # built outside the tree, for its commit id
    with open("/tmp/s/r/f", "w") as f:
        f.write("x\n")
    sh("git", "-C", "/tmp/s/r", "add", "f")
    sh("git", "-C", "/tmp/s/r", "commit", "-q", "-m", "s")
    sha = sh("git", "-C", "/tmp/s/r", "rev-parse", "HEAD")
    sh("git", "update-index", "--add", "--cacheinfo", f"160000,{sha},node_modules/foo")
    time.sleep(2)
    os.makedirs("node_modules", exist_ok=True)
    sh("cp", "-a", "/tmp/s/r", "node_modules/foo")
    sh("git", "-C", "node_modules/foo", "config", "core.fsmonitor", script)
elif how in ("hardlink", "open-fd"):
    # a harmless nested repository, gitlinked: every check it causes finds nothing. Then
    # its config is written through a second name in its objects/ (not watched), or
    # through a descriptor opened before and never closed (no IN_CLOSE_WRITE)
    gitlinked_repo("sub")
    if how == "open-fd":
        fd = os.open("sub/.git/config", os.O_WRONLY | os.O_APPEND)
    time.sleep(2)
    if how == "hardlink":
        os.link("sub/.git/config", "sub/.git/objects/cfg")
        with open("sub/.git/objects/cfg", "a") as f:
            f.write(line)
    else:
        os.write(fd, line.encode())
elif how == "bare-subdir":
    # src/ made an (implicit, bare) repository: HEAD, objects, refs are GIT_ANYWHERE names
    # (a check runs, finds a harmless one); its config and index come after, and "config"
    # in a directory that is no .git is not a git event. A prompt in src/deep finds it.
    src = os.path.abspath("src")
    os.makedirs("src/deep/x", exist_ok=True)
    os.mkdir("src/objects"); os.mkdir("src/refs")
    with open("src/HEAD", "w") as f:
        f.write("ref: refs/heads/main\n")
    time.sleep(2)
    with open("src/f", "w") as f:
        f.write("x\n")
    sh("git", "add", "f", env=dict(os.environ, GIT_DIR=src, GIT_WORK_TREE=src))
    with open("src/config", "w") as f:
        f.write(f"[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = {src}\n" + line[7:])
elif how == "slow-check":
    # ballast: repositories in node_modules (no check runs as they are made), each with
    # a harmless config just under CONFIG_MAX; every check then parses them all (~0.7 s
    # each here). Then test_git_live.py's own commondir plant, which it catches in 0.5 s.
    big = "[a]\n\tb = c\n" * (1_000_000 // 11)
    for i in range(int(os.environ.get("BALLAST", "2"))):
        d = f"node_modules/pkg{i}/.git"
        os.makedirs(d + "/objects"); os.makedirs(d + "/refs")
        with open(d + "/HEAD", "w") as f:
            f.write("ref: refs/heads/main\n")
        with open(d + "/config", "w") as f:
            f.write(big)
    time.sleep(1)
    os.mkdir(".git-common")
    shutil.copy(".git/config", ".git-common/config")
    with open(".git-common/config", "a") as f:
        f.write(line)
    for name in ("objects", "refs"):
        os.symlink(f"../.git/{name}", f".git-common/{name}")
    with open(".git/commondir", "w") as f:
        f.write("../.git-common\n")
time.sleep(1.0)  # twice the 0.5 s test_git_live.py allows the guard
open("PLANTED", "w").close()
tried("planted", how)
time.sleep(float(sys.argv[3]))
"""

# seconds after the plant the prompt starts: the windows the README states
# (the 2 s period, then several times the idle check: CI machines are loaded).
# slow-check's is its check's own time about three times over (README, "Git"): ~1.4 s
# idle, twice that under the two shards at once, where 6 s was once too short (CI run 25)
WINDOW = {"node_modules": 5.0, "hardlink": 5.0, "slow-check": 10.0}
# how -> where the host's prompt runs git status
HOWS = {
    "node_modules": ".",
    "hardlink": ".",
    "open-fd": ".",
    "bare-subdir": "src/deep",
    "slow-check": ".",
}


def _session(
    user: User, repo: Path, how: str, marker: Path, *flags: str
) -> subprocess.Popen[bytes]:
    write_payload(Boxy(user, repo), PLANT, "plant.py")
    stay = str(WINDOW.get(how, 0.0) + 2.0)  # the prompt's time after the plant
    argv = boxy_argv(*flags, *GIT_FLAGS, cmd=["python3", "plant.py", str(marker), how, stay])
    return spawn(user, argv, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _prompt(user: User, repo: Path, where: str, marker: Path, after: float = 0.0) -> None:
    wait_for(lambda: (repo / "PLANTED").exists(), 60, "the payload to plant")
    time.sleep(after)
    for _ in range(6):
        if (repo / where).is_dir():
            git(user, repo / where, "status", "--porcelain", check=False)
        if marker.exists():
            return
        time.sleep(0.25)


@pytest.mark.parametrize("how", list(HOWS))
def test_live_git_guard_attack(user: User, repo: Path, how: str) -> None:
    marker = user.home / f".boxy-escape-live-git2-{uuid.uuid4().hex[:8]}"
    proc = _session(user, repo, how, marker)
    try:
        _prompt(user, repo, HOWS[how], marker, WINDOW.get(how, 0.0))
        ran = marker.exists()
        out, err = proc.communicate(timeout=90)
        if ran:
            print(f"ESCAPED the host's git status ran the payload's fsmonitor ({how})")
        assert not ran, err.decode()
    finally:
        stop(proc)
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("how", list(HOWS))
def test_live_git_guard_attack_control(user: User, repo: Path, how: str) -> None:
    marker = user.home / f".boxy-escape-live-git2-{uuid.uuid4().hex[:8]}"
    proc = _session(user, repo, how, marker, "--allow-git-write")
    try:
        _prompt(user, repo, HOWS[how], marker)
        assert marker.exists(), "the attack did not reproduce: the guarded case proves nothing"
    finally:
        stop(proc)
        marker.unlink(missing_ok=True)
