"""What is wrong with a path the user gave, in the words a user acts on: shared by the
client (which refuses it before a daemon is contacted) and boxyd (which checks what
any caller sends, before a session is recorded). Standard library only, and cheap:
it runs on a client's start."""

from __future__ import annotations

import errno
import os
import stat

PATH_MAX = 4096  # bytes, the terminating NUL included (linux/limits.h)
NAME_MAX = 255  # bytes in one name


def shown(path: str, limit: int = 100) -> str:
    """PATH as a one-line message names it: a long one cut in the middle."""
    if len(path) <= limit:
        return path
    half = (limit - 1) // 2
    return path[:half] + "…" + path[-half:]


def length_problem(path: str) -> str | None:
    """Why Linux would refuse PATH for its length alone, or None."""
    size = len(os.fsencode(path))
    if size >= PATH_MAX:
        return f"too long ({size} bytes; Linux takes a path of at most {PATH_MAX - 1})"
    longest = max(path.split("/"), key=lambda name: len(os.fsencode(name)))
    if len(os.fsencode(longest)) > NAME_MAX:
        return (
            f"a name in it is too long ({len(os.fsencode(longest))} bytes; Linux takes "
            f"names of at most {NAME_MAX})"
        )
    return None


def directory_problem(path: str) -> str | None:
    """Why PATH (absolute) cannot be a run's work directory, or None: it must be a
    directory the user can list and enter (boxyd runs as the user and reads the whole
    tree before the start; one it cannot read would fail there, late)."""
    problem = length_problem(path)
    if problem is not None:
        return problem
    try:
        st = os.stat(path)
    except OSError as e:
        return _stat_problem(path, e)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "permission denied (you cannot list or enter it)"
    return None


def _stat_problem(path: str, e: OSError) -> str:
    if e.errno == errno.ENOENT:
        return "no such directory"
    if e.errno == errno.ENOTDIR:
        return f"{_first_file(path)} is not a directory"
    if e.errno == errno.EACCES:
        closed = _closed_above(path)
        return f"permission denied ({closed} is closed to you)" if closed else "permission denied"
    if e.errno == errno.ELOOP:
        return "too many levels of symbolic links"
    return (e.strerror or str(e)).lower()


def _ancestors(path: str) -> list[str]:
    """PATH's directories above it, from the top: /a/b/c → /, /a, /a/b."""
    out: list[str] = []
    parent = os.path.dirname(path)
    while True:
        out.append(parent)
        if parent == os.path.dirname(parent):
            return out[::-1]
        parent = os.path.dirname(parent)


def _closed_above(path: str) -> str | None:
    """The first directory above PATH the user may not enter."""
    return next((d for d in _ancestors(path) if not os.access(d, os.X_OK)), None)


def _first_file(path: str) -> str:
    """The first of PATH's ancestors that exists and is not a directory."""
    for d in [*_ancestors(path), path]:
        if os.path.lexists(d) and not os.path.isdir(d):
            return d
    return path
