"""The files a host program obeys unasked (config/hostrun.py says which), in a writable
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
from typing import Literal

from boxy.errors import SetupError
from boxyd.config import hostrun
from boxyd.config.hostrun import Held, Judge
from boxyd.gitguard import discover
from boxyd.gitguard.quarantine import Budget, move_entry
from boxyd.kernel import walk
from boxyd.kernel.walk import Type
from boxyd.plan import masking, payloadparse

READ_MAX = 4 << 20  # a config larger than this is held whatever it says
HELD_MAX = 1024  # held entries one tree may have pinned (each is a mount)

# the names the walk looks at: a set intersection in C per directory, as execfiles does
_CANDIDATES = frozenset(
    {*hostrun.NAMES, *(p[-1] for p in hostrun.PATHS)},
)
_LINK_NAMES = frozenset(p[-1] for p in hostrun.LINKS)


# what makes a version file name a program rather than a version: a path, a home, a
# key saying so (asdf's `path:` versions, rustup's `path = `), or a backend that
# installs from a registry (mise's `npm:pkg`, `cargo:crate` in .tool-versions)
_PATHLIKE = (b"/", b"\\", b"~", b"path", b":")


Kind = Literal["file", "dir", "symlink", "other", "absent"]


@dataclass(frozen=True)
class Present:
    """A held entry as the walk found it: pinned (read-only) unless it is a symlink,
    which the live guard puts back when the payload replaces it. What a held symlink
    leads to in the tree (from the held entry, or from inside a held directory) is an
    entry of its own, VIA that one: pinned when it is there, held (quarantined when
    made) when it is ``absent``; so is every other name of a held file's inode."""

    rel: str
    type: Kind
    target: str = ""  # a symlink's text
    via: str = ""  # the held entry this one is reached through
    resolved: str = ""  # a symlink's: where it led, fully resolved (the tree's rel, or /…)


class Finder:
    """A discover.Walker observer: the held entries of one tree, the topmost of each
    (a held directory holds everything beneath it), and what they lead to. BOUNDED
    (the walk before the run): more than HELD_MAX refuse the run (each is a mount);
    the check after the run is never cut short by them."""

    def __init__(self, root: str, bounded: bool = False) -> None:
        self.root, self.bounded = root, bounded
        self.top = os.path.realpath(root)
        self.found: dict[str, Present] = {}
        self.linked: dict[tuple[int, int], masking.Linked] = {}  # held files, nlink > 1

    def __call__(self, dir_fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        inside = hostrun.held_above(walk.join(rel, "_")) if rel else None
        if inside is not None:  # in a held directory: where its symlinks lead
            for name in sorted(n for n, k in entries.items() if k == "symlink"):
                self._target(walk.join(rel, name), inside)
            return
        names = entries.keys() & _CANDIDATES
        joined = "\0".join(entries) + "\0"  # a search in C before any test per name
        if any(s + "\0" in joined for s in hostrun.SUFFIXES):
            names |= {n for n in entries if n.endswith(tuple(hostrun.SUFFIXES))}
        links = entries.keys() & _LINK_NAMES  # `.cargo`, `gradle`: held as symlinks only
        names |= {n for n in links if entries[n] == "symlink"}
        for name in sorted(names):
            path = walk.join(rel, name)
            link = entries[name] == "symlink"
            if hostrun.held_as(path, link=link) is None or hostrun.held_above(path) is not None:
                continue
            self._add(dir_fd, name, path, entries[name])

    def _add(self, dir_fd: int, name: str, path: str, kind: Type) -> None:
        if kind == "symlink":
            resolved = self._target(path, path)
            self.found[path] = Present(path, kind, os.readlink(name, dir_fd=dir_fd), "", resolved)
        else:
            self.found[path] = Present(path, kind)
        if kind == "file":
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if st.st_nlink > 1:  # its other names could change it unseen: pinned too
                self.linked[(st.st_dev, st.st_ino)] = masking.Linked(path, st.st_nlink, [])
        if self.bounded and len(self.found) > HELD_MAX:
            raise SetupError(
                f"{self.root} holds more than {HELD_MAX:,} files that host tools obey "
                "(each is pinned read-only: a mount); narrow the work directory"
            )

    def _target(self, rel: str, via: str) -> str:
        """Where the symlink REL leads, fully resolved: when that lies in the tree it is
        an entry of its own (pinned, or held while absent). Returns the resolution."""
        real = os.path.realpath(os.path.join(self.top, rel))
        if not real.startswith(self.top + "/"):
            return real
        inner = real[len(self.top) + 1 :]
        if inner not in self.found and not os.path.islink(real):
            kind: Kind = (
                "absent" if not os.path.lexists(real) else "dir" if os.path.isdir(real) else "file"
            )
            self.found[inner] = Present(inner, kind, via=via)
        return inner

    def links(self, root_fd: int) -> None:
        """Every other name in the tree of each held file with more than one link."""
        if not self.linked:
            return
        masking.search_links(root_fd, self.linked, stat_all=True, limit=walk.MAX_DIRS)
        for link in self.linked.values():
            for other in link.names:
                self.found.setdefault(other, Present(other, "file", via=link.rel))


def pins(found: Iterable[Present], edit: Iterable[str]) -> list[discover.Protection]:
    """The read-only binds of what the walk found, but what --edit-config names (EDIT:
    rels); every directory between the tree's top and a pin is a mount point as well,
    so none can be renamed away with the pin in it (git's pins do the same)."""
    edit = list(edit)
    out: dict[str, discover.Protection] = {}
    for p in found:
        if p.type in ("symlink", "absent") or hostrun.edited(p.via or p.rel, edit):
            continue
        parts = p.rel.split("/")
        for n in range(1, len(parts)):
            up = "/".join(parts[:n])
            out.setdefault(up, discover.Protection(up, "self", True))
        out[p.rel] = discover.Protection(p.rel, "ro", p.type == "dir")
    return sorted(out.values(), key=lambda p: p.rel.split("/"))


def merged(
    git: list[discover.Protection], held: list[discover.Protection]
) -> list[discover.Protection]:
    """Git's pins and the held files' as one list, parents first. A held entry is
    read-only whole, so git's mount points at it or beneath it (husky's hooks
    directory, `.husky/_`, bound onto itself so that its files stay writable) give way:
    a bind beneath a read-only one would be writable again."""
    ro = [p.rel for p in held if p.kind == "ro"]

    def under(rel: str) -> bool:
        return any(rel == h or rel.startswith(h + "/") for h in ro)

    keep = [p for p in git if p.kind == "ro" and p.rel not in ro or not under(p.rel)]
    rels = {p.rel for p in keep}
    out = keep + [p for p in held if p.rel not in rels]
    return sorted(out, key=lambda p: p.rel.split("/"))


def _obeyed(pfd: int, name: str, held: Held, judged_as: str) -> str | None:
    """Why the entry NAME (in the directory PFD) is held now, or None: a package
    manager's config only while it holds a key that runs something (or cannot be
    read, or has another name it could change through: then whole); JUDGED_AS: the
    name its tool knows it by."""
    if held.judge is Judge.ANY:
        return held.why()
    if held.judge is Judge.SYMLINK:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode)
        return held.why() if is_link else None
    data = walk.read_head(pfd, name, READ_MAX + 1)
    if data is None:  # not a regular file where a config belongs: held whatever it is
        return held.why()
    if os.stat(name, dir_fd=pfd, follow_symlinks=False).st_nlink > 1:
        return f"{held.why()}; another name of it in the tree could change it unseen"
    if held.judge is Judge.PATH:  # a byte search, no parse: linear, in C
        return held.why() if any(m in data for m in _PATHLIKE) else None
    got = payloadparse.exec_settings(judged_as, data) if len(data) <= READ_MAX else None
    if got is None or isinstance(got, payloadparse.Hostile):
        return f"{held.tool} reads it as its config, which could not be judged here"
    if not got:
        return None
    keys = ", ".join(dict.fromkeys(k for k, _ in got))
    return f"{held.tool} runs or installs what {keys} say{'s' if ',' not in keys else ''}"


