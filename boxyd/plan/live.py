"""The live guard's policy (pure): which directories to watch during a session, and
what a change in one of them calls for.

Stand-ins and pins are bind mounts on single files; a host rename over one (an
editor's save, ``git config``) detaches it in the sandbox, and a credential file
the user creates during a session was never covered. boxyd.daemon.liveguard
watches the directories this names and re-applies what this says, through a
joiner (boxyd/stage2/joiner.py, boxyd/stage2/live.py).
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from boxyd.config import hostrun
from boxyd.config.hostrun import Held
from boxyd.gitguard.discover import Protection
from boxyd.plan import credentials, masking
from boxyd.plan.credentials import Action, Rule
from boxyd.plan.masking import Found

MAX_WATCHED = 16_384  # directories per session (the user's inotify budget is shared)
LIST_MAX = 10_000  # entries of one directory the guard lists and judges (more: said)
RESCAN_EVERY = 1.0  # seconds between listings of the directories that could not be watched
RESCAN_MAX = 250_000  # entries one such listing looks at (~1 s; more: the session is stopped)
# What the payload can make one session's guard do (docs/design.md, "The guard is
# live"): cover this many new credentials, and let a change wait this long for its
# redo. Past either the guard cannot keep up, and the session is stopped.
NEW_MAX = 1024
LAG_MAX = 10.0
# Files host programs obey, quarantined in one session (each is a move and an entry in
# the quarantine): past it the payload is making them faster than anyone could look
HOLD_MAX = 256

# A directory's (st_dev, st_ino, st_ctime_ns) as the walk saw it. The live guard, once
# it watches the directory, lists it only if that changed: no entry can have appeared
# in between without changing its ctime, which nobody can set back (utimensat sets it
# to now). Only where the ctime comes from this kernel's clock in nanoseconds (a
# network filesystem's comes from the server's), and never when it is racy: within
# RACY_NS of the walk's own clock a second change can fall in the same clock tick and
# leave it equal (git's racy-index rule; the kernel's coarse clock lags by a tick).
Stamp = tuple[int, int, int]
RACY_NS = 1_000_000_000
LOCAL_FS = frozenset(
    {
        0xEF53,  # ext2, ext3, ext4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs
        0xF2F52010,  # f2fs
        0x794C7630,  # overlayfs
        0x2FC12FC1,  # zfs
        0xCA451A4E,  # bcachefs
    }
)


@dataclass(frozen=True)
class Watched:
    """What the live guard keeps covered in one writable tree."""

    root: str
    pins: Mapping[str, Protection] = field(default_factory=dict)  # read-only pins, by rel
    # covered credentials, by rel; the live guard adds those it covers during the session
    masks: dict[str, Found] = field(default_factory=dict)
    reveal: tuple[str, ...] = ()  # --reveal: absolute paths never covered
    dirs: tuple[str, ...] = ()  # the walk's directories (where a credential may appear)
    secrets: tuple[str, ...] = ()  # the profile's own patterns (filesystem.secrets)
    # of dirs, by rel (stamp()); the session's start only: emptied once it is done
    stamps: dict[str, Stamp] = field(default_factory=dict)
    unlisted: tuple[str, ...] = ()  # the walk's subtrees past MAX_WATCHED (Tree.unlisted)
    # held files (plan/hostrun.py) that were symlinks at the start, by rel: their
    # targets, put back when the payload replaces one
    symlinks: Mapping[str, str] = field(default_factory=dict)
    # where held symlinks led that was absent at the start, by rel: the held entry it is
    # reached through (heldfiles.Present.via); one made is quarantined as that would be
    absent: Mapping[str, str] = field(default_factory=dict)
    edit: tuple[str, ...] = ()  # --edit-config's rels: left to the run
    # the git directories the walk found (discover.Layout.gitdirs): a change in one, or a
    # new repository anywhere, has the git guard look again at once (GIT below)
    gitdirs: tuple[str, ...] = ()
    hookdirs: tuple[str, ...] = ()  # core.hooksPath's directories in the tree (git runs them)
    # directories that got a HEAD, objects or refs during the session (a bare repository
    # in the making: its config and index count as a gitdir's), by the live guard; read
    # with list() (one C call: safe beside the loop's inserts)
    made: dict[str, None] = field(default_factory=dict)


@dataclass(frozen=True)
class Redo:
    """What one change calls for, in this order: a held file the payload made moved
    to the quarantine (HOLD; the rest then only if it holds nothing a tool obeys),
    the pin again, then the stand-in again (its content read anew), or a new
    credential's first stand-in (RULE)."""

    rel: str
    pin: Protection | None = None
    mask: Found | None = None
    rule: Rule | None = None
    hold: Held | None = None
    git: bool = False  # the git guard's discovery again, now (plan/live.py git_event)


