"""Per-project package caches: the node and python presets mount one cache directory
that boxy owns for this work directory and this profile,

    $XDG_CACHE_HOME/boxy/cache/<profile>/<work-directory key>/

as the sandbox's npm, yarn and pip caches (the `{cache}` profile template). Never
the host's own caches (private packages of other projects sit there) and never one
shared between projects: what one project's payload writes into its cache feeds that
project's later runs only — a shared cache would be a poisoning channel.

Bounded: after a run the least recently used projects' caches are removed until the
total is under MAX_BYTES, and any unused for MAX_AGE. A project's metadata (its work
directory, when it was last used) lives beside its cache, never inside what the
sandbox can write.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from boxy.digest import sha256
from boxy.paths import ensure_private_dir

MAX_BYTES = 10 << 30
MAX_AGE = 30 * 86400.0


def base(home: str | None = None) -> Path:
    root = os.environ.get("XDG_CACHE_HOME")
    if not root or not os.path.isabs(root):
        root = os.path.join(home or os.path.expanduser("~"), ".cache")
    return Path(root) / "boxy" / "cache"


def profile_key(profile: str) -> str:
    """A directory name for a profile (a preset, a user profile or a file path)."""
    name = os.path.basename(profile).removesuffix(".yaml").removesuffix(".yml") or "profile"
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:40]


def project_key(workdir: str) -> str:
    """Readable and unique: the work directory's last name and a hash of all of it."""
    tail = re.sub(r"[^A-Za-z0-9_-]", "-", os.path.basename(workdir.rstrip("/")) or "root")[:40]
    return f"{tail}-{sha256(workdir.encode()).hexdigest()[:16]}"


def project_dir(home: str | None, profile: str, workdir: str) -> str:
    return str(base(home) / profile_key(profile) / project_key(workdir))


def is_cache(path: str, home: str | None = None) -> bool:
    top = str(base(home))
    return path == top or path.startswith(top + "/")


def prepare(path: str, workdir: str, home: str | None = None) -> None:
    """Create PATH and boxy's directories above it (0700, each checked: a directory of
    ours, not a symlink), and record that WORKDIR used it now."""
    top = base(home)
    os.makedirs(top.parent.parent, exist_ok=True)  # $XDG_CACHE_HOME: the user's, as it is
    rel = Path(path).relative_to(top.parent)
    d = top.parent
    ensure_private_dir(d)
    for part in rel.parts:
        d = ensure_private_dir(d / part)
    with open(f"{path}.meta", "w") as f:  # beside the cache: the sandbox cannot write it
        json.dump({"workdir": workdir, "last_used": time.time()}, f)


@dataclass(frozen=True)
class Entry:
    profile: str
    path: str
    workdir: str
    last_used: float
    size: int


def _size(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):  # does not follow symlinks
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def entries(home: str | None = None) -> list[Entry]:
    """Every project cache, most recently used first."""
    out = []
    top = base(home)
    with contextlib.suppress(OSError):
        for prof in sorted(os.listdir(top)):
            pdir = top / prof
            for name in sorted(os.listdir(pdir)) if pdir.is_dir() else []:
                path = pdir / name
                if name.endswith(".meta") or path.is_symlink() or not path.is_dir():
                    continue
                try:
                    meta = json.loads(Path(f"{path}.meta").read_text())
                except (OSError, ValueError):
                    meta = {}
                out.append(
                    Entry(
                        prof,
                        str(path),
                        str(meta.get("workdir", "?")),
                        float(meta.get("last_used", 0)),
                        _size(str(path)),
                    )
                )
    return sorted(out, key=lambda e: -e.last_used)


def remove(entry: Entry) -> None:
    shutil.rmtree(entry.path, ignore_errors=True)  # fd-based: symlinks are not followed
    with contextlib.suppress(OSError):
        os.unlink(f"{entry.path}.meta")


def evictable(
    items: list[Entry], now: float, max_bytes: int = MAX_BYTES, max_age: float = MAX_AGE
) -> list[Entry]:
    """Pure: the caches to remove, oldest projects first, until the rest fits."""
    ordered = sorted(items, key=lambda e: e.last_used)
    total = sum(e.size for e in items)
    out = []
    for e in ordered:
        if now - e.last_used > max_age or total > max_bytes:
            out.append(e)
            total -= e.size
    return out


def prune(home: str | None = None) -> list[Entry]:
    gone = evictable(entries(home), time.time())
    for e in gone:
        remove(e)
    return gone
