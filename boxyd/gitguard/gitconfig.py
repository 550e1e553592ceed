"""Git's config file format, parsed the way git 2.39 parses it (config.c), and the
keys in it that make git run a command.

Pure: bytes in, entries out. The parser follows git's character-level state machine
rather than a grammar so that it agrees with git on every odd spelling: a key git
sees and this parser missed would be a way out. It never raises; on input git would
reject it stops where git stops and says the parse was incomplete (git refuses such
a file, but the caller treats it as dangerous anyway: we cannot know what it means).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_SPACE = " \t\n\r"  # git's isspace(): sane_ctype, no \v or \f


def _isalpha(c: str) -> bool:
    return c.isascii() and c.isalpha()


def _iskeychar(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``key = value``. ``value`` is None for a bare boolean key (no ``=``)."""

    section: str  # lower-cased
    subsection: str | None  # as written for [s "sub"]; lower-cased for legacy [s.sub]
    name: str  # lower-cased
    value: str | None

    @property
    def key(self) -> str:
        if self.subsection is None:
            # a key before any section header has no dot at all
            return f"{self.section}.{self.name}" if self.section else self.name
        return f"{self.section}.{self.subsection}.{self.name}"


@dataclass(frozen=True)
class ParsedConfig:
    entries: tuple[Entry, ...]
    complete: bool  # False: git would reject the file here; entries holds what came before


