"""boxyd's view of this machine's own addresses, in a network namespace of the test's
own (`unshare -rn`: any user, no root needed), where adding an address changes
nothing outside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from boxyd.net.rtnl import LocalAddresses
local = LocalAddresses()
def ip(*a):
    subprocess.run(["ip", *a], check=True)
ip("link", "set", "lo", "up")
out = ["127.0.0.1" in local, "11.77.0.9" in local]
ip("addr", "add", "11.77.0.9/32", "dev", "lo")
out.append("11.77.0.9" in local)          # seen at once: no refresh interval
out.append("::ffff:11.77.0.9" in local)   # the mapped form is the same address
ip("addr", "del", "11.77.0.9/32", "dev", "lo")
out.append("11.77.0.9" in local)
print(out)
"""


def test_an_address_added_just_now_is_this_machines() -> None:
    r = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", SCRIPT, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[True, False, True, True, False]"
