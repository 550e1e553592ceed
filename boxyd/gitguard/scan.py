"""After a run: move aside the git control files the payload added or changed that
would make the host's git run a command.

The mounts in discover.py pin the control files that exist before a run; they cannot
pin what does not exist yet (a new nested repository, a new modules/X, a gitlink in
the index that sends ``git status`` into it). So ``snapshot`` fingerprints every
control file before the run and ``scan`` compares after it. A new or changed entry
is quarantined when it is

- a hook: anything under a ``hooks/`` directory (or under a directory in the tree
  that the user's own ``core.hooksPath`` names) not ending in ``.sample``;
- a config file (``config*``, or a file a config includes) with keys that run
  commands, or one git cannot parse;
- a ``.git`` file, ``commondir`` or ``gitdir`` pointer that leaves the tree (or goes
  through a symlink, or cannot be read);
- a symlink, FIFO or other non-regular file where a control file belongs.

``.gitmodules`` is not a control file: ``update = !cmd`` is honoured only from
``.git/config`` (git rejects it from .gitmodules), which is scanned.

Entries unchanged since the snapshot are never touched: they were the user's own.
The scan runs once the payload has exited; a concurrent run in the same tree could
still change a file after it was checked — the mounts are the layer for that.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from boxy.digest import sha256
from boxyd.config.hosttools import Box, Exposure, Opener, ToolError
from boxyd.gitguard import discover, hostgit
from boxyd.gitguard.discover import CONFIG_MAX, POINTER_MAX, Control, Role
from boxyd.gitguard.gitconfig import Entry, dangerous_keys, is_dangerous
from boxyd.kernel import walk
from boxyd.kernel.walk import O_DIR, O_FILE, Type
from boxyd.plan import payloadparse

HASH_MAX = 1 << 20  # content is hashed up to this size; larger files are compared by inode/ctime


@dataclass(frozen=True)
class Record:
    role: Role
    type: Type
    fingerprint: tuple[object, ...]  # equal fingerprints: the entry did not change
    # a config file's keys that run commands, as they were: a change the host makes
    # during the session that adds none is the user's to keep (adopt)
    keys: tuple[str, ...] = ()
    content: bytes | None = None  # a config file's bytes (small ones): what restore puts back


@dataclass(frozen=True)
class Snapshot:
    root: str
    records: Mapping[str, Record]  # by path relative to root
    unreadable: frozenset[str]


@dataclass(frozen=True)
class Finding:
    rel: str  # relative to the work tree
    reason: str
    keys: tuple[str, ...] = ()  # the config keys that run commands
    dest: str = ""  # absolute path in quarantine; "" when it was left in place


def _fingerprint(dir_fd: int, name: str) -> tuple[object, ...] | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return ("symlink", os.readlink(name, dir_fd=dir_fd))
        if stat.S_ISDIR(st.st_mode):
            return ("dir",)
        mode = stat.S_IMODE(st.st_mode)  # exec bits decide whether a hook runs
        if not stat.S_ISREG(st.st_mode):
            return ("other", stat.S_IFMT(st.st_mode), mode, st.st_ino)
        if st.st_size > HASH_MAX:
            return ("file", mode, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        fd = os.open(name, O_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return ("error", exc.errno)
    try:
        digest = sha256()
        while chunk := os.read(fd, 65536):
            digest.update(chunk)
        return ("file", mode, digest.hexdigest())
    except OSError as exc:
        return ("error", exc.errno)
    finally:
        os.close(fd)


def _by_parent(controls: tuple[Control, ...]) -> dict[str, list[Control]]:
    groups: dict[str, list[Control]] = {}
    for c in sorted(controls, key=lambda c: c.rel.split("/")):  # parents first
        groups.setdefault(c.rel.rpartition("/")[0], []).append(c)
    return groups


def snapshot(root: str, lay: discover.Layout | None = None) -> Snapshot:
    """Fingerprint every git control entry in the tree ``root`` (before a run); LAY:
    the walk already made of it, if any."""
    if lay is None:
        lay = discover.layout(root)
    records: dict[str, Record] = {}
    root_fd = walk.open_root(root)
    try:
        for parent, controls in _by_parent(lay.controls).items():
            try:
                pfd = walk.open_dir(root_fd, parent)
            except OSError:
                continue
            try:
                for c in controls:
                    fp = _fingerprint(pfd, c.rel.rpartition("/")[2])
                    if fp is not None:
                        records[c.rel] = Record(c.role, c.type, fp, *_config(pfd, c, fp))
            finally:
                os.close(pfd)
    finally:
        os.close(root_fd)
    return Snapshot(root, records, frozenset(lay.unreadable))


RESTORE_MAX = 1 << 16  # a config file kept whole in the baseline, to put back if need be


def _config(pfd: int, c: Control, fp: tuple[object, ...]) -> tuple[tuple[str, ...], bytes | None]:
    """A config file's keys that run commands, and its bytes when small."""
    if c.role not in ("config", "include") or fp[0] != "file":
        return (), None
    data = walk.read_small(pfd, c.rel.rpartition("/")[2], CONFIG_MAX)
    if data is None:
        return (), None
    parsed = payloadparse.git_config(data)  # apart from boxyd, within a budget
    # not judged: its keys unknown (a change to it is judged after the run all the same)
    keys = () if isinstance(parsed, payloadparse.Hostile) else dangerous_keys(parsed.entries)
    return tuple(keys), data if len(data) <= RESTORE_MAX else None


