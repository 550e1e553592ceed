"""`boxyctl apply`: a review's changes landed in the host's work directory
(docs/design.md, "Changes held for review").

Every host path is reached beneath the work directory without following a symlink
(openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS for the parent, then one name with
dir_fd), a file is written to a new name beside its place (O_EXCL|O_NOFOLLOW) and
renamed over it, so a symlink planted at the place is replaced, never written
through (or, where that lands the same, moved there from the upper layer:
reviewmove). A symlink of the upper layer lands as a symlink (its text as it is: never
followed, by apply or by the review). A host entry changed since the session
started (its ctime at or after the review's stamp, or made where the payload added
one) is refused and named; so is what reviewtree.held names. What landed leaves
the upper layer, so a later diff shows only the rest.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass, field

from boxyd.kernel.openat import open_beneath
from boxyd.plan.reviewmove import Mover
from boxyd.plan.reviewtree import Change, ReviewError, open_dir, open_file, open_workdir

TMP = ".boxy-apply"


@dataclass
class Landed:
    applied: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def select(changes: list[Change], paths: list[str] | None) -> list[Change]:
    """The changes PATHS name (each: an entry, or a directory and all beneath it), with
    the added directories they need; all of them when PATHS is None."""
    if paths is None:
        return list(changes)
    rels = [os.path.normpath(p).strip("/") for p in paths]
    if "." in rels:
        return list(changes)
    for r in rels:
        if r == ".." or r.startswith("../"):
            raise ReviewError(f"{r}: not inside the work directory")
    picked = [c for c in changes if any(c.path == r or c.path.startswith(r + "/") for r in rels)]
    for r in rels:
        if not any(c.path == r or c.path.startswith(r + "/") for c in changes):
            raise ReviewError(f"{r}: not among the session's changes (boxyctl diff lists them)")
    needed = {a for c in picked for a in _ancestors(c.path)}
    extra = [c for c in changes if c.path in needed and c.kind == "added" and c not in picked]
    return extra + picked


def _ancestors(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


def _order(changes: list[Change]) -> list[Change]:
    """Removals first (a file may replace a directory), then directories parents first,
    then files and symlinks."""
    removed = [c for c in changes if c.kind == "removed"]
    dirs = sorted(
        (c for c in changes if c.kind != "removed" and c.type == "dir"), key=lambda c: c.path
    )
    rest = [c for c in changes if c.kind != "removed" and c.type != "dir"]
    return removed + dirs + rest


def _whole(changes: list[Change]) -> dict[str, set[str]]:
    """Each added directory that may move whole (nothing beneath it held, removed or
    changed) with the paths of the changes beneath it."""
    added = {c.path for c in changes if c.kind == "added" and c.type == "dir" and not c.held}
    out: dict[str, set[str]] = {p: set() for p in added}
    for c in changes:
        for a in _ancestors(c.path):
            if a in out:
                if c.held or c.kind != "added":
                    added.discard(a)
                out[a].add(c.path)
    return {p: out[p] for p in added}


class Lander:
    def __init__(self, upper_fd: int, host_fd: int, since_ns: int) -> None:
        self.upper, self.host, self.since = upper_fd, host_fd, since_ns
        self.n = 0
        self.mover = Mover(upper_fd)
        self.whole: dict[str, set[str]] = {}
        self.moved: set[str] = set()  # beneath a directory moved whole: landed with it

    def land(self, changes: list[Change]) -> Landed:
        out = Landed()
        self.whole = _whole(changes)
        for c in _order(changes):
            if c.path in self.moved:
                out.applied.append(c.path)
                continue
            try:
                why = c.held or self._host_changed(c)
                if not why:
                    self._one(c)
            except (OSError, ReviewError) as e:
                why = _why(e)
            if why:
                out.refused.append((c.path, why))
            else:
                out.applied.append(c.path)
        return out

    def _parent(self, rel: str) -> tuple[int, str]:
        """An fd of REL's parent beneath the work directory (no symlink followed), REL's name."""
        parent, _, name = rel.rpartition("/")
        fd = open_beneath(self.host, parent or ".", os.O_PATH | os.O_DIRECTORY)
        if fd < 0:
            raise OSError(-fd, os.strerror(-fd), parent)
        return fd, name

    def _host_changed(self, c: Change) -> str:
        """Why the host's entry is not what the session started with, or ''."""
        pfd, name = self._parent(c.path)
        try:
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                return "" if c.kind == "added" else "the host removed it meanwhile"
            if c.kind == "added":
                return (
                    ""
                    if c.type == "dir" and stat.S_ISDIR(st.st_mode)
                    else ("the host made it meanwhile")
                )
            if st.st_ctime_ns >= self.since:
                return "the host changed it meanwhile"
            if c.kind == "removed" and stat.S_ISDIR(st.st_mode):
                sub = open_dir(pfd, name)
                try:
                    return (
                        "the host changed something in it meanwhile"
                        if _newer(sub, self.since)
                        else ""
                    )
                finally:
                    os.close(sub)
            return ""
        finally:
            os.close(pfd)

    def _one(self, c: Change) -> None:
        pfd, name = self._parent(c.path)
        try:
            if c.kind == "removed":
                self._remove(pfd, name, c)
            elif c.type == "dir":
                beneath = self.whole.get(c.path)
                if beneath is not None and self.mover.tree(c.path, pfd, name, beneath):
                    self.moved |= beneath
                    return
                try:
                    os.mkdir(name, c.mode & 0o777 or 0o755, dir_fd=pfd)
                except FileExistsError:
                    if not stat.S_ISDIR(os.stat(name, dir_fd=pfd, follow_symlinks=False).st_mode):
                        raise
            elif c.type == "symlink":
                tmp = self._tmp_name()
                os.symlink(c.target, tmp, dir_fd=pfd)
                os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
                self._drop_upper(c.path)
            elif not self.mover.file(c.path, pfd, name):  # else copied
                self._file(pfd, name, c)
                self._drop_upper(c.path)
        finally:
            os.close(pfd)

    def _file(self, pfd: int, name: str, c: Change) -> None:
        src = open_file(self.upper, c.path)
        tmp = self._tmp_name()
        try:
            dst = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=pfd,
            )
            try:
                _copy(src, dst)
                os.fchmod(
                    dst, stat.S_IMODE(os.fstat(src).st_mode) & 0o777
                )  # no setuid, setgid, sticky
            finally:
                os.close(dst)
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            raise
        finally:
            os.close(src)

    def _remove(self, pfd: int, name: str, c: Change) -> None:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=pfd)  # fd-based: no symlink in it is followed
        else:
            os.unlink(name, dir_fd=pfd)
        upper_st = _lstat_beneath(self.upper, c.path)
        if upper_st is not None and stat.S_ISCHR(upper_st.st_mode) and upper_st.st_rdev == 0:
            self._drop_upper(c.path)  # the whiteout: done with

    def _drop_upper(self, rel: str) -> None:
        parent, _, name = rel.rpartition("/")
        fd = open_beneath(self.upper, parent or ".", os.O_PATH | os.O_DIRECTORY)
        if fd < 0:
            return
        try:
            os.unlink(name, dir_fd=fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _tmp_name(self) -> str:
        self.n += 1
        return f"{TMP}.{os.getpid()}.{self.n}"


def _lstat_beneath(root: int, rel: str) -> os.stat_result | None:
    parent, _, name = rel.rpartition("/")
    fd = open_beneath(root, parent or ".", os.O_PATH | os.O_DIRECTORY)
    if fd < 0:
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)


def _newer(fd: int, since: int) -> bool:
    """Anything beneath the directory FD changed at or after SINCE (ns)."""
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if st.st_ctime_ns >= since:
            return True
        if stat.S_ISDIR(st.st_mode):
            sub = open_dir(fd, name)
            try:
                if _newer(sub, since):
                    return True
            finally:
                os.close(sub)
    return False


def _copy(src: int, dst: int) -> None:
    size = os.fstat(src).st_size
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src, dst, size - done, done, done)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            n = os.pwrite(dst, os.pread(src, 1 << 20, done), done)
        if n == 0:
            break  # the file shrank meanwhile
        done += n


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno in (errno.ELOOP, errno.EXDEV):
        return "a symlink on the way (not followed)"
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


def land(
    upper: str,
    workdir: str,
    changes: list[Change],
    since_ns: int,
    ident: tuple[int, int] | None = None,
) -> Landed:
    """CHANGES landed in WORKDIR, the directory the session ran in (IDENT: open_workdir)."""
    ufd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        hfd = open_workdir(workdir, ident)
        try:
            return Lander(ufd, hfd, since_ns).land(changes)
        finally:
            os.close(hfd)
    finally:
        os.close(ufd)
