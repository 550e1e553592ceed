"""A tree the payload can write, read without following it: directory fds opened with
O_NOFOLLOW one component at a time (a symlink is reported, never followed, and a path
cannot be swapped under us), small files read through them, and the depth-first walk
of a whole tree, one fd per level.

The git guard's discovery (gitguard/discover.py) walks a tree this way, and the run's
one walk shows each directory it lists to the other features' observers (masking,
held files, the watched files of tools); the live guard and the post-run scan open
and read entries through the same calls.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# a step through a directory that need not be listable (git only needs +x to pass)
O_STEP = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted in place of a file must not hang the daemon
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

# One open fd per level. 2048 single-letter levels already exceed PATH_MAX, past
# which git itself cannot reach a repository; deeper directories are reported.
MAX_DEPTH = 2048
MAX_DIRS = 2_000_000  # directories one walk lists before it gives up (about 15 s here)

Type = Literal["file", "dir", "symlink", "other"]


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def parts(rel: str) -> list[str]:
    """Components of a relative path made by this module; refuses anything else."""
    comps = rel.split("/") if rel else []
    if any(c in ("", ".", "..") for c in comps):
        raise ValueError(f"not a plain relative path: {rel!r}")
    return comps


def exists(name: str, dir_fd: int) -> bool:
    """An entry NAME in the directory DIR_FD, whatever it is (nothing followed)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def open_dir(root_fd: int, rel: str) -> int:
    """Open directory ``rel`` beneath ``root_fd``, one O_NOFOLLOW step at a time.

    The steps on the way are O_PATH: like git, passing through a directory needs
    only its search bit, so a parent made unlistable (0111) hides nothing known."""
    comps = parts(rel)
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(comps):
            nfd = os.open(name, O_DIR if i == len(comps) - 1 else O_STEP, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_child(dir_fd: int, name: str) -> int:
    """Open a subdirectory to list it. One the payload made unlistable raises
    PermissionError: it is reported, never chmod'ed (the host tree is not ours)."""
    return os.open(name, O_DIR, dir_fd=dir_fd)


def open_root(root: str) -> int:
    # the root itself is the daemon's own, already checked host path: its ancestors
    # may be symlinks (/home -> /usr/home); nothing beneath it is followed
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def read_head(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Up to LIMIT bytes of a regular file, or None (not a regular file, unreadable)."""
    got = read_head_at(dir_fd, name, limit)
    return None if got is None else got.data


@dataclass(frozen=True)
class FileRead:
    """What a file held, and which file it was (device, inode): one renamed over it
    since is another, however alike its bytes. FD, when kept (-1 otherwise), holds the
    file open, so that no new file can take its inode number meanwhile; close() it."""

    data: bytes
    file: tuple[int, int]
    fd: int = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def read_head_at(dir_fd: int, name: str, limit: int, *, keep: bool = False) -> FileRead | None:
    """read_head, with the file it read (kept open with KEEP)."""
    try:
        # lstat first: never open a FIFO or a device node planted in place of a file
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None
        fd = os.open(name, O_FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        got = FileRead(b"".join(chunks), (st.st_dev, st.st_ino), fd if keep else -1)
        fd = -1 if keep else fd
        return got
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def read_small(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Content of a regular file, or None (not a regular file, unreadable, too big)."""
    data = read_head(dir_fd, name, limit + 1)
    return data if data is not None and len(data) <= limit else None


def open_in_tree(root: str, rel: str) -> int:
    """Directory REL of the tree ROOT, opened from its root one O_NOFOLLOW step at a time
    (open_dir); for callers holding no fd of the root."""
    root_fd = open_root(root)
    try:
        return open_dir(root_fd, rel)
    finally:
        os.close(root_fd)


def read_beneath_at(root: str, rel: str, limit: int, *, keep: bool = False) -> FileRead | None:
    """read_small of REL beneath the tree ROOT, through fds from its root (no symlink),
    with the file it read (kept open with KEEP)."""
    parent, _, name = rel.rpartition("/")
    try:
        pfd = open_in_tree(root, parent)
    except OSError:
        return None
    try:
        got = read_head_at(pfd, name, limit + 1, keep=keep)
    finally:
        os.close(pfd)
    if got is not None and len(got.data) > limit:
        got.close()
        return None
    return got


def list_dir(fd: int, cap: int | None = None) -> dict[str, Type]:
    """A directory's entries and their types (d_type; never a symlink followed), up to
    one more than CAP. Inline and the commonest first (a tree is mostly files): the
    walk asks this of a million entries."""
    out: dict[str, Type] = {}
    with os.scandir(fd) as it:
        for e in it:
            if cap is not None and len(out) > cap:
                break
            try:
                if e.is_file(follow_symlinks=False):
                    out[e.name] = "file"
                elif e.is_dir(follow_symlinks=False):
                    out[e.name] = "dir"
                else:
                    out[e.name] = "symlink" if e.is_symlink() else "other"
            except OSError:  # vanished while listing
                continue
    return out


def place(roots: Sequence[str], base: str, target: str) -> list[str] | None:
    """Components of ``target`` relative to root, ``..`` still unresolved.

    ``base`` is the relative directory a relative target is taken from; an absolute
    target must start with one spelling of root (as given, or its realpath — git
    writes worktree pointers through realpath). None: outside root.
    """
    comps = [c for c in target.split("/") if c not in ("", ".")]
    if not target.startswith("/"):
        return (base.split("/") if base else []) + comps
    for r in roots:
        rc = [c for c in r.split("/") if c not in ("", ".")]
        if comps[: len(rc)] == rc:
            return comps[len(rc) :]
    return None


def _resolve(root_fd: int, comps: Sequence[str]) -> tuple[list[str], Type] | None:
    """Walk COMPS beneath root, one O_NOFOLLOW step at a time: the clean components
    reached and the type of the last — or of the first symlink met, where it stops
    (a symlink is never followed). ``..`` pops a directory that was itself opened this
    way, so the lexical result is what the kernel would find. None: the path leaves
    root, or an entry is missing or not a directory where one is needed."""
    fds = [os.dup(root_fd)]
    names: list[str] = []
    kind: Type = "dir"  # root itself
    try:
        for i, name in enumerate(comps):
            if name == "..":
                if not names:
                    return None
                os.close(fds.pop())
                names.pop()
                kind = "dir"
                continue
            names.append(name)
            try:
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
            except OSError:
                return None
            if stat.S_ISLNK(st.st_mode):
                return names, "symlink"
            kind = (
                "dir"
                if stat.S_ISDIR(st.st_mode)
                else "file"
                if stat.S_ISREG(st.st_mode)
                else "other"
            )
            if i == len(comps) - 1:
                break
            try:
                fds.append(os.open(name, O_STEP, dir_fd=fds[-1]))
            except OSError:
                return None
        return names, kind
    finally:
        for fd in fds:
            os.close(fd)


def locate(root_fd: int, comps: Sequence[str]) -> tuple[str, Type] | None:
    """The entry ``comps`` names beneath root, or the first symlink on the way to it
    (which git would follow and we never do). None: outside root, missing, or root."""
    found = _resolve(root_fd, comps)
    return ("/".join(found[0]), found[1]) if found and found[0] else None


def walk_beneath(root_fd: int, comps: Sequence[str], last_dir: bool = True) -> str | None:
    """The clean relative path of the directory ``comps`` names beneath root, through
    real directories only; None when it leaves root or meets a symlink or a missing or
    non-directory entry. With ``last_dir`` False, the last component need not exist
    (nor be a directory): only the path up to it must."""
    if not last_dir and comps and comps[-1] != "..":
        head = _resolve(root_fd, comps[:-1])
        return join("/".join(head[0]), comps[-1]) if head and head[1] == "dir" else None
    found = _resolve(root_fd, comps)
    return "/".join(found[0]) if found and found[1] == "dir" else None


# shown each work-tree directory the walk lists: (its fd, its path relative to root, entries)
Observer = Callable[[int, str, Mapping[str, Type]], None]


class TooLarge(Exception):
    """The tree holds more directories than one walk lists (MAX_DIRS)."""


class TreeWalk:
    """One depth-first walk of the tree beneath ROOT_FD, one fd per level: each
    directory listed is shown to ``visit`` (which names the subdirectories to enter)
    and then to OBSERVER. A directory that cannot be listed (or is too deep) is
    reported in ``unreadable``. LIMIT, ENTRY_LIMIT: TooLarge past that many
    directories, entries listed."""

    def __init__(
        self,
        root_fd: int,
        limit: int | None = MAX_DIRS,
        observer: Observer | None = None,
        entry_limit: int | None = None,
    ) -> None:
        self.root_fd = root_fd
        self.limit = limit
        self.observer = observer  # shown every directory listed (the run's one walk)
        self.unreadable: list[str] = []
        self.listed = 0  # directories listed so far
        self.entry_limit = entry_limit
        self.entries = 0  # their entries

    def visit(self, fd: int, rel: str, entries: dict[str, Type]) -> list[str]:
        """One directory of the tree: the subdirectories of it to walk."""
        raise NotImplementedError

    def walk_tree(self) -> None:
        """Every directory of the work tree(s), depth first, one fd per level."""
        stack: list[tuple[int, str, Iterator[str]]] = []

        def enter(fd: int, rel: str) -> None:
            self.listed += 1
            if self.limit is not None and self.listed > self.limit:
                os.close(fd)
                raise TooLarge(f"more than {self.limit:,} directories")
            try:
                room = None if self.entry_limit is None else self.entry_limit - self.entries
                entries = list_dir(fd, room)
                self.entries += len(entries)
                if self.entry_limit is not None and self.entries > self.entry_limit:
                    os.close(fd)
                    raise TooLarge(f"more than {self.entry_limit:,} entries")
                subdirs = self.visit(fd, rel, entries)
                if self.observer is not None:
                    self.observer(fd, rel, entries)
            except OSError:
                os.close(fd)
                self.unreadable.append(rel)
                return
            stack.append((fd, rel, iter(subdirs)))

        try:
            enter(os.dup(self.root_fd), "")
            while stack:
                fd, rel, it = stack[-1]
                name = next(it, None)
                if name is None:
                    os.close(fd)
                    stack.pop()
                    continue
                child = join(rel, name)
                if len(stack) >= MAX_DEPTH:
                    self.unreadable.append(child)
                    continue
                try:
                    cfd = open_child(fd, name)
                except FileNotFoundError:
                    continue
                except OSError:
                    self.unreadable.append(child)  # unreadable, or swapped for a symlink
                    continue
                enter(cfd, child)
        finally:
            for fd, _, _ in stack:
                os.close(fd)