def adopt(snap: Snapshot, rel: str) -> tuple[Snapshot, str | None]:
    """The host changed the pinned control entry REL during the session (the live
    guard saw it): SNAP with REL's record taken from the entry as it is now, so the
    scan after the run leaves the user's change alone — unless the entry now holds what
    the scan would move aside and did not hold before (the payload may have raced the
    host's rename). Returns the snapshot and, when the change is not adopted, why."""
    old = snap.records.get(rel)
    if old is None:
        return snap, None  # not a control entry of the baseline: the scan judges it
    parent, _, name = rel.rpartition("/")
    control = Control(rel, old.role, old.type)
    root_fd = walk.open_root(snap.root)
    try:
        pfd = walk.open_dir(root_fd, parent)
        try:
            fp = _fingerprint(pfd, name)
            if fp is None:
                return snap, "gone"
            verdict = _Judge(snap.root, root_fd)(control, fp[0], pfd)
            keys, content = _config(pfd, control, fp)
        finally:
            os.close(pfd)
    except OSError as exc:
        return snap, os.strerror(exc.errno or 0)
    finally:
        os.close(root_fd)
    known = (
        verdict is not None
        and verdict[0] == "git config that makes git run commands"
        and set(keys) <= set(old.keys)
    )
    if verdict is not None and not known:
        new = [k for k in verdict[1] if k not in old.keys]
        return snap, verdict[0] + (f" ({', '.join(new or verdict[1])})" if verdict[1] else "")
    records = dict(snap.records)
    records[rel] = Record(old.role, old.type, fp, keys, content)
    return Snapshot(snap.root, records, snap.unreadable), None


def restore(snap: Snapshot, rel: str, quarantine: str) -> tuple[str, bool]:
    """The live guard refused a change to the pinned entry REL: the baseline's version
    back, rewritten in place (overwrite) when it can be, else what is there moved to
    QUARANTINE and the baseline's renamed in (the name is free only between the two
    renames). Returns where what it held went, and whether the baseline's version is
    back (only a small config file's is kept)."""
    old = snap.records.get(rel)
    if old is not None and old.content is not None:
        done = overwrite(snap.root, rel, old.content, quarantine)
        if done is not None:
            return done, True
    os.makedirs(quarantine, mode=0o700, exist_ok=True)
    q_fd = os.open(quarantine, O_DIR)
    try:
        pfd = walk.open_in_tree(snap.root, rel.rpartition("/")[0])
        try:
            dest = _move(pfd, rel, quarantine, q_fd)
            back = old is not None and old.content is not None and _put_back(pfd, rel, old)
            return dest, back
        finally:
            os.close(pfd)
    finally:
        os.close(q_fd)


