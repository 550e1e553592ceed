"""`make setup` on this machine, as far as CI's machine can show it: a package apt
cannot install stops it with one line naming the package; the parts the suite uses
are probed by running them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import BIN, User

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


def test_setup_puts_boxyctl_on_path_for_a_user(user: User) -> None:
    """Issue 33 §2: on a minimal Debian boxyctl was left off PATH. As a user, make setup
    links boxyctl and boxy into ~/.local/bin, and says so when that is not on PATH;
    the link runs this tree's boxyctl."""
    home = user.home / "setup-path-home"
    user.makedirs(home)
    script = str(ROOT / "packaging" / "link-commands.sh")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    r = user.run(["bash", script, str(BIN)], extra_env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    dest = home / ".local" / "bin"
    assert os.readlink(dest / "boxyctl") == str(BIN / "boxyctl")
    assert os.readlink(dest / "boxy") == str(BIN / "boxy")
    assert f"{dest} is not on your PATH" in r.stderr.decode()
    version = user.run([str(dest / "boxyctl"), "--version"], extra_env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith(b"boxy "), version.stderr
    again = user.run(["bash", script, str(BIN)], extra_env={**env, "PATH": f"{dest}:/usr/bin:/bin"})
    assert again.returncode == 0 and b"not on your PATH" not in again.stderr  # idempotent
