"""A writable tree on what host programs obey unasked (issue 33 §2): `--rw ~/.ssh` ran
with the key masked, and the payload wrote a ProxyCommand into ~/.ssh/config that ssh
would run at the next connection. Each case then runs the host's own tool (ssh -G,
bash, git) to show it obeys nothing the payload wrote (docs/design.md, "Testing")."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, User
from tests.escape.conftest import describe
from tests.escape.test_held_files import PLANT_NPMRC, _host_npm_test

pytestmark = pytest.mark.sandbox

PROXY = "ProxyCommand /bin/echo ESCAPED"


@pytest.fixture
def ssh_dir(user: User) -> Iterator[Path]:
    """The test user's ~/.ssh, made for the case and removed after (it had none)."""
    d = user.home / ".ssh"
    existed = d.exists()
    user.makedirs(d)
    d.chmod(0o700)
    try:
        yield d
    finally:
        if not existed:
            shutil.rmtree(d, ignore_errors=True)
        else:
            (d / "config").unlink(missing_ok=True)


def _run(user: User, workdir: Path, *flags: str, script: str) -> tuple[int, str, str]:
    r = user.run(
        [str(BIN / "boxyctl"), "run", "-w", str(workdir), "--net", "none", *flags,
         "--", "sh", "-c", script],
        cwd=workdir,
    )  # fmt: skip
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def _ssh_proxy(user: User) -> str:
    """What the host's ssh would run to reach a host: `ssh -G` prints its resolved
    configuration without connecting."""
    r = user.run(["ssh", "-G", "example.invalid"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    return next((ln for ln in lines if ln.lower().startswith("proxycommand")), "")


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the host's ssh client")
def test_a_rw_on_ssh_is_refused_and_ssh_obeys_nothing(
    user: User, workdir: Path, ssh_dir: Path
) -> None:
    code, out, err = _run(
        user, workdir, "--rw", str(ssh_dir),
        script=f"echo '{PROXY}' > {ssh_dir}/config && echo WROTE",
    )  # fmt: skip
    assert "WROTE" not in out, "ESCAPED the payload wrote ~/.ssh/config\n" + err
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert f"--rw {ssh_dir}: is {ssh_dir}, and ssh and sshd run" in err
    assert f"--allow-host-config {ssh_dir} allows it" in err and "Traceback" not in err
    assert not (ssh_dir / "config").exists()
    assert _ssh_proxy(user) == ""  # the host's ssh, afterwards: no ProxyCommand


def test_the_dotfiles_repository_your_bashrc_links_into_is_refused(
    user: User, workdir: Path
) -> None:
    """-w on a repository that ~/.bashrc is a symlink into: the tree holds it."""
    rc = user.home / ".bashrc"
    saved = rc.read_bytes() if rc.exists() and not rc.is_symlink() else None
    rc.unlink(missing_ok=True)
    (workdir / "bashrc").write_text("# the user's own\n")
    user.chown(workdir)
    rc.symlink_to(workdir / "bashrc")
    try:
        code, out, err = _run(user, workdir, script="echo 'echo ESCAPED' >> bashrc && echo WROTE")
        assert "WROTE" not in out, "ESCAPED the payload appended to ~/.bashrc\n" + err
        assert code == 2 and f"holds {rc}, and bash runs it" in err, (code, err)
        # the host's bash, afterwards, runs the rc file as it was
        r = user.run(["bash", "-i", "-c", "true"])
        assert b"ESCAPED" not in r.stdout + r.stderr
    finally:
        rc.unlink(missing_ok=True)
        if saved is not None:
            rc.write_bytes(saved)
            user.chown(rc)


def test_a_rw_on_a_projects_held_directory_itself_is_refused(
    user: User, workdir: Path, tmp_path: Path
) -> None:
    """--rw proj/.claude with the work directory elsewhere: the tree's own walk starts
    inside .claude/, where no name is held, so its settings.json was the payload's."""
    proj = user.home / "boxy-tests" / f"{workdir.name}-proj"
    claude = proj / ".claude"
    user.makedirs(claude)
    try:
        code, out, err = _run(
            user, workdir, "--rw", str(claude),
            script=f"echo '{{\"hooks\": {{}}}}' > {claude}/settings.json && echo WROTE",
        )  # fmt: skip
        assert "WROTE" not in out, "ESCAPED the payload wrote .claude/settings.json\n" + err
        assert code == 2 and f"--rw {claude}: is {claude}, and Claude Code" in err, err
        assert not (claude / "settings.json").exists()
    finally:
        shutil.rmtree(proj, ignore_errors=True)


def test_the_held_files_rules_hold_under_every_rw_tree(user: User, workdir: Path) -> None:
    """A --rw on a second project, not the work directory: its .npmrc the payload plants
    is quarantined as the work directory's would be, and the host's npm, run there
    afterwards, runs nothing of it."""
    other = user.home / "boxy-tests" / f"{workdir.name}-other"
    user.makedirs(other)
    (other / "package.json").write_text(
        json.dumps({"name": "p", "version": "1.0.0", "scripts": {"test": "node -e 0"}}) + "\n"
    )
    user.chown(other)
    try:
        code, out, err = _run(
            user, workdir, "--rw", str(other), script=f"cd {other}\n{PLANT_NPMRC}"
        )
        assert code == 0 and "TRIED planted" in out, err
        assert f"quarantined {other}/.npmrc (npm runs or installs" in err, err
        assert b"HOOK ran on the host" not in _host_npm_test(user, other)
    finally:
        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the host's ssh client")
def test_allow_host_config_is_the_users_word_said_and_recorded(
    user: User, workdir: Path, ssh_dir: Path
) -> None:
    """The weaker mode the user chose: the run writes ~/.ssh, said before it and in the
    audit log; the host's ssh then obeys it (what the flag allows)."""
    audit = workdir / "audit.jsonl"
    code, out, err = _run(
        user, workdir, "--rw", str(ssh_dir), "--allow-host-config", str(ssh_dir),
        "--audit-log", str(audit), script=f"echo '{PROXY}' > {ssh_dir}/config",
    )  # fmt: skip
    assert code == 0, err
    assert f"--allow-host-config: the run may write {ssh_dir}, where ssh and sshd" in err
    records = [json.loads(ln) for ln in audit.read_text().splitlines()]
    assert any(r.get("layer") == "fs.hold" and r.get("path") == str(ssh_dir) for r in records), (
        records
    )
    assert _ssh_proxy(user) == "proxycommand /bin/echo ESCAPED"


def test_a_workdir_you_cannot_write_is_refused(user: User) -> None:
    """`cd /usr/share && boxyctl run …`: no project, said in one line."""
    r = user.run(
        [str(BIN / "boxyctl"), "run", "--net", "none", "--", "touch", "started"],
        cwd="/usr/share",
    )
    err = r.stderr.decode()
    assert r.returncode == 2 and len(err.splitlines()) == 1, describe(r)
    assert "the current directory /usr/share: not writable by you" in err
    assert "cd into a project or pass -w PATH" in err
