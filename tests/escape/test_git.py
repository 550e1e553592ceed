"""Git in the work directory: the payload owns the work tree, but git on the host will
later read `.git` as the user and run whatever hooks and config say. Every case builds a
real repository on the host as the test user, attacks it from the sandbox, and takes the
verdict from the host side (files present, what the host's git does).

And git must keep working inside: init, add, commit, a cross-directory mv.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import (
    GIT_FLAGS,
    assert_contained,
    boxy_argv,
    describe,
    findings,
    git,
    init_repo,
    output,
    run_py,
    stop,
    wait_for,
    write_payload,
)

pytestmark = pytest.mark.sandbox

# --- pinned entries ------------------------------------------------------------------


def test_hook_write_refused(boxy: Boxy, repo: Path) -> None:
    samples = {p.name: p.stat().st_mode for p in (repo / ".git/hooks").iterdir()}
    assert "pre-commit.sample" in samples  # git init's templates are there to abuse
    r = run_py(
        boxy,
        """
hook = b"#!/bin/sh\\ntouch /tmp/boxy-escape-hook-ran\\n"
if write("new-hook", ".git/hooks/pre-commit", hook):
    escaped("new-hook", "wrote .git/hooks/pre-commit")
for label, fn in (("chmod-sample", lambda: os.chmod(".git/hooks/pre-commit.sample", 0o755)),
                  ("rename-sample", lambda: os.rename(".git/hooks/pre-commit.sample", ".git/hooks/pre-commit")),
                  ("symlink-hook", lambda: os.symlink("../../evil", ".git/hooks/post-checkout")),
                  ("append-sample", lambda: open(".git/hooks/pre-push.sample", "ab").write(b"touch /tmp/x\\n"))):
    try:
        fn()
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, "changed .git/hooks")
""",
    )
    labels = ("new-hook", "chmod-sample", "rename-sample", "symlink-hook", "append-sample")
    assert_contained(r, *labels, results={k: {"EROFS"} for k in labels})
    assert {p.name: p.stat().st_mode for p in (repo / ".git/hooks").iterdir()} == samples


@pytest.mark.parametrize(
    "key,value",
    [
        ("core.hooksPath", "/tmp/x"),
        ("core.fsmonitor", "/tmp/boxy-escape-fsmonitor"),
        ("core.pager", "sh -c 'touch /tmp/boxy-escape-pager'"),
        ("core.sshCommand", "touch /tmp/boxy-escape-ssh"),
        ("alias.st", "!touch /tmp/boxy-escape-alias"),
    ],
)
def test_git_config_command_keys_refused(
    boxy: Boxy, user: User, repo: Path, key: str, value: str
) -> None:
    before = (repo / ".git/config").read_bytes()
    r = run_py(
        boxy,
        """
import subprocess
key, value = sys.argv[1], sys.argv[2]
cfg = subprocess.run(["git", "config", key, value], capture_output=True, text=True)
tried("git-config", f"rc={cfg.returncode}")
if cfg.returncode == 0:
    escaped("git-config", f"set {key}")
if write("append", ".git/config", f"[{key.split('.')[0]}]\\n\\t{key.split('.', 1)[1]} = {value}\\n".encode(), "ab"):
    escaped("append", "appended to .git/config")
try:
    os.rename(".git/config", ".git/config.old")
except OSError as e:
    tried("rename", ename(e))
else:
    escaped("rename", "moved .git/config away")
""",
        args=(key, value),
    )
    got = assert_contained(
        r,
        "git-config",
        "append",
        "rename",
        results={"append": {"EROFS"}, "rename": {"EROFS", "EBUSY"}},
    )
    assert got["git-config"] != "rc=0", describe(r)
    assert (repo / ".git/config").read_bytes() == before
    assert git(user, repo, "config", "--get", key, check=False).returncode == 1  # not set


def test_dotgit_rename_refused(boxy: Boxy, repo: Path) -> None:
    head = (repo / ".git/HEAD").read_bytes()
    r = run_py(
        boxy,
        """
import subprocess
try:
    os.rename(".git", ".git-away")
except OSError as e:
    tried("rename-gitdir", ename(e))
else:
    escaped("rename-gitdir", ".git renamed away")
    subprocess.run(["git", "init", "-q", "."])
    os.makedirs(".git/hooks", exist_ok=True)
    if write("fresh-hook", ".git/hooks/pre-commit", b"#!/bin/sh\\ntouch /tmp/x\\n"):
        os.chmod(".git/hooks/pre-commit", 0o755)
        escaped("fresh-hook", "a hook in a recreated .git")
