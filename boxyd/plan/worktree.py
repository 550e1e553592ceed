"""The run's walks of each writable tree. Before the payload starts, one walk gives what
the git guard pins and fingerprints, which credentials are covered, and the
fingerprints of the files other tools run later; after it, one walk (the git guard's
scan) checks them all again. Blocking (a tree can hold hundreds of thousands of
directories): the daemon runs each in a pool of its own (boxyd.daemon.pools).

``prepare`` runs in a process of its own (boxyd/daemon/walkproc.py): a thread walking holds
the GIL for each entry's bytecode (another session's start-up measured 170 ms during a
300,000-directory walk on a loaded 2-core machine, 53 ms idle). ``after`` still runs
in the daemon's checks pool: the scan interleaves its walk with the host's git, whose
tool sandboxes are spawned through the stage-2 template on the event loop's thread
(Toolshed) and whose answers feed the same Walker. Moving it takes either the tool
sandboxes' control sockets passed to the walk process (SCM_RIGHTS) or the scan split
in three — walk, ask git (daemon), walk what git named, judge and move — with the
Walker's state carried between them as plain data.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from boxy.errors import BoxyError, SetupError
from boxyd.config import hostrun
from boxyd.config.hosttools import Opener
from boxyd.gitguard import discover, scan
from boxyd.gitguard.discover import Layout, Protection
from boxyd.gitguard.quarantine import Budget
from boxyd.kernel import openat
from boxyd.kernel.sys import fs_type
from boxyd.kernel.walk import MAX_DIRS, Observer, TooLarge, Type, open_root
from boxyd.plan import heldfiles, live
from boxyd.plan.execfiles import Watch, changes
from boxyd.plan.heldfiles import Present
from boxyd.plan.masking import Finder, Found


@dataclass(frozen=True)
class Tree:
    protections: list[Protection] = field(default_factory=list)  # empty with --allow-git-write
    baseline: scan.Snapshot | None = None  # None with --allow-git-write
    credentials: list[Found] = field(default_factory=list)
    tools: dict[str, tuple[str, str]] = field(default_factory=dict)  # execfiles.Watch.seen
    # directories where a credential may appear during the session (the live guard's;
    # in walk order, not those credentials.SKIP_DIRS names, at most live.MAX_WATCHED)
    dirs: tuple[str, ...] = ()
    stamps: dict[str, live.Stamp] = field(default_factory=dict)  # of dirs (live.stamp)
    # past MAX_WATCHED: the top of each subtree the guard cannot watch (it lists them
    # again every second instead: live.past_budget)
    unlisted: tuple[str, ...] = ()
    # the files host programs obey unasked, as they were at the start (plan/heldfiles.py)
    held: dict[str, Present] = field(default_factory=dict)
    gitdirs: tuple[str, ...] = ()  # the git directories found (the live guard's: live.py)
    hookdirs: tuple[str, ...] = ()  # core.hooksPath's directories in the tree (ditto)


# A walk in boxyd's own thread (a LIMIT given: daemon/walks.py) stops past these too,
# and is done by the walk process instead: a few directories can hold a million names
# or 40 credentials of 4 MiB each (0.2 s and 2 s of another session's start).
SMALL_ENTRIES = 20_000
SMALL_BYTES = 1 << 20


class LargerThan(Exception):
    """The walk stopped at the LIMIT it was given (having changed nothing)."""


class _LiveDirs:
    """The live guard's directories, as the walk lists them (in walk order, not those
    credentials.SKIP_DIRS names, at most live.MAX_WATCHED), with their stamps."""

    def __init__(self, root_fd: int) -> None:
        self.fs, self.dev = fs_type(root_fd), os.fstat(root_fd).st_dev
        self.dirs: list[str] = []
        self.kept: set[str] = set()
        self.unlisted: list[str] = []  # the top of each subtree past MAX_WATCHED
        self.stamps: dict[str, live.Stamp] = {}

    def __call__(self, fd: int, rel: str) -> None:
        if live.skipped(rel):
            return
        if len(self.dirs) >= live.MAX_WATCHED:
            if rel and rel.rpartition("/")[0] in self.kept:
                self.unlisted.append(rel)  # below it, the guard's rescan lists everything
            return
        self.dirs.append(rel)
        self.kept.add(rel)
        st = os.fstat(fd)  # after the listing: live.stamp says why that is safe
        now = (st.st_dev, st.st_ino, st.st_ctime_ns)
        if (s := live.stamp(self.fs, self.dev, now, time.time_ns())) is not None:
            self.stamps[rel] = s


def walk(
    root: str,
    *,
    git_guard: bool,
    created: bool = False,
    user_hooks: str | None = None,
    secrets: Sequence[str] = (),
    limit: int | None = None,
) -> Tree:
    """One walk of ROOT: the git layout (pinned, absent hooks directories created, then
    fingerprinted) and the credentials found on the way (SECRETS: the profile's own
    patterns), then every other name of a credential with more than one hard link.
    CREATED: a --mkdir directory; absent, it is made here (make_missing), so the live
    guard watches it from the start, and walked empty. USER_HOOKS: the user's global
    core.hooksPath (gitguard/userconfig.py). LIMIT: stop (LargerThan) past that many
    directories, SMALL_ENTRIES entries or SMALL_BYTES of credentials read, before
    anything is created."""
    if created and not os.path.lexists(root):
        make_missing(root)
    try:
        root_fd = open_root(root)
        try:
            lay, finder, watch, live_dirs, held = _walk_once(
                root, root_fd, user_hooks, secrets, limit
            )
            refuse_unlistable(root, root_fd, lay.unreadable)
        finally:
            os.close(root_fd)
        found = sorted(finder.found.values(), key=lambda f: f.rel)
        dirs, stamps = tuple(live_dirs.dirs), live_dirs.stamps
        unlisted = tuple(live_dirs.unlisted)
        if not git_guard:
            return Tree(
                credentials=found,
                tools=watch.seen,
                dirs=dirs,
                stamps=stamps,
                unlisted=unlisted,
                held=held.found,
            )
        prots = discover.plan_protections(lay)
        for rel in discover.prepare(root, prots):  # made for git's pins: held ones too
            top = hostrun.held_above(rel) or rel
            if hostrun.match(top) is not None:
                held.found.setdefault(top, Present(top, "dir"))
        snap = scan.snapshot(root, lay)
        gitdirs = tuple(g.rel for g in lay.gitdirs)
        hookdirs = tuple(c.rel for c in lay.controls if c.role == "hookspath" and c.type == "dir")
        return Tree(
            prots, snap, found, watch.seen, dirs, stamps, unlisted, held.found, gitdirs, hookdirs
        )
    except TooLarge as e:
        if limit is not None:
            raise LargerThan(str(e)) from None
        raise SetupError(f"{root} holds {e}, too many to check; narrow the work directory") from e
    except OSError as e:
        where = e.filename if isinstance(e.filename, str) else root
        raise SetupError(
            f"{where}: {e.strerror or e} (the tree changed while it was being read?); run again"
        ) from e


def _walk_once(
    root: str, root_fd: int, user_hooks: str | None, secrets: Sequence[str], limit: int | None
) -> tuple[Layout, Finder, Watch, _LiveDirs, heldfiles.Finder]:
    """The one walk, each directory shown to the credentials' Finder, the tools'
    Watch, the held files' Finder and the live guard's directories; then git's
    configs and hard links."""
    small = limit is not None  # in boxyd's own thread: bounded in entries and bytes too
    finder = Finder(
        root_fd,
        [os.path.abspath(root), os.path.realpath(root)],
        secrets,
        byte_limit=SMALL_BYTES if small else None,
    )
    watch = Watch()
    live_dirs = _LiveDirs(root_fd)
    held = heldfiles.Finder(root, bounded=True)

    def observe(fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        finder(fd, rel, entries)
        watch(fd, rel, entries)
        held(fd, rel, entries)
        live_dirs(fd, rel)  # (its own shape: no entries)

    lay = discover.Walker(
        root,
        root_fd,
        observer=observe,
        user_hooks=user_hooks,
        limit=MAX_DIRS if limit is None else limit,
        entry_limit=SMALL_ENTRIES if small else None,
    ).run()
    finder.git_configs(lay)
    finder.links()
    held.links(root_fd)
    return lay, finder, watch, live_dirs, held


def refuse_unlistable(root: str, root_fd: int, unreadable: Sequence[str]) -> None:
    """SetupError: a directory the walk could not list that the payload can still reach
    into: yours (it may chmod it back), or one you may search (it opens the names it
    knows). Nothing in it was seen, so no credential there was covered and the live
    guard never watched it (inotify wants the right to read): a .env in a directory
    made 0300 by an earlier run was the payload's, and so was one the host saved there
    during the run. One the user cannot reach either is the payload's no more."""
    for rel in unreadable:
        try:  # (no symlink followed on the way: the tree is the payload's)
            fd = openat.openat2(root_fd, rel, os.O_PATH, f"walk {root}")
        except (OSError, SetupError):
            continue  # gone, or on the way to one that is not the payload's either
        try:
            st, here = os.fstat(fd), f"/proc/self/fd/{fd}"
            if not stat.S_ISDIR(st.st_mode) or os.access(here, os.R_OK | os.X_OK):
                continue  # (not a directory now; one too deep to walk, readable)
            reachable = st.st_uid == os.getuid() or os.access(here, os.X_OK)
        finally:
            os.close(fd)
        if reachable:
            raise SetupError(
                f"{root}/{rel}: a directory you cannot list (mode {st.st_mode & 0o7777:04o}): "
                "boxy cannot see what it holds, nor cover a credential there, and the "
                "sandbox can still reach into it; `chmod u+rx` it (or remove it) and run again"
            )


