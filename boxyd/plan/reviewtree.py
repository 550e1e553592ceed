"""What a session held for review changed: its upper layer read against the host's
work directory (docs/design.md, "Changes held for review").

The upper layer is the payload's writing, so it is read as hostile: every entry is
reached from a directory fd one name at a time, never through a symlink
(open_beneath), files opened O_NONBLOCK and checked to be regular before a byte is
read, the walk bounded in entries. Runs in the review child (daemon/reviewproc.py),
never in boxyd's process. Overlayfs's marks as an unprivileged mount writes them: a
whiteout is a character device 0:0 (a removal), an opaque directory carries the
xattr user.overlay.opaque=y (whatever the host has beneath it is removed).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from boxyd.config import hostrun
from boxyd.kernel.openat import RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, open_beneath, open_how

MAX_ENTRIES = 200_000  # entries of the upper layer one review reads
OPAQUE = "user.overlay.opaque"
CHUNK = 1 << 20
# an entry the payload removed or swapped (a symlink, a file) while the measure walked
GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
AT_FDCWD = -100


class ReviewError(Exception):
    """The review cannot be read or applied as asked: one line."""


@dataclass
class Change:
    """One entry of the review: PATH relative to the work directory; KIND added,
    changed or removed; TYPE file, dir, symlink or special; SIZE its bytes (of a
    removed directory: all beneath it); TARGET a symlink's text; GENERATED under a
    tree the profile marks generated (listed, not diffed: that tree's path); HELD why apply refuses it
    (a special file, a git control file, a file host programs obey), or empty;
    GENERATED the generated tree it lies in, or empty."""

    path: str
    kind: str
    type: str
    size: int = 0
    mode: int = 0
    target: str = ""
    generated: str = ""
    held: str = ""
    files: int = 1  # a removed directory: the entries beneath it, itself included

    def to_wire(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", False) or k == "kind"}


@dataclass
class Context:
    """What judging an entry needs beside the trees: the profile's generated globs,
    what the run was allowed to write (--allow-git-write, --edit-config rels), and the
    git control places of the tree apply would leave (daemon/reviewgit.py: gitdirs,
    hooks directories, included configs; held with all beneath them)."""

    generated: list[str] = field(default_factory=list)
    allow_git_write: bool = False
    edit_config: list[str] = field(default_factory=list)
    git: list[str] = field(default_factory=list)


def _type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "special"


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir(dir_fd: int, name: str) -> int:
    """A directory beneath DIR_FD, no symlink followed; OSError otherwise."""
    fd = open_beneath(dir_fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), name)
    return fd


def open_workdir(workdir: str, ident: tuple[int, int] | None, flags: int = os.O_RDONLY) -> int:
    """The host's work directory WORKDIR (absolute, realpath'd at the run), opened by
    its path with no symlink followed and checked to be the directory the session's
    lower layer was (IDENT: its st_dev and st_ino then; None for a review made before
    they were kept). A writable tree around it lets the payload move a directory above
    it and leave a symlink, or another directory, in its place: diff read that tree
    and apply landed the payload's files there, anywhere the user can write."""
    how = flags | os.O_DIRECTORY | os.O_CLOEXEC
    fd = open_how(AT_FDCWD, workdir, how, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
    if fd < 0:
        raise ReviewError(_moved(workdir, os.strerror(-fd)))
    st = os.fstat(fd)
    if ident is not None and (st.st_dev, st.st_ino) != tuple(ident):
        os.close(fd)
        raise ReviewError(_moved(workdir, "another directory is at its path"))
    return fd


def _moved(workdir: str, why: str) -> str:
    return (
        f"the work directory {workdir} is not the one the session ran in ({why}: moved, "
        "replaced, or a symlink on its path); nothing is read or landed until it is "
        "back at that path (or `boxyctl discard`)"
    )


def open_file(dir_fd: int, name: str) -> int:
    """A regular file beneath DIR_FD for reading: never a symlink, never blocking on a
    FIFO swapped in; OSError otherwise."""
    fd = open_beneath(dir_fd, name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd), name)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, "not a regular file", name)
    return fd


