"""What boxyd moved to the quarantine, for the user to read where the user reads.

A line at the end of a run is read by whoever ran it: under Claude Code's hook, the
agent. So boxyd also leaves each quarantine's lines here, one file per event under
``$XDG_STATE_HOME/boxy/notices/``, and the hook's next answer carries them to the
permission prompt the user sees (boxyctl/hook.py), then removes them. Standard
library only, and only ``os``: the hook imports it on every call.
"""

from __future__ import annotations

import os

from boxy.paths import state_dir_str

KEEP = 64  # notices waiting at once (more: the newest are not written; the record has them)
LINE_MAX = 1024  # bytes of one line kept here
TAKE = 8  # notices one answer carries (the rest: the next one)


def _dir() -> str:
    return os.path.join(state_dir_str(), "notices")


def leave(ident: str, lines: list[str]) -> None:
    """LINES of session IDENT, for the hook's next answer; never raises (the record and
    the run's last lines have them too)."""
    if not lines:
        return
    top = _dir()
    try:
        os.makedirs(top, mode=0o700, exist_ok=True)
        if len(os.listdir(top)) >= KEEP:
            return
        text = "\n".join(f"session {ident}: {line[:LINE_MAX]}" for line in lines) + "\n"
        name = f"{os.getpid()}-{ident}-{os.urandom(4).hex()}"
        fd = os.open(
            os.path.join(top, name),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        return


def take() -> list[str]:
    """The lines waiting (the oldest TAKE notices), removed as they are read."""
    top = _dir()
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
    except OSError:
        return []
    lines: list[str] = []
    for entry in entries[:TAKE]:
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                data = os.read(fd, KEEP * LINE_MAX)
            finally:
                os.close(fd)
            os.unlink(entry.path)
        except OSError:
            continue
        lines += data.decode("utf-8", "replace").splitlines()
    return lines
