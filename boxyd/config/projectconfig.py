"""A project's own configuration, and the approvals that let it widen the sandbox.

Three kinds of file in the work directory, which the payload can write, say how the
next run should look: `.boxy.yaml` (the project's profile and settings), `.npmrc` at
npm's project root, and `pip.conf` of a virtual environment in the project (the
registries they name). They are executable input: what of them would widen the
sandbox applies only once a person approved it for that work directory
(`boxyctl trust`, recorded by hash under $XDG_CONFIG_HOME/boxy/trust/). An approval
commits to every key that could widen (widening.approval_view) and to the
registries named, so a change to those needs approval again; until then the run
takes only what is no wider than the defaults and says what it held back.

Read once, as data: beneath the work directory with no symlink in any component
(openat2), non-blocking (a FIFO fails at once), a regular file of bounded size; the
bytes that were judged are the bytes applied.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import itertools
import json
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boxy.digest import sha256
from boxy.errors import ProfileError, UsageError
from boxy.paths import PROJECT_CONFIG, ensure_private_dir
from boxyd.config import parsedoor, profiles, widening
from boxyd.config import projectregistries as pr
from boxyd.config.parsedoor import Hostile, Job, Kind, as_pairs
from boxyd.config.projectregistries import ProjectRegistry
from boxyd.kernel.openat import open_beneath

NAME = PROJECT_CONFIG
MAX_SIZE = 64 << 10
VENV_MARK = "pyvenv.cfg"
MAX_ENTRIES = 4096  # of the work directory looked at for virtual environments


def read_data(workdir: str, rel: str, *, strict: bool) -> bytes | None:
    """The bytes of WORKDIR/REL, or None when it is absent. Anything else that is not
    a small regular file reached without a symlink is a UsageError when STRICT (the
    project's own .boxy.yaml: said, never followed or read past), else None."""
    where = f"{workdir}/{rel}"
    try:
        dirfd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fd = open_beneath(dirfd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    finally:
        os.close(dirfd)
    if fd < 0:
        if -fd in (errno.ENOENT, errno.ENOTDIR) or not strict:
            return None
        why = (
            "a symlink (never followed)" if -fd in (errno.ELOOP, errno.EXDEV) else os.strerror(-fd)
        )
        raise UsageError(f"{where}: {why}")
    try:
        st = os.fstat(fd)
        problem = (
            "not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else f"larger than {MAX_SIZE >> 10} KiB"
            if st.st_size > MAX_SIZE
            else None
        )
        content = os.read(fd, MAX_SIZE + 1) if problem is None else b""
    finally:
        os.close(fd)
    if problem is None and len(content) > MAX_SIZE:
        problem = f"larger than {MAX_SIZE >> 10} KiB"
    if problem is not None:
        if strict:
            raise UsageError(f"{where}: {problem}")
        return None
    return content


@dataclass(frozen=True)
class Project:
    workdir: str
    config: bytes | None = None  # .boxy.yaml as read, or None
    registries: tuple[ProjectRegistry, ...] = field(default_factory=tuple)
    view: Any = None  # what an approval of .boxy.yaml commits to (widening.approval_view)
    # why .boxy.yaml could not be read as data (a symlink, a FIFO, too large): a run
    # says it in one line and goes on without it; `boxyctl trust` refuses
    unreadable: str | None = None
    doc: dict[str, Any] | None = None  # .boxy.yaml parsed (profiles.project_doc), if it was
    doc_error: str | None = None  # why it was not (a ProfileError's line)

    @property
    def path(self) -> str:
        return os.path.join(self.workdir, NAME)

    @property
    def empty(self) -> bool:
        return self.config is None and not self.registries

    @property
    def digest(self) -> str:
        """What an approval commits to: the widening part of .boxy.yaml and the
        registries named, canonically encoded."""
        body = {"boxy": self.view, "registries": [r.wire() for r in self.registries]}
        return sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    @property
    def text(self) -> str:
        return self.config.decode(errors="replace") if self.config is not None else ""


def read(workdir: str, env: Mapping[str, str] | None = None, *, strict: bool = True) -> Project:
    """The project's configuration as the next run would see it (the payload starts
    in the work directory, npm's project root). ENV is what npm expands ${VAR} with
    and where $VIRTUAL_ENV is read. STRICT: a .boxy.yaml that cannot be read as data
    is a UsageError (`boxyctl trust`); else it is left out and named in UNREADABLE
    (a run: the payload planted it, and it must not stop every later run)."""
    try:
        config = read_data(workdir, NAME, strict=True)
    except UsageError as e:
        if strict:
            raise
        return Project(
            workdir, None, tuple(_registries(workdir, env or {})), None, unreadable=str(e)
        )
    view: Any = None
    doc, error = None, None
    if config is not None:
        doc, error = project_doc(config, os.path.join(workdir, NAME))
        try:
            view = widening.approval_view(doc) if doc is not None else None
            json.dumps(view, sort_keys=True)
        except (UsageError, TypeError, ValueError):
            view = None
        if view is None:  # not valid: an approval commits to the bytes
            view = {"unparsed": sha256(config).hexdigest()}
    registries = tuple(_registries(workdir, env or {}))
    return Project(workdir, config, registries, view, doc=doc, doc_error=error)


def replace_data(workdir: str, rel: str, data: bytes, *, was: bytes | None) -> None:
    """WORKDIR/REL becomes DATA at once (a new file renamed over it), only if it still
    holds WAS (None: absent) as read_data reads it: the payload can write the work
    directory, so nothing is followed, and what it put there meanwhile is refused, not
    overwritten. UsageError when it changed or cannot be written."""
    where = f"{workdir}/{rel}"
    if read_data(workdir, rel, strict=True) != was:
        raise UsageError(f"{where} changed while boxy read it: not written")
    dirfd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    tmp = f".{rel}.boxy-{os.getpid()}-{time.monotonic_ns()}"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644, dir_fd=dirfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, rel, src_dir_fd=dirfd, dst_dir_fd=dirfd)  # a symlink there is replaced
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dirfd)
        raise UsageError(f"{where}: could not be written ({e.strerror})") from None
    finally:
        os.close(dirfd)


