"""The daemon core (Manager, Session, the event fan-out) against a fake launcher:
the lifecycle, stop and its grace, timeouts, outcomes, watchers that fall behind,
the registry's events. The real launcher is tested through real sandboxes."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from boxy.buildid import build_id
from boxy.errors import Busy, DaemonError, NoSuchSession, SetupError, UsageError
from boxy.outcome import (
    Counters,
    Destination,
    Detached,
    Ended,
    Notice,
    Reason,
    Running,
    State,
    Stopped,
)
from boxy.request import RunOptions, RunRequest
from boxyd.config import parsedoor, profileview
from boxyd.config.profileview import ProfileView
from boxyd.config.runspec import RunSpec
from boxyd.daemon import seam
from boxyd.daemon import session as session_mod
from boxyd.daemon.events import (
    Audited,
    ClientAttached,
    ClientDetached,
    CountersTick,
    Exited,
    Fanout,
    Lost,
    Noticed,
    PayloadStopped,
    RunStarted,
    SessionEvent,
    SessionNew,
    SessionRemoved,
    StateChanged,
)
from boxyd.daemon.manager import Manager
from boxyd.daemon.seam import (
    Caller,
    Change,
    Exit,
    QuestionParser,
    Report,
    SandboxEvent,
    Sink,
    Started,
)
from boxyd.daemon.session import Session, outcome_of

TABLE = Destination("registry.example", 3, 1, 2, 2000, 9000)


class FakeSandbox:
    """A payload that runs until a signal it does not ignore, or until told to exit."""

    def __init__(
        self,
        sink: Sink,
        *,
        fail: Exception | None = None,
        ignore: tuple[int, ...] = (),
        exit_code: int | None = None,
        timeout: float | None = None,
        hold: bool = False,
        findings: list[str] | None = None,
    ) -> None:
        self.spec = RunSpec(argv=["true"], workdir="/w", timeout=timeout)
        self.sink = sink
        self.fail = fail
        self.ignore = ignore
        self.signals: list[int] = []
        self.closed = False
        self.finished = False
        self.hold = hold  # the payload has not started until the test says so
        self.findings = findings if findings is not None else ["a finding"]
        self._events: asyncio.Queue[SandboxEvent] = asyncio.Queue()
        if exit_code is not None:
            self._events.put_nowait(Exit(code=exit_code))

    async def start(self) -> list[str]:
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        self.sink.record("test", what="started")
        if not self.hold:
            self._events.put_nowait(Started())
        return ["a warning"]

    async def events(self) -> AsyncIterator[SandboxEvent]:
        while True:
            ev = await self._events.get()
            yield ev
            if isinstance(ev, Exit):
                return

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig not in self.ignore or sig == signal.SIGKILL:
            self._events.put_nowait(Exit(signal=sig))

    def push(self, ev: SandboxEvent) -> None:
        self._events.put_nowait(ev)

    def resize(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)

    def limit_lines(self) -> list[str]:
        return ["--pids 512: enforced"]

    def change_policy(self, change: Change, hosts: list[str], caller: Caller, t: float) -> str:
        return f"{change.value} {' '.join(hosts)} ({caller})"

    def counters(self) -> Counters:
        return Counters(connections=len(self.signals))

    def destinations(self, limit: int) -> list[Destination]:
        return [Destination("example.org", 1, 0, 1, 10, 20)][:limit]

    def detach(self) -> bool:
        self.detached = True
        return True

    def attach_client(self, stdio: list[int], terminal: object) -> None:
        self.clients = getattr(self, "clients", 0) + 1

    async def finish(self) -> Report:
        self.finished = True
        return Report(findings=self.findings, notes=["a note"], destinations=[TABLE])

    def audit_log(self) -> int | None:
        return None

    def close(self) -> None:
        self.closed = True


class LocalParser:
    def parse(self, job: parsedoor.Job) -> object | parsedoor.Hostile:
        return parsedoor.LOCAL.parse(job)

    def close(self) -> None:
        pass


class FakeLauncher:
    def __init__(self, **sandbox_args: object) -> None:
        self.args = sandbox_args
        self.made: list[FakeSandbox] = []
        self.closed = False

    async def prepare(self, request: RunRequest, stdio: list[int], sink: Sink) -> FakeSandbox:
        if request.argv == ["bad"]:
            raise UsageError("bad command")
        sb = FakeSandbox(sink, **self.args)  # type: ignore[arg-type]
        self.made.append(sb)
        return sb

    def start(self) -> None:
        pass

    def parser(self) -> QuestionParser:
        """As boxyd's, parsing in this process (the unit tests are apart: conftest)."""
        return LocalParser()

    async def profile(self, name: str, cwd: str, client_env: dict[str, str]) -> ProfileView:
        """As boxyd's: the real load, without asking npm or pip (no tool sandboxes)."""
        return profileview.view(name, cwd, os.path.expanduser("~"), None)

    def close(self) -> None:
        self.closed = True


