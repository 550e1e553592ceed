"""A project's `.boxy.yaml`, and the approvals that let it apply.

The file sits in the work directory, which the payload can write: it is executable
input. It applies only once a person has approved that exact content for that work
directory (`boxyctl trust`, recorded by content hash under
$XDG_CONFIG_HOME/boxy/trust/); any change needs approval again. Until then every
key of it is held back, and the run says so in one line.

Read once, as data: no symlink followed, non-blocking (a FIFO fails at once), a
regular file of bounded size; the bytes that were judged are the bytes applied.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from boxy.errors import UsageError
from boxy.paths import ensure_private_dir

NAME = ".boxy.yaml"
MAX_SIZE = 64 << 10


@dataclass(frozen=True)
class ProjectConfig:
    workdir: str
    content: bytes

    @property
    def path(self) -> str:
        return os.path.join(self.workdir, NAME)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


def read(workdir: str) -> ProjectConfig | None:
    """WORKDIR/.boxy.yaml, or None when there is none; UsageError for one that is
    not a regular file or too large (said, never followed or read past)."""
    try:
        dirfd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fd = os.open(NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "a symlink (never followed)" if e.errno == errno.ELOOP else e.strerror
        raise UsageError(f"{workdir}/{NAME}: {why}") from None
    finally:
        os.close(dirfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{workdir}/{NAME}: not a regular file")
        if st.st_size > MAX_SIZE:
            raise UsageError(f"{workdir}/{NAME}: larger than {MAX_SIZE >> 10} KiB")
        content = os.read(fd, MAX_SIZE + 1)
    finally:
        os.close(fd)
    if len(content) > MAX_SIZE:
        raise UsageError(f"{workdir}/{NAME}: larger than {MAX_SIZE >> 10} KiB")
    return ProjectConfig(workdir, content)


def trust_dir(config_home: str) -> Path:
    return Path(config_home) / "boxy" / "trust"


def _approval(cfg: ProjectConfig) -> str:
    """One file per (work directory, content): the name commits to both."""
    return hashlib.sha256(f"{cfg.workdir}\0{cfg.digest}".encode()).hexdigest() + ".json"


def is_trusted(cfg: ProjectConfig, config_home: str) -> bool:
    path = trust_dir(config_home) / _approval(cfg)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return record.get("workdir") == cfg.workdir and record.get("sha256") == cfg.digest


def approve(cfg: ProjectConfig, config_home: str) -> Path:
    d = ensure_private_dir(trust_dir(config_home))  # ~/.config/boxy itself may be 0755
    path = d / _approval(cfg)
    tmp = d / f".{path.name}.tmp"
    tmp.write_text(json.dumps({"workdir": cfg.workdir, "sha256": cfg.digest,
                               "approved_at": time.time(), "size": len(cfg.content)}) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def approvals(config_home: str) -> list[dict]:
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