def project_doc(config: bytes, label: str) -> tuple[dict[str, Any] | None, str | None]:
    """.boxy.yaml (LABEL's bytes CONFIG) parsed through the door (parsedoor.py: apart
    from boxyd, within a budget): (the doc, None) or (None, why not, one line)."""
    got = parsedoor.parse(Job(Kind.PROJECT, label, config))
    if isinstance(got, Hostile):
        return None, f"profile {label}: could not be judged ({got.why})"
    if isinstance(got, dict) and isinstance(got.get("doc"), dict):
        return copy.deepcopy(got["doc"]), None  # (the door keeps the verdict it gave)
    if isinstance(got, dict) and isinstance(got.get("error"), str):
        return None, got["error"]
    return None, f"profile {label}: came back in no shape"


def _project_job(job: Job) -> dict[str, Any]:
    """Kind.PROJECT, in the parse child: the doc if it is plain data (JSON's: YAML's
    dates and the like are refused here, as no key of a profile takes one), or the
    ProfileError's line."""
    try:
        doc = profiles.project_doc(job.data.decode(errors="replace"), job.arg)
    except ProfileError as e:
        return {"error": str(e)}
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError):
        return {
            "error": f"profile {job.arg}: holds a value that is not plain data (a date, a number too long)"
        }
    return {"doc": doc}


def _npmrc_job(job: Job) -> list[tuple[str, str]]:
    env = json.loads(job.arg)
    return pr.parse_npmrc(job.data.decode(errors="replace"), env if isinstance(env, dict) else {})


def _pipconf_job(job: Job) -> list[tuple[str, str]]:
    return pr.parse_pip_conf(job.data.decode(errors="replace"))


parsedoor.register(Kind.PROJECT, _project_job)
parsedoor.register(Kind.NPMRC, _npmrc_job)
parsedoor.register(Kind.PIPCONF, _pipconf_job)