def _write_beside(pfd: int, data: bytes, mode: int) -> str:
    """A new file of DATA in the directory PFD under a fresh name (never an existing
    entry: the payload may have planted one)."""
    for _ in range(16):
        name = f".boxy-restore-{os.urandom(6).hex()}"
        try:
            fd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode & 0o777,
                dir_fd=pfd,
            )
        except FileExistsError:
            continue
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return name
    raise FileExistsError(errno.EEXIST, "no fresh name to restore into")


def _beneath(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _rebase(rels: Iterable[str], src: str, dst: str) -> Iterator[tuple[str, str]]:
    """(old key, new key) for paths relative to root SRC that lie beneath DST."""
    for rel in rels:
        path = os.path.join(src, rel) if rel else src
        if _beneath(path, dst):
            yield rel, (os.path.relpath(path, dst) if path != dst else "")


def inherit(own: Snapshot, older: Snapshot) -> Snapshot:
    """Pure: OWN with the part it shares with OLDER — the baseline of a session still
    live on an overlapping tree — taken from OLDER. What that session planted is then
    new to this one too, and cannot be laundered by two runs (one plants, the other
    starts, the first deletes, the second re-creates it identically)."""
    a, b = own.root, older.root
    if not (_beneath(a, b) or _beneath(b, a)):
        return own
    shared = a if _beneath(a, b) else b  # the deeper root
    part = os.path.relpath(shared, a) if shared != a else ""  # relative to a

    def in_shared(rel: str) -> bool:
        return not part or rel == part or rel.startswith(part + "/")

    records = {k: v for k, v in own.records.items() if not in_shared(k)}
    records.update((new, older.records[old]) for old, new in _rebase(older.records, b, a))
    unreadable = {u for u in own.unreadable if not in_shared(u)}
    unreadable.update(new for _, new in _rebase(older.unreadable, b, a))
    return Snapshot(a, records, frozenset(unreadable))


def inherit_live(own: Mapping[str, Snapshot], live: Sequence[Snapshot]) -> dict[str, Snapshot]:
    """OWN, where it overlaps a tree a live session runs on, replaced by that session's
    baseline. LIVE: oldest first. Taken once the walk is done, so that every session
    whose payload started before this walk ended is in it (a session sets its baselines
    before its payload starts)."""
    out = {}
    for root, snap in own.items():
        for older in reversed(live):  # newest first: the oldest live baseline wins
            snap = inherit(snap, older)
        out[root] = snap
    return out


_LABEL = {
    "dotgit": ".git entry",
    "config": "config file",
    "commondir": "commondir file",
    "backlink": "gitdir file",
    "hooks": "hooks directory",
    "hook": "hook",
    "modules": "modules directory",
    "module": "submodule gitdir",
    "worktrees": "worktrees directory",
    "worktree": "worktree gitdir",
    "hookspath": "core.hooksPath directory",
    "include": "file a git config includes",
    "head": "HEAD",
}


class _Judge:
    def __init__(self, root: str, root_fd: int) -> None:
        self.root_fd = root_fd
        self.roots = [os.path.abspath(root), os.path.realpath(root)]

    def __call__(self, c: Control, kind: object, pfd: int) -> tuple[str, tuple[str, ...]] | None:
        parent, _, name = c.rel.rpartition("/")
        label = _LABEL[c.role]
        if c.role == "hook":
            if kind == "dir" or name.endswith(".sample"):
                return None  # git never runs a .sample
            return "a new or changed git hook", ()
        if kind == "symlink":
            return f"a symlink where git expects a {label}", ()
        if kind == "error":
            return f"a {label} that could not be read to check it", ()
        if kind == "other":
            return f"not a regular file where git expects a {label}", ()
        if kind != "file":
            return None
        if c.role in ("config", "include"):
            data = walk.read_small(pfd, name, CONFIG_MAX)
            if data is None:
                return "a git config file too large or unreadable to check", ()
            parsed = payloadparse.git_config(data)  # apart from boxyd, within a budget
            if isinstance(parsed, payloadparse.Hostile):
                return f"a git config file that could not be judged ({parsed.why})", ()
            keys = tuple(dangerous_keys(parsed.entries))
            if not parsed.complete:
                return "a git config file git cannot parse", keys
            if keys:
                return "git config that makes git run commands", keys
            return self._worktree(c, parent, parsed.entries)

        if c.role in ("dotgit", "commondir", "backlink"):
            data = walk.read_small(pfd, name, POINTER_MAX)
            text = discover.pointer_text(data, c.role == "dotgit") if data is not None else None
            if text is None:
                return f"a {label} git cannot read", ()
            comps = walk.place(self.roots, parent, text)
            # a backlink names the worktree's .git file, which need not be a directory
            last_dir = c.role != "backlink"
            if comps is None or walk.walk_beneath(self.root_fd, comps, last_dir) is None:
                return f"a {label} pointing outside the work directory (or through a symlink)", ()
        return None

    def _worktree(
        self, c: Control, gitdir: str, entries: Sequence[Entry]
    ) -> tuple[str, tuple[str, ...]] | None:
        """core.worktree naming a directory outside the work directory: the user's next
        `git reset --hard` or `git checkout` there writes files outside it (~/.bashrc).
        Relative to the gitdir, as git takes it; in an included file git's gitdir is
        not known here, so any core.worktree there is a finding."""
        values = [
            e.value
            for e in entries
            if (e.section, e.subsection, e.name) == ("core", None, "worktree") and e.value
        ]
        if not values:
            return None
        if c.role == "include":
            return "core.worktree in a file a git config includes", ("core.worktree",)
        comps = walk.place(self.roots, gitdir, values[-1])
        if comps is None or walk.walk_beneath(self.root_fd, comps) is None:
            return "core.worktree pointing outside the work directory (or through a symlink)", (
                "core.worktree",
            )
        return None


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


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
    """Directory NAME moved to DEST across filesystems: each entry kept as _move keeps
    one (within BUDGET) and the tree removed, children first, no symlink followed.
    Whoever keeps filling it meanwhile (the payload) gets COPY_PASSES tries, then the
    move fails (OSError), as it does past COPY_DEPTH: the caller says so."""
    for _ in range(COPY_PASSES):
        if not _exists(dest, dst_fd):
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
    while _exists(dest, dfd) or _exists(f"{dest}.removed", dfd):
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


def _move(src_fd: int, rel: str, quarantine: str, q_fd: int, budget: Budget | None = None) -> str:
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
        return _move(parent_fd, rel, quarantine, q_fd, budget)
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


MAX_ASKED = 256  # directories the host's git is asked about per tree and run


def consult_git(
    walker: discover.Walker, root: str, home: str, tools: Opener
) -> tuple[dict[str, list[str]], list[Finding]]:
    """Ask the host's git — in a tool sandbox of boxyd's own that TOOLS opens — in every
    directory where it may find a repository, and add to the walk what it names
    inside the tree: the config files it reads (with the keys in them that run
    commands, by git's own parse), its hooks directory, and the gitlinks its index
    holds (each a directory ``git status`` recurses into, found even inside a
    directory nobody can list). Returns those keys by file, and notes."""
    real = os.path.realpath(root)
    env = hostgit.environment(home, os.path.dirname(real))
    keys: dict[str, list[str]] = {}
    notes: list[Finding] = []
    asked: set[str] = set()
    box: Box | None = None
    try:
        while todo := [c for c in walker.askable() if c not in asked]:
            if box is None:  # only a tree where git may find a repository costs a sandbox
                box = tools(Exposure(home=home, read=(real,)))
            for rel in todo:
                asked.add(rel)
                if len(asked) > MAX_ASKED:
                    notes.append(
                        Finding(
                            rel,
                            f"more than {MAX_ASKED} places where git may find a "
                            "repository: the rest were not checked with the host's git",
                        )
                    )
                    return keys, notes
                try:
                    answer = hostgit.ask(box, os.path.join(real, rel), env)
                except hostgit.GitUnanswered as e:
                    notes.append(
                        Finding(rel or ".", f"the host's git could not be asked here ({e})")
                    )
                    continue
                if answer is not None:
                    _add(walker, answer, keys)
    except ToolError as e:
        notes.append(Finding(".", f"the host's git could not be asked ({e})"))
    finally:
        if box is not None:
            box.close()
    return keys, notes


def _add(walker: discover.Walker, answer: hostgit.Answer, keys: dict[str, list[str]]) -> None:
    for path, entry in answer.config:
        comps = walker.inside(path)
        rel = walker.config_file(comps) if comps is not None else None
        if rel is not None and is_dangerous(entry) and entry.key not in keys.setdefault(rel, []):
            keys[rel].append(entry.key)
    hooks = walker.inside(answer.hooks)
    if hooks is not None:
        walker.hooks_dir(hooks)
    for link in answer.gitlinks:
        comps = walker.inside(link)
        if comps:
            walker.visit_known("/".join(comps))


def scan(
    root: str,
    before: Snapshot,
    quarantine: str,
    tools: Opener,
    home: str | None = None,
    observer: walk.Observer | None = None,
    user_hooks: str | None = None,
    budget: Budget | None = None,
) -> list[Finding]:
    """Quarantine the control entries of ``root`` that are new or changed since
    ``before`` and would make git run a command; returns what was found. The pure
    parser judges first, so no git ever reads what it moves aside; then the host's
    git (in a tool sandbox) names what else it would read, and that is judged too.
    BUDGET: the run's bytes in the quarantine (one for all its trees)."""
    root_fd = walk.open_root(root)
    run = _Scan(root, root_fd, before, quarantine, budget or Budget(os.path.dirname(quarantine)))
    try:
        # unbounded: a payload that makes the tree huge delays only its own session's end
        walker = discover.Walker(
            root,
            root_fd,
            limit=None,
            observer=observer,
            user_hooks=user_hooks,
            refuse_unjudged=False,
        )
        walker.run()
        run.judge_all(walker.layout().controls, {})
        git_keys, notes = consult_git(walker, root, home or os.path.expanduser("~"), tools)
        run.findings += notes
        lay = walker.layout()
        run.judge_all(lay.controls, git_keys)
        for rel in lay.unreadable:
            if rel not in before.unreadable:
                run.unreadable(rel)
        run.findings += _locks(root_fd, lay.gitdirs)
    finally:
        os.close(root_fd)
        run.close()
    return run.findings


# git's lock files for what the payload can make the host's git refuse to change: git
# removes its own on exit, so one left after the run is a dead or hostile process's
LOCKS = ("config.lock", "index.lock", "HEAD.lock", "packed-refs.lock", "shallow.lock")


def _locks(root_fd: int, gitdirs: Sequence[discover.GitDir]) -> list[Finding]:
    """Lock files in the gitdirs after the run: named, never removed (a git the user runs
    on the host right now holds its own)."""
    out = []
    for g in gitdirs:
        try:
            fd = walk.open_dir(root_fd, g.rel)
        except OSError:
            continue
        try:
            for name in LOCKS:
                if _exists(name, fd):
                    out.append(
                        Finding(
                            walk.join(g.rel, name),
                            "a git lock file: the host's git "
                            "refuses to change this repository while it is there (remove "
                            "it if no git of yours is running)",
                        )
                    )
        finally:
            os.close(fd)
    return out


class _Scan:
    """One scan's state: what was moved (never judged twice), the quarantine (made with
    the first finding), the findings."""

    def __init__(
        self, root: str, root_fd: int, before: Snapshot, quarantine: str, budget: Budget
    ) -> None:
        self.root_fd = root_fd
        self.budget = budget
        self.before = before
        self.quarantine = quarantine
        self.judge = _Judge(root, root_fd)
        self.findings: list[Finding] = []
        self.moved: set[str] = set()
        self._q_fd: int | None = None

    def q_fd(self) -> int:
        if self._q_fd is None:
            os.makedirs(self.quarantine, mode=0o700, exist_ok=True)
            self._q_fd = os.open(self.quarantine, O_DIR)
        return self._q_fd

    def judge_all(self, controls: tuple[Control, ...], git_keys: Mapping[str, list[str]]) -> None:
        for parent, group in _by_parent(
            tuple(c for c in controls if c.rel not in self.moved)
        ).items():
            try:
                pfd = walk.open_dir(self.root_fd, parent)
            except OSError:
                continue  # moved away with an earlier finding, or gone
            try:
                for c in group:
                    self.judge_one(pfd, c, tuple(git_keys.get(c.rel, ())))
            finally:
                os.close(pfd)

    def judge_one(self, pfd: int, c: Control, named: tuple[str, ...]) -> None:
        fp = _fingerprint(pfd, c.rel.rpartition("/")[2])
        old = self.before.records.get(c.rel)
        if fp is None or (old is not None and old.fingerprint == fp):
            return
        verdict = self.judge(c, fp[0], pfd)
        if verdict is None and named:  # git's parse saw what ours did not
            verdict = ("git config that makes git run commands", named)
        if verdict is None:
            return
        reason, keys = verdict
        keys = keys + tuple(k for k in named if k not in keys)
        self.moved.add(c.rel)
        try:
            dest = _move(pfd, c.rel, self.quarantine, self.q_fd(), self.budget)
            if dest in self.budget.over:
                reason = f"{reason}; {self.budget.over[dest]}"
        except OSError as exc:
            self.findings.append(
                Finding(c.rel, f"{reason}; could not be moved: {os.strerror(exc.errno or 0)}", keys)
            )
            return
        if old is not None and old.content is not None and _put_back(pfd, c.rel, old):
            reason += "; the version from before the run is back"  # the user's, not none
        self.findings.append(Finding(c.rel, reason, keys, dest))

    def unreadable(self, rel: str) -> None:
        """A directory the run made that the walk could not read (its mode, or past
        walk.MAX_DEPTH): nothing in it can be checked, and git (and every other
        program) opens the names it knows there without listing it. Moved whole (a
        rename needs no read of it); where it cannot be, named."""
        reason = "a directory that could not be read (made unreadable, or too deep), so not checked"
        try:
            pfd = walk.open_dir(self.root_fd, rel.rpartition("/")[0])
        except (OSError, ValueError):
            self.findings.append(Finding(rel, reason))
            return
        try:
            dest = _move(pfd, rel, self.quarantine, self.q_fd(), self.budget)
        except OSError as exc:
            why = os.strerror(exc.errno or 0)
            self.findings.append(Finding(rel, f"{reason}; could not be moved: {why}"))
            return
        finally:
            os.close(pfd)
        self.moved.add(rel)
        self.findings.append(Finding(rel, reason, (), dest))

    def close(self) -> None:
        if self._q_fd is not None:
            os.close(self._q_fd)


def _put_back(pfd: int, rel: str, old: Record) -> bool:
    """The baseline's bytes of a config file under its name again (a fresh file renamed
    in: whatever the payload put at the name is already moved away)."""
    try:
        tmp = _write_beside(pfd, old.content or b"", int(old.fingerprint[1]))  # type: ignore[call-overload]
        os.rename(tmp, rel.rpartition("/")[2], src_dir_fd=pfd, dst_dir_fd=pfd)
    except (OSError, ValueError, TypeError):
        return False
    return True


def describe(findings: list[Finding]) -> list[str]:
    """One line per finding, for the user."""
    lines = []
    for f in findings:
        keys = f" ({', '.join(f.keys)})" if f.keys else ""
        if f.dest:
            lines.append(f"git guard: moved {f.rel} to {f.dest}: {f.reason}{keys}")
        else:
            lines.append(
                f"git guard: {f.rel}: {f.reason}{keys} — left in place; check it before running git there"
            )
    return lines
