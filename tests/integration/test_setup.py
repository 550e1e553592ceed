"""`make setup` on this machine, as far as CI's machine can show it: a package apt
cannot install stops it with one line naming the package; the parts the suite uses
are probed by running them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_an_uninstallable_package_fails_setup_naming_it() -> None:
    r = _make("packages", "DEB_PACKAGES=git no-such-package-boxy")
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("make setup:")]
    assert len(lines) == 1, r.stderr
    assert "no-such-package-boxy" in lines[0] and "git " not in lines[0].split(":", 1)[1], lines[0]
    if os.getuid() == 0:
        assert "apt-get could not install: no-such-package-boxy" in lines[0]
    else:
        assert "sudo apt-get install no-such-package-boxy" in lines[0]


def test_the_real_list_is_installed_and_every_part_works() -> None:
    r = _make("packages")
    assert r.returncode == 0, (
        r.stderr
    )  # probes: nft, the bindings, bwrap, dbus-run-session, node, npm
