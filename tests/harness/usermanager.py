"""A real `systemd --user` for the test user, on a machine where systemd is not
PID 1 (docs/design.md, "Facts"): in a private mount namespace with its own
/run/systemd/system, inside a cgroup directory the user owns in both the named
systemd hierarchy and the unified one. Its session bus comes up socket-activated.
Root only (the harness's own privilege); the manager itself runs as the user."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

CGROUP_ROOTS = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")

START = r"""
set -e
uid=$1 user=$2 home=$3
mount -t tmpfs -o mode=0755 tmpfs /run/systemd
mkdir -p /run/systemd/system
for root in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
  d=$root/user.slice/user-$uid.slice/user@$uid.service
  mkdir -p "$d"
  chown -R "$uid:$uid" "$d"
  echo $$ > "$d/cgroup.procs"
done
exec runuser -u "$user" -- env -i HOME="$home" USER="$user" LOGNAME="$user" \
  XDG_RUNTIME_DIR=/run/user/$uid PATH=/usr/local/bin:/usr/bin:/bin \
  /usr/lib/systemd/systemd --user
"""


class UserManager:
    def __init__(self, name: str, uid: int, home: Path, runtime: Path) -> None:
        self.name, self.uid, self.home, self.runtime = name, uid, home, runtime
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {
            "XDG_RUNTIME_DIR": str(self.runtime),
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={self.runtime}/bus",
        }

    def user_cmd(self, argv: list[str]) -> list[str]:
        env = [
            f"{k}={v}"
            for k, v in {
                "HOME": str(self.home),
                "USER": self.name,
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                **self.env(),
            }.items()
        ]
        return ["runuser", "-u", self.name, "--", "env", "-i", *env, *argv]

    def systemctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.user_cmd(["systemctl", "--user", *args]),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def up(self, timeout: float = 30) -> None:
        if not os.path.exists("/usr/lib/systemd/systemd"):
            raise RuntimeError("systemd is not installed")
        self._clear()
        self.proc = subprocess.Popen(
            [
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                START,
                "sh",
                str(self.uid),
                self.name,
                str(self.home),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                assert self.proc.stderr is not None  # stderr=PIPE
                raise RuntimeError(f"systemd --user exited: {self.proc.stderr.read().decode()}")
            # ("offline" is also what systemctl says when nothing answers: ask for more)
            if (self.runtime / "systemd" / "private").exists() and self.systemctl(
                "show-environment"
            ).returncode == 0:
                return
            time.sleep(0.1)
        self.down()
        raise RuntimeError("systemd --user did not come up")

    def down(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.systemctl("exit")
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        self._clear()

    def _clear(self) -> None:
        """What a manager leaves: its runtime state and its cgroup directories."""
        shutil.rmtree(self.runtime / "systemd", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.runtime / "bus").unlink()
        for root in CGROUP_ROOTS:
            top = Path(root) / "user.slice" / f"user-{self.uid}.slice"
            if top.is_dir():
                for d in sorted(
                    (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
                ):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()
