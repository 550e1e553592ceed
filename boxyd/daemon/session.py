"""A Session: one run, from the checked request to its Outcome.

It owns its lifecycle (starting → running → exited | killed | timed-out | failed),
its timers (--timeout, the grace between SIGTERM and SIGKILL), its audit records
and its event fan-out. What the sandbox is made of stays behind the Sandbox
protocol (boxyd.daemon.seam); the Manager owns the task that runs it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from boxy import values
from boxy.errors import BoxyError, Busy, UsageError
from boxy.outcome import (
    STOP_GRACE,
    Counters,
    Detached,
    Ended,
    Notice,
    Outcome,
    Reason,
    Running,
    RunReply,
    SessionInfo,
    State,
    Stopped,
    clip,
)
from boxy.request import RunRequest, Terminal
from boxy.varlink import close_fds
from boxyd.config.runspec import DEFAULT_PROFILE, RunSpec
from boxyd.daemon import seam
from boxyd.daemon.asking import RemoteQuestions
from boxyd.daemon.events import (
    Audited,
    ClientAttached,
    ClientDetached,
    CountersTick,
    Event,
    Exited,
    Fanout,
    Noticed,
    PayloadStopped,
    RunStarted,
    SessionEvent,
    StateChanged,
    Subscription,
)
from boxyd.daemon.seam import Caller, Change

log = logging.getLogger("boxyd")

MAX_AUDIT = 50_000  # records kept per session for --audit-log (a flood is counted, not kept)
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_SETUP = 125
EXIT_NOEXEC = 126
EXIT_NOTFOUND = 127
MAX_POLICY_LINES = 256  # changes of its policy show lists (the audit log has each)
TICK = 1.0  # seconds between counters snapshots for watchers
TOP_DESTINATIONS = 10
SESSION_ID = re.compile(r"[0-9a-f]{8}")  # os.urandom(4).hex(): anything else names no session

Hook = Callable[["Session"], Awaitable[None]]


def check_signal(sig: int) -> None:
    """A signal number a client may send (1 .. NSIG-1, the real-time ones too)."""
    if not 0 < sig < signal.NSIG:
        raise UsageError(f"Signal: {sig} is not a signal number")


class Session:
    def __init__(
        self, sid: str, request: RunRequest, *, grace: float = STOP_GRACE, follower: bool = True
    ) -> None:
        self.id = sid
        self.request = request
        self.sandbox: seam.Sandbox | None = None  # set by the Manager once prepared
        self.state = State.STARTING
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.outcome: Outcome | None = None
        self.warnings: list[str] = []
        self.audit: list[dict[str, Any]] = []
        self.audit_dropped = 0
        self.events: Fanout[SessionEvent] = Fanout()
        self._grace = grace
        self._done = asyncio.Event()
        self._timed_out = False
        self._stop: int | None = None  # a signal asked for before the sandbox could take it
        self._kill_timer: asyncio.TimerHandle | None = None
        # a client follows it (Run, Attach): when that client goes, the session is
        # hung up; a detached one (-d, Ctrl-], a D-Bus Run: FOLLOWER false) lives on
        self.attached = follower and not request.options.detach
        # put in the background (-d, Ctrl-], a D-Bus Run): a client attached later that
        # goes away (an ssh drop) leaves it detached, as tmux and docker do, not hung up
        self._background = not self.attached
        self._counters: Counters | None = None  # set at the end
        self._policy: list[str] = []  # its policy's changes (change_policy), for show
        self._launched = False  # sandbox.start() has returned: signals reach stage 2
        self.questions = RemoteQuestions()  # --ask's, to clients on the bus (api/dbus.py)

    @property
    def spec(self) -> RunSpec:
        assert self.sandbox is not None
        return self.sandbox.spec

    # -- what the sandbox tells us (launch.Sink) ---------------------------------------
    def record(self, layer: str, **fields: object) -> None:
        """One audit record: kept for --audit-log and the record (bounded: a flood of
        denials must not grow the daemon), and an event for watchers (always)."""
        t = time.time()
        rec = {"t": round(t, 3), "session": self.id, "layer": layer, **fields}
        if len(self.audit) < MAX_AUDIT:
            self.audit.append(rec)
        else:
            self.audit_dropped += 1
        if self.events.watchers:  # a flood costs no event nobody reads, or has room for
            self.events.publish_lazy(Audited, lambda: Audited(rec, t=t))

    def notice(self, text: str) -> None:
        self.events.publish(Noticed(text))

    # -- control -------------------------------------------------------------------------
    def subscribe(self, kinds: tuple[type[Event], ...] | None = None) -> Subscription[SessionEvent]:
        return self.events.subscribe(kinds)

    def follow(self) -> Follow:
        """The Run reply stream of the client that started it (subscribed now: call it
        before anything can happen, i.e. right after Manager.start)."""
        return Follow(self, until_running=self.request.options.detach)

    async def wait(self) -> Outcome:
        await self._done.wait()
        assert self.outcome is not None
        return self.outcome

    def signal(self, sig: int) -> None:
        """A signal for the payload (from the client: ^C, SIGCONT after fg); dropped
        unless it runs. UsageError for a number that is no signal."""
        check_signal(sig)
        if self.state is State.RUNNING and self.sandbox is not None:
            self.sandbox.signal(sig)

    def resize(self, rows: int, cols: int) -> None:
        if self.sandbox is not None and not self.state.finished:
            self.sandbox.resize(rows, cols)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM, then SIGKILL after the grace; KILL: SIGKILL now. Before the payload
        runs, the stop waits for the sandbox and is then a SIGKILL (nothing to save)."""
        if self.state.finished:
            return
        if self.state is State.STARTING:
            self._stop = signal.SIGKILL
            if self.sandbox is not None:  # also while start() waits on stage 2: it ends the run
                assert self.sandbox is not None
                self.sandbox.signal(signal.SIGKILL)
            return
        assert self.sandbox is not None
        if kill:
            self.sandbox.signal(signal.SIGKILL)
        else:
            self.sandbox.signal(signal.SIGTERM)
            if self._kill_timer is None:
                self._kill_timer = asyncio.get_running_loop().call_later(
                    self._grace, self.sandbox.signal, signal.SIGKILL
                )

    def hangup(self) -> None:
        """The attached client went away: SIGHUP as from a closed terminal, then a stop."""
        if self.state is State.RUNNING and self.sandbox is not None:
            self.sandbox.signal(signal.SIGHUP)
        self.stop()

    def client_gone(self) -> None:
        """The connection of the client that followed it closed: the run's own client
        hangs it up; one attached to a session in the background detaches it."""
        if not self.attached:
            return
        if self._background:
            self.detach_requested()
        else:
            self.hangup()

    def detach_requested(self) -> None:
        """Ctrl-] (launch.Sink): the client is told, and leaves; the session goes on."""
        if not self.attached or self.state.finished or self.sandbox is None:
            return
        if self.sandbox.detach():
            self.attached = False
            self._background = True
            self.events.publish(ClientDetached())

    def attach(self, stdio: list[int], terminal: Terminal | None) -> Follow:
        """A client takes over the terminal of a detached session (STDIO are ours);
        its reply stream, which starts with Running."""
        try:
            if self.state.finished:
                raise UsageError(f"session {self.id} has ended (`boxyctl show {self.id}`)")
            if self.attached:
                raise Busy(
                    f"session {self.id} is attached to another client (Ctrl-] there detaches it)"
                )
        except BoxyError:
            close_fds(stdio)
            raise
        assert self.sandbox is not None
        follow = Follow(self, first=Running(self.id))  # subscribed before anything is said
        self.sandbox.attach_client(stdio, terminal)
        self.attached = True
        self.events.publish(ClientAttached())
        return follow

    def _timeout(self) -> None:
        self._timed_out = True
        self.stop()

    def _set_state(self, state: State) -> None:
        self.state = state
        self.events.publish(StateChanged(state))

    # -- the lifecycle, run by the Manager's task -----------------------------------------
    def info(self) -> SessionInfo:
        spec = self.sandbox.spec if self.sandbox is not None else None
        return SessionInfo(
            self.id,
            self.state,
            spec.argv if spec else self.request.argv,
            spec.workdir if spec else self.request.cwd,
            (spec.profile if spec else self.request.options.profile) or DEFAULT_PROFILE,
            self.started_at,
            self.ended_at,
            self.outcome if self.state.finished else None,
            self.counters(),
            self.attached,
            self.sandbox.limit_lines() if self.sandbox is not None else [],
            [str(m) for m in spec.publish] if spec else [],
            list(self._policy),
        )

    def change_policy(self, change: Change, hosts: list[str], caller: Caller) -> str:
        """`boxyctl allow` / `deny`: the running session's network policy, changed at
        once. Raises UsageError when it cannot change."""
        if self.state.finished or self.sandbox is None:
            raise UsageError(f"{change.value}: session {self.id} is not running")
        line = self.sandbox.change_policy(change, hosts, caller, time.time() - self.started_at)
        if len(self._policy) < MAX_POLICY_LINES:
            self._policy.append(line)
        return line

    def counters(self) -> Counters:
        """Live while it runs; the last totals once it has ended."""
        if self._counters is None and self.sandbox is not None:
            return self.sandbox.counters()
        return self._counters or Counters()

    async def _tick(self) -> None:
        """Once a second while it runs, for whoever watches: the totals and the
        busiest destinations (computed only when someone wants them)."""
        assert self.sandbox is not None
        while True:
            await asyncio.sleep(TICK)
            if self.events.wants(CountersTick):
                self.events.publish(
                    CountersTick(
                        self.sandbox.counters(), self.sandbox.destinations(TOP_DESTINATIONS)
                    )
                )

    async def run(self, begin: Hook, finished: Hook) -> None:
        """BEGIN (the record of a session under way), start, relay, end; then FINISHED
        (the final record) before anyone hears the outcome."""
        assert self.sandbox is not None
        try:
            await begin(self)
            self.outcome = await self._lifecycle(self.sandbox)
            self.ended_at = time.time()
            self.state = self.outcome.state  # announced once the record is written
            await finished(self)
        except asyncio.CancelledError:  # boxyd is going away without waiting
            if self.outcome is None:
                self.outcome = Outcome(EXIT_SETUP, Reason.SETUP, "boxyd stopped during the run")
            raise
        except Exception as e:  # a bug: still an outcome, and the end
            log.exception("session %s failed", self.id)
            if self.outcome is None:
                self.outcome = Outcome(EXIT_SETUP, Reason.SETUP, _internal(e))
        finally:
            if self._kill_timer is not None:
                self._kill_timer.cancel()
            self.sandbox.close()
            assert self.outcome is not None
            self.ended_at = self.ended_at or time.time()
            self._set_state(self.outcome.state)
            self.events.publish(Exited(self.outcome))
            self.events.close()
            self._done.set()

    async def _lifecycle(self, sandbox: seam.Sandbox) -> Outcome:
        try:
            # -v lists every credential covered: the audit log holds them all
            self.warnings = clip(
                await sandbox.start(), "warnings", "-v and the audit log list them"
            )
        except BoxyError as e:  # the user's input (2), or a layer that cannot be applied (125)
            status = e.exit_status if isinstance(e, UsageError) else EXIT_SETUP
            return Outcome(status, Reason.SETUP, str(e), warnings=self.warnings)
        except Exception as e:  # a bug, not the user's doing: still one line
            log.exception("session %s: setup failed", self.id)
            return Outcome(EXIT_SETUP, Reason.SETUP, _internal(e))
        self._launched = True
        if self._stop is not None:
            sandbox.signal(self._stop)
        timer = None
        ticker: asyncio.Task[None] | None = None
        end = seam.Exit()
        async for event in sandbox.events():
            if isinstance(event, seam.Started):
                self._set_state(State.RUNNING)
                if self.spec.timeout:
                    timer = asyncio.get_running_loop().call_later(self.spec.timeout, self._timeout)
                ticker = asyncio.get_running_loop().create_task(self._tick())
                self.events.publish(RunStarted(self.warnings))
            elif isinstance(event, seam.Stopped):
                self.events.publish(PayloadStopped(event.signal))
            elif isinstance(event, seam.Exit):
                end = event
        if timer is not None:
            timer.cancel()
        if ticker is not None:
            ticker.cancel()
        started = self.state is State.RUNNING
        report = await sandbox.finish()
        self._counters = sandbox.counters()  # the network is let go with the sandbox
        outcome = outcome_of(end, timed_out=self._timed_out, timeout=self.spec.timeout)
        if outcome.reason is Reason.SECCOMP and report.seccomp_kill is not None:
            outcome.message = f"killed by seccomp: the payload called {report.seccomp_kill}"
        elif outcome.reason is Reason.SECCOMP:  # a kernel that cannot name it (doctor says)
            self.record("seccomp", action="kill", signal=outcome.signal)
        outcome.findings, outcome.notes = report.findings, report.notes
        if self.audit_dropped:  # the layers held for them: only the record is short
            outcome.notes.append(
                f"audit log: {self.audit_dropped:,} records past {MAX_AUDIT:,} counted, not kept"
            )
        outcome.destinations, outcome.refusals = report.destinations, report.refusals
        if not started:  # never said: the client hears them with the outcome
            outcome.warnings = self.warnings
        return outcome


