"""The live guard's watches (docs/design.md, "The guard is live"), set up in a worker
thread: each directory opened beneath its tree one O_PATH step at a time (never
through a symlink), watched by that descriptor, and listed when something may be in
it that no event will tell of. What a listing calls for goes back to the event loop
as Redos (boxyd/daemon/liveguard.py carries them out).

A watch is named in ``names`` before its directory is listed: an event the loop reads
for it in between (and drops, not knowing the watch yet) is for an entry that the
listing then sees.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from boxyd.config import hostrun
from boxyd.kernel import walk
from boxyd.plan import live, masking
from boxyd.plan.live import Redo, Watched

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_MODIFY = 0x00000002
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
# by /proc/self/fd/N: following that one (magic) link is the point, so no IN_DONT_FOLLOW
WATCH = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ONLYDIR | IN_EXCL_UNLINK
O_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK

_libc = ctypes.CDLL(None, use_errno=True)
_libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]


@dataclass
class Visit:
    """What one call found: the redos, and what could not be watched (said)."""

    redos: list[Redo] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    full: bool = False  # MAX_WATCHED reached (said once)
    # directories that could not be watched (the budget full, the user's inotify
    # watches used up): the guard lists them again instead (LiveGuard's rescan)
    unwatched: list[str] = field(default_factory=list)


@dataclass
class Rescan:
    """What one listing of the unwatched directories found: new credentials to cover,
    the directories below them (unwatched too), and whether it stopped at its bound."""

    redos: list[Redo] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    over: bool = False


class Mode(enum.Enum):
    """How much a visited directory is listed and judged."""

    START = "start"  # listed if it changed since the walk; new credentials only
    LISTED = "listed"  # listed; new credentials only (pins and stand-ins: everything())
    NEW = "new"  # created or moved in: listed, and every entry the host's news


class _Steps:
    """O_PATH fds from a tree's root down to the directory opened last: directories
    visited parents first, depth first, cost one open each (a stack, so at most one fd
    per level is held)."""

    def __init__(self, root: str) -> None:
        self.stack: list[tuple[str, int]] = [("", walk.open_root(root))]

    def open(self, rel: str) -> int:
        """REL's fd (kept by the stack); OSError if it is gone or not a directory."""
        while len(self.stack) > 1 and not _within(rel, self.stack[-1][0]):
            os.close(self.stack.pop()[1])
        base = self.stack[-1][0]
        for name in walk.parts(rel[len(base) :].lstrip("/")):
            fd = os.open(name, walk.O_STEP, dir_fd=self.stack[-1][1])
            self.stack.append((f"{self.stack[-1][0]}/{name}".lstrip("/"), fd))
        return self.stack[-1][1]

    def close(self) -> None:
        for _, fd in self.stack:
            os.close(fd)
        self.stack = []


def _budget_note(w: Watched) -> str:
    return (
        f"live guard: {w.root}: more than {live.MAX_WATCHED:,} directories; the others "
        f"are listed again every {live.RESCAN_EVERY:g} s instead (a credential saved "
        "there is covered within about that)"
    )


def _within(rel: str, base: str) -> bool:
    return rel == base or rel.startswith(base + "/")


def _order(rels: Iterable[str]) -> list[str]:
    """Depth first, parents before their children (what _Steps walks cheapest)."""
    return sorted(set(rels), key=lambda r: r.split("/") if r else [])


