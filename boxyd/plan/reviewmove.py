"""Landing a review's entries by rename (docs/design.md, "Changes held for review"):
the upper layer and the work directory are usually on one filesystem, so a file the
payload made can be moved into place instead of copied, and a directory the payload
made whole (a fresh node_modules) moved in one rename. The file system's creates,
copies and unlinks were most of an apply's time.

A move lands exactly what a copy would, or is not made: the entry is the user's own,
has one link (no other name of it anywhere, so nothing else can reach what landed),
no xattr (overlayfs's marks, a payload's user.*, an ACL or label a new file would
not get), no setuid/setgid/sticky bit, and a directory's mode is what mkdir would
give it. A whole directory moves only when every entry beneath it passes that,
is among the changes chosen (added, not held), and the host has nothing at its
place (RENAME_NOREPLACE). The destination is reached as a copy's is: its parent
opened beneath the work directory with no symlink followed, the last name replaced,
never followed. Otherwise the caller copies. Runs in the review child.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable

from boxyd.kernel.openat import open_beneath
from boxyd.kernel.sys import libc
from boxyd.plan.reviewtree import open_dir, open_file

RENAME_NOREPLACE = 1
_renameat2 = getattr(libc, "renameat2", None)  # glibc 2.28 on; without it no tree moves
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p] * 2 + [ctypes.c_uint]


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """renameat2(RENAME_NOREPLACE): SRC moved to DST unless DST exists (EEXIST)."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not in this libc", dst)
    ret = _renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), RENAME_NOREPLACE)
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), dst)


def _xattrs(dir_fd: int, name: str) -> bool:
    """NAME beneath DIR_FD carries an xattr (its own: the last name is not followed)."""
    try:
        return bool(os.listxattr(f"/proc/self/fd/{dir_fd}/{name}", follow_symlinks=False))
    except OSError:
        return True  # cannot tell: copy


class Mover:
    """Moves from the upper layer at UPPER_FD while they work (off after an EXDEV:
    the layers live on another filesystem than the work directory)."""

    def __init__(self, upper_fd: int) -> None:
        self.upper = upper_fd
        self.on = True
        self.uid, self.gid = os.geteuid(), os.getegid()
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def _same(self, st: os.stat_result) -> bool:
        """An upper entry lands by rename as a copy would land it."""
        if st.st_uid != self.uid or st.st_gid != self.gid:
            return False
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            return mode != 0 and mode == mode & 0o777 & ~self.umask
        if stat.S_ISREG(st.st_mode):
            return st.st_nlink == 1 and mode == mode & 0o777
        return stat.S_ISLNK(st.st_mode)

    def _into(self, pfd: int) -> bool:
        """The host's parent gives what it holds no group of its own (no setgid)."""
        return self.on and not os.fstat(pfd).st_mode & stat.S_ISGID

    def _from(self, rel: str, pfd: int) -> tuple[int, str] | None:
        """REL's parent in the upper layer (an O_PATH fd, the caller's to close) and
        its last name, when a move into PFD may be made at all."""
        if not self._into(pfd):
            return None
        parent, _, uname = rel.rpartition("/")
        ufd = open_beneath(self.upper, parent or ".", os.O_PATH | os.O_DIRECTORY)
        return (ufd, uname) if ufd >= 0 else None

    def file(self, rel: str, pfd: int, name: str) -> bool:
        """The upper layer's regular file REL moved over NAME in PFD; False when it
        must be copied instead."""
        if (found := self._from(rel, pfd)) is None:
            return False
        ufd, uname = found
        try:
            src = open_file(ufd, uname)
            try:
                st = os.fstat(src)
                if not self._same(st) or os.listxattr(src):
                    return False
            finally:
                os.close(src)
            now = os.stat(uname, dir_fd=ufd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return False
            return self._rename(lambda: os.rename(uname, name, src_dir_fd=ufd, dst_dir_fd=pfd))
        finally:
            os.close(ufd)

    def tree(self, rel: str, pfd: int, name: str, wanted: set[str]) -> bool:
        """The upper directory REL moved to NAME in PFD, where the host has nothing,
        when every entry beneath it is in WANTED and lands as a copy would."""
        if (parent := self._from(rel, pfd)) is None:
            return False
        ufd, uname = parent
        try:
            st = os.stat(uname, dir_fd=ufd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or not self._same(st) or _xattrs(ufd, uname):
                return False
            sub = open_dir(ufd, uname)
            try:
                found = self._beneath(sub, rel, wanted)
            finally:
                os.close(sub)
            if found != len(wanted):
                return False
            return self._rename(lambda: rename_noreplace(ufd, uname, pfd, name))
        finally:
            os.close(ufd)

    def _beneath(self, dfd: int, rel: str, wanted: set[str]) -> int:
        """Entries beneath the upper directory DFD (REL), or -1 at the first that is
        not wanted or would not land as a copy would. Bounded by WANTED."""
        n = 0
        for name in os.listdir(dfd):
            sub_rel = f"{rel}/{name}"
            if sub_rel not in wanted:
                return -1
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not self._same(st) or _xattrs(dfd, name):
                return -1
            n += 1
            if stat.S_ISDIR(st.st_mode):
                sub = open_dir(dfd, name)
                try:
                    m = self._beneath(sub, sub_rel, wanted)
                finally:
                    os.close(sub)
                if m < 0:
                    return -1
                n += m
        return n

    def _rename(self, do: Callable[[], None]) -> bool:
        """DO's rename made: True; an EXDEV turns moves off, an EEXIST leaves it to
        the copy (the host made the place meanwhile): False."""
        try:
            do()
        except OSError as e:
            if e.errno == errno.EXDEV:
                self.on = False
                return False
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOSYS):
                return False
            raise
        return True
