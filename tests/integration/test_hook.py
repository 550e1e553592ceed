"""`boxyctl hook claude` end to end, as the unprivileged user with Claude Code's JSON:
the rewritten command really runs sandboxed and keeps the line's quoting, pipes and
exit status; install/remove on a real settings file; boxyd out of reach denies.
A payload prints ESCAPED only when it read what the sandbox must hide."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, User

pytestmark = pytest.mark.sandbox


def event(command: str, cwd: Path) -> bytes:
    return json.dumps(
        {
            "session_id": "s1",
            "transcript_path": "/tmp/transcript.jsonl",
            "cwd": str(cwd),
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command, "description": "test"},
        }
    ).encode()


def ask_hook(
    user: User, workdir: Path, command: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return user.run(
        [str(BIN / "boxyctl"), "hook", "claude"],
        input=event(command, workdir),
        cwd=workdir,
        extra_env=env,
    )


def answer(r: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)["hookSpecificOutput"]
    assert isinstance(out, dict) and out["hookEventName"] == "PreToolUse"
    return out


def rewritten(user: User, workdir: Path, command: str) -> str:
    out = answer(ask_hook(user, workdir, command))
    assert out["permissionDecision"] == "allow", out
    new = out["updatedInput"]
    assert isinstance(new, dict) and new["description"] == "test"
    return str(new["command"])


def as_claude(user: User, workdir: Path, command: str) -> subprocess.CompletedProcess[bytes]:
    """What Claude Code's Bash tool does with the command: bash -c, in the cwd."""
    return user.run(["bash", "-c", command], cwd=workdir, input=b"")


def _own(user: User, path: Path) -> None:
    shutil.chown(path, user.uid, user.gid)


@pytest.fixture(autouse=True)
def no_notices(user: User) -> None:
    """What earlier tests' runs quarantined is not this test's to be told of."""
    shutil.rmtree(user.home / ".local/state/boxy/notices", ignore_errors=True)


@pytest.fixture
def hook_yaml(user: User) -> Iterator[Path]:
    """The user's hook.yaml: --net none (the network is not the point here)."""
    path = user.home / ".config" / "boxy" / "hook.yaml"
    for d in (user.home / ".config", path.parent):
        d.mkdir(exist_ok=True)
        _own(user, d)
    path.write_text("flags: [--net, none]\n")
    _own(user, path)
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def canary(user: User) -> Iterator[Path]:
    ssh = user.home / ".ssh"
    created = not ssh.exists()
    ssh.mkdir(mode=0o700, exist_ok=True)
    _own(user, ssh)
    path = ssh / f"boxy-hook-canary-{uuid.uuid4().hex[:8]}"
    path.write_text("boxy-secret-canary\n")
    _own(user, path)
    assert user.run(["cat", str(path)]).stdout == b"boxy-secret-canary\n"  # on the host
    yield path
    path.unlink()
    if created:
        shutil.rmtree(ssh, ignore_errors=True)


def test_rewritten_command_runs_sandboxed(
    user: User, workdir: Path, hook_yaml: Path, canary: Path
) -> None:
    line = (
        f"npm --version > npm-version.txt && if grep -q secret {shlex.quote(str(canary))}; "
        "then echo ESCAPED ssh; else echo TRIED ssh; fi"
    )
    command = rewritten(user, workdir, line)
    argv = shlex.split(command)
    assert argv[1:] == ["run", "-p", "node", "--net", "none", "--", "sh", "-c", line]
    r = as_claude(user, workdir, command)
    out = r.stdout.decode()
    assert "ESCAPED" not in out
    assert r.returncode == 0 and "TRIED ssh" in out, r.stderr.decode()
    assert (workdir / "npm-version.txt").read_text().strip()[:1].isdigit()  # npm ran


def test_quoting_pipes_and_exit_status(user: User, workdir: Path, hook_yaml: Path) -> None:
    line = (
        "npm --version | tr 0-9 a-j | sed 's/[a-j]/x/g'; "
        "printf '%s|%s|%s\\n' 'a  b' \"c'd\" \"$((6 * 7))\"; exit 3"
    )
    r = as_claude(user, workdir, rewritten(user, workdir, line))
    assert r.returncode == 3, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert set(lines[0]) <= {"x", "."} and "x" in lines[0]
    assert lines[1:] == ["a  b|c'd|42"]


def test_python_profile(user: User, workdir: Path, hook_yaml: Path) -> None:
    command = rewritten(user, workdir, "python3 -m pip --version >/dev/null; echo $?")
    assert shlex.split(command)[2:4] == ["-p", "python"]


def test_not_intercepted_gets_no_answer(user: User, workdir: Path, hook_yaml: Path) -> None:
    r = ask_hook(user, workdir, "ls -la && git status")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")


def test_bad_input_is_exit_2(user: User, workdir: Path) -> None:
    r = user.run([str(BIN / "boxyctl"), "hook", "claude"], input=b'{"tool_name": "Bash"')
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode().count("\n") == 1 and b"Traceback" not in r.stderr


def test_approved_project_profile(user: User, workdir: Path, hook_yaml: Path) -> None:
    """Not approved: the hook's own profile for npm (node); approved: the profile the
    project names (python here), passed as -p (tests/escape/test_daemon_questions.py
    says why it is passed)."""
    (workdir / ".boxy.yaml").write_text("profile: python\n")
    user.chown(workdir)
    argv = shlex.split(rewritten(user, workdir, "npm --version"))
    assert argv[argv.index("-p") + 1] == "node"  # not approved: the hook's own
    trust = user.run([str(BIN / "boxyctl"), "trust"], cwd=workdir)
    assert trust.returncode == 0, trust.stderr.decode()
    try:
        command = rewritten(user, workdir, "npm --version")
        argv = shlex.split(command)
        assert argv[argv.index("-p") + 1] == "python"  # the approved project's
        r = as_claude(user, workdir, command)
        assert r.returncode == 0, r.stderr.decode()
    finally:
        user.run([str(BIN / "boxyctl"), "trust", "--revoke"], cwd=workdir)