for label, src in (("rename-hooks", ".git/hooks"), ("rename-config", ".git/config")):
    try:
        os.rename(src, src + "-away")
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, f"{src} renamed away")
""",
    )
    assert_contained(
        r,
        "rename-gitdir",
        "rename-hooks",
        "rename-config",
        results={
            "rename-gitdir": {"EBUSY"},
            "rename-hooks": {"EBUSY", "EROFS"},
            "rename-config": {"EBUSY", "EROFS"},
        },
    )
    assert (repo / ".git/HEAD").read_bytes() == head
    assert not (repo / ".git-away").exists() and not (repo / ".git/hooks/pre-commit").exists()


def test_nested_repo_parent_rename_refused(boxy: Boxy, user: User, repo: Path) -> None:
    inner = init_repo(user, repo / "sub" / "inner")
    r = run_py(
        boxy,
        """
import subprocess
for label, src, dst in (("rename-parent", "sub", "sub2"), ("rename-repo", "sub/inner", "sub/inner2"),
                        ("rename-gitdir", "sub/inner/.git", "sub/inner/.git2")):
    try:
        os.rename(src, dst)
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, f"{src} renamed")
if not os.path.exists("sub/inner/.git/HEAD"):  # the pinned tree is gone: rebuild it unpinned
    os.makedirs("sub/inner", exist_ok=True)
    subprocess.run(["git", "init", "-q", "sub/inner"])
    if write("hook", "sub/inner/.git/hooks/pre-commit", b"#!/bin/sh\\ntouch /tmp/x\\n"):
        os.chmod("sub/inner/.git/hooks/pre-commit", 0o755)
        escaped("hook", "planted a hook in a recreated nested repository")
else:
    write("hook", "sub/inner/.git/hooks/pre-commit", b"#!/bin/sh\\ntouch /tmp/x\\n")
""",
    )
    assert_contained(
        r,
        "rename-parent",
        "rename-repo",
        "rename-gitdir",
        "hook",
        # EBUSY: a mount point; EACCES: Landlock refuses renaming one
        results={
            "rename-parent": {"EBUSY", "EACCES"},
            "rename-repo": {"EBUSY", "EACCES"},
            "rename-gitdir": {"EBUSY", "EACCES"},
            "hook": {"EROFS"},
        },
    )
    assert not (repo / "sub2").exists()
    assert (inner / ".git/HEAD").exists() and not (inner / ".git/hooks/pre-commit").exists()


def test_submodule_gitfile_read_only(boxy: Boxy, user: User, repo: Path) -> None:
    upstream = init_repo(user, repo.parent / f"upstream-{uuid.uuid4().hex[:8]}")
    try:
        git(
            user,
            repo,
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            str(upstream),
            "mod",
        )
        git(user, repo, "commit", "-q", "-m", "add submodule")
        gitfile = (repo / "mod/.git").read_bytes()
        assert gitfile.startswith(b"gitdir: ")  # a real submodule: .git is a file
        r = run_py(
            boxy,
            """
if write("gitfile", "mod/.git", b"gitdir: /tmp/evil\\n"):
    escaped("gitfile", "rewrote the submodule's .git file")
for label, fn in (("rename-gitfile", lambda: os.rename("mod/.git", "mod/.git-old")),
                  ("unlink-gitfile", lambda: os.unlink("mod/.git"))):
    try:
        fn()
    except OSError as e:
        tried(label, ename(e))
    else:
        escaped(label, "the submodule's .git file moved")
hook = b"#!/bin/sh\\ntouch /tmp/x\\n"
if write("module-hook", ".git/modules/mod/hooks/post-checkout", hook):
    escaped("module-hook", "a hook in the submodule's gitdir")
if write("module-config", ".git/modules/mod/config", b"[core]\\n\\tfsmonitor = touch /tmp/x\\n", "ab"):
    escaped("module-config", "the submodule's config")
""",
        )
        assert_contained(
            r,
            "gitfile",
            "rename-gitfile",
            "unlink-gitfile",
            "module-hook",
            "module-config",
            results={
                "gitfile": {"EROFS"},
                "rename-gitfile": {"EBUSY", "EROFS"},
                "unlink-gitfile": {"EBUSY", "EROFS"},
                "module-hook": {"EROFS"},
                "module-config": {"EROFS"},
            },
        )
        assert (repo / "mod/.git").read_bytes() == gitfile
        assert not (repo / ".git/modules/mod/hooks/post-checkout").exists()
    finally:
        shutil.rmtree(upstream, ignore_errors=True)


# --- the post-run scan -----------------------------------------------------------------


@pytest.mark.parametrize(
    "rel,content",
    [
        (".git/commondir", "/home/boxytest/.boxy-escape-common\n"),
        (".git/commondir", "../../..\n"),
        (".git/config.worktree", "[core]\n\tfsmonitor = touch /tmp/boxy-escape-worktree\n"),
    ],
    ids=["commondir-absolute", "commondir-relative", "config-worktree"],
)
def test_planted_control_file_quarantined(boxy: Boxy, repo: Path, rel: str, content: str) -> None:
    r = run_py(
        boxy,
        """
