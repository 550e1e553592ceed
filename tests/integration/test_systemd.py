"""boxyd under a real `systemd --user` (brought up by the harness for the test
user): `boxyctl setup`, socket activation, STATUS=, and a stop from systemd that
records the sessions it ends. Without a user manager: the on-demand daemon and
its idle exit."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.harness.usermanager import UserManager
from tests.integration.clients import daemon_pids

pytestmark = pytest.mark.sandbox


def ctl(user: User, *args: str, extra_env: dict[str, str] | None = None,
        manager: UserManager | None = None) -> subprocess.CompletedProcess:
    env = {**(manager.env() if manager else {}), **(extra_env or {})}
    return user.run([str(BIN / "boxyctl"), *args], extra_env=env, timeout=60)


@pytest.fixture(scope="module")
def systemd_user(user: User) -> Iterator[UserManager]:
    if os.getuid() != 0:
        pytest.skip("a user manager for the test user is brought up as root: run `make test` as root")
    ctl(user, "daemon", "stop", "--force")  # the on-demand daemon of earlier tests makes way
    manager = UserManager(user.name, user.uid, user.home, user.runtime)
    manager.up()
    try:
        yield manager
    finally:
        manager.systemctl("disable", "--now", "boxyd.socket", "boxyd.service")
        manager.down()
        for name in ("boxyd.socket", "boxyd.service"):
            (user.home / ".config/systemd/user" / name).unlink(missing_ok=True)


def test_setup_installs_enables_and_is_idempotent(boxy: Boxy, user: User,
                                                  systemd_user: UserManager) -> None:
    r = ctl(user, "setup", manager=systemd_user)
    assert r.returncode == 0, r.stderr
    unit_dir = user.home / ".config/systemd/user"
    assert f"{unit_dir / 'boxyd.service'}: installed" in r.stdout.decode()
    assert "boxyd.socket enabled" in r.stdout.decode()
    service = (unit_dir / "boxyd.service").read_text()
    assert f"ExecStart={BIN / 'boxyd'}\n" in service and "Type=notify" in service
    assert "ListenStream=%t/boxy/boxyd.sock" in (unit_dir / "boxyd.socket").read_text()
    assert systemd_user.systemctl("is-enabled", "boxyd.socket").stdout.strip() == "enabled"
    assert systemd_user.systemctl("is-active", "boxyd.socket").stdout.strip() == "active"
    again = ctl(user, "setup", manager=systemd_user)
    assert again.returncode == 0, again.stderr
    assert again.stdout.decode().count("up to date") == 2


def test_the_first_run_starts_boxyd_by_socket_activation(boxy: Boxy, user: User, workdir: Path,
                                                         systemd_user: UserManager) -> None:
    ctl(user, "setup", manager=systemd_user)
    systemd_user.systemctl("stop", "boxyd.service")
    assert systemd_user.systemctl("is-active", "boxyd.service").stdout.strip() != "active"
    assert daemon_pids(user) == []
    r = subprocess.run(user.cmd([str(BIN / "boxyctl"), "run", "--net", "none", "--", "echo", "hi"],
                                systemd_user.env()), cwd=workdir, capture_output=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, b"hi\n"), r.stderr
    assert systemd_user.systemctl("is-active", "boxyd.service").stdout.strip() == "active"
    main_pid = int(systemd_user.systemctl("show", "-p", "MainPID", "--value",
                                          "boxyd.service").stdout)
    status = ctl(user, "daemon", "status", manager=systemd_user).stdout.decode().split()
    assert int(status[status.index("pid") + 1]) == main_pid  # the run went to systemd's boxyd
    assert systemd_user.systemctl("show", "-p", "StatusText", "--value",
                                  "boxyd.service").stdout.strip() == "0 sessions running"


def test_a_stop_from_systemd_stops_and_records_the_sessions(boxy: Boxy, user: User, workdir: Path,
                                                            systemd_user: UserManager) -> None:
    ctl(user, "setup", manager=systemd_user)
    r = ctl(user, "run", "-d", "-w", str(workdir), "--net", "none", "--", "sleep", "66",
            manager=systemd_user)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and systemd_user.systemctl(
            "show", "-p", "StatusText", "--value", "boxyd.service").stdout.strip() != "1 session running":
        time.sleep(0.1)
    assert systemd_user.systemctl("show", "-p", "StatusText", "--value",
                                  "boxyd.service").stdout.strip() == "1 session running"
    stopped = systemd_user.systemctl("stop", "boxyd.service")
    assert stopped.returncode == 0, stopped.stderr
    shown = ctl(user, "show", sid, manager=systemd_user)  # the socket starts boxyd again
    assert shown.returncode == 0, shown.stderr
    assert "state     killed SIGTERM" in shown.stdout.decode(), shown.stdout