def _internal(e: BaseException) -> str:
    return f"internal error in boxyd ({type(e).__name__}: {e}); see its log"


def outcome_of(end: seam.Exit, *, timed_out: bool, timeout: float | None) -> Outcome:
    """The exit status a shell would see, and why (pure)."""
    if end.error is not None:
        return Outcome(EXIT_SETUP, Reason.SETUP, end.error)
    if end.exec_errno is not None:
        if end.exec_errno == errno.ENOENT:
            return Outcome(EXIT_NOTFOUND, Reason.EXEC, f"{end.cmd}: command not found")
        return Outcome(EXIT_NOEXEC, Reason.EXEC, f"{end.cmd}: {os.strerror(end.exec_errno)}")
    if timed_out and (end.signal is not None or end.code is not None):
        # timeout(1)'s status, even for a payload that caught SIGTERM and exited 0
        return Outcome(
            EXIT_TIMEOUT,
            Reason.TIMEOUT,
            f"timed out after {values.format_duration(timeout or 0)}",
            signal=end.signal,
        )
    if end.signal is not None:
        if end.signal == signal.SIGSYS:
            return Outcome(
                128 + end.signal,
                Reason.SECCOMP,
                "killed by seccomp: the payload made a forbidden system call",
                signal=end.signal,
            )
        return Outcome(128 + end.signal, Reason.SIGNAL, signal=end.signal)
    if end.code is not None:
        return Outcome(end.code, Reason.EXIT)
    return Outcome(EXIT_SETUP, Reason.SETUP, "stage 2 ended without a word (see boxyd's log)")


