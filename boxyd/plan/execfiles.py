"""Files the host's tools run later that a run may change on purpose, outside git:
reported when a run created, changed or removed them (audit layer ``fs.exec``; one
line each at the end of the run), never blocked. What a host program obeys unasked is
held instead (plan/hostrun.py, plan/heldfiles.py).

- the ``scripts`` of every ``package.json`` (npm runs them when you run them; the rest
  of the file changes with every ``npm install <pkg>``, so only the scripts are
  compared), and the keys the git hook managers read from it at each commit
  (``husky``, ``simple-git-hooks``, ``lint-staged``, ``pre-commit``, ``gitHooks``,
  ``config``: a package.json cannot be pinned, npm writes it);
- ``.github/workflows/`` and ``.gitlab-ci.yml``: CI runs them when you push.

The walk shows each directory to ``Watch`` (the same walk as the git guard's);
``node_modules`` is skipped (its packages' scripts are the install itself).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from boxy.digest import sha256
from boxyd.kernel.walk import O_DIR, O_FILE, Type, join
from boxyd.plan import payloadparse

FILES = {".gitlab-ci.yml": "GitLab CI runs it when you push"}
WORKFLOWS = "GitHub Actions runs it when you push"
SCRIPTS = "npm runs its scripts, and git hook managers the commands it names"
MAX_FILES = 2000  # per watched directory; the rest is one entry saying so
READ_MAX = 4 << 20


def _digest(dir_fd: int, name: str, scripts_only: bool = False) -> str:
    try:
        fd = os.open(name, O_FILE, dir_fd=dir_fd)
    except OSError as e:
        return f"error:{e.errno}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"type:{stat.S_IFMT(st.st_mode)}"
        data = os.read(fd, READ_MAX + 1)
    except OSError as e:
        return f"error:{e.errno}"
    finally:
        os.close(fd)
    mode = f"{stat.S_IMODE(st.st_mode):o}"
    if len(data) > READ_MAX:  # what is past the part read changes the ctime when written
        return f"{mode}:{st.st_size}:{st.st_ctime_ns}:{sha256(data).hexdigest()}"
    if scripts_only:  # and the keys git hook managers read (payloadparse.npm_scripts)
        scripts = payloadparse.npm_scripts(data)  # apart from boxyd, within a budget
        if isinstance(scripts, bytes):  # else not JSON to Python, or not judged: whole
            data = scripts
    return f"{mode}:{sha256(data).hexdigest()}"


def _tree(dir_fd: int, name: str) -> str:
    """One digest for a directory: every file's path, mode and content, symlinks' targets."""
    h = sha256()
    count = 0
    stack = [("", os.open(name, O_DIR, dir_fd=dir_fd))]
    try:
        while stack:
            rel, fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                entries = []
            for e in entries:
                count += 1
                if count > MAX_FILES:
                    h.update(b"...more")
                    return h.hexdigest()
                path = join(rel, e.name)
                if e.is_symlink():
                    h.update(f"L {path} {os.readlink(e.name, dir_fd=fd)}\n".encode())
                elif e.is_dir(follow_symlinks=False):
                    try:
                        stack.append((path, os.open(e.name, O_DIR, dir_fd=fd)))
                    except OSError:
                        h.update(f"D? {path}\n".encode())
                else:
                    h.update(f"F {path} {_digest(fd, e.name)}\n".encode())
            os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    return h.hexdigest()


# every name Watch looks at (a directory, a file)
_NAMES = frozenset({*FILES, "workflows", "package.json"})


class Watch:
    """An observer for discover.Walker: fingerprints of every watched entry of a tree."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[str, str]] = {}  # rel -> (why it matters, fingerprint)

    def __call__(self, dir_fd: int, rel: str, entries: Mapping[str, Type]) -> None:
        # only the names below can matter: most directories hold none (one set
        # intersection in C, not a test per entry)
        if not entries.keys() & _NAMES:
            return
        comps = rel.split("/") if rel else []
        if "node_modules" in comps:
            return
        for name, kind in entries.items():
            if name not in _NAMES:
                continue
            path = join(rel, name)
            try:
                if kind == "dir" and name == "workflows" and comps[-1:] == [".github"]:
                    self.seen[path] = (WORKFLOWS, _tree(dir_fd, name))
                elif name in FILES:
                    self.seen[path] = (FILES[name], kind + _digest(dir_fd, name))
                elif name == "package.json":
                    self.seen[path] = (SCRIPTS, kind + _digest(dir_fd, name, scripts_only=True))
            except OSError as e:
                self.seen[path] = ("unreadable", f"error:{e.errno}")


def changes(
    before: Mapping[str, tuple[str, str]], after: Mapping[str, tuple[str, str]], root: str
) -> list[str]:
    """Pure: one line per watched entry of the tree ROOT the run created, changed or
    removed."""
    lines = []
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old == new:
            continue
        what = "created" if old is None else "removed" if new is None else "changed"
        why = (new or old)[0]  # type: ignore[index]
        if rel.endswith("package.json") and what == "changed":
            what = "changed the scripts or hook keys of"
        lines.append(
            f"{what} {os.path.join(root, rel)} ({why}): review it before your tools run it"
        )
    return lines