def request(*argv: str, **options: object) -> RunRequest:
    return RunRequest(list(argv or ["true"]), "/w", RunOptions(**options), build=build_id())


def made(m: Manager) -> list[FakeSandbox]:
    """The sandboxes M's FakeLauncher made."""
    assert isinstance(m.launcher, FakeLauncher)
    return m.launcher.made


def state_now(session: Session) -> State:
    """SESSION's state, read anew (mypy keeps an `is` narrowing across awaits)."""
    return session.state


async def started(session: Session) -> None:
    for _ in range(100):
        if session.state is State.RUNNING:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"still {session.state}")


async def test_start_returns_at_once_and_the_session_runs_without_its_caller() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(), [])
    assert s.state is State.STARTING and m.get(s.id) is s and m.busy()
    await started(s)
    assert [r["layer"] for r in s.audit] == ["test"] and s.audit[0]["session"] == s.id
    sb = made(m)[0]
    sb.push(Exit(code=3))
    out = await s.wait()
    assert (out.exit_status, out.reason, out.state) == (3, Reason.EXIT, State.EXITED)
    assert (out.findings, out.notes, out.destinations) == (["a finding"], ["a note"], [TABLE])
    assert out.warnings == []  # said when it started, not again
    assert state_now(s) is State.EXITED and sb.finished and sb.closed and not m.busy()
    assert s.audit == []  # written out, not held by a long-lived daemon


async def test_an_audit_flood_is_counted_and_the_outcome_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """§3 of issue #30: a bound the payload fills (the audit records kept) is said in
    the run's last lines, not only in the record."""
    monkeypatch.setattr(session_mod, "MAX_AUDIT", 3)
    m = Manager(FakeLauncher())
    s = await m.start(request(), [])
    await started(s)
    for i in range(7):
        s.record("net", n=i)
    made(m)[0].push(Exit(code=0))
    out = await s.wait()
    assert "audit log: 5 records past 3 counted, not kept" in out.notes, out.notes


async def test_bad_input_starts_nothing() -> None:
    m = Manager(FakeLauncher())
    with pytest.raises(UsageError):
        await m.start(request("bad"), [])
    assert m.known() == [] and made(m) == []


async def test_unknown_session() -> None:
    m = Manager(FakeLauncher())
    with pytest.raises(NoSuchSession) as e:
        m.get("feedbeef")
    assert e.value.sid == "feedbeef" and "feedbeef" in str(e.value)
    with pytest.raises(NoSuchSession):
        m.stop("feedbeef")


@pytest.mark.parametrize(
    "fail, status",
    [(UsageError("late"), 2), (SetupError("no landlock"), 125), (RuntimeError("bug"), 125)],
)
async def test_a_setup_failure_is_an_outcome(fail: Exception, status: int) -> None:
    m = Manager(FakeLauncher(fail=fail))
    s = await m.start(request(), [])
    out = await s.wait()
    assert (out.exit_status, out.reason, out.state) == (status, Reason.SETUP, State.FAILED)
    assert str(fail) in out.message
    assert made(m)[0].closed and not made(m)[0].finished


async def test_stop_is_sigterm_then_sigkill_after_the_grace() -> None:
    m = Manager(FakeLauncher(ignore=(signal.SIGTERM,)), grace=0.05)
    s = await m.start(request(), [])
    await started(s)
    m.stop(s.id)
    out = await asyncio.wait_for(s.wait(), 2)
    assert made(m)[0].signals == [signal.SIGTERM, signal.SIGKILL]
    assert (out.exit_status, out.reason, out.state) == (137, Reason.SIGNAL, State.KILLED)


async def test_stop_kill_is_sigkill_now() -> None:
    m = Manager(FakeLauncher(ignore=(signal.SIGTERM,)), grace=60)
    s = await m.start(request(), [])
    await started(s)
    m.stop(s.id, kill=True)
    await asyncio.wait_for(s.wait(), 2)
    assert made(m)[0].signals == [signal.SIGKILL]


async def test_a_stop_before_the_payload_runs_kills_it_once_it_can() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(), [])
    s.stop()  # still starting
    out = await asyncio.wait_for(s.wait(), 2)
    assert made(m)[0].signals[0] == signal.SIGKILL and out.state is State.KILLED