def test_fail_closed_when_boxyd_is_unreachable(user: User, workdir: Path, hook_yaml: Path) -> None:
    """An empty runtime directory (no daemon listens) and a state directory that
    cannot be made (no daemon can start): deny, saying why."""
    runtime = Path(tempfile.mkdtemp(prefix="boxy-hook-rt-"))
    _own(user, runtime)
    env = {"XDG_RUNTIME_DIR": str(runtime), "XDG_STATE_HOME": "/dev/null/state"}
    try:
        out = answer(ask_hook(user, workdir, "npm install", env))
        assert out["permissionDecision"] == "deny"
        assert "boxyd" in str(out["permissionDecisionReason"])
        assert "updatedInput" not in out
        hook_yaml.write_text("on_unavailable: ask\n")
        r = ask_hook(user, workdir, "npm install", env)
        assert (r.returncode, r.stdout) == (0, b"")
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_install_and_remove(user: User, workdir: Path) -> None:
    """On the user's real ~/.claude/settings.json (put back as it was)."""
    claude = user.home / ".claude"
    settings = claude / "settings.json"
    saved = settings.read_bytes() if settings.exists() else None
    made = not claude.exists()  # then it goes again: other tests plant their own ~/.claude
    claude.mkdir(exist_ok=True)
    _own(user, claude)
    other: dict[str, Any] = {
        "model": "m",
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x"}]}]},
    }
    settings.write_text(json.dumps(other))
    _own(user, settings)
    install = [str(BIN / "boxyctl"), "hook", "install", "claude"]
    try:
        assert user.run(install).returncode == 0
        once = settings.read_text()
        assert user.run(install).returncode == 0
        assert settings.read_text() == once
        doc = json.loads(once)
        entry = doc["hooks"]["PreToolUse"][0]
        assert entry["matcher"] == "Bash"
        assert entry["hooks"][0]["command"] == f"{BIN / 'boxyctl'} hook claude"
        assert doc["model"] == "m" and doc["hooks"]["Stop"] == other["hooks"]["Stop"]
        assert user.run([*install, "--remove"]).returncode == 0
        assert json.loads(settings.read_text()) == other
        settings.write_text("{not json")
        r = user.run(install)
        assert r.returncode == 2 and r.stderr.decode().count("\n") == 1
        assert settings.read_text() == "{not json"
        r = user.run([*install, "--project"], cwd=workdir)
        assert r.returncode == 0, r.stderr.decode()
        project = json.loads((workdir / ".claude" / "settings.json").read_text())
        command = project["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
        assert command == "boxyctl hook claude"  # committed: no path of this machine's
        ls = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": str(workdir),
              "tool_input": {"command": "ls"}}  # fmt: skip
        r = user.run(["sh", "-c", command], input=json.dumps(ls).encode(), cwd=workdir)
        assert (r.returncode, r.stdout) == (0, b""), r.stderr  # found on PATH, and ran
    finally:
        if saved is None:
            settings.unlink(missing_ok=True)
        else:
            settings.write_bytes(saved)
        if made:
            for leftover in claude.iterdir():  # an install's temporary file, if one was left
                leftover.unlink()
            claude.rmdir()


def test_shim(user: User, workdir: Path, hook_yaml: Path, canary: Path) -> None:
    line = (
        f"npm --version | tr 0-9 a-j; cat {shlex.quote(str(canary))} 2>/dev/null "
        "&& echo ESCAPED ssh || echo TRIED ssh; exit 5"
    )
    r = user.run([str(BIN / "boxy-sh"), "-c", line], cwd=workdir, input=b"")
    out = r.stdout.decode()
    assert "ESCAPED" not in out
    assert r.returncode == 5 and "TRIED ssh" in out, r.stderr.decode()
    # not on the list: /bin/sh on the host, which can read it
    r = user.run([str(BIN / "boxy-sh"), "-c", f"cat {shlex.quote(str(canary))}; exit 4"])
    assert (r.returncode, r.stdout) == (4, b"boxy-secret-canary\n")


def test_a_quarantine_reaches_the_users_prompt_once(
    user: User, workdir: Path, hook_yaml: Path
) -> None:
    """What a sandboxed command wrote that a host program obeys is moved to the
    quarantine, and the hook's next answer asks the user, naming it (Claude Code shows
    an ask's reason to the user); the answer after that is as before."""
    command = rewritten(user, workdir, "npm --version")
    plant = command.replace("'npm --version'", "'mkdir .claude && echo {} > .claude/settings.json'")
    r = as_claude(user, workdir, plant)
    assert b"quarantined" in r.stderr, r.stderr
    out = answer(ask_hook(user, workdir, "ls"))  # not intercepted: still told
    assert out["permissionDecision"] == "ask", out
    reason = str(out["permissionDecisionReason"])
    assert f"quarantined {workdir}/.claude (Claude Code runs its hooks" in reason, reason
    assert "updatedInput" not in out
    assert not (user.home / ".local/state/boxy/notices").exists() or not any(
        (user.home / ".local/state/boxy/notices").iterdir()
    )
    assert ask_hook(user, workdir, "ls").stdout == b""  # told once
    out = answer(ask_hook(user, workdir, "npm --version"))
    assert out["permissionDecision"] == "allow", out