def generated_root(rel: str, globs: list[str]) -> str:
    """The generated tree REL lies in (its path), or '': a glob without / matches a name
    at any depth (node_modules), one with / the path from the top (build/out)."""
    parts = rel.split("/")
    for g in globs:
        if "/" in g:
            n = g.count("/") + 1
            if len(parts) >= n and fnmatch.fnmatchcase("/".join(parts[:n]), g):
                return "/".join(parts[:n])
        else:
            for i, p in enumerate(parts):
                if fnmatch.fnmatchcase(p, g):
                    return "/".join(parts[: i + 1])
    return ""


def folded(c: Change, root: str) -> str:
    """ROOT when C may be folded into its generated tree's one line (listed, not
    diffed), else '': only a file or directory beneath the tree, or a symlink whose
    text stays in it, is. The tree's root as a symlink or a file (`node_modules ->
    ..`, a script named `build`), a symlink out of it, an entry apply holds: each on
    a line of its own, a file diffed, since a line per tree would hide them."""
    if not root or c.held or c.type == "special" or (c.path == root and c.type != "dir"):
        return ""
    if c.type == "symlink":
        where = os.path.normpath(os.path.join(os.path.dirname(c.path), c.target))
        if c.target.startswith("/") or not where.startswith(root + "/"):
            return ""
    return root


def held(rel: str, typ: str, ctx: Context) -> str:
    """Why apply refuses REL of TYPE (the guard's rules, as a live run would hold it):
    a special file, a git control file, a file host programs obey unasked."""
    if typ == "special":
        return "a device node, FIFO or socket: never applied"
    parts = rel.split("/")
    in_git = ".git" in parts or any(g == "" or rel == g or rel.startswith(g + "/") for g in ctx.git)
    if in_git and not ctx.allow_git_write:
        return "a git control file (the git guard's; --allow-git-write at the run lets it)"
    if hostrun.edited(rel, ctx.edit_config):
        return ""
    found = hostrun.match(rel) or (hostrun.as_link(rel) if typ == "symlink" else None)
    above = hostrun.held_above(rel)
    if found is None and above is not None:
        found = hostrun.match(above)
    if found is not None:
        return f"{found.why()} (a file host programs obey; --edit-config at the run lets it)"
    return ""


def same_content(a: int, b: int) -> bool:
    """Two regular files' bytes are equal (sizes first)."""
    if os.fstat(a).st_size != os.fstat(b).st_size:
        return False
    pos = 0
    while True:
        x, y = os.pread(a, CHUNK, pos), os.pread(b, CHUNK, pos)
        if x != y:
            return False
        if not x:
            return True
        pos += len(x)