async def test_hangup_sends_sighup_then_stops() -> None:
    m = Manager(FakeLauncher(ignore=(signal.SIGHUP, signal.SIGTERM)), grace=0.05)
    s = await m.start(request(), [])
    await started(s)
    s.hangup()
    await asyncio.wait_for(s.wait(), 2)
    assert made(m)[0].signals == [signal.SIGHUP, signal.SIGTERM, signal.SIGKILL]


async def test_timeout_is_124_even_when_the_payload_exits_0_on_sigterm() -> None:
    m = Manager(FakeLauncher(timeout=0.05, ignore=(signal.SIGTERM,)))
    s = await m.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)
    made(m)[0].push(Exit(code=0))  # it caught SIGTERM and exited 0
    out = await asyncio.wait_for(s.wait(), 2)
    assert (out.exit_status, out.reason, out.state) == (124, Reason.TIMEOUT, State.TIMED_OUT)
    assert out.message.startswith("timed out after")


async def test_signals_reach_only_a_running_payload() -> None:
    m = Manager(FakeLauncher(ignore=(signal.SIGINT,)))
    s = await m.start(request(), [])
    s.signal(signal.SIGINT)  # starting: dropped
    await started(s)
    s.signal(signal.SIGINT)
    s.resize(24, 80)
    sb = made(m)[0]
    assert sb.signals == [signal.SIGINT] and sb.size == (24, 80)
    sb.push(Exit(code=0))
    await s.wait()
    s.signal(signal.SIGINT)
    assert sb.signals == [signal.SIGINT]


async def test_events_in_order_and_the_stream_ends() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(), [])
    sub = s.subscribe((RunStarted, PayloadStopped, StateChanged, Exited))
    await started(s)
    made(m)[0].push(seam.Stopped(signal.SIGTSTP))
    made(m)[0].push(Exit(code=0))
    got = [e async for e in sub]
    assert got[:3] == [
        StateChanged(State.RUNNING, t=got[0].t),
        RunStarted(["a warning"], t=got[1].t),
        PayloadStopped(signal.SIGTSTP, t=got[2].t),
    ]
    assert got[3] == StateChanged(State.EXITED, t=got[3].t)
    assert isinstance(got[4], Exited) and got[4].outcome.exit_status == 0
    late = s.subscribe()
    assert [e async for e in late] == []  # subscribing after the end: an empty stream


async def test_a_watcher_that_never_reads_loses_events_and_slows_nothing() -> None:
    fan: Fanout[SessionEvent] = Fanout(bound=10)
    stuck, reader = fan.subscribe(), fan.subscribe()
    for i in range(10_000):
        fan.publish(Audited({"n": i}))
    fan.close()
    assert stuck.lost_total == 10_000 - 10
    events = [e async for e in stuck]
    assert [e.record["n"] for e in events[:10] if isinstance(e, Audited)] == list(range(10))
    assert isinstance(events[10], Lost) and events[10].count == 9_990
    assert len([e async for e in reader]) == 11


def test_a_full_watcher_waits_aside_and_is_told_its_gap_when_it_reads_again() -> None:
    fan: Fanout[SessionEvent] = Fanout(bound=10)
    stuck, reader = fan.subscribe(), fan.subscribe()
    made = 0

    def make() -> Audited:
        nonlocal made
        made += 1
        return Audited({"n": made - 1})

    seen = []
    for _ in range(10_000):  # the reader keeps up; the stuck one fills, then waits aside
        fan.publish_lazy(Audited, make)
        e = reader.pop()
        assert isinstance(e, Audited)
        seen.append(e.record["n"])
    assert seen == list(range(10_000)) and made == 10_000
    assert stuck.lost_total == 9_990 and stuck.queued == 10
    first = [stuck.pop() for _ in range(10)]
    assert [e.record["n"] for e in first if isinstance(e, Audited)] == list(range(10))
    fan.publish(Audited({"n": "after"}))  # offered again once it read
    gap, after = stuck.pop(), stuck.pop()
    assert isinstance(gap, Lost) and gap.count == 9_990
    assert isinstance(after, Audited) and after.record == {"n": "after"}
    assert stuck.pop() is None and stuck.lost_total == 9_990 and reader.lost_total == 0


