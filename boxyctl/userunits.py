"""`boxyctl setup`: install boxyd's systemd user units and its D-Bus activation
file for the calling user, and enable the socket when a user manager runs. Idempotent: a unit whose text is
already there is left alone; each file is written whole and renamed into place.

From the boxy package (its units in /usr/lib/systemd/user run this very boxyd) nothing
is copied: the package's files serve every user, and setup only enables the socket.

Without a user manager nothing more is needed: boxyctl starts boxyd on demand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from boxy.errors import BoxyError

UNITS = ("boxyd.socket", "boxyd.service")
DBUS_SERVICE = "dev.boxy.Daemon.service"
# package data (units/ at the top of the tree links here), so an install from a wheel
# (pipx) has them too
SOURCE = Path(__file__).resolve().parent / "units"
# where the Debian package puts them (debian/rules)
SYSTEM_UNIT_DIR = Path("/usr/lib/systemd/user")
SYSTEM_DBUS_DIR = Path("/usr/share/dbus-1/services")


def unit_dir(environ: dict[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "systemd" / "user"


def dbus_service_dir(environ: dict[str, str]) -> Path:
    base = environ.get("XDG_DATA_HOME") or ""
    if not os.path.isabs(base):
        base = os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return Path(base) / "dbus-1" / "services"


def daemon_command() -> str:
    """This installation's boxyd: the entry point next to this interpreter, or the
    interpreter running the module."""
    exe = Path(sys.executable).parent / "boxyd"
    return str(exe) if os.access(exe, os.X_OK) else f"{sys.executable} -m boxyd"


def packaged(command: str, unit_dir: Path = SYSTEM_UNIT_DIR) -> bool:
    """The system's boxyd.service (the boxy package's) runs COMMAND, this very boxyd."""
    try:
        text = (unit_dir / "boxyd.service").read_text()
    except OSError:
        return False
    return f"\nExecStart={command}\n" in text


def render(name: str, command: str) -> str:
    try:
        text = (SOURCE / name).read_text()
    except OSError as e:
        raise BoxyError(f"setup: cannot read {SOURCE / name}: {e.strerror}") from None
    return text.replace("@BOXYD@", command)


def write_if_changed(path: Path, text: str) -> bool:
    """True when PATH had other content (or none) and now has TEXT."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.boxy-tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def user_manager(environ: dict[str, str]) -> bool:
    """A systemd user manager answers for this user."""
    runtime = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    return os.path.exists(os.path.join(runtime, "systemd", "private"))


def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    # systemd's own, never one a PATH entry in a project (an activated venv) provides
    binary = shutil.which("systemctl", path="/usr/bin:/bin") or "/usr/bin/systemctl"
    return subprocess.run([binary, "--user", *args], capture_output=True, text=True, timeout=30)


def setup(environ: dict[str, str], say: Callable[[str], object]) -> int:
    target = unit_dir(environ)
    command = daemon_command()
    changed = False
    files = [(target / name, name) for name in UNITS]
    files.append((dbus_service_dir(environ) / DBUS_SERVICE, DBUS_SERVICE))
    system = packaged(command)
    for path, name in files:
        if system:
            # A copy would go stale at the package's next upgrade; one already there wins
            # over the package's file (a checkout's setup wrote it), so it is named.
            if path.exists():
                say(f"{path}: yours, used instead of the boxy package's (remove it to use theirs)")
            else:
                shared = SYSTEM_DBUS_DIR if name == DBUS_SERVICE else SYSTEM_UNIT_DIR
                say(f"{shared / name}: from the boxy package")
            continue
        try:
            wrote = write_if_changed(path, render(name, command))
        except OSError as e:
            raise BoxyError(f"setup: cannot write {path}: {e.strerror}") from None
        changed |= wrote and name in UNITS
        say(f"{path}: {'installed' if wrote else 'up to date'}")
    if not user_manager(environ):
        say("no systemd user manager: boxyctl starts boxyd on demand")
        return 0
    # a running manager learns of the package's units only on a reload
    reload = changed or system
    steps = ([("daemon-reload",)] if reload else []) + [("enable", "--now", "boxyd.socket")]
    for step in steps:
        r = systemctl(*step)
        if r.returncode != 0:
            raise BoxyError(
                f"setup: systemctl --user {' '.join(step)}: "
                f"{r.stderr.strip() or f'exit {r.returncode}'}"
            )
    say("boxyd.socket enabled: the first connection starts boxyd")
    return 0
