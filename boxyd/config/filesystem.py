"""build_spec's filesystem step: the host paths exposed (ro, rw, mkdir), protected and
revealed, the files copied in, the fresh tmpfs directories; and the profile's package
cache, made before anything else is decided.

A path from the profile that is wrong is a ProfileError naming the profile's key, one
from a flag a UsageError naming the flag. Reads the filesystem (stat, realpath, the
exposed trees walked for sockets); writes only the package cache (prepare_caches).
Placing copies and tmpfs directories is pure.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from boxy import caches
from boxy.errors import BoxyError, ProfileError, UsageError
from boxy.pathcheck import shown
from boxy.request import RunOptions
from boxyd.config import exposure, hostconfig, hostrun
from boxyd.config.pathutil import absolute, contains, dedupe
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import READ_ONLY_TREES, CopyEntry, PathEntry

# (what names it in a message: "--ro" or "profile P: filesystem.ro"; the entry)
Labelled = tuple[str, PathEntry]
LabelledCopy = tuple[str, CopyEntry]


@dataclass
class Filesystem:
    """RunSpec's filesystem fields (same names)."""

    ro: list[PathEntry]
    rw: list[PathEntry]
    mkdir: list[PathEntry]
    protect: list[PathEntry]
    reveal: list[str]
    edit_config: list[str]
    allow_host_config: list[str]
    secrets: list[str]
    copy: list[CopyEntry]
    copy_ro: list[CopyEntry]
    tmpfs: list[str]
    review: bool
    generated: list[str]


def prepare_caches(prof: Profile, workdir: str, home: str) -> None:
    """The profile's package cache: boxy's own directory, made here (the sandbox binds it)."""
    for entry in prof.mkdir:
        if caches.is_cache(entry.path, home):
            try:
                caches.prepare(entry.path, workdir, home)
            except (OSError, BoxyError) as e:
                raise UsageError(
                    f"profile {prof.source}: the package cache {entry.path}: {e}; "
                    "`boxyctl cache clean` removes it"
                ) from None


def decide(
    o: RunOptions,
    prof: Profile,
    *,
    cwd: str,
    workdir: str,
    home: str,
    uid: int,
    client_env: Mapping[str, str],
    notes: list[str],
    warnings: list[str] | None = None,
) -> Filesystem:
    """The filesystem of a run with flags O (relative paths against CWD) and profile
    PROF in WORKDIR; refused when it would expose a credential's socket or tree."""
    ro = check_paths("ro", prof, o.ro, cwd, notes)
    rw = check_paths("rw", prof, o.rw, cwd, notes)
    mkdir = check_paths("mkdir", prof, o.mkdir, cwd, notes)
    for _, entry in ro:
        if any(e.path == entry.path for _, e in rw):
            raise UsageError(f"{entry.path}: exposed both read-only and read-write")
    writable = [workdir] + [os.path.realpath(e.path) for _, e in rw + mkdir]
    asked = [e for _, e in check_paths("protect", prof, o.protect, cwd, notes)]
    protect = check_protect(asked, writable, prof.source, notes)
    # lexical, not realpath'd: the entries they name are matched as the walk found them
    reveal = dedupe([e.path for e in prof.reveal] + [absolute(p, cwd) for p in o.reveal])
    missing_reveals(o.reveal, cwd, notes if warnings is None else warnings)
    edit_config = check_edit_config(o.edit_config, cwd, writable)
    exposed = [("workdir", workdir)] + [(label, e.path) for label, e in ro + rw + mkdir]
    exposure.check_exposed(exposed, exposure.sensitive_paths(client_env, home, uid))
    written = [("workdir", workdir)] + [(label, e.path) for label, e in rw + mkdir]
    exposure.check_writable(written, exposure.settings_paths(client_env, home))
    check_workdir_writable(o.workdir, cwd, workdir)
    allowed = check_host_config(
        written, o.allow_host_config, cwd, home, client_env, notes if warnings is None else warnings
    )
    for label, path in exposed[1:]:
        exposure.refuse_sockets(label, path)
    review = o.review or bool(prof.review)
    if review:
        check_held_names(rw + mkdir, workdir)
    copies = check_copies(flag_copies(o, cwd) + profile_copies(prof), notes)
    trees = [workdir] + [e.path for _, e in ro + rw + mkdir]
    copy, copy_ro = place_copies(copies, trees)
    return Filesystem(
        ro=[e for _, e in ro],
        rw=[e for _, e in rw],
        mkdir=[e for _, e in mkdir],
        protect=protect,
        reveal=reveal,
        edit_config=edit_config,
        allow_host_config=allowed,
        secrets=list(prof.secrets),
        copy=copy,
        copy_ro=copy_ro,
        tmpfs=check_tmpfs(prof, trees, home),
        review=review,
        generated=list(prof.generated),
    )