def test_pop_takes_what_is_queued_in_order_with_the_gaps_where_they_were() -> None:
    fan: Fanout[SessionEvent] = Fanout(bound=3)
    sub = fan.subscribe()
    for i in range(5):  # 0..2 queued, 3 and 4 lost
        fan.publish(Audited({"n": i}))
    assert [e.record["n"] for e in (sub.pop(), sub.pop()) if isinstance(e, Audited)] == [0, 1]
    fan.publish(Audited({"n": 5}))  # room again: the gap is told before it
    got = [sub.pop() for _ in range(3)]
    assert isinstance(got[0], Audited) and got[0].record == {"n": 2}
    assert isinstance(got[1], Lost) and got[1].count == 2
    assert isinstance(got[2], Audited) and got[2].record == {"n": 5}
    assert sub.pop() is None and sub.lost_total == 2
    for i in range(4):  # lost at the very end: told last
        fan.publish(Audited({"n": 6 + i}))
    assert [type(sub.pop()) for _ in range(4)] == [Audited, Audited, Audited, Lost]


async def test_ready_waits_for_an_event_and_says_when_the_stream_ended() -> None:
    fan: Fanout[Audited | Lost] = Fanout()
    sub = fan.subscribe()
    waiting = asyncio.create_task(sub.ready())
    await asyncio.sleep(0)
    assert not waiting.done()
    fan.publish(Audited({}))
    assert await asyncio.wait_for(waiting, 1) is True
    assert await sub.ready() is True  # still there until popped
    sub.pop()
    fan.close()
    assert await asyncio.wait_for(sub.ready(), 1) is False


async def test_gather_waits_for_enough_events_or_its_time_or_the_end() -> None:
    fan: Fanout[Audited | Lost] = Fanout()
    sub = fan.subscribe()
    loop = asyncio.get_running_loop()
    t = loop.time()
    await sub.gather(3, 0.05)  # nothing comes: its time
    assert loop.time() - t >= 0.04
    waiting = asyncio.create_task(sub.gather(3, 10))
    for _ in range(3):
        await asyncio.sleep(0)
        assert not waiting.done()
        fan.publish(Audited({}))
    await asyncio.wait_for(waiting, 1)  # the third ended it, long before its time
    await asyncio.wait_for(sub.gather(3, 10), 1)  # already there: at once
    later = asyncio.create_task(sub.gather(10, 10))
    await asyncio.sleep(0)
    fan.close()
    await asyncio.wait_for(later, 1)  # the end of the stream ends it too


def test_publish_lazy_makes_an_event_only_for_a_watcher_with_room() -> None:
    fan: Fanout[SessionEvent] = Fanout(bound=2)
    made: list[Audited] = []

    def make() -> Audited:
        made.append(Audited({"n": len(made)}))
        return made[-1]

    fan.publish_lazy(Audited, make)  # nobody watching: nothing made
    assert made == []
    a, b = fan.subscribe(), fan.subscribe()
    only_runs = fan.subscribe((RunStarted,))
    for _ in range(5):
        fan.publish_lazy(Audited, make)
    assert len(made) == 2  # once for both watchers, and not once both were full
    assert a.lost_total == b.lost_total == 3 and only_runs.pop() is None
    assert a.pop() is made[0]
    fan.publish_lazy(Audited, make)  # room in A only
    assert len(made) == 3 and b.lost_total == 4
    assert b.pop() is made[0] and b.pop() is made[1] is a.pop()


def test_memo_is_made_once_per_key_and_shared() -> None:
    ev = Audited({"n": 1})
    calls: list[str] = []

    def render(e: Audited) -> bytes:
        calls.append("x")
        return repr(e.record).encode()

    first = ev.memo("test.wire", render)
    assert ev.memo("test.wire", render) is first and calls == ["x"]
    assert ev.memo("test.other", lambda e: b"other") == b"other"
    assert ev == Audited({"n": 1}, t=ev.t)  # a memo is no field: equality holds
    assert "memo" not in repr(ev)


async def test_a_flood_of_audit_records_never_drops_the_run_stream_events() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(), [])
    run_stream = s.subscribe((RunStarted, Noticed))
    await started(s)
    for i in range(5000):
        s.record("net", n=i)
    s.notice("denied")
    made(m)[0].push(Exit(code=0))
    kinds = [e.kind async for e in run_stream]  # the wire's names
    assert kinds == ["started", "notice"]


async def test_session_new_and_removed_and_the_bound_on_finished_sessions() -> None:
    m = Manager(FakeLauncher(exit_code=0), keep_finished=2)
    watch = m.subscribe()
    ids = []
    for _ in range(4):
        s = await m.start(request(), [])
        ids.append(s.id)
        await s.wait()
    assert len(set(ids)) == 4
    assert [s.id for s in m.known()] == ids[2:]
    m.events.close()
    got = [e async for e in watch]
    assert [e.id for e in got if isinstance(e, SessionNew)] == ids
    assert [e.id for e in got if isinstance(e, SessionRemoved)] == ids[:2]


