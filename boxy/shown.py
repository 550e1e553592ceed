"""Text the payload wrote, made safe to show on a terminal (docs/design.md, "Changes
held for review"): a file name or a line of a file is the payload's, and a terminal
acts on what it prints (escape sequences, OSC 52 clipboard writes, a carriage
return that overwrites a line) or reorders it (bidirectional overrides: Trojan
Source). Every character that is not printable is shown as a backslash escape, so
what the person reads is what lands. Pure, standard library only (the client
imports it).
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    n = ord(c)
    if c in _NAMED:
        return _NAMED[c]
    if 0xDC80 <= n <= 0xDCFF:  # a byte that was not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\x{n - 0xDC00:02x}"
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def name(text: str) -> str:
    """A file name or symlink text as one unambiguous token: as it is when every
    character is printable, else quoted with escapes (git's core.quotePath style), so
    a newline in a name cannot make a line of its own and no name looks like another."""
    if text.isprintable() and '"' not in text and "\\" not in text and text.strip() == text:
        return text
    body = "".join("\\" + c if c in '"\\' else (c if c.isprintable() else _escape(c)) for c in text)
    return f'"{body}"'


def line(text: str) -> str:
    """One line of the payload's content: its line end kept ("\\n", "\\r\\n"), a tab
    kept, every other character that is not printable escaped."""
    end = ""
    for e in ("\r\n", "\n"):
        if text.endswith(e):
            text, end = text[: -len(e)], e
            break
    if text.isprintable():
        return text + end
    return "".join(c if c == "\t" or c.isprintable() else _escape(c) for c in text) + end


def lines(text: str) -> str:
    """TEXT (lines the payload's content makes up) with each line made safe."""
    return "".join(line(x) for x in split(text))


def split(text: str) -> list[str]:
    """TEXT's lines by "\\n" alone, ends kept: str.splitlines also breaks at \\r, \\f,
    \\x1c-\\x1e, U+2028 and others, which would show one line of the file as two."""
    out = text.split("\n")
    last = out.pop()
    return [x + "\n" for x in out] + ([last] if last else [])
