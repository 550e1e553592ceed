"""The quarantine store: where the git guard (scan.py, and the live guard's undo)
and the held files (plan/heldfiles.py) move what a run planted —
~/.local/state/boxy/quarantine/<session>/ — within a budget of bytes and entries
(a run's and all sessions'), a directory moved whole, across filesystems copied
sparse-aware; past the budget only an entry's metadata and sha256 are kept.

Nothing is followed: the entry is moved through its parent's directory fd, and the
quarantine's own directories are made and opened one O_NOFOLLOW step at a time.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from boxyd.gitguard.discover import CONFIG_MAX
from boxyd.kernel import walk
from boxyd.kernel.walk import O_DIR, O_FILE, exists

RUN_BYTES = 64 << 20  # what one run's findings may keep in the quarantine
TOTAL_BYTES = 1 << 30  # what the quarantine keeps across sessions (it is kept 90 days)
HASH_LIMIT = 4 << 30  # a file larger than this is not hashed either (its size says enough)
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# Entries count too: an empty file takes no block, and a payload that plants 100,000
# empty hooks a run filled the quarantine with a million of them (every later run's
# first finding walked them all: seconds). Past either bound an entry is removed.
RUN_ENTRIES = 10_000
TOTAL_ENTRIES = 200_000


class Budget:
    """What the quarantine may still keep: RUN bytes and RUN_ENTRIES entries for one
    run (across its trees), TOTAL bytes and TOTAL_ENTRIES across sessions, counted from
    what TOP (the quarantine) holds when the run's first finding needs it. Past it an
    entry is removed and only its metadata and sha256 are kept (``over``: the line for
    its finding, by destination); past the entries, not even a file of them."""

    def __init__(self, top: str, run: int = RUN_BYTES, total: int = TOTAL_BYTES) -> None:
        self.top, self.left, self.total = top, run, total
        self.entries_left = RUN_ENTRIES
        self.used: int | None = None
        self.used_entries = 0
        self.over: dict[str, str] = {}

    def take(self, size: int) -> bool:
        """Room for one more entry of SIZE allocated bytes (taken when True)."""
        if not self.entry():
            return False
        assert self.used is not None
        if size > self.left or self.used + size > self.total:
            self.entries_left += 1  # not kept after all: its .removed file takes it
            self.used_entries -= 1
            return False
        self.left -= size
        self.used += size
        return True

    def entry(self) -> bool:
        """Room for one more entry of no size (a .removed file): taken when True."""
        if self.used is None:
            self.used, self.used_entries = _usage(self.top, TOTAL_ENTRIES)
        if self.entries_left <= 0 or self.used_entries >= TOTAL_ENTRIES:
            return False
        self.entries_left -= 1
        self.used_entries += 1
        return True


def _usage(top: str, most: int) -> tuple[int, int]:
    """Bytes allocated under TOP and its entries (nothing followed); the walk stops
    once it has counted MOST entries (the quarantine is full then)."""
    used = entries = 0
    with contextlib.suppress(OSError):
        for _, dirs, files, dfd in os.fwalk(top):
            entries += len(dirs) + len(files)
            for f in files:
                with contextlib.suppress(OSError):
                    used += os.stat(f, dir_fd=dfd, follow_symlinks=False).st_blocks * 512
            if entries >= most:
                break
    return used, entries


def _data_ranges(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of each data segment of a regular file (SEEK_DATA/SEEK_HOLE):
    a hole is never read, copied or allocated."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to the end
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end - start
        pos = end


def _copy_sparse(fd: int, out: int, size: int, limit: int) -> bool:
    """FD's content into OUT, holes kept as holes; False once more than LIMIT bytes of
    data were met (the file grew since it was measured)."""
    copied = 0
    for start, length in _data_ranges(fd, size):
        done = 0
        while done < length:
            chunk = os.pread(fd, min(1 << 20, length - done), start + done)
            if not chunk:
                break
            copied += len(chunk)
            if copied > limit:
                return False
            os.pwrite(out, chunk, start + done)
            done += len(chunk)
    os.ftruncate(out, size)
    return True


def _digest(fd: int, size: int) -> str:
    """sha256 of a regular file's SIZE bytes, streamed; holes hashed as the zeros they
    read as, without reading them."""
    if size > HASH_LIMIT:
        return f"not hashed (over {HASH_LIMIT >> 30} GiB)"
    import hashlib  # a file of up to HASH_LIMIT: OpenSSL's speed (boxy/digest.py)

    h, pos, zeros = hashlib.sha256(), 0, bytes(1 << 20)
    for start, length in [*_data_ranges(fd, size), (size, 0)]:
        while pos < start:  # the hole before this segment
            n = min(len(zeros), start - pos)
            h.update(zeros[:n])
            pos += n
        end = start + length
        while pos < end and (chunk := os.pread(fd, min(1 << 20, end - pos), pos)):
            h.update(chunk)
            pos += len(chunk)
    return f"sha256 {h.hexdigest()}"


def _keep_metadata(
    fd: int, st: os.stat_result, dst_fd: int, dest: str, budget: Budget
) -> tuple[str, str]:
    """Past the budget: a small file DEST.removed with what the entry was, instead of
    the entry (past the entries' budget, not even that: the finding's line is all);
    returns its name and what the finding says."""
    line = (
        f"{st.st_size:,} bytes ({st.st_blocks * 512:,} allocated), mode "
        f"{stat.S_IMODE(st.st_mode):o}, modified {st.st_mtime:.0f}, {_digest(fd, st.st_size)}"
    )
    name = f"{dest}.removed"
    where = (
        f"the quarantine's budget ({budget.total >> 20} MiB in all, {RUN_BYTES >> 20} MiB "
        f"a run; {TOTAL_ENTRIES:,} entries in all, {RUN_ENTRIES:,} a run)"
    )
    if not budget.entry():
        return name, f"removed, over {where}: not kept, it was {line}"
    out = os.open(name, _O_NEW, 0o600, dir_fd=dst_fd)
    try:
        os.write(out, (line + "\n").encode())
    finally:
        os.close(out)
    return name, f"removed, over {where}: kept only {line}"


def _keep(
    src_fd: int, name: str, dst_fd: int, dest: str, budget: Budget, same_fs: bool
) -> tuple[str, str | None]:
    """A regular file: renamed (same filesystem) or copied sparse-aware within the
    budget; past it, removed and its metadata kept. Returns the name it has there, and
    what the finding says when only its metadata is."""
    fd = os.open(name, O_FILE, dir_fd=src_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file any more")
        allocated = st.st_blocks * 512
        if budget.take(allocated):
            try:
                if same_fs:
                    os.rename(name, dest, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                    return dest, None
            except OSError as exc:  # one device, two mounts
                if exc.errno != errno.EXDEV:
                    raise
            out = os.open(dest, _O_NEW, 0o600, dir_fd=dst_fd)
            try:
                kept = _copy_sparse(fd, out, st.st_size, allocated)
            finally:
                os.close(out)
            if kept:
                os.unlink(name, dir_fd=src_fd)
                return dest, None
            os.unlink(dest, dir_fd=dst_fd)
        kept_as = _keep_metadata(fd, st, dst_fd, dest, budget)
        os.unlink(name, dir_fd=src_fd)
        return kept_as
    finally:
        os.close(fd)


def _copy_out(src_fd: int, name: str, dst_fd: int, dest: str, budget: Budget) -> None:
    """Move across filesystems (what is not a regular file): a symlink is made again
    there, a directory copied whole (_copy_dir); anything else (a FIFO, a socket) has
    no content worth keeping: it is just removed."""
    st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        _copy_dir(src_fd, name, dst_fd, dest, budget)
        return
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src_fd), dest, dir_fd=dst_fd)
    os.unlink(name, dir_fd=src_fd)


COPY_PASSES = 3  # a directory still filled while it is emptied: then the move fails
COPY_DEPTH = 64  # directories below one moved across filesystems (deeper: the move fails)


def _copy_dir(src_fd: int, name: str, dst_fd: int, dest: str, budget: Budget) -> None:
    """Directory NAME moved to DEST across filesystems: each entry kept as move_into keeps
    one (within BUDGET) and the tree removed, children first, no symlink followed.
    Whoever keeps filling it meanwhile (the payload) gets COPY_PASSES tries, then the
    move fails (OSError), as it does past COPY_DEPTH: the caller says so."""
    for _ in range(COPY_PASSES):
        if not exists(dest, dst_fd):
            os.mkdir(dest, 0o700, dir_fd=dst_fd)
        _empty_into(src_fd, name, dst_fd, dest, budget, COPY_DEPTH)
        try:
            os.rmdir(name, dir_fd=src_fd)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
    raise OSError(errno.ENOTEMPTY, "it was filled again as fast as it was emptied")


def _empty_into(src_fd: int, name: str, dst_fd: int, dest: str, budget: Budget, depth: int) -> None:
    if depth <= 0:
        raise OSError(errno.ELOOP, f"more than {COPY_DEPTH} directories deep")
    s_fd = os.open(name, O_DIR, dir_fd=src_fd)
    try:
        d_fd = os.open(dest, O_DIR, dir_fd=dst_fd)
        try:
            with os.scandir(s_fd) as it:
                entries = [
                    (e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
                    for e in it
                ]
            for child, is_dir, is_file in entries:
                slot = _free(d_fd, child)
                if is_dir:
                    os.mkdir(slot, 0o700, dir_fd=d_fd)
                    _empty_into(s_fd, child, d_fd, slot, budget, depth - 1)
                    with contextlib.suppress(OSError):  # refilled: the next pass
                        os.rmdir(child, dir_fd=s_fd)
                elif is_file:
                    _keep(s_fd, child, d_fd, slot, budget, False)
                else:
                    _copy_out(s_fd, child, d_fd, slot, budget)
        finally:
            os.close(d_fd)
    finally:
        os.close(s_fd)


def _free(dfd: int, name: str) -> str:
    dest, n = name, 0
    while exists(dest, dfd) or exists(f"{dest}.removed", dfd):
        n += 1
        dest = f"{name}.{n}"
    return dest


def _slot(q_fd: int, rel: str) -> tuple[int, str]:
    """The quarantine's directory for REL (made as needed; an fd the caller closes) and a
    free name in it (an earlier finding at the same path keeps its own)."""
    *dirs, leaf = walk.parts(rel)
    dfd = os.dup(q_fd)
    try:
        for d in dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700, dir_fd=dfd)
            nfd = os.open(d, O_DIR, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
    except BaseException:
        os.close(dfd)
        raise
    return dfd, _free(dfd, leaf)  # an earlier finding there keeps its own name


def move_into(
    src_fd: int, rel: str, quarantine: str, q_fd: int, budget: Budget | None = None
) -> str:
    """The entry REL (its directory's fd: SRC_FD) moved into QUARANTINE (open as Q_FD)
    under a free name, within BUDGET; where it is now."""
    dfd, dest = _slot(q_fd, rel)
    leaf = rel.rpartition("/")[2]
    budget = budget or Budget(os.path.dirname(quarantine))
    try:
        if stat.S_ISREG(os.stat(leaf, dir_fd=src_fd, follow_symlinks=False).st_mode):
            same = os.fstat(src_fd).st_dev == os.fstat(dfd).st_dev
            dest, over = _keep(src_fd, leaf, dfd, dest, budget, same)
            if over is not None:
                budget.over[os.path.join(quarantine, *walk.parts(rel)[:-1], dest)] = over
        else:
            try:
                os.rename(leaf, dest, src_dir_fd=src_fd, dst_dir_fd=dfd)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                _copy_out(src_fd, leaf, dfd, dest, budget)
    finally:
        os.close(dfd)
    return os.path.join(quarantine, *walk.parts(rel)[:-1], dest)


def move_entry(parent_fd: int, rel: str, quarantine: str, budget: Budget) -> str:
    """The entry REL (its directory's fd: PARENT_FD) moved to QUARANTINE, a directory
    whole; where it is now."""
    os.makedirs(quarantine, mode=0o700, exist_ok=True)
    q_fd = os.open(quarantine, O_DIR)
    try:
        return move_into(parent_fd, rel, quarantine, q_fd, budget)
    finally:
        os.close(q_fd)


def overwrite(root: str, rel: str, data: bytes, quarantine: str) -> str | None:
    """Put DATA into the pinned file REL in place — the live guard's undo: the pin stays on
    the same inode, so no window opens as a rename would — after copying what it held
    to QUARANTINE. Only a regular file with one link (another name would be changed
    too); None when it is not one, or could not be done."""
    try:
        pfd = walk.open_in_tree(root, rel.rpartition("/")[0])
    except OSError:
        return None
    try:
        fd = os.open(
            rel.rpartition("/")[2],
            os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=pfd,
        )
    except OSError:
        os.close(pfd)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > CONFIG_MAX:
            return None
        held = os.pread(fd, st.st_size + 1, 0)
        os.makedirs(quarantine, mode=0o700, exist_ok=True)
        q_fd = os.open(quarantine, O_DIR)
        try:
            dfd, dest = _slot(q_fd, rel)
        finally:
            os.close(q_fd)
        try:
            out = os.open(
                dest,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=dfd,
            )
            try:
                os.write(out, held)
            finally:
                os.close(out)
        finally:
            os.close(dfd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        return os.path.join(quarantine, *walk.parts(rel)[:-1], dest)
    except OSError:
        return None
    finally:
        os.close(fd)
        os.close(pfd)
