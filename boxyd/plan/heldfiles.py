"""The files a host program obeys unasked (plan/hostrun.py says which), in a writable
tree: found by the run's walk (pinned read-only from the start), and, when the payload
made one anyway, moved to the quarantine with what stood there before put back — by
the live guard at once (``hold``), by the check after the run as the backstop
(``after``). Every path is reached beneath the tree one O_NOFOLLOW step at a time; a
package manager's config is judged by its keys in the parse child
(plan/payloadparse.py), never in boxyd's process.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from boxy.errors import SetupError
from boxyd.config import hostrun
from boxyd.config.hostrun import Held, Judge
from boxyd.gitguard import discover, scan
from boxyd.gitguard.discover import Type
from boxyd.plan import payloadparse

READ_MAX = 4 << 20  # a config larger than this is held whatever it says
HELD_MAX = 1024  # held entries one tree may have pinned (each is a mount)

# the names the walk looks at: a set intersection in C per directory, as execfiles does
_CANDIDATES = frozenset(
    {*hostrun.NAMES, *(p[-1] for p in hostrun.PATHS)},
)


# what makes a version file name a program rather than a version: a path, a home, or
# a key saying so (asdf's `path:` versions, rustup's `path = `)
_PATHLIKE = (b"/", b"\\", b"~", b"path")


@dataclass(frozen=True)
class Present:
    """A held entry as the walk found it: pinned (read-only) unless it is a symlink,
    which the live guard puts back when the payload replaces it (its target, when it
    lies in the tree, is found and pinned as an entry of its own)."""

    rel: str
    type: Type
    target: str = ""  # a symlink's


class Finder:
    """A discover.Walker observer: the held entries of one tree, the topmost of each
    (a held directory holds everything beneath it)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.found: dict[str, Present] = {}

    def __call__(self, dir_fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        names = entries.keys() & _CANDIDATES
        joined = "\0".join(entries) + "\0"  # a search in C before any test per name
        if any(s + "\0" in joined for s in hostrun.SUFFIXES):
            names |= {n for n in entries if n.endswith(tuple(hostrun.SUFFIXES))}
        for name in sorted(names):
            path = discover.join(rel, name)
            if hostrun.match(path) is None or hostrun.held_above(path) is not None:
                continue
            kind = entries[name]
            if kind != "symlink":
                self.found[path] = Present(path, kind)
            else:
                self.found[path] = Present(path, kind, os.readlink(name, dir_fd=dir_fd))
                self._target(path)
            if len(self.found) > HELD_MAX:
                raise SetupError(
                    f"{self.root} holds more than {HELD_MAX:,} files that host tools obey "
                    "(each is pinned read-only: a mount); narrow the work directory"
                )

    def _target(self, rel: str) -> None:
        """What a held symlink leads to, when that lies in the tree: pinned too."""
        top = os.path.realpath(self.root)
        real = os.path.realpath(os.path.join(top, rel))
        if not real.startswith(top + "/") or not os.path.lexists(real):
            return
        inner = real[len(top) + 1 :]
        if inner not in self.found and not os.path.islink(real):
            self.found[inner] = Present(inner, "dir" if os.path.isdir(real) else "file")


def pins(found: Iterable[Present], edit: Iterable[str]) -> list[discover.Protection]:
    """The read-only binds of what the walk found, but what --edit-config names (EDIT:
    rels); every directory between the tree's top and a pin is a mount point as well,
    so none can be renamed away with the pin in it (git's pins do the same)."""
    edit = list(edit)
    out: dict[str, discover.Protection] = {}
    for p in found:
        if p.type == "symlink" or hostrun.edited(p.rel, edit):
            continue
        parts = p.rel.split("/")
        for n in range(1, len(parts)):
            up = "/".join(parts[:n])
            out.setdefault(up, discover.Protection(up, "self", True))
        out[p.rel] = discover.Protection(p.rel, "ro", p.type == "dir")
    return sorted(out.values(), key=lambda p: p.rel.split("/"))


def _obeyed(pfd: int, name: str, held: Held) -> str | None:
    """Why the entry NAME (in the directory PFD) is held now, or None: a package
    manager's config only while it holds a key that runs something (or cannot be
    read: then whole)."""
    if held.judge is Judge.ANY:
        return held.why()
    data = discover.read_head(pfd, name, READ_MAX + 1)
    if data is None:  # not a regular file where a config belongs: held whatever it is
        return held.why()
    if held.judge is Judge.PATH:  # a byte search, no parse: linear, in C
        return held.why() if any(m in data for m in _PATHLIKE) else None
    got = payloadparse.exec_settings(name, data) if len(data) <= READ_MAX else None
    if got is None or isinstance(got, payloadparse.Hostile):
        return f"{held.tool} reads it as its config, which could not be judged here"
    if not got:
        return None
    keys = ", ".join(dict.fromkeys(k for k, _ in got))
    return f"{held.tool} runs or installs what {keys} say{'s' if ',' not in keys else ''}"


def hold(
    root: str, rel: str, held: Held, target: str, quarantine: str, budget: scan.Budget
) -> tuple[str, bool] | None:
    """The entry REL that the payload made: moved to QUARANTINE (a directory whole) and
    the symlink that stood there (TARGET, when one did) put back. The line to say and
    whether it is gone from the tree, or None when it holds nothing a tool obeys (or
    is gone already)."""
    parent, _, name = rel.rpartition("/")
    try:
        pfd = discover.open_in_tree(root, parent)
    except OSError:
        return None
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if target and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=pfd) == target:
            return None  # what stood there: nothing new
        why = _obeyed(pfd, name, held)
        if why is None:
            return None
        dest = scan.move_entry(pfd, rel, quarantine, budget)
        back = ""
        if target:
            try:
                os.symlink(target, name, dir_fd=pfd)
                back = "; the symlink that stood there is back"
            except OSError as e:
                back = f"; the symlink that stood there could not be put back ({e.strerror})"
        line = (
            f"quarantined {os.path.join(root, rel)} ({why}): it is in {dest}{back}; "
            "if you made it yourself meanwhile, move it back"
        )
        return line, True
    except OSError as e:
        why = e.strerror or str(e)
        return f"{os.path.join(root, rel)}: could not be quarantined ({why}): check it", False
    finally:
        os.close(pfd)


def after(
    before: Mapping[str, Present],
    now: Mapping[str, Present],
    root: str,
    quarantine: str,
    edit: Iterable[str],
    budget: scan.Budget,
) -> list[str]:
    """After the run: every held entry the run made (absent at the start, or in place
    of a symlink), quarantined as the live guard would have. EDIT: --edit-config's
    rels, said and left."""
    edit = list(edit)
    lines = []
    for rel in sorted(now, key=lambda r: r.split("/")):
        old, new = before.get(rel), now[rel]
        if old is not None and (old.type != "symlink" or new == old):
            continue  # pinned from the start: only the host could change it
        held = hostrun.match(rel)
        if held is None:
            continue
        if hostrun.edited(rel, edit):
            lines.append(f"left {os.path.join(root, rel)} as the run made it (--edit-config)")
            continue
        got = hold(root, rel, held, old.target if old is not None else "", quarantine, budget)
        if got is not None:
            lines.append(got[0])
    return lines