class Watches:
    """One session's inotify instance and what each of its watch descriptors names."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.names: dict[int, tuple[str, str]] = {}  # wd -> (root, directory rel)
        # Held around each inotify_add_watch and the close: a worker still adding
        # watches as the session ends must never add one to whatever instance reuses
        # the fd's number (another session's)
        self._lock = threading.Lock()

    def close(self) -> None:
        """The instance closed, once no watch is being added (in a worker: the close
        waits for an RCU grace period)."""
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    def _add(self, fd: int, mask: int = WATCH) -> int:
        with self._lock:
            if self.fd < 0:
                raise OSError(errno.EBADF, "the session ended")
            wd = int(_libc.inotify_add_watch(self.fd, f"/proc/self/fd/{fd}".encode(), mask))
            if wd < 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
            return wd

    def start(self, w: Watched) -> Visit:
        """The session's start: every directory live.watch_dirs names watched, and
        listed only where it changed since the walk (live.unchanged); a directory found
        there that is not watched yet is entered too. What the budget cannot hold
        (live.past_budget) is the rescan's."""
        out = self._visit(w, live.watch_dirs(w), Mode.START)
        if past := live.past_budget(w):
            out.unwatched += past
            if not out.full:
                out.full = True
                out.notes.append(_budget_note(w))
        return out

    def again(self, w: Watched) -> Visit:
        """After lost events (the queue overflowed): every watched directory listed."""
        return self._visit(w, self._watched(w), Mode.LISTED)

    def enter(self, w: Watched, rels: Iterable[str]) -> Visit:
        """Directories created or moved in during the session: each watched, and what
        it holds judged, at every depth (a tree moved in holds directories already)."""
        return self._visit(w, rels, Mode.NEW)

    def _watched(self, w: Watched) -> list[str]:
        # list() of a dict's values is one C call: safe beside the other worker's inserts
        return [rel for root, rel in list(self.names.values()) if root == w.root]

    def forget(self, wd: int) -> None:
        """WD's directory is gone (IN_IGNORED): a new one by that name is entered anew."""
        self.names.pop(wd, None)

    def _visit(self, w: Watched, rels: Iterable[str], mode: Mode) -> Visit:
        out = Visit()
        try:
            steps = _Steps(w.root)
        except OSError as e:
            out.notes.append(f"live guard: {w.root}: {e.strerror}; not watched")
            return out
        try:
            todo = _order(rels)[::-1]  # popped from the end: depth first
            planned, known = set(todo), set(self._watched(w))
            while todo:
                found = self._one(w, steps, todo.pop(), mode, known, out)
                new = [d for d in found if d not in planned]
                planned.update(new)
                todo += _order(new)[::-1]
        finally:
            steps.close()
        return out

    def _one(
        self, w: Watched, steps: _Steps, rel: str, mode: Mode, known: set[str], out: Visit
    ) -> list[str]:
        """Watch REL, list it if need be; the subdirectories found that are not watched."""
        if len(self.names) >= live.MAX_WATCHED:
            if not out.full:
                out.full = True
                out.notes.append(_budget_note(w))
            out.unwatched.append(rel)
            return []
        try:
            fd = steps.open(rel)
            # a gitdir's config written through a descriptor kept open (no close to see)
            wd = self._add(fd, WATCH | IN_MODIFY if live.is_gitdir(w, rel) else WATCH)
            self.names[wd] = (w.root, rel)  # before the listing: the module's docstring
            known.add(rel)
            st = os.fstat(fd)
            if mode is Mode.START and live.unchanged(
                w, rel, (st.st_dev, st.st_ino, st.st_ctime_ns)
            ):
                return []
            entries = _listing(fd)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                if not out.full:  # the user's inotify watches are used up: said once
                    out.full = True
                    out.notes.append(
                        f"live guard: {w.root}/{rel}: {e.strerror}; not watched, listed "
                        f"again every {live.RESCAN_EVERY:g} s instead"
                    )
                out.unwatched.append(rel)
            elif e.errno == errno.EACCES and mode is not Mode.LISTED:
                # made so (the walk listed every directory it watches from the start:
                # worktree.refuse_unlistable): never watched, a credential the host saved
                # there was the payload's, which reaches in by name; held at once
                out.redos.append(Redo(rel, hold=hostrun.UNREADABLE))
            return []  # gone, moved away: nothing that can be watched there
        if len(entries) > live.LIST_MAX:
            out.notes.append(
                f"live guard: {w.root}/{rel}: more than {live.LIST_MAX:,} entries; "
                f"the rest listed every {live.RESCAN_EVERY:g} s"
            )
            out.unwatched.append(rel)  # the rescan lists it whole, in a child
        return self._judge(w, rel, entries[: live.LIST_MAX], mode, known, out)

    def _judge(
        self,
        w: Watched,
        rel: str,
        entries: list[tuple[str, str]],
        mode: Mode,
        known: set[str],
        out: Visit,
    ) -> list[str]:
        subdirs = []
        for name, kind in entries:
            is_dir = kind == "dir"
            if kind == "socket" and (sock := live.socket_redo(w, rel, name)) is not None:
                out.redos.append(sock)  # a server listening in the tree: covered
                continue
            redo = live.on_change(w, rel, name, is_dir)
            if redo is not None and (redo.hold is not None or redo.git):  # the payload's
                out.redos.append(redo)
                sub = live.new_dir(w, rel, name) if redo.git and is_dir else None
                if sub is not None and sub not in known:
                    subdirs.append(sub)  # a new gitdir in modules/: watched as well
                continue
            if is_dir:
                sub = live.new_dir(w, rel, name)
                if sub is not None and sub not in known:
                    subdirs.append(sub)
                continue
            sub = f"{rel}/{name}" if rel else name
            # what the walk covered or pinned is in place unless an event says otherwise;
            # a new directory's entries are all the host's news
            if redo is not None and (
                mode is Mode.NEW or (redo.rule is not None and sub not in w.masks)
            ):
                out.redos.append(redo)
        return subdirs


