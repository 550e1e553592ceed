"""The text of `boxyctl diff`'s summary (pure): one line per change, a generated
tree's entries folded into one line per tree, then the totals. Names and symlink
texts are the payload's: shown escaped (boxy/shown.py)."""

from __future__ import annotations

from boxy import shown
from boxy.values import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_MARK = {"added": "A", "changed": "M", "removed": "D"}

# What git writes in a gitdir as it works (a commit, a fetch): held like every entry
# under a .git, folded into one line per gitdir, since a commit writes dozens; what
# runs commands (config, hooks, info/) keeps a line of its own
GIT_WORK_DIRS = ("objects", "refs", "logs")
GIT_WORK_FILES = ("index", "HEAD", "ORIG_HEAD", "FETCH_HEAD", "COMMIT_EDITMSG", "packed-refs")


def git_work(path: str) -> str:
    """The gitdir PATH is git's working state in (`sub/.git`), or ''."""
    parts = path.split("/")
    if ".git" not in parts[:-1]:
        return ""
    at = len(parts) - 1 - parts[::-1].index(".git", 1)
    rest = parts[at + 1 :]
    if (rest[0] in GIT_WORK_DIRS) or (len(rest) == 1 and rest[0] in GIT_WORK_FILES):
        return "/".join(parts[: at + 1])
    return ""


def folded_git(items: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """ITEMS (path, why) apart from git's working state, and that state's count by
    gitdir."""
    rest: list[tuple[str, str]] = []
    by_dir: dict[str, int] = {}
    for path, why in items:
        gitdir = git_work(path) if why else ""
        if gitdir:
            by_dir[gitdir] = by_dir.get(gitdir, 0) + 1
        else:
            rest.append((path, why))
    return rest, by_dir


def _line(c: dict[str, Any]) -> str:
    kind, typ, path = str(c.get("kind")), str(c.get("type")), str(c.get("path"))
    size = int(c.get("size") or 0)
    what = shown.name(f"{path}/" if typ == "dir" else path)
    if typ == "symlink":
        what += f" -> {shown.name(str(c.get('target', '')))}"
    extra = f"  ({c.get('files', 1):,} entries)" if kind == "removed" and typ == "dir" else ""
    line = f"{_MARK.get(kind, '?')} {what}  {format_size(size)}{extra}"
    if c.get("held"):
        line += f"  [held: {c['held']}]"
    return line


def git_line(gitdir: str, n: int) -> str:
    return (
        f"H {shown.name(gitdir + '/')}  {n:,} entries git writes as it works (objects, refs, "
        "logs, index: a commit or a fetch in the run), held: land your work tree and commit "
        "it yourself (--allow-git-write at the run lets them)"
    )


def summary_lines(changes: list[dict[str, Any]]) -> list[str]:
    if not changes:
        return ["no changes"]
    lines: list[str] = []
    trees: dict[str, list[dict[str, Any]]] = {}
    gitwork: dict[str, int] = {}
    for c in changes:
        gitdir = git_work(str(c.get("path"))) if c.get("held") else ""
        if gitdir:
            gitwork[gitdir] = gitwork.get(gitdir, 0) + 1
        elif c.get("generated"):
            trees.setdefault(str(c["generated"]), []).append(c)
        else:
            lines.append(_line(c))
    lines += [git_line(d, n) for d, n in gitwork.items()]
    for root, entries in trees.items():
        size = sum(int(e.get("size") or 0) for e in entries)
        kinds = "/".join(sorted({str(e.get("kind")) for e in entries}))
        lines.append(
            f"G {shown.name(root + '/')}  {len(entries):,} entries {kinds}, {format_size(size)} "
            "(generated: listed, not diffed)"
        )
    counts = {k: sum(1 for c in changes if c.get("kind") == k) for k in _MARK}
    total = sum(int(c.get("size") or 0) for c in changes if c.get("kind") != "removed")
    lines.append(
        f"{counts['added']} added, {counts['changed']} changed, {counts['removed']} removed; "
        f"{format_size(total)} to land"
    )
    return lines
