"""The I/O half of credentials.py: finds the credentials of a writable tree during the
run's one walk (discover.Walker calls a ``Finder`` for every directory it lists, in the
worker thread) and reads what the stand-ins are made of.

Everything is read through the walk's own directory fds, O_NONBLOCK|O_NOFOLLOW, and
must be a regular file. A symlink with a credential's name is followed only inside the
tree and only through real directories; its target is covered then (in the sandbox the
link resolves to that target), and one that leaves the tree points at nothing the
sandbox can see.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from boxyd import credentials
from boxyd.credentials import Action, Rule
from boxyd.gitguard import discover
from boxyd.gitguard.discover import Layout, Type


@dataclass(frozen=True)
class Found:
    rel: str  # the entry covered, relative to the tree
    kind: str  # credentials.Rule.kind
    action: Action
    is_dir: bool
    content: bytes = b""  # the stand-in file's content (scrubbed copy, or empty)
    via: str = ""  # the symlink (relative) that named it, if any


def judge(dir_fd: int, name: str, rule: Rule) -> Found | None:
    """The stand-in for one entry the rule names, or None (nothing to cover)."""
    if rule.is_dir:
        return Found("", rule.kind, rule.action, True)
    if rule.action is Action.EMPTY and not rule.needs_content:
        return Found("", rule.kind, rule.action, False)
    limit = credentials.KEY_PROBE if rule.action is Action.EMPTY else credentials.SCRUB_MAX + 1
    data = discover.read_head(dir_fd, name, limit)
    if data is None:
        return None
    if rule.action is Action.EMPTY:  # a .pem or .key: only a private key is covered
        return Found("", rule.kind, rule.action, False) if credentials.holds_private_key(data) else None
    if len(data) > credentials.SCRUB_MAX:  # too large to scrub: nothing of it is shown
        return Found("", rule.kind, Action.EMPTY, False)
    clean = credentials.scrub(rule, data)
    return None if clean == data else Found("", rule.kind, rule.action, False, clean)


class Finder:
    """Called by the walk for each directory of one tree (``discover.Walker``'s
    observer); ``found`` is the result."""

    def __init__(self, root_fd: int, roots: list[str]) -> None:
        self.root_fd = root_fd
        self.roots = roots
        self.found: dict[str, Found] = {}

    def __call__(self, dir_fd: int, rel: str, entries: Mapping[str, Type]) -> None:
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
            found = judge(dir_fd, name, rule) if rule is not None else None
            if found is not None:
                self._add(discover.join(rel, name), found)

    def _link(self, dir_fd: int, rel: str, parent: str, name: str) -> None:
        rule = credentials.rule_for(parent, name, False) or credentials.rule_for(parent, name, True)
        if rule is None:
            return
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return
        comps = discover.place(self.roots, rel, target)
        spot = discover.locate(self.root_fd, comps) if comps is not None else None
        if spot is None or spot[1] not in ("file", "dir") or (spot[1] == "dir") != rule.is_dir:
            return  # outside the tree, through another symlink, or not what the name says
        tparent, _, tname = spot[0].rpartition("/")
        try:
            pfd = discover.open_dir(self.root_fd, tparent)
        except OSError:
            return
        try:
            found = judge(pfd, tname, rule)
        finally:
            os.close(pfd)
        if found is not None:
            self._add(spot[0], found, via=discover.join(rel, name))

    def _add(self, rel: str, found: Found, via: str = "") -> None:
        self.found.setdefault(rel, Found(rel, found.kind, found.action, found.is_dir,
                                         found.content, via))

    def git_configs(self, lay: Layout) -> None:
        """git's own config files (every gitdir's config and config.worktree): a CI
        checkout's token lives there."""
        for c in lay.controls:
            parent, _, name = c.rel.rpartition("/")
            if c.role != "config" or c.type != "file" or name not in ("config", "config.worktree"):
                continue
            try:
                pfd = discover.open_dir(self.root_fd, parent)
            except OSError:
                continue
            try:
                found = judge(pfd, name, credentials.GIT_CONFIG)
            finally:
                os.close(pfd)
            if found is not None:
                self._add(c.rel, found)


def revealed(found: Iterable[Found], root: str, reveal: Iterable[str]) -> tuple[list[Found], list[Found]]:
    """(covered, revealed): an entry is revealed when --reveal names it, the symlink that
    led to it, or a directory above it (absolute paths)."""
    tops = [r.rstrip("/") for r in reveal]

    def named(rel: str) -> bool:
        path = os.path.join(root, rel)
        return any(path == t or path.startswith(t + "/") for t in tops)

    covered, shown = [], []
    for f in found:
        (shown if named(f.rel) or (f.via and named(f.via)) else covered).append(f)
    return covered, shown