def missing_reveals(flags: Sequence[str], cwd: str, warnings: list[str]) -> None:
    """A --reveal naming nothing is most likely a typo, said in one line; not refused:
    a file the run itself creates (a generated .env) is revealed when it appears."""
    for p in flags:
        path = absolute(p, cwd)
        if not os.path.lexists(path):
            warnings.append(
                f"--reveal {path}: no such file or directory (yet); "
                "it is revealed if the run creates it"
            )


def check_edit_config(flags: Sequence[str], cwd: str, writable: list[str]) -> list[str]:
    """--edit-config: absolute, lexical (matched as the walk finds entries), each a
    held entry itself (config/hostrun.py) in a writable tree (realpath'd: WRITABLE):
    a path inside a held directory, or one boxy does not hold, would leave more (or
    less) than the user named."""
    out = []
    for p in flags:
        path = absolute(p, cwd)
        parent = os.path.realpath(os.path.dirname(path))
        trees = [t for t in writable if contains(t, parent)]
        if not trees:
            raise UsageError(f"--edit-config {p}: not inside the work directory or a --rw path")
        tree = max(trees, key=len)
        full = os.path.join(parent, os.path.basename(path))
        rel = os.path.relpath(full, tree)
        above = hostrun.held_above(rel)
        if above is not None:
            raise UsageError(
                f"--edit-config {p}: lies in {os.path.join(tree, above)}, which is held "
                f"whole; name that"
            )
        if hostrun.match(rel) is None:
            raise UsageError(
                f"--edit-config {p}: not a file boxy holds (README, "
                '"Files host programs obey are held")'
            )
        out.append(full)
    return dedupe(out)


def check_held_names(writable: list[Labelled], workdir: str) -> None:
    """--review: a writable tree that is the work directory's, or holds it, is named
    by its own path (WORKDIR is realpath'd). By another name (a symlink on the way,
    LINK/sub or LINK/.. for LINK -> the work directory) it was a host tree of its own
    at that name in the sandbox, the host's work directory written as the run went
    beside the overlay (mountplan binds a tree from the overlay by the path it is
    named by: overlaid)."""
    for label, e in writable:
        real = os.path.realpath(e.path)
        if real != e.path and (contains(workdir, real) or contains(real, workdir)):
            raise _err(
                label.startswith("profile "),
                f"{label} {e.path}: is {real}, "
                f"{'inside' if contains(workdir, real) else 'around'} the work directory "
                f"--review holds, by another name (a symlink on the way); name it {real}",
            )


def check_workdir_writable(flag: str | None, cwd: str, workdir: str) -> None:
    """The work directory is the run's writable project: one you cannot write (-w /etc,
    a run started in /usr/share) is no project, refused in one line (after the
    exposure checks: from / or your home, what it would expose is the line to say)."""
    if os.access(workdir, os.W_OK):
        return
    what = "--workdir" if flag else "the current directory"
    cd = "pass -w PATH" if flag else "cd into a project or pass -w PATH"
    raise UsageError(
        f"{what} {shown(absolute(flag or cwd, cwd))}: not writable by you, and the work "
        f"directory is the run's writable project; {cd} (--ro exposes a directory read-only)"
    )


def check_host_config(
    written: list[tuple[str, str]],
    flags: Sequence[str],
    cwd: str,
    home: str,
    client_env: Mapping[str, str],
    said: list[str],
) -> list[str]:
    """Refuse a writable tree (WRITTEN: label, path) that is, lies in or holds a place
    whose files a host program obeys unasked: one of your home's (config/hostconfig.py:
    ~/.ssh, the shell's rc files, ~/.local/bin …), or a file or directory that a
    project's tools obey (config/hostrun.py: a --rw on a project's .claude/ itself is no
    tree the held files' rules see from above). --allow-host-config PATH (FLAGS), naming
    the tree or the place, allows it, said in a line (SAID); one that allows nothing is
    refused as a typo. Returns the trees allowed so (realpath'd)."""
    resolve = hostconfig.resolver()
    known = hostconfig.resolved(hostconfig.places(home, (client_env, os.environ)), resolve)
    asked = {os.path.realpath(absolute(p, cwd)): p for p in flags}
    used: set[str] = set()
    allowed: dict[str, str] = {}
    for label, tree in written:
        real = os.path.realpath(tree)
        for verb, place in [*hostconfig.touched(tree, known, resolve), *_held_root(real, home)]:
            named = {real, resolve(place.path)} & asked.keys()
            if not named:
                raise UsageError(
                    f"{label} {tree}: {verb} {place.path}, and {place.why()}: the host "
                    f"would obey what the run writes there; --allow-host-config {tree} "
                    "allows it"
                )
            used |= named
            allowed.setdefault(real, place.why())
    for real, p in asked.items():
        if real not in used:
            raise UsageError(
                f"--allow-host-config {p}: allows nothing (no writable tree of this run is, "
                "lies in or holds a place whose files host programs obey)"
            )
    said += [f"--allow-host-config: the run may write {t}, where {w}" for t, w in allowed.items()]
    return list(allowed)