class _Reader:
    """git's get_next_char(): CRLF folds to LF, end of input reads as LF with eof set."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.eof = False

    def next(self) -> str:
        if self.pos >= len(self.text):
            self.eof = True
            return "\n"
        c = self.text[self.pos]
        self.pos += 1
        if c == "\r" and self.text.startswith("\n", self.pos):
            self.pos += 1
            return "\n"
        return c


def _base_var(r: _Reader) -> str | None:
    """After ``[``: the section name (lower-cased), plus ``.subsection`` when quoted."""
    name: list[str] = []
    while True:
        c = r.next()
        if r.eof:
            return None
        if c == "]":
            return "".join(name)
        if c in _SPACE:
            return _extended_base_var(r, "".join(name), c)
        if not _iskeychar(c) and c != ".":
            return None
        name.append(c.lower())


def _extended_base_var(r: _Reader, base: str, c: str) -> str | None:
    while True:  # skip the blanks between the name and the opening quote
        if c == "\n":
            return None
        c = r.next()
        if c not in _SPACE:
            break
    if c != '"':
        return None
    sub = []
    while True:
        c = r.next()
        if c == "\n":
            return None
        if c == '"':
            break
        if c == "\\":
            c = r.next()
            if c == "\n":
                return None
        sub.append(c)
    if r.next() != "]":
        return None
    return base + "." + "".join(sub)


def _value(r: _Reader) -> str | None:
    """After ``=``: the value up to the end of the (possibly continued) line."""
    out: list[str] = []
    quote = comment = False
    space = 0
    while True:
        c = r.next()
        if c == "\n":
            if quote:
                return None
            # git hands the value on as a C string: it ends at the first NUL
            return "".join(out).split("\0", 1)[0]
        if comment:
            continue
        if c in _SPACE and not quote:
            if out:
                space += 1  # blanks inside a value collapse to single spaces, trailing ones vanish
            continue
        if not quote and c in ";#":
            comment = True
            continue
        out.extend(" " * space)
        space = 0
        if c == "\\":
            c = r.next()
            if c == "\n":
                continue  # line continuation
            esc = {"t": "\t", "b": "\b", "n": "\n", "\\": "\\", '"': '"'}.get(c)
            if esc is None:
                return None  # git rejects unknown escapes
            out.append(esc)
            continue
        if c == '"':
            quote = not quote
            continue
        out.append(c)


def split_key(full: str, value: str | None) -> Entry:
    first, last = full.find("."), full.rfind(".")
    if first < 0:
        return Entry("", None, full, value)
    sub = full[first + 1 : last] if last > first else None
    return Entry(full[:first], sub, full[last + 1 :], value)


def parse(data: bytes | str) -> ParsedConfig:
    """Parse a config file; never raises."""
    text = data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data
    if text.startswith("\ufeff"):
        text = text[1:]  # git skips a UTF-8 byte order mark
    r = _Reader(text)
    entries: list[Entry] = []
    # one object per distinct entry: a file of 'b\n' lines held ~170 bytes per 2 read
    distinct: dict[Entry, Entry] = {}
    base = ""
    comment = False
    while True:
        c = r.next()
        if c == "\n":
            if r.eof:
                return ParsedConfig(tuple(entries), True)
            comment = False
            continue
        if comment or c in _SPACE:
            continue
        if c in "#;":
            comment = True
            continue
        if c == "[":
            name = _base_var(r)
            if not name:
                break
            base = name + "."
            continue
        if not _isalpha(c):
            break
        key = [c.lower()]
        while True:
            c = r.next()
            if r.eof or not _iskeychar(c):
                break
            key.append(c.lower())
        while c in " \t":
            c = r.next()
        value = None
        if c != "\n":
            if c != "=":
                break
            value = _value(r)
            if value is None:
                break
        entry = split_key(base + "".join(key), value)
        entries.append(distinct.setdefault(entry, entry))
    return ParsedConfig(tuple(entries), False)


# --- which keys run a command -------------------------------------------------------

_FALSE = {"false", "no", "off", "0", ""}
_BOOL = _FALSE | {"true", "yes", "on"}
_INT = re.compile(r"[+-]?[0-9]+")


def _is_bool(value: str | None) -> bool:
    # a narrower notion than git's (which also takes 0x10, 1k): what we do not
    # recognise as a boolean counts as a command, which errs on the safe side
    return value is None or value.lower() in _BOOL or bool(_INT.fullmatch(value))


def _is_false(value: str | None) -> bool:
    if value is None:
        return False  # a bare key is true
    return value.lower() in _FALSE or bool(_INT.fullmatch(value)) and int(value) == 0


_ALWAYS = frozenset(
    {
        ("core", "fsmonitor"),  # tested separately (a false value is harmless)
        ("core", "hookspath"),
        ("core", "pager"),
        ("core", "askpass"),
        ("core", "gitproxy"),
        ("diff", "external"),
        ("diff", "textconv"),
        ("merge", "driver"),
        ("filter", "clean"),
        ("filter", "smudge"),
        ("filter", "process"),
        ("mergetool", "path"),
        ("difftool", "path"),
        ("browser", "path"),
        ("man", "path"),
        ("remote", "uploadpack"),
        ("remote", "receivepack"),
        ("sendemail", "smtpserver"),  # an absolute path here is a program to run
        ("interactive", "difffilter"),
        ("init", "templatedir"),  # templates carry hooks into new repositories
        ("imap", "tunnel"),
        ("instaweb", "httpd"),
        ("lfs", "path"),  # git-lfs custom transfer agents
        ("lfs", "clean"),
        ("lfs", "smudge"),
    }
)
# names that are a command wherever they appear (gpg.program, gpg.ssh.program,
# credential.<url>.helper, sequence.editor, trailer.*.cmd, core.sshCommand,
# core.alternateRefsCommand, gpg.ssh.defaultKeyCommand, guitool.*.cmd,
# sendemail.toCmd, uploadpack.packObjectsHook, diff.*.command, …)
_SUFFIXES = ("cmd", "command", "program", "editor", "helper", "hook")
# sections whose every key is dangerous:
# - include/includeIf pull in another file, which can hold anything;
# - alias: not only "!cmd" — a plain alias can carry git's own options and
#   subcommands that run programs ("-c core.pager=…", "--exec-path=…",
#   "submodule foreach …", "fetch --upload-pack=…"), and a repository's alias
#   overrides the user's global one of the same name.
_WHOLE_SECTIONS = frozenset({"include", "includeif", "alias"})
_SUBMODULE_UPDATE = frozenset({"checkout", "rebase", "merge", "none"})
_RUNNING_URL = ("ext::", "fd::")  # transports that run a command


def is_dangerous(e: Entry) -> bool:
    s, n, v = e.section, e.name, e.value
    # a subsection is ignored on purpose: [core "x"] fsmonitor is inert to git, but
    # flagging it costs nothing and keeps the rules simple
    if s in _WHOLE_SECTIONS:
        return True
    if (s, n) == ("core", "fsmonitor"):
        return not _is_false(v)  # true starts a daemon, a string is a hook to run
    if (s, n) in _ALWAYS:
        return True
    if s != "advice" and n.endswith(_SUFFIXES):  # advice.waitingForEditor is a boolean
        return True
    if s == "pager":
        return not _is_bool(v)  # pager.<cmd> = <string> is the pager command
    if s == "protocol" and n == "allow":
        return v != "never"  # lets remote.*.url = ext::<cmd> run
    if s == "submodule" and n == "update":
        return v not in _SUBMODULE_UPDATE  # "!cmd" runs cmd
    if s == "remote" and n in ("url", "pushurl"):
        return v is not None and v.startswith(_RUNNING_URL)
    if s == "url":
        return (e.subsection or "").startswith(_RUNNING_URL)
    return False


def dangerous_keys(entries: Iterable[Entry]) -> list[str]:
    """The keys (as git spells them, each once) that can make git run a command."""
    seen: dict[str, None] = {}
    for e in entries:
        if is_dangerous(e):
            seen.setdefault(e.key)
    return list(seen)