def _pairs(kind: Kind, arg: str, data: bytes, path: str) -> list[tuple[str, str]]:
    """A registry file's pairs through the door; one not judged gives none (its
    registries are not taken: the run says so)."""
    got = parsedoor.parse(Job(kind, arg, data))
    try:
        return [] if isinstance(got, Hostile) else as_pairs(got)
    except (TypeError, ValueError):
        return []


def run_env(home: str, user: str, client_env: Mapping[str, str]) -> dict[str, str]:
    """What `read` expands and looks in for a run of USER's: the sandbox's HOME and USER
    (npm inside expands ${VAR} with its own environment), and the client's
    $VIRTUAL_ENV. The run and `boxyctl trust` must read the project alike."""
    venv = {k: v for k, v in client_env.items() if k == "VIRTUAL_ENV"}
    return {"HOME": home, "USER": user, **venv}


def _registries(workdir: str, env: Mapping[str, str]) -> list[ProjectRegistry]:
    out: list[ProjectRegistry] = []
    data = read_data(workdir, pr.NPMRC, strict=False)
    if data is not None:
        path = os.path.join(workdir, pr.NPMRC)
        pairs = _pairs(Kind.NPMRC, json.dumps(dict(env)), data, path)
        out += pr.registries(path, "npm", pairs)
    for rel in _venvs(workdir, env):
        path = os.path.join(rel, pr.PIP_CONF)
        data = read_data(workdir, path, strict=False)
        if data is not None:
            full = os.path.join(workdir, path)
            out += pr.registries(full, "pip", _pairs(Kind.PIPCONF, "", data, full))
    return out


def _rel(workdir: str, path: str) -> str | None:
    if path == workdir:
        return ""
    return path[len(workdir) + 1 :] if path.startswith(workdir.rstrip("/") + "/") else None


def _venvs(workdir: str, env: Mapping[str, str]) -> list[str]:
    """Virtual environments pip could run from: each directory directly in the work
    directory holding pyvenv.cfg, and $VIRTUAL_ENV when it lies inside."""
    out: list[str] = []
    try:
        with os.scandir(workdir) as it:  # bounded: the payload can fill the directory
            entries = sorted(itertools.islice(it, MAX_ENTRIES), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and os.path.lexists(
            os.path.join(entry.path, VENV_MARK)
        ):
            out.append(entry.name)
    venv = _rel(workdir, os.path.normpath(env.get("VIRTUAL_ENV", "")))
    if venv and venv not in out:
        out.append(venv)
    return out


def trust_dir(config_home: str) -> Path:
    return Path(config_home) / "boxy" / "trust"


def _approval(project: Project) -> str:
    """One file per (work directory, what is approved): the name commits to both."""
    return sha256(f"{project.workdir}\0{project.digest}".encode()).hexdigest() + ".json"


def is_trusted(project: Project, config_home: str) -> bool:
    path = trust_dir(config_home) / _approval(project)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and record.get("workdir") == project.workdir
        and record.get("digest") == project.digest
    )


def approve(project: Project, config_home: str) -> Path:
    d = ensure_private_dir(trust_dir(config_home))  # ~/.config/boxy itself may be 0755
    path = d / _approval(project)
    tmp = d / f".{path.name}.tmp"
    record = {
        "workdir": project.workdir,
        "digest": project.digest,
        "approved_at": time.time(),
        "boxy_yaml": project.config is not None,
        "registries": [r.wire() for r in project.registries],
    }
    tmp.write_text(json.dumps(record) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def approvals(config_home: str) -> list[dict[str, Any]]:
    d = trust_dir(config_home)
    out = []
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            record = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("workdir"), str):
            out.append({**record, "file": p})
    return sorted(out, key=lambda r: (r["workdir"], r.get("approved_at", 0)))


def revoke(workdir: str, config_home: str) -> int:
    """Every approval for WORKDIR goes; how many there were."""
    gone = 0
    for record in approvals(config_home):
        if record["workdir"] == workdir:
            record["file"].unlink(missing_ok=True)
            gone += 1
    return gone
