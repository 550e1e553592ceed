"""The unified diff of a review's text files (docs/design.md, "Changes held for
review"): the host's file against the upper layer's, both read through fds that
reviewtree opened without following a symlink. Bounded: a file over DIFF_MAX bytes,
one holding a NUL or not UTF-8 is named, not diffed. Names and lines are the
payload's: each is shown escaped for a terminal (boxy/shown.py), and a file's mode
is shown when it lands other than it was. Runs in the review child."""

from __future__ import annotations

import difflib
import os
import stat

from boxy import shown
from boxyd.plan.reviewtree import Change, open_file

DIFF_MAX = 1 << 20  # bytes of one side of one file's diff
LINES_MAX = 20_000  # lines of one side (difflib's time grows faster than linear)


def _text(dir_fd: int, rel: str) -> list[str] | str:
    """REL's lines, or why it is not diffed."""
    try:
        fd = open_file(dir_fd, rel)
    except PermissionError as e:
        return f"could not be read ({e.strerror})"
    try:
        if os.fstat(fd).st_size > DIFF_MAX:
            return f"larger than {DIFF_MAX >> 20} MiB"
        data = os.pread(fd, DIFF_MAX + 1, 0)
    finally:
        os.close(fd)
    if b"\0" in data:
        return "binary"
    try:
        lines = shown.split(data.decode())
    except UnicodeDecodeError:
        return "binary"
    if len(lines) > LINES_MAX:
        return f"more than {LINES_MAX:,} lines"
    return lines


def _modes(host_fd: int, c: Change) -> str:
    """The mode lines of a file that lands with another mode than it had (git's form):
    what apply gives it, the permission bits."""
    if c.kind == "removed":
        return ""
    new = c.mode & 0o777
    if c.kind == "added":
        return f"new file mode {new:04o}\n" if new & 0o111 else ""
    old = stat.S_IMODE(os.stat(c.path, dir_fd=host_fd, follow_symlinks=False).st_mode) & 0o777
    return f"old mode {old:04o}\nnew mode {new:04o}\n" if old != new else ""


def file_diff(upper_fd: int, host_fd: int, c: Change) -> str:
    """One change's unified diff (git's a/ b/ labels), or a line saying why there is
    none; names and lines escaped for a terminal."""
    modes = _modes(host_fd, c)
    old: list[str] | str = [] if c.kind == "added" else _text(host_fd, c.path)
    new: list[str] | str = [] if c.kind == "removed" else _text(upper_fd, c.path)
    for side in (old, new):
        if isinstance(side, str):
            return f"{c.kind} {shown.name(c.path)}: {side}, not diffed\n{modes}"
    assert isinstance(old, list) and isinstance(new, list)
    a = "/dev/null" if c.kind == "added" else shown.name(f"a/{c.path}")
    b = "/dev/null" if c.kind == "removed" else shown.name(f"b/{c.path}")
    out = [f"--- {a}\n+++ {b}\n{modes}"] if modes and old == new else []
    for i, line in enumerate(difflib.unified_diff(old, new, a, b)):
        if i == 2:
            out.append(modes)
        line = line if i < 2 else shown.line(line)
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def diffs(upper_fd: int, host_fd: int, changes: list[Change]) -> str:
    """The text of every diffable change: regular files outside generated trees."""
    out = []
    for c in changes:
        if c.type != "file" or c.generated:
            continue
        out.append(file_diff(upper_fd, host_fd, c))
    return "".join(out)
