"""A boxyctl run in the background as the test user, its output in files."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.conftest import BIN, User


def start_client(
    user: User, workdir: Path, script: str, *flags: str
) -> tuple[subprocess.Popen[bytes], int]:
    """boxyctl run as USER, its output in files (the payload holds on to them: pipes
    would not reach EOF when the client goes); returns the process and boxyctl's own
    pid (the child of runuser, which only passes signals on)."""
    argv = [str(BIN / "boxyctl"), "run", "--net", "none", *flags, "--", "sh", "-c", script]
    with (
        open(workdir.parent / f"{workdir.name}.out", "wb") as out,
        open(workdir.parent / f"{workdir.name}.err", "wb") as err,
    ):
        proc = subprocess.Popen(
            user.cmd(argv), cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )
    deadline = time.monotonic() + 30
    while client_out(workdir) != b"ready\n" and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert client_out(workdir) == b"ready\n", client_err(workdir)
    if os.getuid() != user.uid:
        kids = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(kids) == 1, kids
        return proc, int(kids[0])
    return proc, proc.pid


def client_out(workdir: Path) -> bytes:
    return (workdir.parent / f"{workdir.name}.out").read_bytes()


def client_err(workdir: Path) -> str:
    return (workdir.parent / f"{workdir.name}.err").read_text()


def sessions_running(user: User) -> int:
    words = user.run([str(BIN / "boxyctl"), "daemon", "status"]).stdout.decode().split()
    # boxyd: running  pid N  build B  sessions running N  up Ts
    return int(words[words.index("sessions") + 2]) if "sessions" in words else 0


def daemon_pids(user: User) -> list[int]:
    """USER's boxyd processes serving its own runtime directory (not the one a
    network test runs in the topology with a runtime directory of its own)."""
    out = subprocess.run(
        ["pgrep", "-u", str(user.uid), "-f", "python[^ ]* -m boxyd( |$)|bin/boxyd$"],
        capture_output=True,
        text=True,
    ).stdout.split()
    mine = []
    for pid in out:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"XDG_RUNTIME_DIR={user.runtime}".encode() in env:
            mine.append(int(pid))
    return mine