rel, content = sys.argv[1], sys.argv[2]
if not write("plant", rel, content.encode()):
    escaped("plant", "could not even be planted: the test is moot")
""",
        args=(rel, content),
    )
    # planting works (an absent entry cannot be pinned); the scan is the layer under test
    assert_contained(r, "plant", results={"plant": {"written"}})
    lines = [ln for ln in findings(r) if rel in ln]
    assert lines, f"the post-run scan did not report {rel}\n{describe(r)}"
    assert not (repo / rel).exists(), f"{rel} is still in the work directory"
    m = re.search(r" to (/\S+): ", lines[0])
    assert m and Path(m.group(1)).exists(), lines[0]  # really quarantined, not deleted


# where the new repository sits: plain; its gitdir absorbed into .git/modules; inside a
# directory the user can traverse but not list (mode 0111); deeper than 256 levels
LAYOUTS = ["nested-gitdir", "absorbed-into-git-modules", "exec-only-parent", "deep"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fsmonitor_in_new_nested_repo_does_not_run_on_host(
    boxy: Boxy, user: User, repo: Path, layout: str
) -> None:
    marker = user.home / f".boxy-escape-fsmonitor-{uuid.uuid4().hex[:8]}"
    try:
        r = _plant_nested_fsmonitor(boxy, marker, layout)
        if "live guard: git guard: moved" not in r.stderr.decode():  # (or it stopped the plant)
            assert_contained(r, "planted", "index")
        st = git(user, repo, "status", check=False)  # what the user does next
        assert not marker.exists(), (
            f"the host's git ran the payload's fsmonitor\n{describe(r)}"
            f"--- host git status\n{st.stderr.decode()}"
        )
        assert any("nested" in ln or "could not be read" in ln for ln in findings(r)), (
            f"not reported\n{describe(r)}"
        )
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fsmonitor_attack_is_real_without_the_guard(
    boxy: Boxy, user: User, repo: Path, layout: str
) -> None:
    """Control for the case above: with --allow-git-write the same payload does make the
    host's `git status` run its command, so the guarded case is not passing vacuously."""
    marker = user.home / f".boxy-escape-fsmonitor-{uuid.uuid4().hex[:8]}"
    try:
        r = _plant_nested_fsmonitor(boxy, marker, layout, "--allow-git-write")
        assert r.returncode == 0 and b"TRIED index" in r.stdout, describe(r)
        git(user, repo, "status", check=False)
        assert marker.exists(), "the attack did not reproduce: the guarded test proves nothing"
    finally:
        marker.unlink(missing_ok=True)


def _plant_nested_fsmonitor(
    boxy: Boxy, marker: Path, layout: str, *flags: str
) -> subprocess.CompletedProcess[bytes]:
    """A new repository `nested` whose config runs a script, registered as a gitlink in
    the outer index so that the host's `git status` descends into it."""
    return run_py(
        boxy,
        """
import subprocess
marker, layout = sys.argv[1], sys.argv[2]
prefix = {"exec-only-parent": "locked/", "deep": "d/" * 260}.get(layout, "")
if prefix:
    os.makedirs(prefix)
    os.chdir(prefix)
def sh(*argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        print("FAILED", argv, r.stderr, flush=True)
        sys.exit(3)
    return r.stdout.strip()
sh("git", "init", "-q", "nested")
with open("nested/fsmon.sh", "w") as f:
    f.write(f"#!/bin/sh\\ntouch {marker}\\n")
os.chmod("nested/fsmon.sh", 0o755)
with open("nested/file", "w") as f:
    f.write("x\\n")
sh("git", "-C", "nested", "add", "file", "fsmon.sh")
sh("git", "-C", "nested", "commit", "-q", "-m", "nested")
sh("git", "-C", "nested", "config", "core.fsmonitor", os.path.abspath("nested/fsmon.sh"))
if layout == "absorbed-into-git-modules":  # as `git submodule absorbgitdirs` leaves it
    import shutil
    # copied, not renamed: .git is a mount point, so a rename into it is EXDEV
    shutil.copytree("nested/.git", ".git/modules/nested", symlinks=True)
    shutil.rmtree("nested/.git")
    with open("nested/.git", "w") as f:
        f.write("gitdir: ../.git/modules/nested\\n")
    sh("git", "--git-dir=.git/modules/nested", "config", "core.worktree", "../../../nested")
tried("planted", os.path.abspath("nested/fsmon.sh"))
sha = sh("git", "-C", "nested", "rev-parse", "HEAD")
os.chdir(sys.argv[3])
sh("git", "update-index", "--add", "--cacheinfo", f"160000,{sha},{prefix}nested")
if layout == "exec-only-parent":
    os.chmod("locked", 0o111)  # git can still reach locked/nested; nobody can list locked
tried("index", sha)
""",
        *flags,
        *GIT_FLAGS,
        args=(str(marker), layout, str(boxy.workdir)),
    )


