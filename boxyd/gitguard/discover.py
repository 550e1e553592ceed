"""Find the git repositories in a writable tree and the entries in them to pin.

The tree belongs to the payload between runs (and during concurrent runs), so it is
read only through directory fds opened with O_NOFOLLOW, one component at a time:
a symlink is reported, never followed, and a path cannot be swapped under us (the
safe walk itself, which other features observe, is boxyd/kernel/walk.py).

What is found, for one writable tree ``root``:

- every gitdir: ``.git`` directories at any depth, every directory git's own
  ``is_git_directory()`` accepts (setup.c: a valid HEAD, and ``objects`` and ``refs``
  in the common directory that pass ``access(X_OK)`` — an executable *file* does;
  any ``commondir`` counts), submodule gitdirs under ``modules/**``, linked-worktree
  gitdirs under ``worktrees/*``, and the targets of ``.git`` files and ``commondir``
  files when they resolve inside root through real directories (anything else is
  never followed);
- in each gitdir its control entries: ``config*``, ``commondir``, ``gitdir``,
  ``hooks`` (and everything under it), ``modules``, ``worktrees`` and their entries;
- the files its config includes (``include.path``, ``includeIf.*.path``, transitively:
  git reads them as its own config) and the directory ``core.hooksPath`` names,
  when they lie in the tree — or the first symlink on the way to them;
- every ``.git`` entry in the work trees, whatever its type.

A directory the user cannot list (mode 0111, 0000) is never chmod'ed: the guard does
not change the host tree. It is reported; known names inside one are still reached
(``visit_known``: O_PATH lookups need only the search bit, as git's do).

Absent entries: ``prepare`` creates an absent ``hooks`` directory so that it can be
pinned read-only. An absent ``config.worktree``, ``commondir`` (an empty one breaks
git) or ``config`` is not created: those are left to the post-run scan (scan.py),
which catches any that appear.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from boxy.errors import SetupError
from boxyd.kernel import walk
from boxyd.kernel.walk import (
    MAX_DIRS,
    O_DIR,
    O_FILE,
    Observer,
    TreeWalk,
    Type,
    join,
    list_dir,
    locate,
    open_dir,
    open_root,
    parts,
    place,
    read_small,
    walk_beneath,
)
from boxyd.plan import payloadparse

POINTER_MAX = 64 * 1024  # a .git / commondir / gitdir file larger than this is not a pointer
# A config larger than this is not read (and is judged dangerous: "too large to
# check"). A real one is a few KiB; parsing costs ~2 s and ~10-30 MB per MiB.
CONFIG_MAX = 1 << 20
MAX_INCLUDE_DEPTH = 10  # git's own limit (config.c MAX_INCLUDE_DEPTH)

Role = Literal[
    "dotgit",  # a .git entry in a work tree
    "config",  # config* in a gitdir
    "commondir",
    "backlink",  # the "gitdir" file of a worktree/module gitdir
    "hooks",
    "hook",  # anything under hooks/
    "modules",
    "module",  # anything under modules/ down to the submodule gitdirs
    "worktrees",
    "worktree",  # an entry of worktrees/
    "hookspath",  # the directory core.hooksPath names in the tree: a mount point, its files scanned
    "include",  # a file a config includes: read by git as config, so pinned and judged as one
    "head",  # a HEAD that is a FIFO, socket or device: git blocks on it (only those are kept)
]

# directories git itself keeps in a gitdir: never a submodule namespace under modules/
_GITDIR_INTERNALS = frozenset(
    {
        "objects",
        "refs",
        "logs",
        "hooks",
        "info",
        "modules",
        "worktrees",
        "branches",
        "rr-cache",
        "lfs",
        "svn",
        "fsmonitor--daemon",
        "sequencer",
        "rebase-merge",
        "rebase-apply",
    }
)
_GITDIR_MARKERS = ("HEAD", "config", "commondir", "objects", "refs", "hooks")
_AREA_ROLE: dict[str, Role] = {"hooks": "hook", "modules": "module", "worktrees": "worktree"}
# entries git opens and reads where it looks for a repository: one of them that is a
# FIFO, a socket or a device makes the host's git block (or misread) there
_BLOCKING = ("HEAD", "config", "commondir")
_HEX_PREFIX = re.compile(rb"[0-9a-fA-F]{40}")  # get_oid_hex(): the first 40, whatever follows


@dataclass(frozen=True)
class Protection:
    """One entry of a writable tree to mount over before the payload runs.

    ``self``: bind the directory onto itself (a mount point cannot be renamed away);
    ``ro``: bind read-only. ``symlink``: a symlink sits where the entry belongs — it
    is never followed; the caller must refuse it (DESIGN: a protected symlink is
    refused). An ``ro`` directory that is absent is created by ``prepare``.
    """

    rel: str
    kind: Literal["ro", "self"]
    is_dir: bool
    symlink: bool = False


@dataclass(frozen=True)
class Control:
    rel: str
    role: Role
    type: Type


@dataclass(frozen=True)
class GitDir:
    rel: str  # "" when root is itself a (bare) repository
    shares_common: bool  # has a commondir file: hooks and config live in the common dir
    has_hooks: bool


@dataclass(frozen=True)
class Layout:
    gitdirs: tuple[GitDir, ...]
    controls: tuple[Control, ...]
    unreadable: tuple[str, ...]  # directories that could not be walked (permissions, depth, races)
    # where the host's git may find a repository: root, and every directory with a .git
    # or a HEAD entry (scan.py asks git itself there)
    candidates: tuple[str, ...] = ()


# --- pointers (.git files, commondir, gitdir) ----------------------------------------


def pointer_text(data: bytes, dotgit: bool) -> str | None:
    """The path a pointer file names, as git reads it; None when git would not."""
    if b"\0" in data:
        return None
    if dotgit:  # read_gitfile_gently(): "gitdir: " prefix, trailing CR/LF dropped
        if not data.startswith(b"gitdir: "):
            return None
        path = data[len(b"gitdir: ") :].rstrip(b"\r\n")
    else:  # commondir / gitdir: strbuf_rtrim()
        path = data.rstrip(b" \t\n\r")
    return os.fsdecode(path) if path else None


def valid_head(dir_fd: int) -> bool:
    """git's validate_headref() (setup.c): a symlink into refs/, a file starting with
    "ref:" then (after spaces) "refs/", or one starting with a hex object id — git
    reads only the first 255 bytes and ignores whatever follows. A FIFO or device,
    which git would block on or misread, counts as valid: loose errs towards 'is a
    repository'."""
    try:
        st = os.stat("HEAD", dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return os.readlink("HEAD", dir_fd=dir_fd)[:5] == "refs/"
        if stat.S_ISDIR(st.st_mode):
            return False  # git's read() fails with EISDIR
        if not stat.S_ISREG(st.st_mode):
            return True
        fd = os.open("HEAD", O_FILE, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        data = os.read(fd, 255).split(b"\0", 1)[0]  # a C string from here on
    except OSError:
        return False
    finally:
        os.close(fd)
    if data.startswith(b"ref:") and data[4:].lstrip(b" \t\n\r").startswith(b"refs/"):
        return True
    return bool(_HEX_PREFIX.match(data))


def is_git_directory(dir_fd: int, entries: Mapping[str, Type]) -> bool:
    """git's is_git_directory() for a directory we hold open: a valid HEAD, then
    ``objects`` and ``refs`` that pass access(X_OK) — of any type, through any
    symlink — in the common directory. With a ``commondir`` entry the common
    directory is elsewhere: counted as a repository without looking there (its
    target is explored, or judged, on its own)."""
    if "HEAD" not in entries or not valid_head(dir_fd):
        return False
    if "commondir" in entries:
        return True
    return all(n in entries and os.access(n, os.X_OK, dir_fd=dir_fd) for n in ("objects", "refs"))


# --- the walk --------------------------------------------------------------------------


class Walker(TreeWalk):
    """One walk of one tree (kernel/walk.py's, each directory visited for git).
    ``run`` walks it all; ``visit_known``, ``config_file`` and ``hooks_dir`` add what
    something else (the host's git) named; ``layout`` is the result so far."""

    def __init__(
        self,
        root: str,
        root_fd: int,
        limit: int | None = MAX_DIRS,
        observer: Observer | None = None,
        user_hooks: str | None = None,
        refuse_unjudged: bool = True,
        entry_limit: int | None = None,
    ) -> None:
        """REFUSE_UNJUDGED: a config whose parse is Hostile refuses the run (the walk
        before it: what it includes is unknown); False after the run, where the scan
        judges that file itself (and moves it aside) and must go on to the others.
        LIMIT, ENTRY_LIMIT: TooLarge past that many directories, entries listed."""
        super().__init__(root_fd, limit, observer, entry_limit)
        self.refuse_unjudged = refuse_unjudged
        # the user's global core.hooksPath (userconfig.py): every repository's hooks too
        self.user_hooks = user_hooks
        self.roots = [os.path.abspath(root), os.path.realpath(root)]
        self.gitdirs: dict[str, GitDir] = {}
        self.controls: dict[str, Control] = {}
        self.pending: list[str] = []  # pointer targets inside root, to explore after the walk
        # (the root only when it has a .git or HEAD entry itself: with the ceiling above it,
        # git finds a repository there no other way, and asking costs a tool sandbox)
        self.candidates: dict[str, None] = {}
        # directories where git would meet a FIFO (or another non-regular file) as its
        # HEAD, config, commondir or .git: never a place to ask the host's git (it would
        # block there until its deadline), and neither is anything below one
        self.blocked: set[str] = set()

    def control(self, rel: str, role: Role, kind: Type) -> None:
        self.controls.setdefault(rel, Control(rel, role, kind))

    def follow(self, dir_fd: int, name: str, base: str, dotgit: bool) -> None:
        """Queue the gitdir a pointer file names, if it lies inside root."""
        data = read_small(dir_fd, name, POINTER_MAX)
        text = pointer_text(data, dotgit) if data is not None else None
        comps = place(self.roots, base, text) if text else None
        target = walk_beneath(self.root_fd, comps) if comps is not None else None
        if target is not None:
            self.pending.append(target)

    def run(self) -> Layout:
        self.walk_tree()
        return self.drain()

    def layout(self) -> Layout:
        return Layout(
            tuple(self.gitdirs.values()),
            tuple(self.controls.values()),
            tuple(self.unreadable),
            tuple(self.askable()),
        )

    def askable(self) -> list[str]:
        """The candidates where the host's git may be asked: none at or below a
        directory whose git files are not regular files (git discovers upwards)."""
        if not self.blocked:
            return list(self.candidates)
        return [
            c
            for c in self.candidates
            if not any(c == b or c.startswith(b + "/") or not b for b in self.blocked)
        ]

    def _nonregular(self, rel: str, entries: Mapping[str, Type], where: str) -> None:
        """A HEAD, config or commondir in REL that is a FIFO, socket or device: WHERE
        (the work tree git would be run in) is no place to ask git; a HEAD is kept as
        a control entry (judged and moved aside after a run, like the others)."""
        bad = [n for n in _BLOCKING if entries.get(n) == "other"]
        if bad:
            self.blocked.add(where)
        if "HEAD" in bad:
            self.control(join(rel, "HEAD"), "head", "other")

    def inside(self, path: str) -> list[str] | None:
        """Components of an absolute host path beneath root; None: outside it."""
        return place(self.roots, "", path)

    def _in_dir(self, rel: str, fn: Callable[[int, str, dict[str, Type]], object]) -> None:
        """FN(fd, rel, entries) for the directory REL; one that cannot be listed is
        reported, one that is gone is skipped."""
        try:
            fd = open_dir(self.root_fd, rel)
        except (OSError, ValueError):
            return
        try:
            fn(fd, rel, list_dir(fd))
        except OSError:
            self.unreadable.append(rel)
        finally:
            os.close(fd)

    def visit_known(self, rel: str) -> None:
        """One directory named from outside the walk (a gitlink in an index), reached
        through O_PATH steps: its parents need not be listable."""
        self._in_dir(rel, self.visit)
        self.drain()

    def config_file(self, comps: list[str]) -> str | None:
        """A file git reads as config: judged like one. Returns its relative path (or
        that of the symlink on the way to it)."""
        found = locate(self.root_fd, comps)
        if found is not None:
            self.control(found[0], "include", found[1])
        return found[0] if found else None

    def drain(self) -> Layout:
        while self.pending:
            rel = self.pending.pop()
            if rel not in self.gitdirs:
                self._in_dir(rel, self.explore_gitdir)
        return self.layout()

    def visit(self, fd: int, rel: str, entries: dict[str, Type]) -> list[str]:
        """One work-tree directory: its .git entry, itself as a bare repository."""
        kind = entries.get(".git")
        if kind is not None or "HEAD" in entries:
            self.candidates.setdefault(rel)
        self._nonregular(rel, entries, rel)
        if kind == "other":
            self.blocked.add(rel)
        if kind is not None:
            dotgit = join(rel, ".git")
            self.control(dotgit, "dotgit", kind)
            if kind == "dir":
                gfd = os.open(".git", O_DIR, dir_fd=fd)
                try:
                    self.explore_gitdir(gfd, dotgit, list_dir(gfd), worktree=rel)
                finally:
                    os.close(gfd)
            elif kind == "file":
                self.follow(fd, ".git", rel, dotgit=True)
        bare = is_git_directory(fd, entries)
        if bare:
            self.explore_gitdir(fd, rel, entries, worktree=rel)
        return [
            n
            for n, k in entries.items()
            if k == "dir" and n != ".git" and not (bare and n == "objects")
        ]

    def explore_gitdir(
        self, fd: int, rel: str, entries: dict[str, Type], worktree: str | None = None
    ) -> None:
        """One gitdir; ``worktree``: where its hooks run, when known (for core.hooksPath)."""
        if rel in self.gitdirs:
            return
        self.gitdirs[rel] = GitDir(rel, "commondir" in entries, "hooks" in entries)
        self._nonregular(rel, entries, worktree if worktree is not None else rel)
        for name, kind in entries.items():
            sub = join(rel, name)
            if name.startswith("config"):
                self.control(sub, "config", kind)
            elif name == "commondir":
                self.control(sub, "commondir", kind)
                if kind == "file":
                    self.follow(fd, name, rel, dotgit=False)
            elif name == "gitdir":
                self.control(sub, "backlink", kind)
            elif name in ("hooks", "modules", "worktrees"):
                self.control(sub, cast(Role, name), kind)
                if kind == "dir":
                    self.below(fd, name, sub, name, 0)
        for name in ("config", "config.worktree"):
            if entries.get(name) == "file":
                self.read_config(fd, rel, name, worktree, 0)
        if self.user_hooks and not self.user_hooks.startswith("~"):
            # relative: from the work tree (a bare repository's: the gitdir), as git runs hooks
            self.hooks_dir(
                place(self.roots, rel if worktree is None else worktree, self.user_hooks)
            )

    def read_config(self, fd: int, rel: str, name: str, worktree: str | None, depth: int) -> None:
        """What a config file (the user's own: it is pinned) makes git read or run from
        the tree: the files it includes, transitively, and core.hooksPath's directory
        — e.g. husky's ``.husky/_``, whose files run like hooks."""
        data = read_small(fd, name, CONFIG_MAX)
        if data is None:
            return
        parsed = payloadparse.git_config(data)  # apart from boxyd, within a budget
        if isinstance(parsed, payloadparse.Hostile):  # what it includes is unknown
            if not self.refuse_unjudged:
                return  # the scan's judge finds it not judged and moves it aside
            raise SetupError(
                f"git guard: {join(rel, name)}: could not be judged ({parsed.why}); "
                "the run is refused (check the file, or pass --allow-git-write)"
            )
        entries = parsed.entries
        for e in entries:
            if (
                e.name == "path"
                and e.value
                and (e.section == "include" and e.subsection is None or e.section == "includeif")
            ):
                self.include(rel, e.value, worktree, depth + 1)
        paths = [
            e.value
            for e in entries
            if (e.section, e.subsection, e.name) == ("core", None, "hookspath") and e.value
        ]
        if not paths or paths[-1].startswith("~") or (worktree is None and paths[-1][0] != "/"):
            return  # ~ is $HOME, outside the tree; a relative one needs the work tree
        self.hooks_dir(place(self.roots, worktree or "", paths[-1]))

    def include(self, base: str, path: str, worktree: str | None, depth: int) -> None:
        """An included file, relative to the including file's directory (config.c
        handle_path_include); every includeIf counts, whatever its condition."""
        if depth > MAX_INCLUDE_DEPTH or path.startswith("~"):
            return  # git stops there too; ~ is $HOME, outside every work tree
        self._claim(
            place(self.roots, base, path),
            "include",
            "file",
            lambda fd, parent, leaf: self.read_config(fd, parent, leaf, worktree, depth),
        )

    def hooks_dir(self, comps: list[str] | None) -> None:
        """core.hooksPath's directory (or the first symlink on the way to it)."""
        self._claim(
            comps,
            "hookspath",
            "dir",
            lambda fd, parent, leaf: self.below(fd, leaf, join(parent, leaf), "hooks", 0),
        )

    def _claim(
        self, comps: list[str] | None, role: Role, want: Type, then: Callable[[int, str, str], None]
    ) -> None:
        """Record the entry COMPS names (or the first symlink on the way to it) as ROLE;
        when it is a WANT, THEN(parent_fd, parent, name). A symlink is judged as it
        stands, never followed."""
        found = locate(self.root_fd, comps) if comps is not None else None
        if found is None or found[0] in self.controls:
            return
        target, kind = found
        self.control(target, role, kind)
        if kind != want:
            return
        parent, _, leaf = target.rpartition("/")
        try:
            pfd = open_dir(self.root_fd, parent)
        except OSError:
            return
        try:
            then(pfd, parent, leaf)
        finally:
            os.close(pfd)

    def below(self, parent_fd: int, name: str, rel: str, area: str, depth: int) -> None:
        """The entries under hooks/ (all), worktrees/ (each a gitdir), modules/ (down
        to each submodule gitdir: names may hold slashes, and may nest, "a" and "a/b")."""
        if depth >= walk.MAX_DEPTH // 4:
            self.unreadable.append(rel)
            return
        try:
            fd = os.open(name, O_DIR, dir_fd=parent_fd)
        except OSError:
            self.unreadable.append(rel)
            return
        try:
            entries = list_dir(fd)
            if depth > 0 and area == "modules" and any(m in entries for m in _GITDIR_MARKERS):
                self.explore_gitdir(fd, rel, entries)
                entries = {
                    n: k for n, k in entries.items() if k == "dir" and n not in _GITDIR_INTERNALS
                }
            role = _AREA_ROLE[area]
            for n, k in entries.items():
                sub = join(rel, n)
                self.control(sub, role, k)
                if k != "dir":
                    continue
                if area == "worktrees":
                    cfd = os.open(n, O_DIR, dir_fd=fd)
                    try:
                        self.explore_gitdir(cfd, sub, list_dir(cfd))
                    finally:
                        os.close(cfd)
                else:
                    self.below(fd, n, sub, area, depth + 1)
        except OSError:
            self.unreadable.append(rel)
        finally:
            os.close(fd)


def layout(root: str, user_hooks: str | None = None) -> Layout:
    """Every gitdir and git control entry in the tree ``root`` (an absolute host path)."""
    root_fd = open_root(root)
    try:
        return Walker(root, root_fd, user_hooks=user_hooks).run()
    finally:
        os.close(root_fd)


# --- protections -----------------------------------------------------------------------


def _ancestors(rel: str) -> list[str]:
    comps = parts(rel)
    return ["/".join(comps[:i]) for i in range(1, len(comps))]


_PINNED = {"config", "config.worktree", "commondir", "gitdir"}


def plan_protections(lay: Layout) -> list[Protection]:
    """Pure: the mounts for a layout, parents before children."""
    out: dict[str, Protection] = {}

    def add(p: Protection) -> None:
        old = out.get(p.rel)
        if old is None or (old.kind == "self" and p.kind == "ro"):
            out[p.rel] = p  # ro is the stronger of the two, and a mount point as well

    for g in lay.gitdirs:
        if g.rel:  # "": root is itself a bare repository, and mounted anyway
            for a in _ancestors(g.rel):
                add(Protection(a, "self", True))
            add(Protection(g.rel, "self", True))
        if not g.has_hooks and not g.shares_common:
            # git reads hooks from the common dir only: a worktree gitdir needs none
            add(Protection(join(g.rel, "hooks"), "ro", True))
    for c in lay.controls:
        name = c.rel.rsplit("/", 1)[-1]
        pinned = c.role in ("dotgit", "hooks", "include", "hookspath") or (
            c.role in ("config", "commondir", "backlink") and name in _PINNED
        )
        if c.role in ("dotgit", "include", "hookspath"):
            # outside a gitdir: renaming a parent would carry the pinned entry away
            for a in _ancestors(c.rel):
                add(Protection(a, "self", True))
        if c.type == "symlink" and (
            pinned or c.role in ("module", "worktree", "modules", "worktrees")
        ):
            add(Protection(c.rel, "ro", False, symlink=True))
        elif c.role == "hookspath" and c.type == "dir":
            # a mount point: cannot be removed or swapped for a symlink; its files stay
            # writable (husky rewrites them) and are scanned after the run
            add(Protection(c.rel, "self", True))
        elif pinned and c.type in ("file", "other"):
            add(Protection(c.rel, "ro", False))
        elif c.role == "hooks" and c.type == "dir":
            add(Protection(c.rel, "ro", True))
    return sorted(out.values(), key=lambda p: p.rel.split("/"))


def protections(root: str) -> list[Protection]:
    """The mounts that pin the git control entries of the writable tree ``root``."""
    return plan_protections(layout(root))


def prepare(root: str, prots: Sequence[Protection] | None = None) -> list[str]:
    """Create each absent read-only directory (hooks/) so it can be pinned; returns them.

    Created as ``git init`` would (empty, 0755), through O_NOFOLLOW dir fds.
    """
    if prots is None:
        prots = protections(root)
    created: list[str] = []
    root_fd = open_root(root)
    try:
        for p in prots:
            if p.kind != "ro" or not p.is_dir or p.symlink:
                continue
            parent, _, name = p.rel.rpartition("/")
            pfd = open_dir(root_fd, parent)
            try:
                try:
                    os.mkdir(name, 0o755, dir_fd=pfd)
                except FileExistsError:
                    continue  # present (a symlink there is refused when mounting)
                fd = os.open(name, O_DIR, dir_fd=pfd)
                try:
                    os.fchmod(fd, 0o755)  # whatever the daemon's umask
                finally:
                    os.close(fd)
                created.append(p.rel)
            finally:
                os.close(pfd)
    finally:
        os.close(root_fd)
    return created