async def test_shutdown_stops_every_running_session_and_waits() -> None:
    m = Manager(FakeLauncher(), grace=0.05)
    sessions = [await m.start(request(), []) for _ in range(5)]
    for s in sessions:
        await started(s)
    await asyncio.wait_for(m.shutdown(), 2)
    assert (
        all(s.state is State.KILLED for s in sessions)
        and isinstance(m.launcher, FakeLauncher)
        and m.launcher.closed
    )


async def test_fifty_sessions_at_once() -> None:
    m = Manager(FakeLauncher())
    sessions = [await m.start(request(), []) for _ in range(50)]
    for s in sessions:
        await started(s)
    assert len(m.running()) == 50 and m.status().sessions_running == 50
    for sb in made(m):
        sb.push(Exit(code=0))
    outs = await asyncio.gather(*(s.wait() for s in sessions))
    assert all(o.exit_status == 0 for o in outs) and not m.busy()


@pytest.mark.parametrize("end, timed_out, want", [
    (Exit(code=0), False, (0, Reason.EXIT, "")),
    (Exit(code=7), False, (7, Reason.EXIT, "")),
    (Exit(signal=9), False, (137, Reason.SIGNAL, "")),
    (Exit(signal=signal.SIGSYS), False, (159, Reason.SECCOMP, "killed by seccomp: the payload "
                                              "made a forbidden system call")),
    (Exit(signal=15), True, (124, Reason.TIMEOUT, "timed out after 1m")),
    (Exit(code=0), True, (124, Reason.TIMEOUT, "timed out after 1m")),
    (Exit(exec_errno=errno.ENOENT, cmd="nope"), False, (127, Reason.EXEC, "nope: command not found")),
    (Exit(exec_errno=errno.EACCES, cmd="x"), False, (126, Reason.EXEC, "x: Permission denied")),
    (Exit(error="landlock: not supported"), False, (125, Reason.SETUP, "landlock: not supported")),
    (Exit(), False, (125, Reason.SETUP, "stage 2 ended without a word (see boxyd's log)")),
])  # fmt: skip
def test_outcome_of(end: Exit, timed_out: bool, want: tuple[int, Reason, str]) -> None:
    out = outcome_of(end, timed_out=timed_out, timeout=60.0)
    assert (out.exit_status, out.reason, out.message) == want


async def test_a_record_outlives_the_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from boxyd.daemon import records

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    m = Manager(FakeLauncher(exit_code=4), records.Records(str(tmp_path)))
    s = await m.start(request("echo", "x"), [])
    await s.wait()
    again = Manager(FakeLauncher(), records.Records(str(tmp_path)))
    info = await again.info(s.id)
    assert info.outcome is not None
    assert (info.state, info.argv, info.outcome.exit_status) == (State.EXITED, ["true"], 4)
    assert [i.id for i in await again.infos(all=True)] == [s.id]
    assert await again.infos() == []
    for bad in ("../../etc", "..", "", "DEADBEEF", "deadbeef0", s.id + "/"):
        assert records.read_meta(bad) is None
        with pytest.raises(NoSuchSession):
            await again.info(bad)
    assert (tmp_path / "boxy" / "sessions" / s.id).stat().st_mode & 0o777 == 0o700


async def test_no_new_session_once_shutting_down() -> None:
    m = Manager(FakeLauncher(exit_code=0))
    await m.shutdown()
    with pytest.raises(DaemonError, match="boxyd is stopping"):
        await m.start(request(), [])


async def test_detach_and_attach() -> None:
    m = Manager(FakeLauncher(), grace=0.05)
    s = await m.start(request(), [])
    await started(s)
    sub = s.subscribe((ClientDetached, ClientAttached))
    with pytest.raises(Busy, match="is attached to another client"):
        s.attach([], None)
    s.detach_requested()
    assert not s.attached and made(m)[0].detached
    s.client_gone()  # the client that detached closes its connection: no hang-up
    assert made(m)[0].signals == []
    s.attach([], None)
    assert s.attached and made(m)[0].clients == 1
    s.client_gone()  # this one is killed (an ssh drop): the session is detached again
    assert not s.attached and made(m)[0].signals == [] and s.state is State.RUNNING
    m.stop(s.id, kill=True)
    out = await asyncio.wait_for(s.wait(), 2)
    assert out.state is State.KILLED
    assert [e.kind async for e in sub] == ["detached", "attached", "detached"]
    with pytest.raises(UsageError, match="has ended"):
        s.attach([], None)


