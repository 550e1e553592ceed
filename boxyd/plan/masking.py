"""The I/O half of credentials.py: finds the credentials of a writable tree during the
run's one walk (discover.Walker calls a ``Finder`` for every directory it lists, in the
worker thread) and reads what the stand-ins are made of.

Everything is read through the walk's own directory fds, O_NONBLOCK|O_NOFOLLOW, and
must be a regular file. A symlink with a credential's name is followed only inside the
tree and only through real directories; its target is covered then (in the sandbox the
link resolves to that target), and one that leaves the tree points at nothing the
sandbox can see.

A credential file with more than one name (``st_nlink > 1``: the payload ran
``ln .env.local node_modules/.cache/e`` in an earlier run, and the user filled the
file in later) is covered under every name in the tree: ``links`` searches the whole
tree for its inode — ``node_modules`` and ``.git`` included — only when a
credential's link count says it has other names, so a tree without one pays nothing.
The search compares the inode number each directory listing already holds (no
``stat`` per file); a listing whose numbers are not the files' own (overlayfs without
xino) is detected on the credential itself, and then every regular file is stat'ed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from boxy.errors import SetupError
from boxyd.gitguard.discover import Layout
from boxyd.kernel import walk
from boxyd.kernel.walk import Type
from boxyd.plan import credentials, payloadparse
from boxyd.plan.credentials import Action, Rule


@dataclass(frozen=True)
class Found:
    rel: str  # the entry covered, relative to the tree
    kind: str  # credentials.Rule.kind
    action: Action
    is_dir: bool
    content: bytes = b""  # the stand-in file's content (scrubbed copy, or empty)
    via: str = ""  # the symlink (relative), or the other hard link, that named it, if any
    note: str = ""  # said with it under -v and in the audit log (its other hard links)


# What a payload can make one tree's credentials cost (docs/design.md, "Credentials"):
# each is a mount of its own in the sandbox (the mount table is bounded: fs.mount-max),
# and a scrubbed copy travels in the plan. Past FOUND_MAX the run is refused; past
# STAND_INS_MAX of copies, the rest are covered empty (nothing of them shown).
FOUND_MAX = 4096
STAND_INS_MAX = 16 << 20


def judge(
    dir_fd: int,
    name: str,
    rule: Rule,
    *,
    room: int = credentials.SCRUB_MAX,
    spent: Callable[[int], None] | None = None,
) -> Found | None:
    """The stand-in for one entry the rule names, or None (nothing to cover). ROOM:
    the bytes a scrubbed copy may still take (past it: covered empty); SPENT: told
    how many bytes were read."""
    if rule.is_dir:
        return Found("", rule.kind, rule.action, True)
    if rule.action is Action.EMPTY and not rule.needs_content:
        return Found("", rule.kind, rule.action, False)
    room = min(room, credentials.SCRUB_MAX)
    limit = credentials.KEY_PROBE if rule.action is Action.EMPTY else room + 1
    data = walk.read_head(dir_fd, name, limit)
    if data is None:
        return None
    if spent is not None:
        spent(len(data))
    if rule.action is Action.EMPTY:  # a .pem or .key: only a private key is covered
        return (
            Found("", rule.kind, rule.action, False)
            if credentials.holds_private_key(data)
            else None
        )
    if len(data) > room:  # too large to scrub (or no room left): nothing of it is shown
        return Found("", rule.kind, Action.EMPTY, False)
    clean = payloadparse.scrub(rule, data)  # apart from boxyd, within a budget
    if isinstance(clean, payloadparse.Hostile):  # not judged: nothing of it is shown
        return Found("", rule.kind, Action.EMPTY, False, note=f"not judged: {clean.why}")
    return None if clean == data else Found("", rule.kind, rule.action, False, clean)


@dataclass
class Linked:
    rel: str  # the credential's name the walk found
    nlink: int
    names: list[str]  # every name of its inode found in the tree so far


class Finder:
    """Called by the walk for each directory of one tree (``discover.Walker``'s
    observer); ``found`` is the result. SECRETS: the profile's own patterns
    (``filesystem.secrets``)."""

    def __init__(
        self,
        root_fd: int,
        roots: list[str],
        secrets: Sequence[str] = (),
        byte_limit: int | None = None,
    ) -> None:
        """BYTE_LIMIT: walk.TooLarge past reading that many bytes (a walk in
        boxyd's own thread hands a tree that costs more to the walk process)."""
        self.root_fd = root_fd
        self.roots = roots
        self.secrets = tuple(secrets)
        self.byte_limit = byte_limit
        self.read = 0  # bytes of credentials read
        self.room = STAND_INS_MAX  # bytes scrubbed copies may still take
        self.found: dict[str, Found] = {}
        self.linked: dict[tuple[int, int], Linked] = {}  # (st_dev, st_ino) of credentials
        self.d_ino_ok = True  # the listings' inode numbers are the files' own

    def __call__(self, dir_fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        if "other" in entries.values():  # a search in C: most directories hold none
            self._sockets(dir_fd, rel, entries)
        probe = [n for n, k in entries.items() if k == "file" and credentials.probe_worthy(n)]
        if not self.secrets and not probe and not credentials.any_candidate(entries):
            return  # most directories: nothing in them could be a credential
        comps = rel.split("/") if rel else []
        if any(c in credentials.SKIP_DIRS for c in comps):
            return
        parent = comps[-1] if comps else ""
        for name, kind in entries.items():
            if kind == "symlink":
                self._link(dir_fd, rel, parent, name)
                continue
            if kind not in ("file", "dir"):
                continue
            rule = credentials.rule_for(parent, name, kind == "dir")
            if rule is None and self.secrets:
                rule = credentials.user_rule(self.secrets, walk.join(rel, name), kind == "dir")
            found = self._judge(dir_fd, name, rule) if rule is not None else None
            if found is not None:
                self._add(walk.join(rel, name), found, dir_fd=dir_fd, name=name)
        for name in probe:
            self._by_content(dir_fd, rel, name)

    def _by_content(self, dir_fd: int, rel: str, name: str) -> None:
        """A key under an ordinary name (credentials.by_content), covered empty."""
        path = walk.join(rel, name)
        if path in self.found:
            return
        head = walk.read_head(dir_fd, name, credentials.CONTENT_PROBE)
        if head is None:
            return
        self._spent(len(head))
        kind = credentials.by_content(head)
        if kind is not None:
            found = Found(path, kind, Action.EMPTY, False, note="found by what it holds")
            self._add(path, found, dir_fd=dir_fd, name=name)

    def _sockets(self, dir_fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        """Unix sockets anywhere in the tree (node_modules and .git too): without
        Landlock's unix-socket scope (ABI 9) the payload could connect to a host server
        listening there; a stand-in over one is a read-only regular file, and a
        connect() to it is refused (EACCES)."""
        for name, kind in entries.items():
            if kind != "other":
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):  # (its other names: links())
                path = walk.join(rel, name)
                self._add(path, socket_found(path), dir_fd=dir_fd, name=name)

    def _link(self, dir_fd: int, rel: str, parent: str, name: str) -> None:
        rule = credentials.rule_for(parent, name, False) or credentials.rule_for(parent, name, True)
        if rule is None:
            return
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return
        comps = walk.place(self.roots, rel, target)
        spot = walk.locate(self.root_fd, comps) if comps is not None else None
        if spot is None or spot[1] not in ("file", "dir") or (spot[1] == "dir") != rule.is_dir:
            return  # outside the tree, through another symlink, or not what the name says
        self._judge_at(spot[0], rule, via=walk.join(rel, name))

    def _judge_at(self, rel: str, rule: Rule, via: str = "") -> None:
        """Judge the entry REL of the tree (reached through real directories only)."""
        parent, _, name = rel.rpartition("/")
        try:
            pfd = walk.open_dir(self.root_fd, parent)
        except OSError:
            return
        try:
            found = self._judge(pfd, name, rule)
            if found is not None:
                self._add(rel, found, via=via, dir_fd=pfd, name=name)
        finally:
            os.close(pfd)

    def _judge(self, dir_fd: int, name: str, rule: Rule) -> Found | None:
        found = judge(dir_fd, name, rule, room=self.room, spent=self._spent)
        if found is not None:
            self.room -= len(found.content)
        return found

    def _spent(self, n: int) -> None:
        self.read += n
        if self.byte_limit is not None and self.read > self.byte_limit:
            raise walk.TooLarge(f"more than {self.byte_limit:,} bytes of credentials")

    def _count(self) -> None:
        if len(self.found) > FOUND_MAX:
            raise SetupError(
                f"{self.roots[0]} holds more than {FOUND_MAX:,} credential files (each is "
                "covered by a mount of its own): remove them, or run in a narrower directory"
            )

    def _add(self, rel: str, found: Found, via: str = "", dir_fd: int = -1, name: str = "") -> None:
        if rel in self.found:
            return
        self.found[rel] = replace(found, rel=rel, via=via)  # its note (not judged) kept
        self._count()
        if found.is_dir or dir_fd < 0:
            return
        try:  # the same lstat judge made: a file's other names are not in its name
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return
        if (stat.S_ISREG(st.st_mode) or stat.S_ISSOCK(st.st_mode)) and st.st_nlink > 1:
            self.linked.setdefault((st.st_dev, st.st_ino), Linked(rel, st.st_nlink, []))
            self.d_ino_ok = self.d_ino_ok and _listed_ino(dir_fd, name) == st.st_ino

    def git_configs(self, lay: Layout) -> None:
        """git's own config files — every gitdir's config and config.worktree, and
        every file a config includes (``include.path``, ``includeIf.*.path``, found by
        the walk): a CI checkout's token lives there, and git reads an included file
        as its own config."""
        for c in lay.controls:
            name = c.rel.rpartition("/")[2]
            if c.type != "file" or not (
                c.role == "config" and name in ("config", "config.worktree") or c.role == "include"
            ):
                continue
            self._judge_at(c.rel, credentials.GIT_CONFIG)

    def links(self, limit: int | None = walk.MAX_DIRS) -> None:
        """Every other name of each credential with more than one link, covered with
        the same stand-in (and said so); a link count higher than the names found
        means the rest lie outside the tree, which is said too."""
        if not self.linked:
            return
        search_links(self.root_fd, self.linked, stat_all=not self.d_ino_ok, limit=limit)
        for link in self.linked.values():
            primary = self.found[link.rel]
            others = [n for n in link.names if n != link.rel]
            missing = link.nlink - len(set(link.names) | {link.rel})
            note = f"{link.nlink} hard links: also {', '.join(others) or 'none in the tree'}"
            if missing > 0:
                note += f"; {missing} outside the tree (not shown to the payload, but not covered there)"
            self.found[link.rel] = replace(
                primary, note="; ".join(filter(None, (primary.note, note)))
            )
            for other in others:
                self.found.setdefault(
                    other,
                    replace(primary, rel=other, via=link.rel, note=f"a hard link of {link.rel}"),
                )
                self._count()


SOCKET = credentials.Rule("unix socket", Action.EMPTY)


def socket_found(rel: str) -> Found:
    """The stand-in of a unix socket at REL: an empty file, which refuses connections."""
    return Found(rel, SOCKET.kind, SOCKET.action, False, b"", note="connections are refused")


def socket_names(root: str, rel: str) -> tuple[list[str], int]:
    """The other names in the tree ROOT of the socket at REL (a hard link the payload
    made in the moment before its stand-in: connect() goes through any name), and its
    link count (0: gone, or not a socket)."""
    parent, _, name = rel.rpartition("/")
    try:
        root_fd = walk.open_root(root)
    except OSError:
        return [], 0
    try:
        pfd = walk.open_dir(root_fd, parent)
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        finally:
            os.close(pfd)
        if not stat.S_ISSOCK(st.st_mode) or st.st_nlink < 2:
            return [], st.st_nlink if stat.S_ISSOCK(st.st_mode) else 0
        wanted = {(st.st_dev, st.st_ino): Linked(rel, st.st_nlink, [])}
        search_links(root_fd, wanted, stat_all=True, limit=walk.MAX_DIRS)
        return [n for n in wanted[(st.st_dev, st.st_ino)].names if n != rel], st.st_nlink
    except OSError:
        return [], 0
    finally:
        os.close(root_fd)


def _listed_ino(dir_fd: int, name: str) -> int:
    """The inode number NAME's directory listing holds (d_ino)."""
    with os.scandir(dir_fd) as it:
        for e in it:
            if e.name == name:
                return e.inode()
    return -1


def search_links(
    root_fd: int, wanted: Mapping[tuple[int, int], Linked], *, stat_all: bool, limit: int | None
) -> None:
    """Append to each WANTED entry's ``names`` every name of its inode in the tree,
    walking every directory depth first through O_NOFOLLOW fds (one open per level);
    stops once every link is found. A directory that cannot be listed is skipped (the
    payload, the same user, cannot list it either)."""
    inos = {ino for _, ino in wanted}
    left = sum(w.nlink for w in wanted.values())
    stack: list[tuple[int, str, Iterator[str]]] = []
    listed = 0

    def enter(fd: int, rel: str) -> None:
        nonlocal left
        subdirs = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
                    elif (stat_all or e.inode() in inos) and not e.is_symlink():
                        left -= _match(fd, e.name, walk.join(rel, e.name), wanted)
        except OSError:
            pass
        stack.append((fd, rel, iter(subdirs)))

    try:
        enter(os.dup(root_fd), "")
        while stack and left > 0 and (limit is None or listed < limit):
            fd, rel, names = stack[-1]
            name = next(names, None)
            if name is None or len(stack) >= walk.MAX_DEPTH:
                os.close(fd)
                stack.pop()
                continue
            try:
                child = walk.open_child(fd, name)
            except OSError:
                continue
            listed += 1
            enter(child, walk.join(rel, name))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _match(fd: int, name: str, rel: str, wanted: Mapping[tuple[int, int], Linked]) -> int:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return 0
    link = wanted.get((st.st_dev, st.st_ino))
    if link is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return 0
    link.names.append(rel)
    return 1


def revealed(
    found: Iterable[Found], root: str, reveal: Iterable[str]
) -> tuple[list[Found], list[Found]]:
    """(covered, revealed): an entry is revealed when --reveal names it, the symlink that
    led to it, or a directory above it (absolute paths)."""
    tops = [r.rstrip("/") for r in reveal]

    def named(rel: str) -> bool:
        path = os.path.join(root, rel)
        return any(path == t or path.startswith(t + "/") for t in tops)

    covered: list[Found] = []
    shown: list[Found] = []
    for f in found:
        (shown if named(f.rel) or (f.via and named(f.via)) else covered).append(f)
    return covered, shown
