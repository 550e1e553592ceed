"""Attacks on the questions boxyd answers for clients (profile show, trust, the hook's
Trusted), from a security review of them; each asserts the defended outcome and runs
the host's own client afterwards."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, User

pytestmark = pytest.mark.sandbox

TIOCGPTN = 0x80045430


def _boxyctl(
    user: User, cwd: Path, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], cwd=cwd, input=stdin)


def _boxyd_pid(user: User) -> int:
    r = subprocess.run(
        ["pgrep", "-u", user.name, "-f", f"^{BIN}/python3 -m boxyd( |$)"],
        capture_output=True,
        text=True,
    )
    return int(r.stdout.split()[0])


def test_an_approval_swapped_after_the_hook_answered_gets_the_approved_profile(
    user: User, workdir: Path
) -> None:
    """The hook's approval check and the run's read of .boxy.yaml are two reads: a
    payload that removes the approved file between them got the run the default
    profile (generic: a public network) instead of the approved one."""
    (workdir / ".boxy.yaml").write_text("profile: offline\n")
    user.chown(workdir / ".boxy.yaml")
    assert _boxyctl(user, workdir, "trust").returncode == 0
    event = {
        "session_id": "s", "transcript_path": "/tmp/x", "cwd": str(workdir),
        "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command": "npm install"},
    }  # fmt: skip
    r = _boxyctl(user, workdir, "hook", "claude", stdin=json.dumps(event).encode())
    line = json.loads(r.stdout)["hookSpecificOutput"]["updatedInput"]["command"]
    (workdir / ".boxy.yaml").unlink()  # the payload's move, after the hook answered
    argv = shlex.split(line)
    argv[argv.index("sh") + 2] = "true"
    assert user.run(argv, cwd=workdir).returncode == 0
    ps = _boxyctl(user, workdir, "ps", "-a", "--json")
    last = max(json.loads(ps.stdout)["sessions"], key=lambda s: s.get("started_at", 0))
    assert last["profile"] == "offline", (line, last)


def test_a_terminal_named_as_a_profile_does_not_become_boxyds(user: User, workdir: Path) -> None:
    """An `extends:` naming a /dev/pts terminal made it boxyd's controlling terminal (a
    session leader without one takes the first it opens): its hang-up killed boxyd
    and every session. boxyd holds a terminal of its own."""
    holder = subprocess.Popen(
        user.cmd(["python3", "-c", (
            "import os,fcntl,struct,sys,time\n"
            "m,s=os.openpty(); os.close(s)\n"
            f"n=struct.unpack('i',fcntl.ioctl(m,{TIOCGPTN},b'0000'))[0]\n"
            "print(f'/dev/pts/{n}',flush=True); sys.stdin.read(); os.close(m); time.sleep(1)"
        )]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdin is not None
    pts = holder.stdout.readline().decode().strip()
    (workdir / "p.yaml").write_text(f"extends: {pts}\n")
    user.chown(workdir / "p.yaml")
    r = _boxyctl(user, workdir, "profile", "show", str(workdir / "p.yaml"))
    assert r.returncode == 2 and b"not a regular file" in r.stderr, r.stderr
    pid = _boxyd_pid(user)
    tty_nr = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4])
    assert tty_nr != os.stat(pts).st_rdev  # not the named terminal
    holder.stdin.close()  # hang the named terminal up
    holder.wait(timeout=30)
    assert Path(f"/proc/{pid}").exists(), "boxyd died of the named terminal's hang-up"
    assert _boxyctl(user, workdir, "daemon", "status").returncode == 0
