"""Files the host's tools run later, outside git: reported when a run created, changed or
removed them (audit layer ``fs.exec``; one line each at the end of the run). Never
blocked here — the node and python presets make the ones an install never writes
read-only, and the README says which.

- ``.vscode/`` (tasks with ``runOn: folderOpen``, settings naming programs),
  ``.idea/`` (run configurations), ``.devcontainer/`` (``postCreateCommand``…),
  ``.github/workflows/``, ``.husky/``, at any depth;
- ``.gitlab-ci.yml``, ``.envrc`` (direnv runs it on ``cd``), ``.pre-commit-config.yaml``;
- the ``scripts`` of every ``package.json`` (npm runs them; the rest of the file
  changes with every ``npm install <pkg>``, so only the scripts are compared);
- ``.pnpmfile.cjs`` and ``yarn.config.cjs`` (pnpm and yarn load them as code);
- the package managers' own config files (``.npmrc``, ``.yarnrc``, ``.yarnrc.yml``,
  ``pnpm-workspace.yaml``, ``pip.conf``/``pip.ini``), by the keys in them that make
  the tool run something or change what runs (toolconfig.py): reported when a run
  leaves such a key new or changed, never for the rest (an auth token, a timeout).

The walk shows each directory to ``Watch`` (the same walk as the git guard's);
``node_modules`` is skipped (its packages' scripts are the install itself).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping

from boxy.digest import sha256
from boxyd.gitguard.discover import O_DIR, O_FILE, Type, join, read_head
from boxyd.plan import payloadparse, toolconfig

DIRS = {
    ".vscode": "VS Code runs its tasks (runOn: folderOpen) and reads its settings",
    ".idea": "JetBrains IDEs run its run configurations",
    ".devcontainer": "dev containers run its lifecycle commands",
    ".husky": "husky's git hooks",
}
FILES = {
    ".gitlab-ci.yml": "GitLab CI runs it",
    ".envrc": "direnv runs it when you enter the directory",
    ".pre-commit-config.yaml": "pre-commit runs the hooks it names",
    ".pnpmfile.cjs": "pnpm runs it on every install",
    "yarn.config.cjs": "yarn runs it (constraints)",
}
WORKFLOWS = "GitHub Actions runs it"
SCRIPTS = "npm runs its scripts"
MAX_FILES = 2000  # per watched directory; the rest is one entry saying so
READ_MAX = 4 << 20
KEYS = "keys:"  # the fingerprint of a tool's config: only its settings that run something
UNREAD = "unread:"  # ... or all of it, when its settings could not be read


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
    if scripts_only:
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


# every name Watch looks at (a directory, a file, a tool's config)
_NAMES = frozenset({*DIRS, *FILES, "workflows", "package.json", *toolconfig.TOOLS})


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
                if kind == "dir" and name in DIRS:
                    self.seen[path] = (DIRS[name], _tree(dir_fd, name))
                elif kind == "dir" and name == "workflows" and comps[-1:] == [".github"]:
                    self.seen[path] = (WORKFLOWS, _tree(dir_fd, name))
                elif name in FILES:
                    self.seen[path] = (FILES[name], kind + _digest(dir_fd, name))
                elif name == "package.json":
                    self.seen[path] = (SCRIPTS, kind + _digest(dir_fd, name, scripts_only=True))
                elif kind == "symlink" and (name in DIRS or name in toolconfig.TOOLS):
                    why = DIRS.get(name) or f"{toolconfig.TOOLS[name][0]} reads it as its config"
                    self.seen[path] = (why, "symlink:" + os.readlink(name, dir_fd=dir_fd))
                elif kind == "file" and name in toolconfig.TOOLS:
                    self._config(dir_fd, name, path)
            except OSError as e:
                self.seen[path] = ("unreadable", f"error:{e.errno}")

    def _config(self, dir_fd: int, name: str, path: str) -> None:
        """A tool's config file counts only while it holds a key that runs something,
        or whole when what it holds is not known (too long, or its parse failed)."""
        data = read_head(dir_fd, name, READ_MAX + 1)
        if data is None:
            return
        tool = toolconfig.TOOLS[name][0]
        settings = (
            payloadparse.exec_settings(name, data)  # apart from boxyd, within a budget
            if len(data) <= READ_MAX
            else None
        )
        if settings is None or isinstance(settings, payloadparse.Hostile):
            why = f"{tool} reads it as its config, which could not be read here"
            self.seen[path] = (why, UNREAD + _digest(dir_fd, name))
            return
        if not settings:
            return
        keys = ", ".join(dict.fromkeys(k for k, _ in settings))
        digest = sha256(json.dumps(sorted(settings)).encode()).hexdigest()
        self.seen[path] = (
            f"{tool} runs or installs what {keys} say{'s' if ',' not in keys else ''}",
            KEYS + digest,
        )


def changes(
    before: Mapping[str, tuple[str, str]], after: Mapping[str, tuple[str, str]], root: str
) -> list[str]:
    """Pure: one line per watched entry of the tree ROOT the run created, changed or
    removed."""
    lines = []
    for rel in sorted(set(before) | set(after)):
        old, new = before.get(rel), after.get(rel)
        if old == new or (new is None and old is not None and old[1].startswith(KEYS)):
            continue  # the keys that run something gone (or the file): nothing to review
        what = "created" if old is None else "removed" if new is None else "changed"
        why = (new or old)[0]  # type: ignore[index]
        if rel.endswith("package.json") and what == "changed":
            what = "changed the scripts of"
        lines.append(
            f"{what} {os.path.join(root, rel)} ({why}): review it before your tools run it"
        )
    return lines
