"""config/parsedoor.py, plan/payloadparse.py and daemon/parseproc.py: the one door to the parsers of what
the payload wrote, and the child behind it, on real processes: the same verdicts as
a parse in place, a job past its budget Hostile and its child killed, a child that
dies or refuses Hostile, the next job in a fresh child, and a parse in boxyd's own
process refused loudly."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from boxyd.config import parsedoor
from boxyd.config.parsedoor import Hostile, Job, Kind
from boxyd.daemon import parseproc
from boxyd.plan import credentials, payloadparse

NPMRC = b"registry=https://r.example/\n//r.example/:_authToken=secret\nfund=false\n"
GITCONFIG = b'[core]\n\tfsmonitor = x\n[include]\n\tpath = other\n[remote "o"]\n\turl = u\n'
JOBS = [
    Job(Kind.SCRUB, "npm config", NPMRC),
    Job(Kind.EXEC, ".npmrc", b"node-options=--require ./x.js\nscript-shell=/bin/zsh\n"),
    Job(Kind.SCRIPTS, "", b'{"scripts": {"b": "x", "a": "y"}, "name": "p"}'),
    Job(Kind.SCRIPTS, "", b"[" * 100_000),
    Job(Kind.GITCONFIG, "", GITCONFIG),
]


@pytest.fixture
def apart() -> Iterator[Callable[..., parseproc.Apart]]:
    made: list[parseproc.Apart] = []

    def make(spawn: parseproc.Spawn = parseproc.fork_child, **kw: float) -> parseproc.Apart:
        made.append(parseproc.Apart(spawn, **kw))
        return made[-1]

    yield make
    for a in made:
        a.close()
    time.sleep(0.05)
    parseproc.reap_children()


def test_apart_gives_what_a_parse_in_place_gives(apart: Callable[..., parseproc.Apart]) -> None:
    parser = apart()
    for job in JOBS:
        assert parser.parse(job) == parsedoor.run(job), job.kind
    assert parser.overruns == []


def test_the_typed_helpers_through_a_child(apart: Callable[..., parseproc.Apart]) -> None:
    with parsedoor.using(apart()):
        rule = credentials.Rule("npm config", credentials.Action.SCRUB, needs_content=True)
        clean = payloadparse.scrub(rule, NPMRC)
        assert isinstance(clean, bytes) and b"secret" not in clean and b"fund=false" in clean
        parsed = payloadparse.git_config(GITCONFIG)
        assert not isinstance(parsed, Hostile) and parsed.complete
        assert [e.key for e in parsed.entries][:2] == ["core.fsmonitor", "include.path"]
        assert payloadparse.npm_scripts(b"[" * 100_000) is None
        settings = payloadparse.exec_settings(".npmrc", b"node-options=--require ./x.js\n")
        assert settings == [("node-options", "--require ./x.js")]


def hanging_child() -> socket.socket:
    """A parse child that says hello and then never answers (a parser that never
    returns, deep in C where no signal handler runs)."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            parseproc.send(theirs, {"pid": os.getpid()})
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        finally:
            os._exit(0)
    theirs.close()
    return ours


def test_a_job_past_its_budget_is_hostile_and_its_child_killed(
    apart: Callable[..., parseproc.Apart],
) -> None:
    spawned: list[int] = []

    def spawn() -> socket.socket:
        sock = hanging_child()
        spawned.append(1)
        return sock

    parser = apart(spawn, job_budget=0.2, run_budget=5)
    got = parser.parse(JOBS[0])
    # the job's own 0.2 s ended it, not the run's 5 s: the verdict names which
    assert isinstance(got, Hostile) and "ran over 0.2 s" in got.why
    assert parser._sock is None  # killed (SIGKILL by pidfd: SIGTERM is ignored there)
    assert isinstance(parser.parse(JOBS[0]), Hostile) and len(spawned) == 2  # a fresh one


def test_the_runs_budget_once_spent_makes_every_job_hostile_at_once(
    apart: Callable[..., parseproc.Apart],
) -> None:
    spawned: list[int] = []

    def spawn() -> socket.socket:
        spawned.append(1)
        return hanging_child()

    parser = apart(spawn, job_budget=0.2, run_budget=0.3)
    assert isinstance(parser.parse(JOBS[0]), Hostile)
    assert isinstance(parser.parse(JOBS[0]), Hostile)
    asked = len(spawned)
    got = parser.parse(JOBS[0])
    assert isinstance(got, Hostile) and "budget" in got.why and "spent" in got.why
    assert len(spawned) == asked, "a child was asked (a job would take the 0.2 s)"