def make_missing(path: str) -> None:
    """--mkdir's directory and its missing parents, no component followed as a symlink
    (kernel.openat.walk_create, which stage 2 runs again on it): made before the walk,
    not by stage 2, as the live guard cannot watch a tree that is not there yet (it
    said `not watched` of every --mkdir directory it did not find, and a credential the
    host saved there during the run went uncovered). SetupError: the run's line."""
    top = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(openat.walk_create(top, path, leaf="dir", step=f"--mkdir {path}"))
    finally:
        os.close(top)


def prepare(
    roots: Sequence[str],
    *,
    git_guard: bool,
    created: Sequence[str] = (),
    user_hooks: str | None = None,
    secrets: Sequence[str] = (),
    limit: int | None = None,
) -> dict[str, Tree]:
    """Every root's walk; LIMIT: of each (LargerThan past it; what an earlier root's walk
    created — absent hooks directories — a second walk finds in place)."""
    return {
        root: walk(
            root,
            git_guard=git_guard,
            created=root in created,
            user_hooks=user_hooks,
            secrets=secrets,
            limit=limit,
        )
        for root in roots
    }


def _own_access(root: str) -> list[str]:
    """The tree's top as the walk before the run could list it: a payload that took
    its owner's read or search right away (chmod 0311 .) would have the whole check
    skip it. Its owner's rights are put back (the user's own directory), said."""
    try:
        st = os.stat(root, follow_symlinks=False)
    except OSError:
        return []
    if os.access(root, os.R_OK | os.X_OK) or st.st_uid != os.getuid():
        return []
    os.chmod(root, (st.st_mode | 0o700) & 0o7777, follow_symlinks=False)
    return [f"{root}: the run took away your own read access to it; it is back"]