class Reader:
    """The walk of UPPER_FD against HOST_FD (the work directory), yielding Changes."""

    def __init__(self, upper_fd: int, host_fd: int, ctx: Context) -> None:
        self.upper, self.host, self.ctx = upper_fd, host_fd, ctx
        self.seen = 0

    def changes(self) -> list[Change]:
        out = list(self._dir(self.upper, self.host, ""))
        for c in out:
            if not c.held and c.kind != "removed":
                c.held = held(c.path, c.type, self.ctx)
            elif c.kind == "removed" and not c.held:
                c.held = held(c.path, "file", self.ctx)
            c.generated = folded(c, generated_root(c.path, self.ctx.generated))
        return out

    def _count(self) -> None:
        self.seen += 1
        if self.seen > MAX_ENTRIES:
            raise ReviewError(f"the upper layer holds more than {MAX_ENTRIES:,} entries")

    def _dir(self, ufd: int, hfd: int | None, rel: str) -> Iterator[Change]:
        names = sorted(os.listdir(ufd))
        if hfd is not None and _opaque(ufd):
            # an opaque directory hides all the host had beneath it: what the upper
            # does not name again is removed
            for name in sorted(set(os.listdir(hfd)) - set(names)):
                yield self._removed(hfd, name, _join(rel, name))
        for name in names:
            self._count()
            yield from self._entry(ufd, hfd, name, _join(rel, name))

    def _entry(self, ufd: int, hfd: int | None, name: str, rel: str) -> Iterator[Change]:
        st = os.stat(name, dir_fd=ufd, follow_symlinks=False)
        hst = _lstat(hfd, name) if hfd is not None else None
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout
            if hst is not None:
                assert hfd is not None
                yield self._removed(hfd, name, rel)
            return
        typ = _type(st.st_mode)
        if hst is not None and _type(hst.st_mode) != typ:
            assert hfd is not None
            yield self._removed(hfd, name, rel)
            hst = None
        if typ == "dir":
            yield from self._subdir(ufd, hfd if hst is not None else None, name, rel, st)
            return
        kind = "added" if hst is None else "changed"
        change = Change(rel, kind, typ, size=st.st_size, mode=stat.S_IMODE(st.st_mode))
        if typ == "symlink":
            change.target = os.readlink(name, dir_fd=ufd)
        if hfd is None or hst is None or not self._unchanged(ufd, hfd, name, change, hst):
            yield change

    def _subdir(
        self, ufd: int, hfd: int | None, name: str, rel: str, st: os.stat_result
    ) -> Iterator[Change]:
        mode = stat.S_IMODE(st.st_mode)
        try:
            sub = open_dir(ufd, name)
        except PermissionError as e:  # (the review child reads as the layer's owner)
            why = f"could not be read ({e.strerror}): what it holds is not reviewed"
            yield Change(rel, "added" if hfd is None else "changed", "dir", mode=mode, held=why)
            return
        if hfd is None:
            yield Change(rel, "added", "dir", mode=mode)
        hsub = open_dir(hfd, name) if hfd is not None else None
        try:
            yield from self._dir(sub, hsub, rel)
        finally:
            os.close(sub)
            if hsub is not None:
                os.close(hsub)

    def _unchanged(self, ufd: int, hfd: int, name: str, c: Change, hst: os.stat_result) -> bool:
        """A copy-up with the same bytes and mode (opened for writing, touched), a symlink
        with the same text: no change."""
        if c.type == "symlink":
            return os.readlink(name, dir_fd=hfd) == c.target
        if c.type != "file":
            return False
        if c.size != hst.st_size or c.mode != stat.S_IMODE(hst.st_mode):
            return False
        try:  # one side unreadable is shown as a change (its diff says why)
            a = open_file(ufd, name)
        except PermissionError:
            return False
        try:
            b = open_file(hfd, name)
        except PermissionError:
            os.close(a)
            return False
        try:
            return same_content(a, b)
        finally:
            os.close(a)
            os.close(b)

    def _removed(self, hfd: int, name: str, rel: str) -> Change:
        hst = os.stat(name, dir_fd=hfd, follow_symlinks=False)
        typ = _type(hst.st_mode)
        change = Change(rel, "removed", typ, size=hst.st_size)
        if typ == "dir":
            sub = open_dir(hfd, name)
            try:
                files, change.size = _du(sub)
            finally:
                os.close(sub)
            change.files = files + 1
        return change


def _du(fd: int) -> tuple[int, int]:
    """Entries and bytes beneath the host directory FD (no symlink followed)."""
    files = size = 0
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        files += 1
        size += st.st_size if not stat.S_ISDIR(st.st_mode) else 0
        if stat.S_ISDIR(st.st_mode):
            sub = open_dir(fd, name)
            try:
                f, s = _du(sub)
            finally:
                os.close(sub)
            files, size = files + f, size + s
    return files, size


def footprint(upper: str, cap: int = MAX_ENTRIES) -> tuple[int, int]:
    """(bytes, entries) the upper layer at UPPER holds, the walk stopped past CAP
    entries. A file counts its length or its blocks, whichever is more: a sparse file
    costs the disk nothing here, but apply would write all of it. Each hard link
    counts too: apply writes every name as a file of its own."""
    total = entries = 0
    stack = [os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)]
    try:
        while stack and entries <= cap:
            fd = stack.pop()
            try:
                for entry in os.scandir(fd):
                    entries += 1
                    try:  # the payload may be writing as this walks: gone is skipped
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            stack.append(open_dir(fd, entry.name))
                    except OSError as e:
                        if e.errno in GONE:
                            continue
                        raise  # what cannot be measured is not skipped: the run stops
                    length = st.st_size if stat.S_ISREG(st.st_mode) else 0
                    total += max(st.st_blocks * 512, length)
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return total, entries


def _opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def read(
    upper: str, workdir: str, ctx: Context, ident: tuple[int, int] | None = None
) -> list[Change]:
    """Every change of the upper layer at UPPER against the work directory WORKDIR
    (IDENT: open_workdir)."""
    ufd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        hfd = open_workdir(workdir, ident)
    except (OSError, ReviewError):
        os.close(ufd)
        raise
    try:
        return Reader(ufd, hfd, ctx).changes()
    finally:
        os.close(ufd)
        os.close(hfd)