def watched(
    root: str,
    pins: Iterable[Protection],
    masks: Iterable[Found],
    reveal: Iterable[str],
    dirs: Iterable[str] = (),
    protect: Iterable[str] = (),
    secrets: Iterable[str] = (),
    stamps: dict[str, Stamp] | None = None,
    unlisted: Iterable[str] = (),
    symlinks: Mapping[str, str] | None = None,
    edit: Iterable[str] = (),
    gitdirs: Iterable[str] = (),
    absent: Mapping[str, str] | None = None,
    hookdirs: Iterable[str] = (),
) -> Watched:
    """Only read-only pins: a ``self`` pin is a directory bound onto itself, which the
    host renaming it away ends for the host as well (nothing left to guard there).
    PROTECT: --protect (and the presets' tools' files) as absolute paths; those in this
    tree that are files are pinned again like git's (a directory bind survives the
    host's renames inside it)."""
    own = {p.rel: p for p in pins if p.kind == "ro"}
    top = root.rstrip("/") + "/"
    for path in protect:
        if path.startswith(top) and path[len(top) :] not in own:
            own[path[len(top) :]] = Protection(path[len(top) :], "ro", False)
    return Watched(
        root,
        own,
        {f.rel: f for f in masks},
        tuple(reveal),
        tuple(dirs),
        tuple(secrets),
        stamps if stamps is not None else {},  # the walk's own (not copied: emptied later)
        tuple(unlisted),
        dict(symlinks or {}),
        dict(absent or {}),
        tuple(edit),
        tuple(gitdirs),
        tuple(hookdirs),
    )


def stamp(fs_type: int, root_dev: int, st: tuple[int, int, int], now_ns: int) -> Stamp | None:
    """ST (a directory's st_dev, st_ino, st_ctime_ns, read after it was listed) as a
    Stamp, or None where it cannot prove the directory unchanged later: a filesystem
    not in LOCAL_FS (FS_TYPE: the tree root's f_type), another device than the root's
    (a mount beneath it), a ctime within RACY_NS of NOW_NS (or after it)."""
    dev, _, ctime_ns = st
    if fs_type not in LOCAL_FS or dev != root_dev or ctime_ns >= now_ns - RACY_NS:
        return None
    return st


def unchanged(w: Watched, rel: str, now: Stamp) -> bool:
    """Directory REL is as the walk listed it (NOW: its stamp, read once it is watched)."""
    return w.stamps.get(rel) == now


def skipped(rel: str) -> bool:
    """A directory no credential is looked for in (node_modules, .git: by git's rules)."""
    return bool(rel) and not credentials.SKIP_DIRS.isdisjoint(rel.split("/"))


# What makes git find its configuration, its hooks or another repository (git's
# setup.c: is_git_directory, read_gitfile, get_common_dir; the worktrees' and
# submodules' gitdirs): a new entry by one of these names anywhere in the tree, or any
# new entry in a git directory but the ones git writes as it works, has the git
# guard's discovery run again at once.
GIT_ANYWHERE = frozenset({".git", "HEAD", "commondir", "objects", "refs"})
GIT_AT_WORK = frozenset(
    {
        "HEAD", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE",
        "REBASE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "AUTO_MERGE", "BISECT_LOG",
        "COMMIT_EDITMSG", "TAG_EDITMSG", "SQUASH_MSG", "logs", "objects", "refs",
        "packed-refs", "description", "rr-cache", "sequencer", "rebase-merge",
        "rebase-apply", "lost-found", "gitk.cache", "shallow",
    }
)  # fmt: skip
GIT_NESTED = ("worktrees", "modules")  # where git keeps other gitdirs: watched too


def git_event(w: Watched, dir_rel: str, name: str) -> bool:
    """A new entry NAME in DIR_REL that may change what git reads or runs."""
    if name.endswith(".lock"):
        return False  # a lock git (or the payload) holds: the file it names comes next
    if is_gitdir(w, dir_rel):
        return name not in GIT_AT_WORK
    if dir_rel in w.hookdirs or _is_hooks(w, dir_rel):
        return True  # a hook
    return name in GIT_ANYWHERE or _in_nested(w, dir_rel)


def is_gitdir(w: Watched, rel: str) -> bool:
    """REL is a git directory the walk found, or one made meanwhile."""
    return rel in w.gitdirs or rel.rpartition("/")[2] == ".git" or rel in w.made


def repository_made(w: Watched, redo: Redo) -> None:
    """A git redo for a HEAD, objects or refs: their directory may be a bare repository
    in the making, so what a gitdir's changes count for counts there too."""
    parent, _, name = redo.rel.rpartition("/")
    if redo.git and name in ("HEAD", "objects", "refs"):
        w.made[parent] = None