def rescan(w: Watched, rels: list[str], limit: int) -> Rescan:
    """REL's directories (those that could not be watched) listed, and every directory
    below them, up to LIMIT entries in all: each credential that is not covered yet, to
    cover (the payload's window on it: until the next rescan). In a child of the walk
    template (rescan_reply): boxyd only judges the few names it sends back."""
    out = Rescan()
    try:
        steps = _Steps(w.root)
    except OSError:
        return out
    seen, todo = 0, _order(rels)[::-1]
    try:
        while todo and not out.over:
            rel = todo.pop()
            try:  # past LIST_MAX too: this pass's bound is the one that counts here
                entries = _listing(steps.open(rel), limit - seen)
            except OSError:
                continue  # gone: nothing there any more
            seen += len(entries)
            out.over = seen > limit
            for name, kind in entries:
                sub = f"{rel}/{name}" if rel else name
                is_dir = kind == "dir"
                redo = live.on_change(w, rel, name, is_dir)
                if kind == "socket":
                    redo = live.socket_redo(w, rel, name)
                if redo is not None and _new(w, redo):
                    out.redos.append(redo)
                    continue
                if is_dir and live.new_dir(w, rel, name) is not None:
                    out.dirs.append(sub)
                    todo.append(sub)
    finally:
        steps.close()
    return out


# The rescan's wire (walkproc.py): what boxyd sends a child of the walk template, and
# what comes back: the paths of the credentials found, at most FOUND_MAX (one more
# than the session may cover: past it the guard stops the session anyway).
FOUND_MAX = live.NEW_MAX + 1


def rescan_request(w: Watched, rels: list[str], limit: int) -> dict[str, object]:
    return {
        "rescan": {
            "root": w.root,
            "rels": rels,
            "limit": limit,
            "reveal": list(w.reveal),
            "secrets": list(w.secrets),
        }
    }


def rescan_reply(req: dict[str, Any]) -> dict[str, object]:
    """In the child: the listing, as the paths of what it found (covered or not: the
    child does not know what boxyd covered since)."""
    w = live.watched(str(req["root"]), (), (), req["reveal"], secrets=req["secrets"])
    got = rescan(w, [str(r) for r in req["rels"]], int(req["limit"]))
    found = got.redos[:FOUND_MAX]
    sockets = [r.rel for r in found if r.rule is masking.SOCKET]
    return {"found": [r.rel for r in found], "sockets": sockets, "over": got.over}


def rescan_answer(w: Watched, reply: dict[str, Any]) -> Rescan:
    """In boxyd: the child's paths judged again against what is covered now (a few
    names: a flood of them is the backlog's to refuse)."""
    out = Rescan(over=bool(reply["over"]))
    sockets = {str(r) for r in reply.get("sockets", ())}
    for rel in reply["found"][:FOUND_MAX]:
        parent, _, name = str(rel).rpartition("/")
        redo = (
            live.socket_redo(w, parent, name)
            if rel in sockets
            else live.on_change(w, parent, name, False)
        )
        if redo is not None and _new(w, redo):
            out.redos.append(redo)
    return out


def _new(w: Watched, redo: Redo) -> bool:
    """REDO is for an entry made since: a held file, a change git would read, or a
    credential not covered yet."""
    return redo.hold is not None or redo.git or (redo.rule is not None and redo.rel not in w.masks)


def _listing(fd: int, cap: int = live.LIST_MAX) -> list[tuple[str, str]]:
    """(name, kind) of the directory at the O_PATH FD, up to one more than CAP: kind is
    "dir", "socket" (a unix socket: _judge covers it) or "other"."""
    lfd = os.open(".", O_LIST, dir_fd=fd)
    try:
        out: list[tuple[str, str]] = []
        with os.scandir(lfd) as it:
            for e in it:
                out.append((e.name, _kind(e)))
                if len(out) > cap:
                    break
        return out
    finally:
        os.close(lfd)


def _kind(e: os.DirEntry[str]) -> str:
    if e.is_dir(follow_symlinks=False):
        return "dir"
    if e.is_file(follow_symlinks=False) or e.is_symlink():
        return "other"
    try:  # (d_type said neither: an lstat, for the few that are not files)
        return "socket" if stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode) else "other"
    except OSError:
        return "other"


def sockets_in(root: str, rel: str) -> list[str]:
    """The unix sockets directly in the directory REL of the tree ROOT (reached one
    O_NOFOLLOW step at a time), up to LIST_MAX entries looked at: what a host server
    made listen there during the session (LiveGuard's sweep)."""
    try:
        fd = walk.open_in_tree(root, rel)
    except (OSError, ValueError):
        return []
    try:
        return [name for name, kind in _listing(fd) if kind == "socket"]
    except OSError:
        return []
    finally:
        os.close(fd)
