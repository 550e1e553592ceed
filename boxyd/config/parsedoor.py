"""The one door to the parsers of bytes the payload wrote (docs/design.md, "Nothing
the payload wrote is parsed in boxyd's process").

CPython holds the interpreter lock through a whole regex match or YAML walk: one
slow parse in a thread of boxyd stopped its event loop, its live guard and every
other session (a 64 KiB `.npmrc` line held every run 56 s). So the spec, the walk,
the guard and the rest never call a parser of payload bytes themselves: they ask the
Parser in force (``current()``) with a Job, and get a plain-data verdict or a
Hostile. In boxyd the Parser in force is daemon/parseproc.py's Apart: a child
process with a CPU limit and a wall budget per job and per run; a job past its
budget is Hostile, and the caller treats the file as hostile (covered, watched,
refused, left out: each says how), never as harmless. LOCAL parses in the process
that asks, and is refused unless that process said it is apart (``allow_local``:
the parse child itself, boxyctl, the unit tests).

The door is here, below the layers whose parsers it runs: each layer registers its
own kinds of job (``register``) in the module that holds the typed helpers its
callers use (this layer's: projectconfig.py and profiles.py; the plan's and the guard's:
plan/payloadparse.py). The parse child imports both (parseproc.py), and a test runs
every Kind through it.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import NamedTuple, Protocol

from boxy.digest import sha256


class Kind(Enum):
    # the plan's and the guard's (plan/payloadparse.py)
    SCRUB = "scrub"  # arg: a credentials rule's kind; result: the scrubbed bytes
    EXEC = "exec"  # arg: a tool's config file name; result: its settings that run something
    SCRIPTS = "scripts"  # package.json's "scripts", canonical JSON; None: not JSON
    GITCONFIG = "gitconfig"  # {"entries": [(section, subsection, name, value)], "complete"}
    # the spec's (config/projectconfig.py)
    NPMRC = "npmrc"  # arg: the environment npm expands, JSON; result: (key, value) pairs
    PIPCONF = "pipconf"  # result: (key, value) pairs
    PROJECT = "project"  # arg: the file's path; result: .boxy.yaml's approval view, or None
    PROFILE = "profile"  # arg: the file's label; result: {"doc"} or {"error": one line}


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


_PARSERS: dict[Kind, Callable[[Job], object]] = {}


def register(kind: Kind, parse: Callable[[Job], object]) -> None:
    """PARSE (pure: bytes in, plain data out; it may raise on input it refuses) runs
    the jobs of KIND."""
    _PARSERS[kind] = parse


def run(job: Job) -> object:
    """JOB's result as plain data (the wire carries it); raises on input a parser
    refuses, or a kind no module of this process registered."""
    parse = _PARSERS.get(job.kind)
    if parse is None:
        raise LookupError(f"no parser for {job.kind.value} jobs in this process")
    return parse(job)


class _NotApart(RuntimeError):
    pass


_local_allowed = False


def allow_local() -> None:
    """This process is apart from boxyd (the parse child, boxyctl, a test): LOCAL may
    parse."""
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


def parse(job: Job) -> object | Hostile:
    """JOB through the Parser in force, unless the same bytes were judged before: a
    parse is a pure function of (kind, arg, bytes), and a project's files are mostly
    the ones its last run saw (its .git/config, .npmrc, package.json: judged by the
    walk before a run and again after it). Hostile verdicts are not kept: a budget
    depends on the moment."""
    if len(job.data) > MEMO_INPUT:  # hashing it here would cost boxyd's lock its time
        return _current.get().parse(job)
    key = (job.kind, job.arg, sha256(job.data).hexdigest())
    hit = MEMO.get(key)
    if hit is not _MISS:
        return hit
    got = _current.get().parse(job)
    if not isinstance(got, Hostile):
        MEMO.put(key, got)
    return got


MEMO_INPUT = 256 << 10  # bytes of a job's input past which it is not kept (~2 ms to hash)


_MISS = object()


class _Memo:
    """Verdicts by (kind, arg, sha256 of the bytes): bounded in entries and in the
    bytes of the verdicts kept (a scrubbed copy is as large as its file); thread-safe
    (worker threads of several runs ask at once)."""

    def __init__(self, entries: int = 1024, size: int = 4 << 20, largest: int = 256 << 10):
        self._kept: collections.OrderedDict[tuple[Kind, str, str], tuple[object, int]] = (
            collections.OrderedDict()
        )
        self._entries, self._size, self._largest = entries, size, largest
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Kind, str, str]) -> object:
        with self._lock:
            got = self._kept.get(key)
            if got is None:
                return _MISS
            self._kept.move_to_end(key)
            return got[0]

    def put(self, key: tuple[Kind, str, str], verdict: object) -> None:
        cost = len(verdict) if isinstance(verdict, bytes) else len(repr(verdict))
        if cost > self._largest:
            return
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = (verdict, cost)
            self._bytes += cost
            while len(self._kept) > self._entries or self._bytes > self._size:
                _, (_, gone) = self._kept.popitem(last=False)
                self._bytes -= gone

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0


MEMO = _Memo()


@contextlib.contextmanager
def using(parser: Parser) -> Iterator[Parser]:
    """PARSER is the one in force in this thread (context) meanwhile."""
    token = _current.set(parser)
    try:
        yield parser
    finally:
        _current.reset(token)


def as_list(value: object) -> list[object]:
    """VALUE (a verdict: off the wire a list, from LOCAL maybe a tuple) as a list;
    TypeError if it is neither."""
    if not isinstance(value, (list, tuple)):
        raise TypeError("not a list")
    return list(value)


def as_pairs(value: object) -> list[tuple[str, str]]:
    """A verdict of (key, value) pairs; TypeError/ValueError if it is in no such shape."""
    out = []
    for pair in as_list(value):
        k, v = as_list(pair)
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("not a pair of strings")
        out.append((k, v))
    return out
