"""The git guard must accept everything git accepts: the review's reproductions, each
attacked from a real sandbox and judged by the host's own git afterwards (`git status`,
`git commit`, run as the user, as they would later). Every attack has a control run
with --allow-git-write that shows the same payload does make the host's git run its
command, so a guarded pass is never vacuous.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import (
    boxy_argv,
    describe,
    findings,
    git,
    run_py,
    stop,
    wait_for,
    write_payload,
)

pytestmark = pytest.mark.sandbox

# A fake bare repository: git rejects .git (its refs made unsearchable) or finds none,
# and then accepts the directory itself, checking only that objects and refs pass
# access(X_OK) — an executable file does.
FAKE_BARE = """
import subprocess
marker, where = sys.argv[1], sys.argv[2]
d = {"root": ".", "subdir": "sub", "commondir": "sub"}[where]
os.makedirs(d, exist_ok=True)
script = os.path.abspath(os.path.join(d, "fsmon.sh"))
with open(script, "w") as f:
    f.write(f"#!/bin/sh\\ntouch {marker}\\n")
os.chmod(script, 0o755)
if where == "root":
    os.chmod(".git/refs", 0o644)
with open(os.path.join(d, "HEAD"), "w") as f:
    f.write("ref: refs/heads/main\\n")
common = d
if where == "commondir":  # HEAD + commondir: objects, refs and config live over there
    common = "common"
    os.makedirs(common)
    with open(os.path.join(d, "commondir"), "w") as f:
        f.write("../common\\n")
with open(os.path.join(common, "objects"), "w") as f:
    f.write("#!/bin/sh\\n")
os.chmod(os.path.join(common, "objects"), 0o755)
os.makedirs(os.path.join(common, "refs"), exist_ok=True)
with open(os.path.join(common, "config"), "w") as f:
    f.write(f"[core]\\n\\tworktree = {os.path.abspath(d)}\\n\\tfsmonitor = {script}\\n"
            f"\\tpager = {script}\\n")
tried("planted", where)
"""


def _marker(user: User, what: str) -> Path:
    return user.home / f".boxy-escape-{what}-{uuid.uuid4().hex[:8]}"


def _host_git(user: User, repo: Path, where: str) -> str:
    """What the user does next in that directory: `git status`, and `git branch` on a
    terminal (git 2.39 ignores core.worktree in an implicit bare repository, so its
    status stops early; the pager still runs)."""
    cwd = repo if where == "root" else repo / "sub"
    st = git(user, cwd, "status", check=False)
    br = user.run(
        ["script", "-qec", "git branch", "/dev/null"],
        cwd=cwd,
        extra_env={"GIT_CONFIG_NOSYSTEM": "1", "TERM": "dumb"},
    )
    return f"--- host git status\n{st.stderr.decode()}--- host git branch\n{br.stdout.decode()}"


@pytest.mark.parametrize("where", ["root", "subdir", "commondir"])
def test_fake_bare_repository_does_not_run_on_host(
    boxy: Boxy, user: User, repo: Path, where: str
) -> None:
    marker = _marker(user, "bare")
    try:
        r = run_py(boxy, FAKE_BARE, args=(str(marker), where))
        assert b"TRIED planted" in r.stdout and b"ESCAPED" not in r.stdout, describe(r)
        host = _host_git(user, repo, where)
        assert not marker.exists(), (
            f"ESCAPED: the host's git ran the fake bare repository's commands\n{describe(r)}{host}"
        )
        # (the live guard may take a commondir as it appears, before what it names)
        assert any("config" in ln or "commondir" in ln for ln in findings(r)), describe(r)
    finally:
        marker.unlink(missing_ok=True)
        (repo / ".git/refs").chmod(0o755)


@pytest.mark.parametrize("where", ["root", "subdir", "commondir"])
def test_fake_bare_repository_attack_is_real(
    boxy: Boxy, user: User, repo: Path, where: str
) -> None:
    marker = _marker(user, "bare")
    try:
        r = run_py(boxy, FAKE_BARE, "--allow-git-write", args=(str(marker), where))
        assert b"TRIED planted" in r.stdout, describe(r)
        _host_git(user, repo, where)
        assert marker.exists(), "the attack did not reproduce: the guarded test proves nothing"
    finally:
        marker.unlink(missing_ok=True)
        (repo / ".git/refs").chmod(0o755)


INCLUDE = """
marker, target = sys.argv[1], sys.argv[2]
script = os.path.abspath("fsmon.sh")
with open(script, "w") as f:
    f.write(f"#!/bin/sh\\ntouch {marker}\\n")