def test_a_child_that_dies_or_cannot_be_made_is_hostile(
    apart: Callable[..., parseproc.Apart],
) -> None:
    def dying() -> socket.socket:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            parseproc.send(theirs, {"pid": os.getpid()})
            os._exit(0)  # at the first job's arrival it is gone
        theirs.close()
        return ours

    got = apart(dying).parse(JOBS[0])
    assert isinstance(got, Hostile) and "failed" in got.why

    def none() -> socket.socket:
        raise OSError("no template")

    got = apart(none).parse(JOBS[0])
    assert isinstance(got, Hostile) and "no template" in got.why


def test_a_parser_that_refuses_its_input_is_hostile(
    apart: Callable[..., parseproc.Apart],
) -> None:
    bad = apart().parse(Job(Kind.SCRUB, "a kind no rule has", b"x"))
    assert isinstance(bad, Hostile) and "refused" in bad.why, bad
    assert apart().parse(Job(Kind.EXEC, "not a tool's file", b"x")) == []  # nothing runs


def test_a_parse_in_boxyds_own_process_is_refused_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No Parser in force and this process not apart: the call path forgot its Parser."""
    monkeypatch.setattr(parsedoor, "_local_allowed", False)
    with pytest.raises(RuntimeError, match="in boxyd's own process"):
        payloadparse.npm_scripts(b"{}")


ALL_KINDS = {
    **{job.kind: job for job in JOBS},
    Kind.NPMRC: Job(Kind.NPMRC, '{"HOME": "/h"}', b"registry=https://r.test/\n"),
    Kind.PIPCONF: Job(Kind.PIPCONF, "", b"[global]\nindex-url = https://i.test/simple\n"),
    Kind.PROJECT: Job(Kind.PROJECT, "/w/.boxy.yaml", b"profile: node\nnetwork:\n  mode: none\n"),
    Kind.PROFILE: Job(Kind.PROFILE, "/w/ci.yaml", b"extends: node\nnet: none\n"),
}


async def test_every_kind_runs_in_a_child_of_the_real_walk_template() -> None:
    """The registrations are made in the parse child (the walk template imports what
    registers every Kind): what boxyd's threads get is what a parse in place gives."""
    import asyncio

    from boxyd.daemon.walks import Walks

    assert set(ALL_KINDS) == set(Kind)
    walks = Walks()
    walks.start()
    try:

        def through_the_door() -> list[object]:
            return parseproc.call_apart(
                walks.apart, lambda: [parsedoor.parse(job) for job in ALL_KINDS.values()]
            )

        got = await asyncio.to_thread(through_the_door)
    finally:
        walks.close()
    for job, verdict in zip(ALL_KINDS.values(), got, strict=True):
        assert not isinstance(verdict, Hostile), (job.kind, verdict)
        assert verdict == _wire(parsedoor.run(job)), job.kind


def _wire(value: object) -> object:
    """VALUE as the wire gives it back (tuples become lists; bytes stay raw)."""
    import json

    return value if isinstance(value, bytes) or value is None else json.loads(json.dumps(value))


class Counting:
    """A Parser that counts what reaches it; Hostile for the bytes b'bad'."""

    def __init__(self) -> None:
        self.asked: list[Job] = []

    def parse(self, job: Job) -> object:
        self.asked.append(job)
        return Hostile("bad") if job.data == b"bad" else parsedoor.run(job)


def test_the_door_keeps_verdicts_of_the_same_bytes_not_hostile_ones() -> None:
    counting = Counting()
    job = Job(Kind.SCRIPTS, "", b'{"scripts": {"a": "b"}}')
    with parsedoor.using(counting):
        first = parsedoor.parse(job)
        assert parsedoor.parse(job) == first and len(counting.asked) == 1
        assert parsedoor.parse(job._replace(arg="other")) == first  # another key
        assert len(counting.asked) == 2
        for _ in range(2):
            assert isinstance(parsedoor.parse(Job(Kind.SCRIPTS, "", b"bad")), Hostile)
        assert len(counting.asked) == 4  # a Hostile verdict is asked again
        big = Job(Kind.SCRIPTS, "", b" " * (parsedoor.MEMO_INPUT + 1) + b"{}")
        parsedoor.parse(big)
        parsedoor.parse(big)
        assert len(counting.asked) == 6  # too large to hash here: never kept


def test_the_door_keeps_a_bounded_number_and_size_of_verdicts() -> None:
    memo = parsedoor._Memo(entries=3, size=100, largest=60)
    for i in range(5):
        memo.put((Kind.SCRUB, str(i), "k"), b"x" * 10)
    assert memo.get((Kind.SCRUB, "0", "k")) is parsedoor._MISS  # the oldest went
    assert memo.get((Kind.SCRUB, "4", "k")) == b"x" * 10
    memo.put((Kind.SCRUB, "big", "k"), b"x" * 61)  # larger than one verdict may be
    assert memo.get((Kind.SCRUB, "big", "k")) is parsedoor._MISS
    for i in range(3):
        memo.put((Kind.SCRUB, f"s{i}", "k"), b"x" * 50)
    assert memo._bytes <= 100 and len(memo._kept) <= 3
