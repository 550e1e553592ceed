"""A session's review layers (--review; docs/design.md, "Changes held for review"):
$XDG_STATE_HOME/boxy/review/<id>/ holds ``upper`` (where the payload's writes to the
work directory land), ``work`` (overlayfs's own) and ``review.json`` (the work
directory, the stamp the host's changes are judged against, what the run allowed).
Each level 0700 and checked. Kept apart from the session's record, whose retention
would prune it: a review lives until it is applied or discarded.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from boxy import values
from boxy.errors import UsageError
from boxy.paths import ensure_private_dir, state_dir
from boxyd.config.runspec import RunSpec

META = "review.json"
META_MAX = 1 << 20


@dataclass
class Review:
    """What apply and diff need of a held session (review.json)."""

    id: str
    workdir: str
    since_ns: int  # the stamp's ctime: a host entry changed at or after it is refused
    generated: list[str] = field(default_factory=list)
    allow_git_write: bool = False
    edit_config: list[str] = field(default_factory=list)
    size: list[int] | None = None  # [bytes, entries] of the layer as the run ended
    # [st_dev, st_ino] of the work directory, the overlay's lower layer: diff and apply
    # read and land in that directory alone (reviewtree.open_workdir); None: an older review
    ident: list[int] | None = None

    @property
    def dir(self) -> Path:
        return root() / self.id

    @property
    def upper(self) -> str:
        return str(self.dir / "upper")


def root() -> Path:
    return ensure_private_dir(ensure_private_dir(state_dir()) / "review")


def _inside(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/")


def prepare(sid: str, spec: RunSpec) -> tuple[str, str]:
    """The session's layers, made before its plan: (upper, work), real paths. Refused
    in one line where the work directory holds boxy's state (overlayfs refuses layers
    inside one another)."""
    base = os.path.realpath(root())
    if _inside(base, spec.workdir):
        raise UsageError(
            f"--review: the work directory {spec.workdir} holds boxy's state ({base}); "
            "run it in a project directory"
        )
    d = ensure_private_dir(Path(base) / sid)
    upper, work = ensure_private_dir(d / "upper"), ensure_private_dir(d / "work")
    stamp = d / "stamp"
    fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        since = os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
    st = os.stat(spec.workdir)
    meta = Review(
        sid, spec.workdir, since, list(spec.generated), spec.allow_git_write,
        [os.path.relpath(p, spec.workdir) for p in spec.edit_config if _inside(p, spec.workdir)],
        ident=[st.st_dev, st.st_ino],
    )  # fmt: skip
    _write(d, meta)
    return str(upper), str(work)


def _write(d: Path, meta: Review) -> None:
    tmp = d / (META + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(meta.__dict__, f)
    os.replace(tmp, d / META)


def get(sid: str) -> Review | None:
    """Session SID's review, or None when it has none (never had, applied, discarded)."""
    d = root() / sid
    try:
        fd = os.open(d / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = json.loads(f.read(META_MAX))
    return Review(**raw)


def held() -> set[str]:
    """The ids of every session held for review. Asked by every List and show: it
    looks, and makes nothing (root() makes the directory, for a run that reviews)."""
    base = state_dir() / "review"
    try:
        return {n for n in os.listdir(base) if (base / n / META).exists()}
    except OSError:
        return set()


def shown(sid: str) -> str | None:
    """What `show` says of session SID's review: 'held (12MiB in 340 entries)', or
    None when it holds none."""
    r = get(sid) if (state_dir() / "review" / sid / META).exists() else None
    if r is None:
        return None
    size = described(r)
    return f"held ({size})" if size else "held"


def discard(sid: str) -> None:
    """Drop session SID's layers. overlayfs leaves its work/work at mode 0, and the
    payload may leave a directory of the upper layer so: each made the owner's again
    first (rmtree would stop at it)."""
    d = root() / sid
    os.unlink(d / META)  # first: half a removal is no review any more
    _owners(os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
    shutil.rmtree(d)


def _owners(top: int) -> None:
    """Every directory beneath the directory fd TOP (taken) made 0700, top down, by
    fd: the session has ended, and no symlink is followed (O_PATH|O_NOFOLLOW, the
    mode set through the fd's /proc link, which names that directory alone)."""
    stack = [top]
    try:
        while stack:
            fd = stack.pop()
            try:
                for e in os.scandir(fd):
                    if not e.is_dir(follow_symlinks=False):
                        continue
                    sub = os.open(
                        e.name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                    )
                    try:
                        if stat.S_IMODE(os.fstat(sub).st_mode) & stat.S_IRWXU != stat.S_IRWXU:
                            os.chmod(f"/proc/self/fd/{sub}", stat.S_IRWXU)
                        stack.append(
                            os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=sub)
                        )
                    finally:
                        os.close(sub)
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)


def after_run(sid: str, size: tuple[int, int] | None = None) -> str:
    """The run's last word on its review: an upper layer left empty is dropped; SIZE,
    (bytes, entries) as measured after the run (reviewwatch), kept with the review."""
    r = get(sid)
    if r is None:
        return "--review: nothing was held"
    try:
        empty = not os.listdir(r.upper)
    except OSError:
        empty = False
    if empty:
        discard(sid)
        return f"--review: the payload changed nothing in {r.workdir}"
    held = ""
    if size is not None:
        r.size = list(size)
        _write(r.dir, r)
        held = f" ({described(r)})"
    return (
        f"--review: its changes to {r.workdir} are held{held}: `boxyctl diff {sid}`, then "
        f"`boxyctl apply {sid} [PATH...]` or `boxyctl discard {sid}`"
    )


def described(r: Review) -> str:
    """'12MiB in 340 entries' as the layer was when the run ended; '' unmeasured."""
    if not r.size:
        return ""
    entries = f"{r.size[1]:,} entries" if r.size[1] != 1 else "1 entry"
    return f"{values.format_size(r.size[0])} in {entries}"