FOLLOWED = (RunStarted, Noticed, PayloadStopped, ClientDetached)  # what a follower hears


class Follow:
    """The reply stream of the client that follows a session (Run, Attach): Running,
    then Notice and Stopped as they happen, then Detached or Ended. UNTIL_RUNNING (a
    run started with -d): Running is the last, the session is on its own; FIRST: a
    reply said at once (Attach). Subscribed when made, so nothing after is missed."""

    def __init__(
        self, session: Session, *, until_running: bool = False, first: Running | None = None
    ) -> None:
        self.session = session
        self._until_running = until_running
        self._first = first
        self._events = session.subscribe(FOLLOWED)

    def last(self, reply: RunReply) -> bool:
        """Does REPLY end the stream (the varlink reply without "continues")?"""
        return isinstance(reply, (Detached, Ended)) or (
            self._until_running and isinstance(reply, Running)
        )

    def client_gone(self) -> None:
        """The follower's connection closed: an attached session is hung up."""
        self.session.client_gone()

    def close(self) -> None:
        self._events.close()

    def __aiter__(self) -> AsyncIterator[RunReply]:
        return self._replies()

    async def _replies(self) -> AsyncIterator[RunReply]:
        sid = self.session.id
        if self._first is not None:
            yield self._first
        try:
            async for ev in self._events:
                if isinstance(ev, RunStarted):
                    yield Running(sid, ev.warnings)
                    if self._until_running:
                        return
                elif isinstance(ev, Noticed):
                    yield Notice(sid, ev.text)
                elif isinstance(ev, PayloadStopped):
                    yield Stopped(sid, ev.signal)
                elif isinstance(ev, ClientDetached):
                    yield Detached(sid)
                    return
                # Lost: a follower that does not read loses notices, never the end
        finally:
            self.close()
        yield Ended(sid, await self.session.wait())
