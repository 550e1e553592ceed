"""The user's own git configuration, read for what decides where host git runs code in
a work tree (never by running git: the pure parser of gitconfig.py).

``core.hooksPath`` set globally applies to every repository: a relative value is
taken from the top of each work tree (git's hook.c: hooks run there), so
``core.hooksPath=.githooks`` in ~/.gitconfig makes every project's ``.githooks``
directory its hooks — a directory the payload can write. The guard then treats
that directory in every repository of the tree as it treats ``.git/hooks``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from boxyd.gitguard.discover import CONFIG_MAX
from boxyd.gitguard.gitconfig import parse
from boxyd.kernel.walk import read_small

MAX_DEPTH = 10  # git's own include depth limit


def files(home: str, env: Mapping[str, str]) -> list[str]:
    """System, XDG and global config files, in git's order (later ones win)."""
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return ["/etc/gitconfig", os.path.join(xdg, "git", "config"), os.path.join(home, ".gitconfig")]


def _read(path: str) -> bytes | None:
    parent, name = os.path.split(path)
    try:
        fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_small(fd, name, CONFIG_MAX)  # regular files only, no FIFO, bounded
    finally:
        os.close(fd)


def _expand(value: str, base: str, home: str) -> str:
    if value.startswith("~/"):
        return os.path.join(home, value[2:])
    return value if value.startswith("/") else os.path.join(base, value)


def hooks_path(home: str, env: Mapping[str, str] | None = None) -> str | None:
    """The user's effective global core.hooksPath (``~`` expanded; a relative value is
    returned as written, to be taken from each work tree), or None."""
    found: list[str | None] = [None]

    def read(path: str, depth: int) -> None:
        data = _read(path)
        if data is None or depth > MAX_DEPTH:
            return
        for e in parse(data).entries:
            if (e.section, e.subsection, e.name) == ("core", None, "hookspath") and e.value:
                found[0] = os.path.join(home, e.value[2:]) if e.value.startswith("~/") else e.value
            elif (
                e.name == "path"
                and e.value
                and (e.section == "include" and e.subsection is None or e.section == "includeif")
            ):
                # every includeIf counts, whatever its condition: it may hold for a repository here
                read(_expand(e.value, os.path.dirname(path), home), depth + 1)

    for path in files(home, env if env is not None else os.environ):
        read(path, 0)
    return found[0]