def _held_root(real: str, home: str) -> list[tuple[str, hostconfig.Place]]:
    """A writable tree that is itself a file or directory a project's tools obey, or
    lies in one (judged by its whole path, config/hostrun.py): its own walk starts
    inside it, where no name is held. ~/.claude is exposure.settings_paths' (its
    projects/, the transcripts, is no settings)."""
    if contains(os.path.join(home, ".claude"), real):
        return []
    rel = real.lstrip("/")
    above = hostrun.held_above(rel)
    held, top = (hostrun.match(rel), rel) if above is None else (hostrun.match(above), above)
    if held is None:
        return []
    verb = "is" if top == rel else "lies in"
    return [(verb, hostconfig.Place("/" + top, held.tool, held.runs))]


def _err(from_profile: bool, message: str) -> UsageError:
    return ProfileError(message) if from_profile else UsageError(message)


def check_paths(
    kind: str, prof: Profile, flags: Sequence[str], cwd: str, notes: list[str]
) -> list[Labelled]:
    """The profile's entries of KIND (ro, rw, mkdir, protect), then the flags', each
    path once: a path must exist (mkdir: be a directory if it does); an optional
    profile entry that is absent is skipped, with a note."""
    entries = [(f"profile {prof.source}: filesystem.{kind}", e, True) for e in getattr(prof, kind)]
    entries += [(f"--{kind}", PathEntry(absolute(p, cwd)), False) for p in flags]
    out: list[Labelled] = []
    for label, entry, from_profile in entries:
        if any(e.path == entry.path for _, e in out):
            continue
        problem = check_mkdir(entry.path) if kind == "mkdir" else check_exposed(kind, entry.path)
        if problem == ABSENT and entry.optional:
            # a preset's protect list names every tool's files: most are absent in any
            # one project, so saying each one would be eight lines on every -v run
            if kind != "protect":
                notes.append(f"{label} {entry.path}: absent; skipped")
            continue
        if problem is not None:
            raise _err(from_profile, f"{label} {entry.path}: {problem}")
        out.append((label, entry))
    return out


ABSENT = "no such file or directory"


def check_exposed(kind: str, path: str) -> str | None:
    """Why PATH cannot be exposed (ro, rw) or protected, or None: it must exist and be
    readable by the user (boxyd runs as the user and walks it before the start; a tree
    it cannot read would fail there, late), and writable for --rw."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ABSENT
    except PermissionError:
        return "not readable by you (a directory above it is closed to you)"
    except OSError as e:
        return e.strerror or str(e)
    need = os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)
    if not os.access(path, need):
        return "not readable by you"
    if kind == "rw" and not os.access(path, os.W_OK):
        return "not writable by you; --ro exposes it read-only"
    return None


def check_mkdir(path: str) -> str | None:
    """Why a --mkdir PATH cannot be made (or used when it exists), or None: boxyd makes
    it as the user before the start, so its nearest existing ancestor must be a
    directory the user can write in."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        return f"cannot be looked at ({e.strerror or e}); a directory above it is closed to you"
    else:
        if not stat.S_ISDIR(st.st_mode):
            return "exists and is not a directory"
        if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
            return "exists and is not writable by you"
        return None
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot be made: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be made: {parent} is not writable by you"
    return None


def check_protect(
    entries: list[PathEntry], writable: list[str], source: str, notes: list[str]
) -> list[PathEntry]:
    """Protect entries, realpath'd: each must lie in a writable tree (WRITABLE,
    realpath'd) and not be a symlink (one cannot be pinned read-only). An optional
    entry is the profile's (SOURCE): one leading outside is skipped, with a note."""
    out: list[PathEntry] = []
    for entry in entries:
        if os.path.islink(entry.path) and entry.optional:  # a preset's tools' file
            # refused, not skipped: a symlink cannot be pinned, and one a payload planted
            # is exactly what the protection is for
            raise UsageError(
                f"profile {source}: {entry.path} is a symlink, which cannot be made "
                "read-only (an earlier run may have planted it); look at it and "
                "remove it"
            )
        if os.path.islink(entry.path):
            raise UsageError(f"--protect {entry.path}: is a symlink; name what it points to")
        real = os.path.realpath(entry.path)
        inside = any(contains(tree, real) for tree in writable)
        if not inside and entry.optional:
            # a preset's venv pip.conf through a .venv symlink to elsewhere: not writable
            # inside (the sandbox does not see where it points), so nothing to protect
            notes.append(f"protect {entry.path}: leads outside the writable trees; skipped")
            continue
        if not inside:
            raise UsageError(
                f"--protect {entry.path}: not inside the work directory or a --rw path"
            )
        out.append(PathEntry(real, entry.optional))
    return out


