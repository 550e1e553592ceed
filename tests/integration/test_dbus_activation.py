"""D-Bus activation without a user manager, on a bus of dbus-run-session's: the
activated boxyd lets go of the bus daemon's stdout (a `$(…)` around the call
returns), one activated while another boxyd runs hands it the bus (JoinBus) and
exits, and the bus going away leaves boxyd serving varlink."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import BIN, User
from tests.integration.clients import daemon_pids

pytestmark = pytest.mark.sandbox

# the output of the call, through a command substitution: it returns only once every
# holder of the pipe (the bus daemon and what it started) has let go of it
CALL = (
    "o=$(dbus-run-session -- busctl --user call dev.boxy.Daemon /dev/boxy/Manager "
    'dev.boxy.Manager1 List b false); echo "got: $o"'
)


def ctl(user: User, *args: str) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], timeout=60)


def call_through_a_fresh_bus(user: User) -> subprocess.CompletedProcess[bytes]:
    return user.run(["sh", "-c", CALL], timeout=30)


def stopped(user: User) -> None:
    """No boxyd of USER's left: `daemon stop` returns once the lock is let go, and the
    process may take a moment more to exit (long on a loaded machine)."""
    ctl(user, "daemon", "stop", "--force")
    deadline = time.monotonic() + 20
    while daemon_pids(user) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon_pids(user) == []


@pytest.fixture
def no_daemon(user: User) -> Iterator[None]:
    stopped(user)
    assert ctl(user, "setup").returncode == 0  # the activation file (no user manager here)
    yield
    ctl(user, "daemon", "stop", "--force")
    for name in ("boxyd.socket", "boxyd.service"):  # what setup installed: as we found it
        (user.home / ".config/systemd/user" / name).unlink(missing_ok=True)
    (user.home / ".local/share/dbus-1/services/dev.boxy.Daemon.service").unlink(missing_ok=True)


def test_an_activated_boxyd_lets_go_of_the_bus_daemons_output(user: User, no_daemon: None) -> None:
    r = call_through_a_fresh_bus(user)  # TimeoutExpired (30 s) while boxyd holds the pipe
    assert r.stdout.decode().startswith("got: a(sso) "), r.stderr
    pids = daemon_pids(user)
    assert len(pids) == 1  # activated, and still there once the bus has gone
    assert ctl(user, "ps").returncode == 0 and daemon_pids(user) == pids  # varlink serves


def test_activation_while_boxyd_runs_joins_the_running_one(user: User, no_daemon: None) -> None:
    assert ctl(user, "ps").returncode == 0  # an on-demand boxyd, started before any bus
    pids = daemon_pids(user)
    assert len(pids) == 1
    for _ in range(2):  # each bus in turn: joined, then lost when dbus-run-session ends
        r = call_through_a_fresh_bus(user)
        assert r.stdout.decode().startswith("got: a(sso) "), r.stderr
        deadline = time.monotonic() + 10  # the activated one hands over, then exits
        while daemon_pids(user) != pids and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon_pids(user) == pids
    assert ctl(user, "ps").returncode == 0