async def test_the_runs_own_client_going_hangs_it_up() -> None:
    """The `boxyctl run` that started a session in the foreground goes (killed, a
    cancelled CI job): SIGHUP, then a stop; nothing is left running."""
    m = Manager(FakeLauncher(), grace=0.05)
    s = await m.start(request(), [])
    await started(s)
    s.client_gone()
    out = await asyncio.wait_for(s.wait(), 2)
    assert made(m)[0].signals[0] == signal.SIGHUP and out.state is State.KILLED


@pytest.mark.parametrize("follower", [True, False])
async def test_an_attach_to_a_detached_run_that_drops_detaches_it(follower: bool) -> None:
    """-d (or a D-Bus Run), then `attach` over ssh, and the ssh drops: docker and tmux
    users expect the session to go on, detached; it was hung up (issue 33 §2)."""
    m = Manager(FakeLauncher(), grace=0.05)
    s = await m.start(request(detach=follower), [], follower=follower)
    await started(s)
    s.attach([], None)
    assert s.attached
    s.client_gone()
    assert not s.attached and made(m)[0].detached and made(m)[0].signals == []
    assert s.state is State.RUNNING
    s.attach([], None)  # and it can be taken over again
    assert s.attached and made(m)[0].clients == 2
    m.stop(s.id, kill=True)
    await s.wait()


async def test_a_detached_run_is_not_hung_up() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(detach=True), [])
    await started(s)
    s.client_gone()
    assert made(m)[0].signals == [] and s.state is State.RUNNING
    m.stop(s.id, kill=True)
    await s.wait()


async def test_counters_once_a_tick_for_watchers_and_kept_after_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from boxyd.daemon import session as session_mod

    monkeypatch.setattr(session_mod, "TICK", 0.01)
    m = Manager(FakeLauncher(ignore=(signal.SIGINT,)))
    s = await m.start(request(), [])
    await started(s)
    s.signal(signal.SIGINT)  # the fake counts signals as connections
    sub = s.subscribe((CountersTick,))
    await asyncio.sleep(0.1)
    made(m)[0].push(Exit(code=0))
    await s.wait()
    got = [e async for e in sub if isinstance(e, CountersTick)]
    assert len(got) >= 3
    assert got[0].counters.connections == 1
    assert got[0].destinations == [Destination("example.org", 1, 0, 1, 10, 20)]
    assert s.info().counters == Counters(connections=1)  # the totals outlive the sandbox


@pytest.mark.parametrize("controllers, unit, want", [
    (frozenset(), "boxy-a.scope", {"memory": False, "pids": True, "cpus": False}),
    (frozenset({"memory", "pids", "cpu"}), "boxy-a.scope", {"memory": True, "pids": True, "cpus": True}),
    (frozenset({"memory", "pids", "cpu"}), None, {"memory": False, "pids": True, "cpus": False}),
    (frozenset({"pids"}), "boxy-a.scope", {"memory": False, "pids": True, "cpus": False}),
])  # fmt: skip
def test_what_each_limit_amounts_to(
    controllers: frozenset[str], unit: str | None, want: dict[str, bool]
) -> None:
    from boxyd.daemon.scopes import Placement, limits

    spec = RunSpec(argv=["true"], workdir="/w", memory=1 << 30, pids=300, cpus=0.5)
    got = limits(spec, Placement(unit, controllers, "" if unit else "no session bus"))
    assert {lim.name: lim.enforced for lim in got} == want
    for lim in got:
        if not lim.enforced:
            assert "not enforced" in lim.line
            assert (f"in {unit})" if unit else "no scope (no session bus)") in lim.line
    pids = next(lim for lim in got if lim.name == "pids")
    assert ("TasksMax" in pids.by) == ("pids" in controllers and unit is not None)


def test_the_scope_asks_for_every_limit() -> None:
    from boxyd.daemon.scopes import unit_properties

    spec = RunSpec(argv=["true"], workdir="/w", memory=1 << 30, pids=300, cpus=0.5)
    props = dict(unit_properties((42, 43), spec, "abcd1234"))
    assert props["PIDs"] == ("au", [42, 43]) and props["Delegate"] == ("b", True)
    assert props["MemoryMax"] == ("t", 1 << 30) and props["TasksMax"] == ("t", 300)
    assert props["CPUQuotaPerSecUSec"] == ("t", 500_000)
    assert "CPUQuotaPerSecUSec" not in dict(
        unit_properties([42], RunSpec(argv=["x"], workdir="/"), "x")
    )