def flag_copies(o: RunOptions, cwd: str) -> list[LabelledCopy]:
    """--copy and --copy-ro as entries (DST defaults to SRC and must be absolute)."""
    out: list[LabelledCopy] = []
    for items, flag in ((o.copy, "--copy"), (o.copy_ro, "--copy-ro")):
        for item in items:
            dst = item.dst
            src_path = absolute(item.src, cwd)
            if dst is not None and not dst.startswith("/"):
                raise UsageError(f"{flag} {item.src}:{dst}: the destination must be absolute")
            out.append((flag, CopyEntry(src_path, os.path.normpath(dst or src_path))))
    return out


def profile_copies(prof: Profile) -> list[LabelledCopy]:
    out = [(f"profile {prof.source}: filesystem.copy", e) for e in prof.copy]
    return out + [(f"profile {prof.source}: filesystem.copy_ro", e) for e in prof.copy_ro]


def check_copies(copies: list[LabelledCopy], notes: list[str]) -> list[LabelledCopy]:
    """Flag copies, then profile copies, checked: each source a readable regular file,
    each destination once and never on a read-only tree; a flag replaces a profile
    copy to the same destination (the seed's --copy other.json:$HOME/.claude.json)."""
    out: list[LabelledCopy] = []
    seen: dict[str, str] = {}
    for label, entry in copies:
        from_profile = label.startswith("profile ")
        if entry.dst in seen:
            if from_profile and not seen[entry.dst].startswith("profile "):
                notes.append(f"{label} {entry.src}: replaced by {seen[entry.dst]} to {entry.dst}")
                continue
            raise _err(from_profile, f"{label} {entry.src}: a second copy to {entry.dst}")
        try:
            st = os.stat(entry.src)
        except OSError:
            if entry.optional:
                notes.append(f"{label} {entry.src}: absent; skipped")
                continue
            raise _err(from_profile, f"{label} {entry.src}: no such file or directory") from None
        if not stat.S_ISREG(st.st_mode):
            raise _err(from_profile, f"{label} {entry.src}: not a regular file")
        if not os.access(entry.src, os.R_OK):
            raise _err(from_profile, f"{label} {entry.src}: not readable by you")
        check_destination(label, entry, from_profile)
        seen[entry.dst] = label
        out.append((label, entry))
    return out


def check_destination(label: str, entry: CopyEntry, from_profile: bool) -> None:
    """A copy lands on the sandbox's own tmpfs: a file, never on a read-only tree."""
    if entry.dst == "/":
        raise _err(from_profile, f"{label} {entry.src}:/: the destination must name a file")
    for tree in READ_ONLY_TREES:
        if contains(tree, entry.dst):
            raise _err(
                from_profile,
                f"{label} {entry.src}:{entry.dst}: the destination lies on "
                f"the sandbox's read-only {tree}; copy it under $HOME or /tmp",
            )


def place_copies(
    copies: list[LabelledCopy], trees: list[str]
) -> tuple[list[CopyEntry], list[CopyEntry]]:
    """(copy, copy_ro): each copy's destination outside every exposed tree (TREES)."""
    copy: list[CopyEntry] = []
    copy_ro: list[CopyEntry] = []
    for label, entry in copies:
        for tree in trees:
            if contains(tree, entry.dst):
                raise UsageError(
                    f"{label} {entry.src}:{entry.dst}: the destination lies inside the exposed "
                    f"path {tree}; a copy goes onto the sandbox's own tmpfs"
                )
        read_only = label.endswith("copy_ro") or label == "--copy-ro"
        (copy_ro if read_only else copy).append(entry)
    return copy, copy_ro


def check_tmpfs(prof: Profile, trees: list[str], home: str) -> list[str]:
    """filesystem.tmpfs: each path on the sandbox's own tmpfs, never on a tree that
    is bound in (an exposed path, the system's read-only trees, /proc, /dev)."""
    out: list[str] = []
    for path in prof.tmpfs:
        label = f"profile {prof.source}: filesystem.tmpfs {path}"
        if path in (home, "/tmp", "/dev/shm"):
            raise ProfileError(f"{label}: already a fresh tmpfs")
        for tree in (*READ_ONLY_TREES, *trees):
            if contains(tree, path) or contains(path, tree):
                raise ProfileError(
                    f"{label}: overlaps {tree}, which is bound in; a tmpfs goes "
                    "on the sandbox's own filesystem (under $HOME, /tmp, /opt …)"
                )
        if path not in out:
            out.append(path)
    return out