def _each(*observers: Observer) -> Observer:
    """One Walker observer that shows each directory to every one of OBSERVERS."""

    def observe(fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        for o in observers:
            o(fd, rel, entries)

    return observe


def after(
    trees: dict[str, Tree],
    baselines: dict[str, scan.Snapshot],
    quarantine: str,
    home: str,
    tools: Opener,
    user_hooks: str | None = None,
    edit: Mapping[str, Sequence[str]] | None = None,
) -> tuple[list[str], list[str]]:
    """After the run, one walk per tree: (git guard findings, the tools' files the run
    created or changed, and the held files it made, quarantined: heldfiles.after),
    one line each. BASELINES: the git guard's, inherited from live sessions where
    trees overlap (none with --allow-git-write). TOOLS: the tool sandboxes the host's
    git is asked in. EDIT: --edit-config's rels, by tree. Never raises: a tree that
    cannot be checked is itself a finding."""
    git_lines: list[str] = []
    tool_lines: list[str] = []
    budget = Budget(os.path.dirname(quarantine))  # the run's, across its trees
    for root, tree in trees.items():
        git_lines += _own_access(root)
        watch, held = Watch(), heldfiles.Finder(root)
        observe = _each(watch, held)
        dest = os.path.join(quarantine, root.strip("/").replace("/", "_"))
        try:
            if root in baselines:
                git_lines += scan.describe(
                    scan.scan(root, baselines[root], dest, tools, home, observe, user_hooks, budget)
                )
            else:
                root_fd = open_root(root)
                try:
                    discover.Walker(
                        root, root_fd, limit=None, observer=observe, refuse_unjudged=False
                    ).run()
                finally:
                    os.close(root_fd)
        except (OSError, BoxyError) as e:  # never raises: a tree not checked is a finding
            git_lines.append(
                f"git guard: {root} could not be checked ({e}); check it before running git there"
            )
            continue
        tool_lines += changes(tree.tools, watch.seen, root)
        tool_lines += heldfiles.after(
            tree.held, held.found, root, dest, (edit or {}).get(root, ()), budget
        )
    return git_lines, tool_lines