os.chmod(script, 0o755)
try:
    with open(target, "a") as f:
        f.write(f"[core]\\n\\tfsmonitor = {script}\\n")
except OSError as e:
    tried("append", ename(e))
else:
    tried("append", "written")
"""


@pytest.mark.parametrize("present", [True, False], ids=["existing-include", "absent-include"])
@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "control"])
def test_included_config_does_not_run_on_host(
    boxy: Boxy, user: User, repo: Path, present: bool, guarded: bool
) -> None:
    """include.path = ../.gitconfig, a common shared-config pattern: the payload appends
    core.fsmonitor to the included file (pinned when it exists, judged when it appears)."""
    git(user, repo, "config", "include.path", "../.gitconfig")
    if present:
        (repo / ".gitconfig").write_text("[user]\n\tname = Shared\n")
        user.chown(repo / ".gitconfig")
    marker = _marker(user, "include")
    try:
        flags = () if guarded else ("--allow-git-write",)
        r = run_py(boxy, INCLUDE, *flags, args=(str(marker), ".gitconfig"))
        assert b"TRIED append" in r.stdout and b"ESCAPED" not in r.stdout, describe(r)
        git(user, repo, "status", check=False)
        if not guarded:
            assert marker.exists(), "the attack did not reproduce: the guarded test proves nothing"
            return
        assert not marker.exists(), (
            f"ESCAPED: the host's git ran an included fsmonitor\n{describe(r)}"
        )
        if present:
            assert b"TRIED append EROFS" in r.stdout, describe(r)
            assert (repo / ".gitconfig").read_text() == "[user]\n\tname = Shared\n"
        else:
            assert any(".gitconfig" in ln and "core.fsmonitor" in ln for ln in findings(r)), (
                describe(r)
            )
    finally:
        marker.unlink(missing_ok=True)


HOOKS_SWAP = """
import shutil
marker = sys.argv[1]
os.makedirs("evil", exist_ok=True)
with open("evil/pre-commit", "w") as f:
    f.write(f"#!/bin/sh\\ntouch {marker}\\n")
os.chmod("evil/pre-commit", 0o755)
for label, fn in (("rmtree", lambda: shutil.rmtree(".githooks")),
                  ("rename", lambda: os.rename(".githooks", ".githooks-old"))):
    try:
        fn()
    except OSError as e:
        tried(label, ename(e))
    else:
        tried(label, "done")
try:
    os.symlink("evil", ".githooks")
except OSError as e:
    tried("symlink", ename(e))
else:
    tried("symlink", "done")
"""


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "control"])
def test_hooks_path_swapped_for_symlink_does_not_run_on_host(
    boxy: Boxy, user: User, repo: Path, guarded: bool
) -> None:
    """core.hooksPath = .githooks (husky uses .husky/_): the payload replaces the
    directory with a symlink to hooks of its own; the host's git commit runs them."""
    git(user, repo, "config", "core.hooksPath", ".githooks")
    (repo / ".githooks").mkdir()
    user.chown(repo / ".githooks")
    marker = _marker(user, "hookspath")
    try:
        flags = () if guarded else ("--allow-git-write",)
        r = run_py(boxy, HOOKS_SWAP, *flags, args=(str(marker),))
        assert b"TRIED symlink" in r.stdout and b"ESCAPED" not in r.stdout, describe(r)
        git(user, repo, "commit", "-q", "--allow-empty", "-m", "host", check=False)
        if not guarded:
            assert marker.exists(), "the attack did not reproduce: the guarded test proves nothing"
            return
        assert not marker.exists(), (
            f"ESCAPED: the host's git commit ran a swapped-in hook\n{describe(r)}"
        )
        assert b"TRIED rename EBUSY" in r.stdout, describe(r)  # a mount point
        assert (repo / ".githooks").is_dir() and not (repo / ".githooks").is_symlink()
    finally:
        marker.unlink(missing_ok=True)