def test_limit_events_counted_by_the_controllers() -> None:
    from boxyd.daemon.scopes import limit_events

    files = {
        "memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n",
        "pids.events": "max 7\n",
    }
    assert limit_events(files) == [
        ("the memory limit killed a process", 1),
        ("the memory limit was reached", 12),
        ("the pids limit refused a fork", 7),
    ]
    assert limit_events({"memory.events": "max 0\noom_kill 0\n"}) == []
    assert limit_events({}) == []  # no controller: nothing counted, nothing said


async def test_a_stop_after_launch_but_before_the_payload_runs_reaches_stage_2() -> None:
    m = Manager(FakeLauncher(hold=True))
    s = await m.start(request(), [])
    sb = None
    for _ in range(100):  # launched: start() has returned, the payload not started
        if s._launched:
            sb = made(m)[0]
            break
        await asyncio.sleep(0)
    assert sb is not None and s.state is State.STARTING
    s.stop()
    out = await asyncio.wait_for(s.wait(), 2)
    assert signal.SIGKILL in sb.signals and out.state is State.KILLED


async def test_an_outcome_is_bounded_and_its_lists_kept_in_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,000 long-named planted hooks: the reply and the record hold counts and the
    first lines; the whole list is a 0600 file in the session's record."""
    from boxy.outcome import MAX_LINES
    from boxy.varlink import MAX_MESSAGE, encode
    from boxyd.daemon import records

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    lines = [
        f"git guard: moved .git/hooks/{i:06d}{'h' * 400} to /q: a new or changed git hook"
        for i in range(100_000)
    ]
    m = Manager(FakeLauncher(exit_code=3, findings=lines), records.Records(str(tmp_path)))
    s = await m.start(request(), [])
    out = await s.wait()
    assert out.exit_status == 3 and len(out.findings) == MAX_LINES and out.findings[0] == lines[0]
    full = tmp_path / "boxy" / "sessions" / s.id / "findings.txt"
    assert (
        f"… and {100_000 - MAX_LINES + 1:,} more findings (100,000 in all; the full list is in "
        f"{full})" == out.findings[-1]
    )
    assert full.read_text().splitlines() == lines and full.stat().st_mode & 0o777 == 0o600
    assert len(encode({"parameters": out.to_wire()})) < MAX_MESSAGE // 100
    shown = records.read_meta(s.id)
    assert shown is not None and shown.outcome is not None
    assert shown.outcome.findings == out.findings  # bounded again: nothing changes


# -- the typed reply stream and the decisions the core makes for every API --------------
async def test_the_follow_stream_is_typed_running_notice_stopped_ended() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(), [])
    follow = s.follow()
    await started(s)
    s.notice("denied example.org")
    made(m)[0].push(seam.Stopped(signal.SIGTSTP))
    made(m)[0].push(Exit(code=3))
    got = [r async for r in follow]
    assert got[:3] == [
        Running(s.id, ["a warning"]),
        Notice(s.id, "denied example.org"),
        Stopped(s.id, signal.SIGTSTP),
    ]
    assert isinstance(got[3], Ended) and got[3].outcome.exit_status == 3
    assert [follow.last(r) for r in got] == [False, False, False, True]


async def test_a_detached_runs_stream_ends_with_running_and_attach_starts_with_it() -> None:
    m = Manager(FakeLauncher(), grace=0.05)
    s = await m.start(request(detach=True), [])
    follow = s.follow()
    got = [r async for r in follow]
    assert got == [Running(s.id, ["a warning"])] and follow.last(got[0])
    attached = s.attach([], None)
    s.detach_requested()
    assert [r async for r in attached] == [Running(s.id), Detached(s.id)]
    m.stop(s.id, kill=True)
    await s.wait()


def test_every_run_reply_decodes_into_its_own_type() -> None:
    from boxy.outcome import Outcome, Reason, run_reply

    for r in (
        Running("ab12cd34", ["w"]),
        Notice("ab12cd34", "denied"),
        Stopped("ab12cd34", signal.SIGTSTP),
        Detached("ab12cd34"),
        Ended("ab12cd34", Outcome(1, Reason.EXIT, "m", findings=["f"])),
    ):
        assert run_reply(r.to_wire()) == r
    with pytest.raises(ValueError):
        run_reply({"id": "ab12cd34", "exit_status": 0})  # no kind: never guessed


