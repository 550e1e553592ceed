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


def summary_lines(changes: list[dict[str, Any]]) -> list[str]:
    if not changes:
        return ["no changes"]
    lines: list[str] = []
    trees: dict[str, list[dict[str, Any]]] = {}
    for c in changes:
        if c.get("generated"):
            trees.setdefault(str(c["generated"]), []).append(c)
        else:
            lines.append(_line(c))
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
