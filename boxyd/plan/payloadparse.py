"""The one door to the parsers of bytes the payload wrote (docs/design.md, "Nothing
the payload wrote is parsed in boxyd's process").

CPython holds the interpreter lock through a whole regex match or YAML walk: one
slow parse in a thread of boxyd stopped its event loop, its live guard and every
other session (a 64 KiB `.npmrc` line held every run 56 s). So the walk, the guard
and the rest never call a parser of payload bytes themselves: they ask the Parser in
force (``current()``) with a Job, and get a typed verdict or a Hostile. In boxyd the
Parser in force is daemon/parseproc.py's Apart: a child process with a CPU limit and
a wall budget per job and per run; a job past its budget is Hostile, and the caller
treats the file as hostile (covered, watched, refused: each says how), never as
harmless. LOCAL parses in the process that asks, and is refused unless that process
said it is apart (``allow_local``: the parse child itself; the unit tests).

This module is pure but for the choice of Parser: ``run`` is the dispatch the parse
child executes, and the typed helpers are what the callers use.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from enum import Enum
from typing import Any, NamedTuple, Protocol

from boxyd.gitguard import gitconfig
from boxyd.plan import credentials, toolconfig


class Kind(Enum):
    SCRUB = "scrub"  # arg: a credentials rule's kind; result: the scrubbed bytes
    EXEC = "exec"  # arg: a tool's config file name; result: its settings that run something
    SCRIPTS = "scripts"  # package.json's "scripts", canonical JSON; None: not JSON
    GITCONFIG = "gitconfig"  # result: {"entries": [(section, subsection, name, value)], "complete"}


class Job(NamedTuple):
    kind: Kind
    arg: str
    data: bytes


class Hostile(NamedTuple):
    """A job that could not be judged: why, in words for the user's one line."""

    why: str


class Parser(Protocol):
    def parse(self, job: Job) -> object | Hostile:
        """What run(JOB) returns, or Hostile."""
        ...


class _NotApart(RuntimeError):
    pass


_local_allowed = False


def allow_local() -> None:
    """This process is apart from boxyd (the parse child, a test): LOCAL may parse."""
    global _local_allowed
    _local_allowed = True


class _Local:
    def parse(self, job: Job) -> object | Hostile:
        if not _local_allowed:  # a call path that forgot its Parser: loud, never silent
            raise _NotApart(f"a {job.kind.value} parse of payload bytes in boxyd's own process")
        try:
            return run(job)
        except Exception as e:  # as the parse child answers it (parseproc._answer)
            return Hostile(f"the parser refused it ({type(e).__name__}: {str(e)[:200]})")


LOCAL: Parser = _Local()
_current: contextvars.ContextVar[Parser] = contextvars.ContextVar("parser", default=LOCAL)


def current() -> Parser:
    return _current.get()


@contextlib.contextmanager
def using(parser: Parser) -> Iterator[Parser]:
    """PARSER is the one in force in this thread (context) meanwhile."""
    token = _current.set(parser)
    try:
        yield parser
    finally:
        _current.reset(token)


# -- the dispatch (run in the parse child) --------------------------------------------


def run(job: Job) -> object:
    """JOB's result as plain data (the wire carries it); raises on input a parser
    refuses (the child answers that as Hostile)."""
    match job.kind:
        case Kind.SCRUB:
            rule = credentials.Rule(job.arg, credentials.Action.SCRUB, needs_content=True)
            return credentials.scrub(rule, job.data)
        case Kind.EXEC:
            return [list(p) for p in toolconfig.exec_settings(job.arg, job.data)]
        case Kind.SCRIPTS:
            return _scripts(job.data)
        case Kind.GITCONFIG:
            parsed = gitconfig.parse(job.data)
            entries = [[e.section, e.subsection, e.name, e.value] for e in parsed.entries]
            return {"entries": entries, "complete": parsed.complete}
    raise ValueError(f"unknown job {job.kind}")


def _scripts(data: bytes) -> bytes | None:
    """A package.json's scripts in one form; None where Python's json cannot read it
    (bad JSON, nested past the recursion limit, an int past 4300 digits): the caller
    compares it whole."""
    try:
        doc = json.loads(data)
        scripts = doc.get("scripts") if isinstance(doc, dict) else None
        return json.dumps(scripts, sort_keys=True).encode()
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


# -- what the callers use: typed, Hostile passed through -------------------------------


def scrub(rule: credentials.Rule, data: bytes) -> bytes | Hostile:
    got = current().parse(Job(Kind.SCRUB, rule.kind, data))
    return got if isinstance(got, (bytes, Hostile)) else Hostile("a scrub came back as no bytes")


def exec_settings(name: str, data: bytes) -> list[tuple[str, str]] | Hostile:
    got = current().parse(Job(Kind.EXEC, name, data))
    if isinstance(got, Hostile):
        return got
    try:
        return [(str(k), str(v)) for k, v in _list(got)]
    except (TypeError, ValueError):
        return Hostile("the settings came back in no shape")


def npm_scripts(data: bytes) -> bytes | None | Hostile:
    got = current().parse(Job(Kind.SCRIPTS, "", data))
    return got if got is None or isinstance(got, (bytes, Hostile)) else Hostile("no scripts")


def git_config(data: bytes) -> gitconfig.ParsedConfig | Hostile:
    got = current().parse(Job(Kind.GITCONFIG, "", data))
    if isinstance(got, Hostile):
        return got
    try:
        if not isinstance(got, dict) or not isinstance(got.get("complete"), bool):
            raise TypeError("not a parsed config")
        entries = tuple(gitconfig.Entry(*_entry(e)) for e in _list(got.get("entries")))
    except (TypeError, ValueError):
        return Hostile("the entries came back in no shape")
    return gitconfig.ParsedConfig(entries, got["complete"])


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    return value


def _entry(e: object) -> tuple[str, str | None, str, str | None]:
    fields = _list(e)
    if len(fields) != 4 or not all(f is None or isinstance(f, str) for f in fields):
        raise ValueError("not an entry")
    section, subsection, name, value = fields
    if section is None or name is None:
        raise ValueError("not an entry")
    return section, subsection, name, value
