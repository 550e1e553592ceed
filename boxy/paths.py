"""Where boxy keeps its socket, state and logs (XDG base directories)."""

import os
import stat
from pathlib import Path

from boxy.errors import DaemonError


def runtime_dir() -> Path:
    """$XDG_RUNTIME_DIR/boxy; without it /run/user/UID/boxy when that directory exists
    and is the user's own (what systemd makes it: so that a shell without the variable
    finds the same daemon as one with it); /tmp/boxy-UID only when neither exists."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        return Path(base) / "boxy"
    uid = os.getuid()
    try:
        st = os.stat(f"/run/user/{uid}", follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
        return Path(f"/run/user/{uid}/boxy")
    return Path(f"/tmp/boxy-{uid}")


def socket_path() -> Path:
    return runtime_dir() / "boxyd.sock"


def state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "boxy"


def config_home(home: str | None = None) -> str:
    """$XDG_CONFIG_HOME, or ~/.config (HOME's)."""
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(home or os.path.expanduser("~"), ".config")
    return base


def ensure_private_dir(path: Path) -> Path:
    """Create PATH (mode 0700) if needed and verify it: a directory, not a symlink,
    owned by us, with no access for group or others. A directory another user could
    write or swap is the front door left open, so anything else is refused."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise DaemonError(f"cannot create {path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise DaemonError(f"{path} is not a directory (refusing a symlink or file there)")
    if st.st_uid != os.getuid():
        raise DaemonError(f"{path} is owned by uid {st.st_uid}, not by you")
    if st.st_mode & 0o077:
        raise DaemonError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700")
    return path