def _is_hooks(w: Watched, rel: str) -> bool:
    parent, _, name = rel.rpartition("/")
    return name == "hooks" and is_gitdir(w, parent)


def _in_nested(w: Watched, rel: str) -> bool:
    """REL lies in a git directory's worktrees/ or modules/ (other gitdirs live there)."""
    return any(rel.startswith(f"{g}/{n}".lstrip("/")) for g in w.gitdirs for n in GIT_NESTED)


def _watch_order(w: Watched) -> list[str]:
    """The directory of every pin and stand-in first (those must be watched), then every
    git directory and where it keeps others, then the walk's directories, parents first."""
    must = {r.rpartition("/")[0] for r in (*w.pins, *w.masks)}
    nested = (*GIT_NESTED, "hooks")
    must |= {*w.gitdirs, *w.hookdirs, *(f"{g}/{n}".lstrip("/") for g in w.gitdirs for n in nested)}
    first = sorted(must, key=lambda d: (d.count("/") if d else -1, d))
    rest = sorted({"", *w.dirs} - must, key=lambda d: (d.count("/") if d else -1, d))
    return first + rest


def watch_dirs(w: Watched) -> list[str]:
    """What the guard watches from the start: _watch_order, at most MAX_WATCHED."""
    return _watch_order(w)[:MAX_WATCHED]


def past_budget(w: Watched) -> list[str]:
    """What the walk found that the watches cannot hold: the directories watch_dirs
    leaves out, and the subtrees the walk did not list past MAX_WATCHED (the guard
    lists them again every RESCAN_EVERY instead)."""
    return _watch_order(w)[MAX_WATCHED:] + list(w.unlisted)


def new_dir(w: Watched, dir_rel: str, name: str) -> str | None:
    """A directory created (or moved in) during the session, to watch as well: the
    walk's kind, a new repository's gitdir (git_event), and where a gitdir keeps others."""
    rel = f"{dir_rel}/{name}" if dir_rel else name
    if name == ".git" and not skipped(dir_rel):  # a new repository's gitdir: its top
        return rel
    if _is_hooks(w, rel):  # ... and its hooks
        return rel
    return rel if not skipped(rel) or _in_nested(w, rel) else None


def _revealed(w: Watched, rel: str) -> bool:
    path = os.path.join(w.root, rel)
    return any(path == t.rstrip("/") or path.startswith(t.rstrip("/") + "/") for t in w.reveal)


def on_change(w: Watched, dir_rel: str, name: str, is_dir: bool) -> Redo | None:
    """A new entry NAME appeared in the watched directory DIR_REL (created, or renamed
    over what was there): what to re-apply, if anything."""
    rel = f"{dir_rel}/{name}" if dir_rel else name
    pin, mask = w.pins.get(rel), w.masks.get(rel)
    if pin is not None or mask is not None:
        return Redo(
            rel,
            pin=pin if pin is not None and pin.is_dir == is_dir else None,
            mask=mask if mask is not None and mask.is_dir == is_dir else None,
        )
    if git_event(w, dir_rel, name):
        return Redo(rel, git=True)
    parent = dir_rel.rpartition("/")[2]
    if skipped(dir_rel):
        return None
    held = _held(w, rel, is_dir)
    rule = None if _revealed(w, rel) else credentials.rule_for(parent, name, is_dir)
    if rule is None and w.secrets and not _revealed(w, rel):
        rule = credentials.user_rule(w.secrets, rel, is_dir)
    if held is not None:
        return Redo(held[0], hold=held[1], rule=rule if held[0] == rel else None)
    return Redo(rel, rule=rule) if rule is not None else None


def _held(w: Watched, rel: str, is_dir: bool) -> tuple[str, Held] | None:
    """The held entry the new entry REL makes (itself, or the held directory it lies in
    when that is not pinned: the payload made that too; a non-directory that may be a
    symlink in place of a directory a tool reads, hostrun.LINKS), or None: not held,
    pinned (a change beneath a pinned directory is the host's: the payload cannot
    write there), or left to the run by --edit-config."""
    via = w.absent.get(rel)
    if via is not None:  # where a held symlink leads, made now
        got = hostrun.held_as(rel, via)
        return (rel, got[0]) if got is not None and not hostrun.edited(via, w.edit) else None
    above = hostrun.held_above(rel)
    if above is not None and above in w.pins:
        return None
    top = above if above is not None else rel
    held = hostrun.match(top)
    if held is None and above is None and not is_dir:  # judged by its type when held
        held = hostrun.as_link(rel)
    if held is None or hostrun.edited(top, w.edit):
        return None
    return top, held