def hold(
    root: str,
    rel: str,
    held: Held,
    target: str,
    quarantine: str,
    budget: Budget,
    judged_as: str = "",
) -> tuple[str, bool] | None:
    """The entry REL that the payload made: moved to QUARANTINE (a directory whole) and
    the symlink that stood there (TARGET, when one did) put back. The line to say and
    whether it is gone from the tree, or None when it holds nothing a tool obeys (or
    is gone already). JUDGED_AS: the name its tool knows it by (hostrun.held_as)."""
    parent, _, name = rel.rpartition("/")
    try:
        pfd = walk.open_in_tree(root, parent)
    except OSError:
        return None
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if target and stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=pfd) == target:
            return None  # what stood there: nothing new
        why = _obeyed(pfd, name, held, judged_as or name)
        if why is None:
            return None
        return _moved(pfd, root, rel, why, target, quarantine, budget), True
    except OSError as e:
        why = e.strerror or str(e)
        return f"{os.path.join(root, rel)}: could not be quarantined ({why}): check it", False
    finally:
        os.close(pfd)


def _moved(
    pfd: int, root: str, rel: str, why: str, target: str, quarantine: str, budget: Budget
) -> str:
    name = rel.rpartition("/")[2]
    dest = move_entry(pfd, rel, quarantine, budget)
    back = ""
    if target:
        try:
            os.symlink(target, name, dir_fd=pfd)
            back = "; the symlink that stood there is back"
        except OSError as e:
            back = f"; the symlink that stood there could not be put back ({e.strerror})"
    return (
        f"quarantined {os.path.join(root, rel)} ({why}): it is in {dest}{back}; "
        "if you made it yourself meanwhile, move it back"
    )


def after(
    before: Mapping[str, Present],
    now: Mapping[str, Present],
    root: str,
    quarantine: str,
    edit: Iterable[str],
    budget: Budget,
) -> list[str]:
    """After the run: every held entry the run made (absent at the start, or in place
    of a symlink, or a symlink that now leads elsewhere), quarantined as the live guard
    would have. EDIT: --edit-config's rels, said and left."""
    edit = list(edit)
    lines = []
    for rel in sorted(now, key=lambda r: r.split("/")):
        old, new = before.get(rel), now[rel]
        made = _made(old, new)
        via = old.via if old is not None else ""
        got = hostrun.held_as(rel, via, link=new.type == "symlink") if made else None
        if got is None:
            continue
        if hostrun.edited(old.via if old is not None and old.via else rel, edit):
            lines.append(f"left {os.path.join(root, rel)} as the run made it (--edit-config)")
            continue
        # a symlink that stayed but leads elsewhere (a directory on its way swapped) is
        # moved itself: put back, it would lead there again
        target = old.target if old is not None and new.target != old.target else ""
        moved = hold(root, rel, got[0], target, quarantine, budget, got[1])
        if moved is not None:
            lines.append(moved[0])
    return lines


def _made(old: Present | None, new: Present) -> bool:
    """The run made NEW: it was not there (and is not reached through a held entry
    made in the run, which is moved whole), or was absent, or a symlink that is not
    the same one leading to the same place."""
    if new.type == "absent":
        return False
    if old is None:
        return not new.via
    if old.type == "absent":
        return True
    return old.type == "symlink" and new != old
