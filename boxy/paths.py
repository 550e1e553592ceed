"""Where boxy keeps its socket, state and logs (XDG base directories).

Each place comes as a str (what the client uses: pathlib and what it imports cost
it 5 ms of every run) and as a Path (for the daemon, which joins paths onto them)."""

from __future__ import annotations

import os
import stat

from boxy.errors import DaemonError

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import TypeVar

    P = TypeVar("P", str, Path)


# a project's own configuration, in its work directory (`boxyctl trust` approves it)
PROJECT_CONFIG = ".boxy.yaml"


# What every sandbox holds (boxyd/plan/mountplan.py), as systemd's container interface
# has a container manager name itself (systemd.io/CONTAINER_INTERFACE): a client inside
# a run knows it is there. The payload cannot make it on the host (/run is root's), and
# inside it cannot remove it (the sandbox's root is read-only): it only ever refuses.
SANDBOX_MARK = "/run/host/container-manager"
SANDBOX_NAME = "boxy"


def inside_sandbox() -> bool:
    """This process runs inside a boxy sandbox."""
    try:
        with open(SANDBOX_MARK, "rb") as f:
            return f.read(64).strip() == SANDBOX_NAME.encode()
    except OSError:
        return False


def runtime_base_problem() -> str | None:
    """Why $XDG_RUNTIME_DIR cannot hold boxyd's socket, or None: set to a directory that
    does not exist, it is not the one your login made (systemd-logind's
    /run/user/UID), and a boxyd started there would be a second one whose sessions
    the first's `ps` never shows."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.path.isabs(base) or os.path.isdir(base):
        return None
    return (
        f"XDG_RUNTIME_DIR={base}: no such directory (your login makes it, as /run/user/"
        f"{os.getuid()}); boxy would start a second boxyd there, apart from yours: "
        "unset it or set it to your own"
    )


def runtime_dir_str() -> str:
    """$XDG_RUNTIME_DIR/boxy; without it /run/user/UID/boxy when that directory exists
    and is the user's own (what systemd makes it: so that a shell without the variable
    finds the same daemon as one with it); /tmp/boxy-UID only when neither exists."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        return os.path.join(base, "boxy")
    uid = os.getuid()
    try:
        st = os.stat(f"/run/user/{uid}", follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077:
        return f"/run/user/{uid}/boxy"
    return f"/tmp/boxy-{uid}"


def runtime_dir() -> Path:
    from pathlib import Path

    return Path(runtime_dir_str())


def socket_path_str() -> str:
    return os.path.join(runtime_dir_str(), "boxyd.sock")


def socket_path() -> Path:
    from pathlib import Path

    return Path(socket_path_str())


def state_dir_str() -> str:
    base = os.environ.get("XDG_STATE_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "boxy")


def state_dir() -> Path:
    from pathlib import Path

    return Path(state_dir_str())


def config_home(home: str | None = None) -> str:
    """$XDG_CONFIG_HOME, or ~/.config (HOME's)."""
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(home or os.path.expanduser("~"), ".config")
    return base


def ensure_private_dir(path: P) -> P:
    """Create PATH (mode 0700) if needed and verify it: a directory, not a symlink,
    owned by us, with no access for group or others. A directory another user could
    write or swap is the front door left open, so anything else is refused."""
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, mode=0o700, exist_ok=True)
        # not contextlib.suppress: every client start comes here before its run is sent,
        # and contextlib imports collections (docs/design.md, "Processes")
        try:  # noqa: SIM105
            os.mkdir(path, 0o700)
        except FileExistsError:  # verified below, whatever it is
            pass
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