def on_write(w: Watched, dir_rel: str, name: str) -> Redo | None:
    """A file in DIR_REL was written and closed in place (no new dentry: any stand-in on
    it stays). What the content decides is judged again: a covered scrubbed copy is
    made anew from the host's new content (the host wrote the file beneath it: the
    payload cannot reach it), a credential created empty and then written (an
    ``.npmrc`` that had no token when it appeared) is covered now, and a held file
    judged by its keys (an ``.npmrc`` written after it appeared) is judged again."""
    rel = f"{dir_rel}/{name}" if dir_rel else name
    mask = w.masks.get(rel)
    if mask is not None:
        return Redo(rel, mask=mask) if mask.action is Action.SCRUB else None
    if rel in w.pins:
        return None
    redo = on_change(w, dir_rel, name, False)
    if redo is None or redo.hold is not None or redo.git:  # what it now says decides
        return redo
    return redo if redo.rule is not None and redo.rule.needs_content else None


def socket_redo(w: Watched, dir_rel: str, name: str) -> Redo | None:
    """A unix socket that appeared in DIR_REL (a host server listening in the tree): its
    stand-in, which refuses connections (masking.SOCKET), unless --reveal names it."""
    rel = f"{dir_rel}/{name}" if dir_rel else name
    if rel in w.masks or _revealed(w, rel):
        return None
    return Redo(rel, rule=masking.SOCKET)


def everything(w: Watched) -> list[Redo]:
    """After lost events (the inotify queue overflowed): re-apply every pin and stand-in."""
    rels = sorted(set(w.pins) | set(w.masks), key=lambda r: r.split("/"))
    return [Redo(r, pin=w.pins.get(r), mask=w.masks.get(r)) for r in rels]


Key = tuple[str, str]  # (tree root, rel)


@dataclass
class Backlog:
    """The redos one session's guard has yet to do, oldest first, one per entry: a
    change to an entry whose redo is still waiting joins it (the redo reads the entry
    anew when its turn comes). Bounded in what the payload can make it cost: NEW_MAX
    new credentials in a session (each is a mount that stays), a wait of LAG_MAX for
    the oldest. add() and take() say why not, once the guard cannot keep up."""

    new_max: int = NEW_MAX
    lag_max: float = LAG_MAX
    # by entry: its redo, since when it waits, and the number of its place in _heap
    _waiting: dict[Key, tuple[Redo, float, int]] = field(default_factory=dict)
    # (since, number, entry), the oldest first: a place whose number is no longer its
    # entry's is passed over (a take is O(log n): after lost events every pin and
    # stand-in waits at once, thousands, and a scan per take was O(n^2) on the loop)
    _heap: list[tuple[float, int, Key]] = field(default_factory=list)
    _numbers: Iterator[int] = field(default_factory=itertools.count)
    _new: set[Key] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, root: str, redo: Redo, since: float) -> str | None:
        """REDO of tree ROOT, for a change at SINCE; why the guard is over, or None."""
        key = (root, redo.rel)
        if redo.rule is not None and key not in self._new:
            if len(self._new) >= self.new_max:
                return f"more than {self.new_max:,} new credentials to cover in one session"
            self._new.add(key)
        old = self._waiting.get(key)
        if old is not None and old[1] <= since:  # joins it, in its place
            self._waiting[key] = (_joined(old[0], redo), old[1], old[2])
            return None
        if old is not None:
            redo = _joined(old[0], redo)
        number = next(self._numbers)
        self._waiting[key] = (redo, since, number)
        heapq.heappush(self._heap, (since, number, key))
        return None

    def take(self, now: float) -> tuple[str, Redo, float] | str | None:
        """The oldest waiting redo as (root, redo, since); None when none waits; why the
        guard is over when the oldest waited more than LAG_MAX."""
        while self._heap:
            since, number, key = self._heap[0]
            waiting = self._waiting.get(key)
            if waiting is None or waiting[2] != number:
                heapq.heappop(self._heap)  # taken, or moved to an earlier place
                continue
            if now - since > self.lag_max:
                return (
                    f"a change waited {now - since:.1f}s for its redo (more than {self.lag_max:g}s)"
                )
            heapq.heappop(self._heap)
            del self._waiting[key]
            return key[0], waiting[0], since
        return None


def _joined(old: Redo, new: Redo) -> Redo:
    """Two waiting redos of one entry as one: the newer's parts where it has them."""
    return Redo(
        new.rel,
        pin=new.pin or old.pin,
        mask=new.mask or old.mask,
        rule=new.rule or old.rule,
        hold=new.hold or old.hold,
        git=new.git or old.git,
    )