def test_hooks_in_repo_created_during_run_quarantined(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """Nothing to pin before the run: the scan is what stands between this and the host."""
    marker = user.home / f".boxy-escape-newrepo-{uuid.uuid4().hex[:8]}"
    try:
        r = boxy.sh(
            "set -e; git init -q; "
            f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; "
            "git config core.hooksPath .git/hooks; echo TRIED planted",
            *GIT_FLAGS,
        )
        assert r.returncode == 0 and b"TRIED planted" in r.stdout, describe(r)
        reported = "\n".join(findings(r)).lower()  # git's key names are case-insensitive
        assert ".git/hooks/pre-commit" in reported and "core.hookspath" in reported, describe(r)
        assert not (workdir / ".git/hooks/pre-commit").exists()
        git(user, workdir, "commit", "-q", "--allow-empty", "-m", "host commit", check=False)
        assert not marker.exists(), "the host's git commit ran the payload's hook"
    finally:
        marker.unlink(missing_ok=True)


def test_background_process_cannot_plant_after_scan(boxy: Boxy, user: User, repo: Path) -> None:
    """A detached grandchild outlives the payload and plants a hook a moment later: it must
    die with the session, or be caught by the scan — never land after it."""
    r = run_py(
        boxy,
        """
import subprocess
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1.5)
        open("late-writer-ran", "w").close()
        subprocess.run(["git", "init", "-q", "late"])
        with open("late/.git/hooks/pre-commit", "w") as f:
            f.write("#!/bin/sh\\ntouch /tmp/x\\n")
        os.chmod("late/.git/hooks/pre-commit", 0o755)
    os._exit(0)
os.wait()
tried("forked")
""",
    )
    assert_contained(r, "forked")
    time.sleep(4)  # longer than the grandchild's delay
    hook = repo / "late/.git/hooks/pre-commit"
    assert not hook.exists(), f"a hook landed after the run ended\n{describe(r)}"
    if (repo / "late-writer-ran").exists():  # it ran inside the session: then it was scanned
        assert any("late/.git/hooks/pre-commit" in ln for ln in findings(r)), describe(r)


# --- swaps between and during runs -------------------------------------------------------


@pytest.mark.parametrize("entry", ["hooks", "config"])
def test_symlink_swapped_in_before_second_run(
    boxy: Boxy, user: User, repo: Path, entry: str
) -> None:
    r1 = boxy.sh("echo TRIED first")
    assert r1.returncode == 0 and b"TRIED first" in r1.stdout, describe(r1)
    marker = user.home / f".boxy-escape-swap-{uuid.uuid4().hex[:8]}"
    # between the runs the entry becomes a symlink into the (payload-writable) work tree
    if entry == "hooks":
        user.run(
            ["sh", "-c", "mv .git/hooks .git/hooks-real && mkdir evil && ln -s ../evil .git/hooks"],
            cwd=repo,
        )
    else:
        user.run(
            [
                "sh",
                "-c",
                "cp .git/config evil-config && mv .git/config .git/config-real && "
                "ln -s ../evil-config .git/config",
            ],
            cwd=repo,
        )
    assert (repo / ".git" / entry).is_symlink()
    try:
        r = run_py(
            boxy,
            """
marker, entry = sys.argv[1], sys.argv[2]
if entry == "hooks":
    ok = write("through-link", "evil/pre-commit", f"#!/bin/sh\\ntouch {marker}\\n".encode())
    if ok:
        os.chmod("evil/pre-commit", 0o755)
else:
    ok = write("through-link", "evil-config", f"[core]\\n\\tfsmonitor = touch {marker}\\n".encode(), "ab")
""",
            args=(str(marker), entry),
        )
        assert "ESCAPED" not in output(r), describe(r)
        if b"TRIED through-link" not in r.stdout:  # refused to start: say so, clearly
            assert r.returncode != 0 and ".git" in r.stderr.decode(), describe(r)
        # the verdict on the host: nothing reachable through .git/<entry>
        assert not (repo / ".git/hooks/pre-commit").exists(), describe(r)
        assert git(user, repo, "config", "--get", "core.fsmonitor", check=False).returncode != 0, (
            describe(r)
        )
        git(user, repo, "status", check=False)
        assert not marker.exists(), describe(r)
    finally:
        marker.unlink(missing_ok=True)


SWAPPER = """
import json
stop_at = time.monotonic() + 40
attempts, results = 0, {}
def note(label, fn):
    try:
        fn()
    except OSError as e:
        results.setdefault(label, set()).add(ename(e))
    else:
        escaped(label, "succeeded")
while time.monotonic() < stop_at and not os.path.exists("b-done"):
    note("rename-hooks", lambda: os.rename(".git/hooks", ".git/hooks-old"))
    note("rmdir-hooks", lambda: os.rmdir(".git/hooks"))
    note("symlink-hooks", lambda: os.symlink("../evil", ".git/hooks"))
    note("rename-gitdir", lambda: os.rename(".git", ".git-old"))
    note("hook", lambda: open(".git/hooks/pre-commit", "wb").close())
    attempts += 1
    if attempts == 1:
        open("a-started", "w").close()
    time.sleep(0.01)
tried("swapper", f"attempts={attempts},b-done={os.path.exists('b-done')}")
for label, errs in sorted(results.items()):
    tried(label, ",".join(sorted(errs)))
"""

STARTER = """
n = sys.argv[1]
if os.path.islink(".git/hooks"):
    escaped("b-hooks", "the second session sees .git/hooks as a symlink")
if write("b-hook", ".git/hooks/pre-commit", b"#!/bin/sh\\ntouch /tmp/x\\n"):
    escaped("b-hook", "the second session can write .git/hooks")
if n == "2":
    open("b-done", "w").close()
"""


def test_concurrent_sessions_cannot_swap_hooks(boxy: Boxy, user: User, repo: Path) -> None:
    os.mkdir(repo / "evil")
    user.chown(repo / "evil")
    write_payload(boxy, SWAPPER, "swapper.py")
    a = subprocess.Popen(
        user.cmd(boxy_argv(cmd=["python3", "swapper.py"])),
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: (repo / "a-started").exists() or a.poll() is not None, 60, "session A")
        # session B starts (twice) while A keeps trying
        bs = [run_py(boxy, STARTER, args=(str(n),), name="starter.py") for n in (1, 2)]
        out, err = a.communicate(timeout=90)
        ra = subprocess.CompletedProcess(a.args, a.returncode, out, err)
    finally:
        stop(a)
    got = assert_contained(ra, "swapper", "rename-hooks", "symlink-hooks", "rename-gitdir", "hook")
    assert "b-done=True" in got["swapper"], describe(ra)  # the two really overlapped
    for rb in bs:
        assert_contained(rb, "b-hook", results={"b-hook": {"EROFS"}})
    hooks = repo / ".git/hooks"
    assert hooks.is_dir() and not hooks.is_symlink() and not (hooks / "pre-commit").exists()
    assert stat.S_ISDIR(os.lstat(repo / ".git").st_mode)


# --- must keep working ------------------------------------------------------------------


@pytest.mark.parametrize("start", ["fresh", "existing"])
def test_git_workflow_still_works(boxy: Boxy, user: User, workdir: Path, start: str) -> None:
    if start == "existing":
        init_repo(user, workdir)
    r = boxy.sh(
        "set -e; [ -d .git ] || git init -q; "
        "mkdir -p a/deep b; echo one > a/deep/f; git add -A; git commit -q -m one; "
        "mv a/deep/f b/f; mv a/deep b/; "  # cross-directory renames (Landlock REFER)
        "git add -A; git commit -q -m two; "
        "git mv b/f a/g; git commit -q -m three; "
        "echo TRIED count=$(git rev-list --count HEAD) status=$(git status --porcelain | wc -l)",
        *GIT_FLAGS,
    )
    want = 4 if start == "existing" else 3
    assert r.returncode == 0, describe(r)
    assert f"TRIED count={want} status=0".encode() in r.stdout, describe(r)
    assert not findings(r), f"a plain git workflow was quarantined\n{describe(r)}"
    log = git(user, workdir, "rev-list", "--count", "HEAD")  # and the host sees the commits
    assert log.stdout.decode().strip() == str(want)
    assert (workdir / "a/g").read_text() == "one\n"
