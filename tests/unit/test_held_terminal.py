"""boxyd holds a pty of its own as its controlling terminal (boxyd/__main__.py): as a
session leader without one, it took the first terminal it opened (a /dev/pts path a
client named for `profile show`, an `extends:`), and died of its SIGHUP (attack
finding F3). Tried in a real session leader: a terminal opened later, without
O_NOCTTY, does not become its controlling terminal, and that terminal's hangup does
not reach it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LEADER = r"""
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
hold = sys.argv[2] == "hold"
if hold:
    from boxyd.__main__ import hold_a_terminal
    hold_a_terminal()
master, slave = os.openpty()
name = os.ttyname(slave)
fd = os.open(name, os.O_RDWR)  # as an open of a named path would: no O_NOCTTY
tty_nr = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[4])
print(name, os.major(os.stat(name).st_rdev), os.minor(os.stat(name).st_rdev), tty_nr, flush=True)
os.close(master)  # the named terminal hangs up
time.sleep(0.2)
print("alive", flush=True)
"""


def _leader(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LEADER, str(ROOT), mode],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # a session leader without a terminal, as boxyd is
        stdin=subprocess.DEVNULL,
    )


def _took(r: subprocess.CompletedProcess[str]) -> bool:
    """Did the later terminal become the controlling one (its dev number)?"""
    _, major, minor, tty_nr = r.stdout.split("\n")[0].split()
    return int(tty_nr) == os.makedev(int(major), int(minor))


def test_without_a_held_terminal_the_leader_takes_one_and_dies_of_its_hangup() -> None:
    r = _leader("bare")  # the control: the defect as it was
    assert _took(r), r.stdout + r.stderr
    assert "alive" not in r.stdout  # SIGHUP ended it


def test_with_its_own_terminal_held_a_later_one_is_not_taken() -> None:
    r = _leader("hold")
    assert r.returncode == 0, r.stderr
    assert not _took(r), r.stdout
    assert "alive" in r.stdout