def test_hooks_the_user_installed_still_run_on_host(boxy: Boxy, user: User, repo: Path) -> None:
    """Must keep working: husky's layout, installed on the host, survives a sandboxed
    install and still runs on the host's next commit."""
    git(user, repo, "config", "core.hooksPath", ".husky/_")
    hooks = repo / ".husky/_"
    hooks.mkdir(parents=True)
    ran = _marker(user, "husky-ok")
    (hooks / "pre-commit").write_text(f"#!/bin/sh\ntouch {ran}\n")
    (hooks / "pre-commit").chmod(0o755)
    user.chown(repo / ".husky")
    try:
        r = boxy.sh("ls .husky/_ && echo TRIED listed")
        assert r.returncode == 0 and b"TRIED listed" in r.stdout, describe(r)
        assert not findings(r), describe(r)
        git(user, repo, "commit", "-q", "--allow-empty", "-m", "host")
        assert ran.exists(), "the user's own hook no longer runs on the host"
    finally:
        ran.unlink(missing_ok=True)


LAUNDER_A = """
marker = sys.argv[1]
hook = f"#!/bin/sh\\ntouch {marker}\\n".encode()
with open(".githooks/_/pre-commit", "wb") as f:
    f.write(hook)
os.chmod(".githooks/_/pre-commit", 0o755)
open("a-planted", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("b-started") and time.monotonic() < deadline:
    time.sleep(0.05)
if os.path.exists(".githooks/_/pre-commit"):  # (the live guard may have moved it already)
    os.unlink(".githooks/_/pre-commit")  # so that A's own scan finds nothing
tried("a", f"b-started={os.path.exists('b-started')}")
"""

LAUNDER_B = """
marker = sys.argv[1]
hook = f"#!/bin/sh\\ntouch {marker}\\n".encode()
open("b-started", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("a-exited") and time.monotonic() < deadline:
    time.sleep(0.05)
if write("recreate", ".githooks/_/pre-commit", hook):  # byte-identical to what B saw at its start
    os.chmod(".githooks/_/pre-commit", 0o755)
tried("b", f"a-exited={os.path.exists('a-exited')}")
"""


def test_two_concurrent_runs_cannot_launder_a_hook(boxy: Boxy, user: User, repo: Path) -> None:
    """Reproduction 2: run A plants a hook; run B starts while it exists (so, on its own,
    B would call it the user's); A deletes it before exiting (A's scan finds nothing);
    B re-creates it byte-identical. B's baseline is A's, so B's scan sees it as new."""
    git(user, repo, "config", "core.hooksPath", ".githooks/_")
    (repo / ".githooks/_").mkdir(parents=True)
    user.chown(repo / ".githooks")
    marker = _marker(user, "launder")
    write_payload(boxy, LAUNDER_A, "a.py")
    write_payload(boxy, LAUNDER_B, "b.py")
    a = subprocess.Popen(
        user.cmd(boxy_argv(cmd=["python3", "a.py", str(marker)])),
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    b = None
    try:
        wait_for(lambda: (repo / "a-planted").exists() or a.poll() is not None, 60, "run A")
        b = subprocess.Popen(
            user.cmd(boxy_argv(cmd=["python3", "b.py", str(marker)])),
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        ra = subprocess.CompletedProcess(a.args, a.wait(timeout=90), *a.communicate(timeout=10))
        (repo / "a-exited").touch()
        rb = subprocess.CompletedProcess(b.args, b.wait(timeout=90), *b.communicate(timeout=10))
    finally:
        stop(a)
        if b is not None:
            stop(b)
    assert b"TRIED a b-started=True" in ra.stdout, describe(ra)
    # A left nothing behind (what its live guard moved meanwhile is said: not laundered)
    assert all(ln.startswith("boxyctl: live guard:") for ln in findings(ra)), describe(ra)
    assert b"TRIED recreate written" in rb.stdout and b"a-exited=True" in rb.stdout, describe(rb)
    git(user, repo, "commit", "-q", "--allow-empty", "-m", "host", check=False)
    assert not marker.exists(), f"ESCAPED: a laundered hook ran on the host\n{describe(rb)}"
    assert any(".githooks/_/pre-commit" in ln for ln in findings(rb)), describe(rb)
    marker.unlink(missing_ok=True)
