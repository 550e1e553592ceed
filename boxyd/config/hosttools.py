"""Host tools boxyd may run over trees the payload could write: where one may be found,
what its sandbox shows, and the interface it is run through (docs/design.md, "Tools
boxyd runs").

- a tool is found only in PATH directories outside every payload-writable tree
  (and so is the file a symlink there resolves to); never by a bare name;
- what it sees is an Exposure; the sandbox itself is planned in boxyd.plan.tools
  and carried out by boxyd.daemon.toolbox.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from boxyd.config.runspec import SYSTEM_TREES


class ToolError(Exception):
    """A tool could not be asked: no sandbox, a deadline, an answer that cannot be read."""


@dataclass(frozen=True)
class Answer:
    rc: int | None  # None: it did not run or was killed
    out: bytes
    timed_out: bool = False
    truncated: bool = False


class Runner(Protocol):
    """Runs one tool call inside a tool sandbox (boxyd.daemon.toolbox.ToolBox)."""

    def run(
        self, argv: Sequence[str], *, cwd: str, env: dict[str, str], timeout: float, limit: int
    ) -> Answer: ...


class Box(Runner, Protocol):
    """An open tool sandbox: calls until it is closed (which ends it)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Exposure:
    """What a tool sandbox shows besides the system's read-only trees."""

    home: str  # $HOME's path (an empty directory, read-only)
    read: tuple[str, ...] = ()  # trees read, nothing on them executable (absolute, no symlink)
    files: tuple[str, ...] = ()  # single files read (a tool's config), if present
    execute: tuple[str, ...] = ()  # a tool's own installation outside the system trees


# Opens a tool sandbox showing an Exposure (raises ToolError); a run's opener holds
# the run's one budget for every check.
Opener = Callable[[Exposure], Box]


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hostile(path: str, writable: Sequence[str], *, holding: bool = False) -> bool:
    """PATH lies in a tree the payload could write (HOLDING: or holds one); checked by
    its spelling and by where its symlinks lead."""
    spellings = {os.path.abspath(path), os.path.realpath(path)}
    trees = {t for w in writable for t in (os.path.abspath(w), os.path.realpath(w))}
    return any(_inside(p, w) or (holding and _inside(w, p)) for p in spellings for w in trees)


def resolve(name: str, path: str, writable: Sequence[str]) -> str | None:
    """Where NAME would be found in PATH, skipping every directory inside a writable
    tree (and a hit whose real file lies in one): the binary that answers, or None."""
    for entry in path.split(":"):
        if not entry.startswith("/") or hostile(entry, writable):
            continue  # a relative entry is the cwd's: never
        candidate = os.path.join(entry, name)
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(candidate, os.X_OK):
            return None if hostile(candidate, writable) else candidate
    return None


def safe_path(path: str, writable: Sequence[str]) -> str:
    """PATH without its relative entries and those inside a writable tree: the
    tool sandbox's PATH, so a tool's own helpers are found the same way."""
    return ":".join(e for e in path.split(":") if e.startswith("/") and not hostile(e, writable))


def installation(binary: str, home: str, writable: Sequence[str]) -> tuple[str, ...]:
    """The trees a tool found outside the system trees needs to run: its bin directory's
    parent (a prefix: nvm's versions/node/vX, a venv) unless that is the home itself or
    holds a writable tree; then just the directories of the binary and its target."""
    out: list[str] = []
    for path in (binary, os.path.realpath(binary)):
        d = os.path.dirname(path)
        if any(_inside(d, s) for s in SYSTEM_TREES):
            continue
        prefix = os.path.dirname(d) if os.path.basename(d) == "bin" else d
        if _inside(home, prefix) or hostile(prefix, writable, holding=True):
            prefix = d
        if not hostile(prefix, writable, holding=True) and prefix not in out:
            out.append(prefix)
    return tuple(out)
