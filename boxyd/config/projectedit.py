"""`for this project` (--ask, issue 34 §2): a host added to .boxy.yaml's allow_hosts
as a person would add it, the rest of the file (comments, order, quoting) untouched.

Pure text in, text out: a block list gets one more item at its indentation, a
one-line flow list one more element, a file without the key the key at its end.
Any other shape is None, and the caller changes nothing and says so. What this
returns is never trusted as is: the caller parses it (apart, parsedoor.py) and
writes it only when it reads as the old document plus HOST (config/trust.py)."""

from __future__ import annotations

import json

KEY = "allow_hosts"


def with_allowed_host(text: str, host: str) -> str | None:
    """TEXT with HOST appended to its top-level allow_hosts, or None."""
    item = json.dumps(host)  # a JSON string is a YAML scalar: "*.x" is no alias
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if _is_key(line)]
    if not at:
        sep = "" if not text or text.endswith("\n") else "\n"
        return f"{text}{sep}{KEY}:\n  - {item}\n"
    if len(at) > 1:
        return None
    i = at[0]
    rest = lines[i].split(":", 1)[1]
    if "#" in rest or "&" in rest or "!" in rest:  # a comment, an anchor, a tag: not ours
        return None
    value = rest.strip()
    if value in ("", "~", "null"):
        return _block(lines, i, item)
    if value.startswith("[") and value.endswith("]") and "[" not in value[1:]:
        inner = value[1:-1].strip()
        elements = f"{inner}, {item}" if inner else item
        newline = "\n" if lines[i].endswith("\n") else ""
        return "".join([*lines[:i], f"{KEY}: [{elements}]{newline}", *lines[i + 1 :]])
    return None


def _is_key(line: str) -> bool:
    head, colon, _ = line.partition(":")
    return bool(colon) and head.strip().strip("'\"") == KEY and not line[:1].isspace()


def _block(lines: list[str], i: int, item: str) -> str | None:
    """After line I (`allow_hosts:`): one more `- ITEM` after its last item."""
    indent, last = "  ", i
    for j in range(i + 1, len(lines)):
        line = lines[j]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not (line[:1].isspace() or line.startswith("-")):
            break  # the next top-level key
        if (stripped.startswith("- ") or stripped == "-") and last == i:
            indent = line[: len(line) - len(line.lstrip())]
        last = j
    if lines[i].split(":", 1)[1].strip() in ("~", "null"):
        if last != i:
            return None
        head = [*lines[:i], f"{KEY}:\n"]
    else:
        head = lines[: last + 1]
    if head and not head[-1].endswith("\n"):
        head[-1] += "\n"
    return "".join([*head, f"{indent}- {item}\n", *lines[last + 1 :]])
