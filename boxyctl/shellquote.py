"""sh quoting, as shlex.quote and shlex.join do it, without importing shlex: shlex
imports re, and re enum and functools, ~8 ms of a process that runs before every
command an agent types (`boxyctl hook claude`, bench/hook.py). Pure; the tests
hold it to shlex's own output."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# shlex.quote's safe characters: re's \w under re.ASCII, and @%+=:,./-
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def quote(s: str) -> str:
    """S as one word to sh: itself when every character is safe, else single-quoted
    (a single quote inside as '"'"')."""
    if not s:
        return "''"
    if _SAFE.issuperset(s):
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


def join(argv: Iterable[str]) -> str:
    """ARGV as one sh command line (shlex.join)."""
    return " ".join(quote(a) for a in argv)
