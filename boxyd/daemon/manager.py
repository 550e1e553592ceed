"""The core's registry: a Manager owns every run as a Session.

Both API front ends (varlink, D-Bus) are thin adapters over this module: they
decode a RunRequest, call `start`, and relay the session's events and outcome.
No policy lives in an adapter; no wire format lives here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from boxy import VERSION
from boxy.buildid import build_id
from boxy.checks import Check, probe
from boxy.errors import BuildMismatch, Busy, DaemonError, NoSuchSession, UsageError
from boxy.outcome import STOP_GRACE, SessionInfo
from boxy.paths import config_home
from boxy.request import RunRequest
from boxy.varlink import close_fds
from boxyd.config import parsedoor
from boxyd.config.runspec import DEFAULT_PROFILE
from boxyd.daemon import pools, records, review, reviews
from boxyd.daemon.events import (
    Fanout,
    ManagerEvent,
    SessionEnded,
    SessionNew,
    SessionRemoved,
    Subscription,
)
from boxyd.daemon.records import Records
from boxyd.daemon.seam import Caller, Change, Launcher
from boxyd.daemon.session import Session

if TYPE_CHECKING:
    from boxyd.config.profileview import ProfileView
    from boxyd.config.trust import Approval

R = TypeVar("R")

log = logging.getLogger("boxyd")

KEEP_FINISHED = 64  # finished sessions kept in memory (the rest live in their records)
MAX_OFFSET = (1 << 63) - 1  # the largest file offset there is
OUTPUT_CHUNK = 1 << 16  # bytes of an output log one Output call carries
PRUNE_DELAY = 1.0  # seconds after a session ends before its records are bounded


@dataclass(frozen=True)
class Output:
    id: str
    data: bytes
    offset: int
    ended: bool
    kept: bool


@dataclass(frozen=True)
class DaemonStatus:
    build: str
    version: str
    pid: int
    uptime: float
    sessions_running: int


def _client_paths(cwd: str, *names: str) -> None:
    """A client's directory (absolute) and names, checked: a NUL byte names no file,
    and boxyd's own cwd is not the client's; one line each, never an internal error."""
    if any("\0" in p for p in (cwd, *names)):
        raise UsageError("a path contains a NUL byte")
    if not os.path.isabs(cwd):
        raise UsageError(f"the directory {cwd!r} is not an absolute path")


def token() -> str:
    """A new session id: secrets.token_hex(4), without the secrets module (it imports
    hmac, and hmac hashlib: OpenSSL's libcrypto, 3.8 MiB of boxyd's memory)."""
    return os.urandom(4).hex()


class Manager:
    def __init__(
        self,
        launcher: Launcher,
        records: Records | None = None,
        *,
        keep_finished: int = KEEP_FINISHED,
        grace: float = STOP_GRACE,
    ) -> None:
        self.launcher = launcher
        self.records = records
        self.sessions: dict[str, Session] = {}
        self.events: Fanout[ManagerEvent] = Fanout()
        self.started_at = time.time()
        self._keep = keep_finished
        self._grace = grace
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        self._begun: dict[str, asyncio.Future[None]] = {}  # start records being written

    def start_launcher(self) -> None:
        self.launcher.start()

    # -- queries ---------------------------------------------------------------------
    def status(self) -> DaemonStatus:
        return DaemonStatus(
            build_id(),
            VERSION,
            os.getpid(),
            round(time.time() - self.started_at, 1),
            len(self.running()),
        )

    def running(self) -> list[Session]:
        return [s for s in self.sessions.values() if not s.state.finished]

    def busy(self) -> bool:
        return bool(self.running())

    def known(self) -> list[Session]:
        """Every session in memory (running, and the newest finished ones)."""
        return [*self.sessions.values()]

    def get(self, sid: str) -> Session:
        """A session in memory by its id or a unique prefix of it (Attach, Signal,
        Resize, Stop: only a session boxyd holds can be acted on)."""
        try:
            return self.sessions[_unique(sid, list(self.sessions))]
        except KeyError:
            raise NoSuchSession(sid) from None

    async def resolve(self, sid: str) -> str:
        """SID, or the one id it is a prefix of among the sessions in memory and on
        record. NoSuchSession when none is; UsageError naming them when several are."""
        if sid in self.sessions:
            return sid
        on_record = (
            await pools.run(pools.RECORDS, records.record_ids) if self.records is not None else []
        )
        return _unique(sid, [*self.sessions, *on_record])

    def watched(self, sid: str | None) -> Session:
        """`watch [ID]`: that session; without an id the only running one."""
        if sid is not None:
            return self.get(sid)  # a finished one not in memory: the service asks info()
        running = self.running()
        if len(running) == 1:
            return running[0]
        if not running:
            raise UsageError("watch: no session is running (`boxyctl ps -a` lists finished ones)")
        raise UsageError(
            "watch: several sessions are running ("
            + ", ".join(s.id for s in running)
            + "); name one"
        )

    def subscribe(self) -> Subscription[ManagerEvent]:
        return self.events.subscribe()

    async def profiles(self) -> ProfileView:
        """`profile list`: the presets and the user's own (each file read for its
        description, parsed apart)."""
        from boxyd.config import profileview  # YAML: loaded with the first question

        return await self._apart(profileview.listing)

    async def profile(self, name: str, cwd: str, client_env: dict[str, str]) -> ProfileView:
        """`profile show NAME` as a run in CWD would load it."""
        _client_paths(cwd, name)
        return await self.launcher.profile(name, cwd, client_env)

    async def approve(self, cwd: str, client_env: dict[str, str]) -> Approval:
        """`trust`: CWD's configuration read as a run reads it, approved as read."""
        from boxyd.config import trust

        return await self._asked(trust.approve, cwd, client_env)

    async def trusted(self, cwd: str, client_env: dict[str, str]) -> str | None:
        """The hook's question: is CWD's .boxy.yaml approved as it is now? The profile
        it names when it is (config/trust.py)."""
        from boxyd.config import trust

        return await self._asked(trust.trusted, cwd, client_env)

    async def revoke(self, cwd: str) -> int:
        """`trust --revoke`: every approval for CWD withdrawn; how many there were."""
        from boxyd.config import projectconfig

        home = config_home(pwd.getpwuid(os.getuid()).pw_dir)
        return await pools.run(pools.ASKED, projectconfig.revoke, cwd, home)

    async def approvals(self) -> list[dict[str, object]]:
        """`trust --list`: every approval."""
        from boxyd.config import trust

        home = config_home(pwd.getpwuid(os.getuid()).pw_dir)
        return await pools.run(pools.ASKED, trust.approvals, home)

    async def _asked(self, fn: Callable[..., R], cwd: str, client_env: dict[str, str]) -> R:
        """FN(CWD, home, user, CLIENT_ENV, config home), its parses apart (_apart)."""
        _client_paths(cwd)
        me = pwd.getpwuid(os.getuid())
        return await self._apart(
            lambda: fn(cwd, me.pw_dir, me.pw_name, client_env, config_home(me.pw_dir))
        )

    async def _apart(self, fn: Callable[[], R]) -> R:
        """FN() in a worker, its parses of files a payload could have written in a parse
        child of the launcher's (parsedoor.py)."""
        parser = self.launcher.parser()

        def call() -> R:
            with parsedoor.using(parser):
                return fn()

        try:
            return await pools.run(pools.ASKED, call)
        finally:
            parser.close()

    async def doctor(self) -> list[Check]:
        """The doctor's checks as this daemon finds them (its session, cgroup and
        environment), run in a process of their own and bounded (boxy.checks.probe)."""
        return await pools.run(pools.ASKED, probe)

    def check_shutdown(self, force: bool) -> None:
        """May boxyd stop now? Busy while sessions run, unless FORCE (then they are
        stopped and recorded first: shutdown())."""
        running = self.running()
        if running and not force:
            ids = ", ".join(s.id for s in running)
            raise Busy(f"sessions are running ({ids}); --force stops them first")

    # -- control ---------------------------------------------------------------------
    async def start(
        self, request: RunRequest, stdio: list[int], *, follower: bool = True
    ) -> Session:
        """Check REQUEST and start its session; returns once it is under way (the run
        goes on in a task of ours, whoever asked). STDIO are ours from the call on.
        FOLLOWER: a client follows it (Session.follow) and its going hangs it up.
        Raises BuildMismatch or UsageError (nothing started, nothing changed)."""
        try:
            if self._closing:
                raise DaemonError("boxyd is stopping; run again in a moment")
            if request.build != build_id():  # every API: a client of another build
                raise BuildMismatch(build_id(), request.build)
            if not stdio and request.options.detach:
                stdio = _null_stdio()
        except BaseException:
            close_fds(stdio)
            raise
        session = Session(self._new_id(), request, grace=self._grace, follower=follower)
        session.sandbox = await self.launcher.prepare(request, stdio, session)
        self.sessions[session.id] = session
        task = asyncio.get_running_loop().create_task(
            session.run(self._begin, self._finished), name=f"session {session.id}"
        )
        self._tasks[session.id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(session.id, None))
        self.events.publish(SessionNew(session.id))
        return session

    def change_policy(self, sid: str, change: Change, hosts: list[str], caller: Caller) -> str:
        """Allow or Deny (both wires): the running session SID's network policy."""
        return self.get(sid).change_policy(change, hosts, caller)

    def stop(self, sid: str, kill: bool = False) -> None:
        self.get(sid).stop(kill)

    async def stop_and_wait(self, sid: str, kill: bool = False) -> SessionInfo:
        """`boxyctl stop`: the session as it ended (a finished one as it is)."""
        sid = await self.resolve(sid)
        try:
            s = self.get(sid)
        except NoSuchSession:
            return await self.info(sid)
        s.stop(kill)
        await s.wait()
        return s.info()

    async def infos(self, all: bool = False) -> list[SessionInfo]:
        """The sessions starting or running; ALL: and the finished ones, those in
        memory and every one on record (from before a restart too). Oldest first."""
        held = await pools.run(pools.RECORDS, review.held)
        found = {
            s.id: s.info()
            for s in self.sessions.values()
            if all or not s.state.finished or s.id in held
        }
        if all and self.records is not None:
            for info in await pools.run(pools.RECORDS, records.read_all):
                found.setdefault(info.id, _profiled(info))
        elif held and self.records is not None:  # the held ones' records alone: a List
            for sid in sorted(held - found.keys()):  # must not read every record there is
                meta = await pools.run(pools.RECORDS, records.read_meta, sid)
                if meta is not None:
                    found[sid] = _profiled(meta)
        for info in found.values():
            info.review = "held" if info.id in held else None
        return sorted(found.values(), key=lambda i: i.started_at)

    async def info(self, sid: str) -> SessionInfo:
        sid = await self.resolve(sid)
        held = await pools.run(pools.RECORDS, review.shown, sid)
        if sid in self.sessions:
            live = self.sessions[sid].info()
            live.review = held
            return live
        info = (
            await pools.run(pools.RECORDS, records.read_meta, sid)
            if self.records is not None
            else None
        )
        if info is None:
            raise NoSuchSession(sid)
        info.review = held
        return _profiled(info)

    # -- --review: the changes a held session made ----------------------------------
    async def _review(self, sid: str) -> review.Review:
        sid = await self.resolve(sid)
        running = sid in self.sessions and not self.sessions[sid].state.finished
        return await reviews.held(sid, running)

    async def review_diff(self, sid: str, text: bool = True) -> dict[str, object]:
        return await reviews.diff(await self._review(sid), text)

    async def review_apply(self, sid: str, paths: list[str] | None) -> dict[str, object]:
        return await reviews.apply(await self._review(sid), paths)

    async def review_discard(self, sid: str) -> None:
        await reviews.discard(await self._review(sid))

    async def output(self, sid: str, offset: int, limit: int = OUTPUT_CHUNK) -> Output:
        """`logs`: a piece of the session's output log. Whether it had ended is asked
        first: an empty read after that is the whole of it."""
        if offset < 0:
            raise UsageError(f"Output: offset {offset} is negative")
        if offset > MAX_OFFSET:  # a file offset is a signed 64-bit number
            raise UsageError(f"Output: offset {offset} is past any file's end")
        sid = await self.resolve(sid)
        held = self.sessions.get(sid)
        ended = held is None or held.state.finished  # not held: a record, finished
        data = await pools.run(pools.RECORDS, records.read_output, sid, offset, limit)
        return Output(sid, data or b"", offset + len(data or b""), ended, data is not None)

    async def shutdown(self) -> None:
        """boxyd is told to stop: every running session is stopped (SIGTERM, grace,
        SIGKILL) and recorded before it returns."""
        self._closing = True
        for s in self.running():
            s.stop()
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks)
        self.launcher.close()

    def _new_id(self) -> str:
        while True:
            sid = token()
            if sid not in self.sessions:
                return sid

    async def _begin(self, s: Session) -> None:
        """A record while it runs: `ps -a` after a crash of boxyd still lists it.
        Written meanwhile (not on the start-up path); the final one waits for it."""
        if self.records is not None:
            self._begun[s.id] = pools.submit(pools.RECORDS, self.records.begin, s)

    async def _finished(self, s: Session) -> None:
        """The session has its outcome: its record is written before anyone hears it."""
        self.events.publish(SessionEnded(s.id))
        begun = self._begun.pop(s.id, None)
        if begun is not None:
            await begun
        if self.records is not None:
            await pools.run(pools.RECORDS, self.records.write, s)
            # a moment later: its thread would hold the GIL this session's end needs
            asyncio.get_running_loop().call_later(
                PRUNE_DELAY, pools.submit, pools.RECORDS, self.records.prune
            )
        s.audit = []  # written out (or kept in the record): not held by a long-lived daemon
        self._forget_old(s)

    def _forget_old(self, ending: Session) -> None:
        """A long-lived daemon keeps only the newest finished sessions in memory (their
        records on disk are the history)."""
        finished = [s for s in self.sessions.values() if s.state.finished or s is ending]
        for old in finished[: max(0, len(finished) - self._keep)]:
            del self.sessions[old.id]
            self.events.publish(SessionRemoved(old.id))


MAX_NAMED = 5  # ids an ambiguous prefix names (the rest counted)


def _unique(sid: str, ids: list[str]) -> str:
    """The one of IDS that is SID or starts with it."""
    if sid in ids:
        return sid
    found = sorted({i for i in ids if sid and i.startswith(sid)})
    if not found:
        raise NoSuchSession(sid)
    if len(found) > 1:
        named = ", ".join(found[:MAX_NAMED])
        more = f" and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
        raise UsageError(f"id {sid} is ambiguous: {named}{more}; give more of it")
    return found[0]


def _profiled(info: SessionInfo) -> SessionInfo:
    """A record from before profiles were always named: the one it ran with."""
    if info.profile is None:
        info.profile = DEFAULT_PROFILE
    return info


def _null_stdio() -> list[int]:
    """A detached run's stdin, stdout and stderr when its client passed none (a client
    without fd passing): it writes to a terminal of its own (sessions/<id>/output.log,
    attachable later), so three /dev/null stand for the client's."""
    return [os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) for _ in range(3)]