async def test_the_core_refuses_another_build_for_every_api_and_closes_the_fds() -> None:
    import os

    from boxy.errors import BuildMismatch

    m = Manager(FakeLauncher())
    r, w = os.pipe()
    req = request()
    req.build = "other"
    with pytest.raises(BuildMismatch):
        await m.start(req, [w], follower=False)
    assert os.read(r, 1) == b""  # the write end was closed by the core
    os.close(r)
    assert m.known() == []


async def test_shutdown_and_signals_are_decided_by_the_core() -> None:
    m = Manager(FakeLauncher())
    m.check_shutdown(False)  # nothing runs
    s = await m.start(request(), [])
    await started(s)
    with pytest.raises(Busy, match=s.id):
        m.check_shutdown(False)
    m.check_shutdown(True)
    for bad in (0, -1, signal.NSIG, 1 << 40):
        with pytest.raises(UsageError, match="not a signal number"):
            s.signal(bad)
    s.signal(signal.SIGRTMAX)  # the real-time ones are signals too
    assert s.info().profile == "generic"  # the default is named by the core
    m.stop(s.id, kill=True)
    await s.wait()


async def test_a_run_nobody_follows_is_not_hung_up() -> None:
    m = Manager(FakeLauncher())
    s = await m.start(request(), [], follower=False)  # as D-Bus starts one
    await started(s)
    assert not s.attached
    s.client_gone()
    assert made(m)[0].signals == []
    m.stop(s.id, kill=True)
    await s.wait()


async def test_a_unique_prefix_names_a_session_an_ambiguous_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from boxyd.daemon import manager, records

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    ids = iter(["ab120000", "ab340000", "cd560000"])
    monkeypatch.setattr(manager, "token", lambda: next(ids))
    m = Manager(FakeLauncher(exit_code=0), records.Records(str(tmp_path)))
    a, b = await m.start(request(), []), await m.start(request(), [])
    await a.wait()
    await b.wait()
    assert m.get("ab1") is a and (await m.info("ab3")).id == b.id
    with pytest.raises(UsageError, match="id ab is ambiguous: ab120000, ab340000"):
        await m.info("ab")
    with pytest.raises(UsageError, match="ambiguous"):
        m.get("a")
    with pytest.raises(NoSuchSession):
        await m.info("ff")
    # after a restart: the records' ids are what a prefix is matched against
    again = Manager(FakeLauncher(), records.Records(str(tmp_path)))
    assert (await again.info("ab12")).id == a.id
    assert (await again.stop_and_wait("ab3")).id == b.id
    with pytest.raises(UsageError, match="ambiguous"):
        await again.stop_and_wait("ab")


async def test_output_reads_the_log_in_pieces_and_says_when_it_is_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from boxyd.daemon import records

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    m = Manager(FakeLauncher(), records.Records(str(tmp_path)))
    s = await m.start(request(), [])
    await started(s)
    none = await m.output(s.id[:5], 0)
    assert (none.id, none.kept, none.ended) == (s.id, False, False)
    (records.record_dir(s.id) / "output.log").write_bytes(b"x" * 10)
    got = await m.output(s.id, 0, limit=4)
    assert (got.data, got.offset, got.kept, got.ended) == (b"xxxx", 4, True, False)
    made(m)[0].push(Exit(code=0))
    await s.wait()
    rest = await m.output(s.id, 4)
    assert (rest.data, rest.offset, rest.ended) == (b"x" * 6, 10, True)
    assert (await m.output(s.id, 10)).data == b""
    with pytest.raises(UsageError, match="negative"):
        await m.output(s.id, -1)
    with pytest.raises(UsageError, match="past any file's end"):  # no OverflowError in boxyd
        await m.output(s.id, 2**70)
    assert (await m.output(s.id, 2**63 - 1)).data == b""


async def test_a_policy_change_reaches_the_running_session_and_show_keeps_it() -> None:
    m = Manager(FakeLauncher(), grace=0.05)
    s = await m.start(request(), [])
    await started(s)
    who = Caller(1000, 4242, "varlink")
    line = m.change_policy(s.id[:4], Change.ALLOW, ["api.example"], who)
    assert line == "allow api.example (uid 1000, pid 4242, varlink)"
    assert (await m.info(s.id)).policy == [line]
    m.stop(s.id, kill=True)
    await s.wait()
    with pytest.raises(UsageError, match="is not running"):
        m.change_policy(s.id, Change.DENY, ["api.example"], who)
    with pytest.raises(NoSuchSession):
        m.change_policy("ffffffff", Change.DENY, ["api.example"], who)
