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
still change a file after it was checked — the mounts are the layer for that. What
is moved aside goes to the quarantine store (quarantine.py).
"""

from __future__ import annotations

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
from boxyd.gitguard.quarantine import Budget, move_into, overwrite
from boxyd.kernel import walk
from boxyd.kernel.walk import O_DIR, O_FILE, Type, exists
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
            dest = move_into(pfd, rel, quarantine, q_fd)
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
                if exists(name, fd):
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
            dest = move_into(pfd, c.rel, self.quarantine, self.q_fd(), self.budget)
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
            dest = move_into(pfd, rel, self.quarantine, self.q_fd(), self.budget)
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
