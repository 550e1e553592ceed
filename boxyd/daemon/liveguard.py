"""The live guard of one session: inotify on the directories boxyd/plan/live.py names, and
each change re-applied in the sandbox through a joiner (stage2/joiner.py, stage2/live.py).

The window that remains is from the host's rename to the stand-in or pin being in
place again: the event is read on the event loop, the file judged in a worker
thread, the mount made by stage 2. Each redo is recorded (audit layer ``fs.live``)
with that window in milliseconds, and said under -v.

The payload can make changes faster than any guard redoes them. A session's covers
go one at a time (a flood in one session holds one worker, never another
session's), through a bounded backlog (plan/live.py Backlog); when the guard
cannot keep up, or a redo could not be done, the session is stopped and says why:
protection never goes on with a hole in it (docs/design.md, "The guard is live").
A pin's redo for a host rename goes at once: only the host makes one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import functools
import logging
import os
import stat
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from boxyd.config import hostrun
from boxyd.config.hostrun import Held
from boxyd.daemon import pools
from boxyd.daemon.livewatch import IN_CLOSE_WRITE, IN_MODIFY, Rescan, Visit, Watches, sockets_in
from boxyd.daemon.parseproc import Apart, call_apart
from boxyd.gitguard import discover
from boxyd.kernel import walk
from boxyd.plan import credentials, live, masking
from boxyd.plan.credentials import Action, Rule
from boxyd.plan.live import Redo, Watched
from boxyd.plan.masking import Found
from boxyd.stage2.protocol import LiveCover, LivePin

log = logging.getLogger("boxyd")

IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")

_libc = ctypes.CDLL(None, use_errno=True)

LIVE_TIMEOUT = 10.0  # seconds for stage 2 to answer one request
# re-pins of one entry in a row that may fail because it was renamed over again while
# the pin went on (the redo of that rename is queued): past it, the session is stopped
REPIN_MISSES = 16
Send = Callable[[LiveCover | LivePin], None]  # one request to the session's joiner
Record = Callable[..., None]  # Sink.record
Stop = Callable[[str], None]  # ends the session's payload now (the line: why)
# (root, rel, what holds it, the symlink that stood there or "", the name it is judged
# as) -> heldfiles.hold's
Hold = Callable[[str, str, Held, str, str], tuple[str, bool] | None]


@dataclass
class _Pending:
    rel: str
    what: str
    since: float
    done: asyncio.Future[bool]  # True: in place


SAID_MAX = 16  # lines of what the guard could not do, in a run's outcome
SWEEP_EVERY = 0.1  # seconds from a directory's new entry to the look for sockets in it
SOCKETS_EVERY = 0.25  # seconds between looks at the host's bound sockets (/proc/net/unix)
GIT_EVERY = 2.0  # seconds between git checks while the trees change
# ... at most a tenth of the time, but never further apart than this: the window of a
# plant no event tells of (a write through mmap) is this plus the check's own time
GIT_EVERY_MAX = 4.0
GIT_BURST = 2.0  # seconds of git checks a session may run back to back
GIT_SHARE = 0.5  # ... and then this share of the time


class LiveGuard:
    """Started once the payload runs; closed when the session ends."""

    def __init__(
        self,
        trees: list[Watched],
        send: Send,
        record: Record,
        adopt: Callable[[str, str, walk.FileRead | None], str | None],
        notice: Callable[[str], None],
        apart: Callable[[], Apart],
        stop: Stop,
        rescan: Callable[[Watched, list[str], int], Rescan],
        hold: Hold,
        git_check: Callable[[], Awaitable[list[str]]],
    ) -> None:
        """APART: a Parser for a redo's parse of what the payload wrote (parseproc.py);
        STOP: what the guard does when it cannot keep the trees covered; RESCAN: a
        listing of what it could not watch, in a child (walks.Walks.rescan); HOLD: a
        held file the payload made, moved to the quarantine (in a worker thread);
        GIT_CHECK: the git guard's discovery and judgement of the trees, now (what it
        moved, as lines)."""
        self._trees = {w.root: w for w in trees}
        self._apart = apart
        self._send = send
        self._record = record
        # (root, rel, what the host saved) of a pin the host changed -> a finding, if any
        self._adopt = adopt
        self._notice = notice
        self._stop = stop
        self._rescan_apart = rescan
        self._holder = hold
        self._git_check = git_check
        self._git_task: asyncio.Task[None] | None = None
        self._git_again = False  # a change came while a check ran: one more after it
        # a change git reads came during the session: a repository may be made where no
        # event tells (node_modules, through a hard link), so checked every GIT_EVERY
        self._git_touched = False
        self._git_last = 0.0  # seconds the last git check took
        self._swept: set[tuple[str, str]] = set()  # (root, rel): looked into for sockets
        self._sweeper: asyncio.Task[None] | None = None
        self._git_credit, self._git_at = GIT_BURST, time.monotonic()  # (_git_loop)
        self._holds = 0  # held files quarantined in this session (live.HOLD_MAX)
        self._backlog = live.Backlog()
        # a pin's redo under way, and the next one if it changed again meanwhile
        self._pinning: dict[live.Key, tuple[Redo, float] | None] = {}
        self._misses: dict[live.Key, int] = {}  # failed re-pins in a row excused (_superseded)
        self._drainer: asyncio.Task[None] | None = None
        self.stopped: str | None = None  # why the guard stopped the session
        self._fd = -1
        self._watches = Watches(-1)
        self._entering: list[tuple[str, str, float]] = []  # (root, rel, since) to watch
        self._enterer: asyncio.Task[None] | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # root -> directories that could not be watched, listed again every RESCAN_EVERY
        self._unwatched: dict[str, set[str]] = {}
        self._rescanner: asyncio.Task[None] | None = None
        # what the guard could not do as it would (a budget reached, a directory it
        # could not list), for the run's outcome: its record and its last lines
        self.said: list[str] = []

    async def start(self) -> list[str]:
        """Watch every directory the policy names (up to 4096, in a worker thread;
        events are read from the first watch on, so none is lost meanwhile) and list
        those that changed since the walk (what appeared in between: no event told of
        it); what could not be watched, said. Without an inotify instance the session is
        stopped: the guard cannot watch."""
        try:
            self._fd = _inotify_init()
        except OSError as e:
            self.fail(f"{e.strerror} (no inotify instance left: fs.inotify.max_user_instances)")
            return []
        self._watches = Watches(self._fd)
        since = time.monotonic()
        asyncio.get_running_loop().add_reader(self._fd, self._readable)
        notes = []
        for w in self._trees.values():
            found = await pools.run(pools.WATCHES, self._watches.start, w)
            w.stamps.clear()  # the start's only (~50 KB a session for 200 directories)
            if self._fd < 0:
                break  # closed meanwhile: the session ended
            notes += self._apply(w, found, since)
        self.said += notes[: SAID_MAX - len(self.said)]
        if self._fd >= 0:
            self._track(self._periodic())
        return notes

    def _apply(self, w: Watched, found: Visit, since: float) -> list[str]:
        for redo in found.redos:
            self._spawn(w, redo, since)
        if found.unwatched:
            self._unwatched.setdefault(w.root, set()).update(found.unwatched)
            if self._rescanner is None:
                self._rescanner = self._track(self._rescan())
        return found.notes

    async def _rescan(self) -> None:
        """A bound the payload can fill (the watches) never leaves protection off: the
        directories that could not be watched are listed again every RESCAN_EVERY, in a
        child (docs/design.md, "The guard is live"). Past RESCAN_MAX entries a pass
        would leave the rest unlisted: the session is stopped instead."""
        took = 0.0
        while self._fd >= 0:
            # at most half a core however large the tree (a pass of 250,000: ~1 s)
            await asyncio.sleep(max(live.RESCAN_EVERY, took))
            start = time.monotonic()
            for root, rels in list(self._unwatched.items()):
                w = self._trees[root]
                got = await pools.run(
                    pools.WATCHES, self._rescan_apart, w, sorted(rels), live.RESCAN_MAX
                )
                if self._fd < 0:
                    return
                for redo in got.redos:
                    self._spawn(w, redo, time.monotonic())
                if got.over:
                    self.fail(
                        f"{root}: more than {live.RESCAN_MAX:,} entries in directories it "
                        "could not watch"
                    )
                    return
            took = time.monotonic() - start

    def _say(self, note: str) -> None:
        self._record("fs.live", note=note)
        self._notice(note)
        if note not in self.said and len(self.said) < SAID_MAX:
            self.said.append(note)

    def fail(self, why: str) -> None:
        """The guard cannot keep the trees covered: the session is stopped (fail closed),
        and its record and last lines say why. Once."""
        if self.stopped is not None:
            return
        self.stopped = line = (
            f"live guard: {why}: the session was stopped, so that nothing the host saves "
            "meanwhile is left uncovered"
        )
        self._record("fs.live", note=line)
        self.said = [*self.said[: SAID_MAX - 1], line]
        self._stop(line)
        self.close()

    def _new_dir(self, w: Watched, dir_rel: str, name: str, since: float) -> None:
        """A directory created or moved in: watched too, and what it holds at every depth
        judged, in a worker thread. Those that come while one batch is in there go in
        the next (a `pip install` makes dozens in a second)."""
        rel = live.new_dir(w, dir_rel, name)
        if rel is None:
            return
        self._entering.append((w.root, rel, since))
        if self._enterer is None or self._enterer.done():
            self._enterer = self._track(self._enter())

    async def _enter(self) -> None:
        while self._entering and self._fd >= 0:
            batch, self._entering = self._entering, []
            since = min(t for _, _, t in batch)  # the window is said from the first
            for root in dict.fromkeys(r for r, _, _ in batch):
                w = self._trees[root]
                rels = [rel for r, rel, _ in batch if r == root]
                found = await pools.run(pools.WATCHES, self._watches.enter, w, rels)
                for note in self._apply(w, found, since):
                    self._say(note)

    async def _again(self, since: float) -> None:
        """After lost events: every watched directory listed again (new credentials)."""
        for w in self._trees.values():
            self._apply(w, await pools.run(pools.WATCHES, self._watches.again, w), since)

    def _readable(self) -> None:
        now = time.monotonic()
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, pos)
            name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
            pos += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                for w in self._trees.values():
                    for redo in live.everything(w):
                        self._spawn(w, redo, now)
                self._track(self._again(now))
                continue
            if mask & IN_IGNORED or wd not in self._watches.names:
                self._watches.forget(wd)
                continue
            root, rel = self._watches.names[wd]
            w, entry = self._trees[root], os.fsdecode(name)
            if mask & (IN_CLOSE_WRITE | IN_MODIFY):  # (IN_MODIFY: gitdirs' watches only)
                if (written := live.on_write(w, rel, entry)) is not None:
                    self._spawn(w, written, now)
                continue
            changed = live.on_change(w, rel, entry, bool(mask & IN_ISDIR))
            if changed is not None:
                self._spawn(w, changed, now, host=True)
            if not mask & IN_ISDIR:
                self._fresh(root, rel)  # a socket, perhaps: bound or renamed in, any name
            if mask & IN_ISDIR and (changed is None or changed.git):
                self._new_dir(w, rel, entry, now)

    def _spawn(self, w: Watched, redo: Redo, since: float, *, host: bool = False) -> None:
        """HOST: a pin's redo for a host rename over it, done at once beside the
        backlog: only the host makes these (the payload cannot rename over a pinned
        file, a mount point), and host git reads the file as soon as it is there (a
        payload's write in the window is put back by it). Everything else waits its
        turn in the backlog (lost events' redos of every pin too: the payload can make
        those)."""
        if self.stopped is not None:
            return
        if redo.git:
            live.repository_made(w, redo)
            self._git_touched = True  # from now on checked every GIT_EVERY as well
            self._git_soon()
            return
        if host and redo.pin is not None:
            self._pin_at_once(w, redo, since)
            return
        why = self._backlog.add(w.root, redo, since)
        if why is not None:
            self.fail(why)
        elif self._drainer is None or self._drainer.done():
            self._drainer = self._track(self._drain())

    def _pin_at_once(self, w: Watched, redo: Redo, since: float) -> None:
        """One redo of a pin at a time, and one more after it if the host (or the
        payload, in the window) renamed over it again meanwhile."""
        key = (w.root, redo.rel)
        if key in self._pinning:
            self._pinning[key] = (redo, since)
            return
        self._pinning[key] = None
        self._track(self._pin_loop(w, key, redo, since))

    async def _pin_loop(self, w: Watched, key: live.Key, redo: Redo, since: float) -> None:
        try:
            while True:
                await self._redo(w, redo, since)
                again = self._pinning.get(key)
                if again is None:
                    return
                self._pinning[key] = None
                redo, since = again
        finally:
            self._pinning.pop(key, None)

    def _fresh(self, root: str, rel: str) -> None:
        """Directory REL had an entry created: looked into for sockets SWEEP_EVERY
        later, each directory once however many entries it got meanwhile."""
        self._swept.add((root, rel))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = self._track(self._sweep())

    async def _sweep(self) -> None:
        while self._swept and self.stopped is None:
            await asyncio.sleep(SWEEP_EVERY)
            dirs, self._swept = self._swept, set()
            since = time.monotonic()
            for root, rel in dirs:
                w = self._trees[root]
                for name in await pools.run(pools.LIVE, sockets_in, root, rel):
                    if (redo := live.socket_redo(w, rel, name)) is not None:
                        self._spawn(w, redo, since)

    async def _periodic(self) -> None:
        """What no event of a watched directory tells of: once a change git reads came
        in the session, a git check every GIT_EVERY (a repository made where nothing
        is watched, a config written through a hard link or a shared mmap: no event
        follows), at most a tenth of the time but at least every GIT_EVERY_MAX; and the
        host's sockets bound in the trees (/proc/net/unix: node_modules and .git are
        not watched) every SOCKETS_EVERY."""
        git_at = time.monotonic()
        while self.stopped is None and self._fd >= 0:
            await asyncio.sleep(SOCKETS_EVERY)
            for root, rel in await pools.run(pools.LIVE, bound_sockets, list(self._trees)):
                parent, _, name = rel.rpartition("/")
                if (redo := live.socket_redo(self._trees[root], parent, name)) is not None:
                    self._spawn(self._trees[root], redo, time.monotonic())
            now = time.monotonic()
            due = now - git_at >= min(GIT_EVERY_MAX, max(GIT_EVERY, 10 * self._git_last))
            if due and self._git_touched:
                git_at = now
                self._git_soon()

    def _git_soon(self) -> None:
        """The git guard's check now, or once the one under way is done (changes that
        come meanwhile are one more check, not one each)."""
        if self._git_task is not None and not self._git_task.done():
            self._git_again = True
            return
        self._git_task = self._track(self._git_loop())

    async def _git_loop(self) -> None:
        """Checks one after another while changes keep coming. The first ones go at once
        (a plant is a few writes: the check that sees the last of them is the one that
        counts); past GIT_BURST seconds of checks the payload can make git's files change
        forever, so they are paced to GIT_SHARE of the time (in children of the walk
        template, not boxyd's)."""
        while self.stopped is None:
            self._git_again = False
            now = time.monotonic()
            self._git_credit = min(GIT_BURST, self._git_credit + (now - self._git_at) * GIT_SHARE)
            if self._git_credit < 0:
                await asyncio.sleep(-self._git_credit / GIT_SHARE)
            began = self._git_at = time.monotonic()
            lines = await self._git_check()
            self._git_at = time.monotonic()
            self._git_last = self._git_at - began
            self._git_credit -= self._git_last
            log.info("live guard: git check %.3fs", self._git_at - began)
            for line in lines:
                self._record("git", finding=line)
                self._notice(f"live guard: {line}")
            if not self._git_again:
                return

    async def _drain(self) -> None:
        """The session's redos, one at a time, oldest first."""
        while self.stopped is None:
            item = self._backlog.take(time.monotonic())
            if item is None:
                return
            if isinstance(item, str):
                self.fail(item)
                return
            root, redo, since = item
            await self._redo(self._trees[root], redo, since)

    def _track(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        """A redo, a listing, a rescan that failed leaves something uncovered: stopped."""
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            e = task.exception()
            log.warning("live guard: %s: %s", type(e).__name__, e)
            self.fail(str(e) or type(e).__name__)

    async def _redo(self, w: Watched, redo: Redo, since: float) -> None:
        """The pin again, then the stand-in again (or a new one); each answered by stage
        2 before the next redo. One not in place while its entry is still there stops
        the session (_settle)."""
        if redo.hold is not None and await self._hold(w, redo):
            return  # quarantined: nothing left there to pin or cover
        if redo.pin is not None:
            await self._repin(w, redo.pin.rel, since)
        mask = redo.mask
        if mask is None and redo.rule is None:
            return
        if mask is None and await pools.run(pools.LIVE, _symlink, w.root, redo.rel):
            return  # (a held symlink put back): what it leads to is covered as its own
        rule = _rule(redo)
        if rule is not None and rule.action is Action.EMPTY and not rule.needs_content:
            found: Found | None = Found(
                redo.rel, rule.kind, rule.action, rule.is_dir
            )  # nothing to read
        else:
            found = await pools.run(
                pools.LIVE,
                call_apart,
                self._apart,
                functools.partial(_stand_in, w.root, redo, rule),
            )
        if found is None:
            return  # nothing in it to cover now (or gone)
        w.masks[redo.rel] = found  # a later rename over it is covered again too
        covered = self._ask(
            functools.partial(
                LiveCover,
                dst=redo.rel,
                dst_base=w.root,
                is_dir=found.is_dir,
                content=base64.b64encode(found.content).decode(),
            ),
            redo.rel,
            "covered again" if mask is not None else "covered new",
            since,
            w.root,
        )
        await self._settle(covered, w.root, redo.rel, "covered")
        if found.kind == masking.SOCKET.kind:
            await self._socket_links(w, redo.rel, since)

    async def _socket_links(self, w: Watched, rel: str, since: float) -> None:
        """A socket just covered whose other names (hard links the payload made in the
        moment before) lead to it still: each covered as well; names outside the tree
        (another tree on its filesystem) cannot be, and stop the session. A name once
        covered is a mount point, and link() from it fails (EXDEV)."""
        others, nlink = await pools.run(pools.LIVE, masking.socket_names, w.root, rel)
        for other in others:
            parent, _, name = other.rpartition("/")
            if (redo := live.socket_redo(w, parent, name)) is not None:
                self._spawn(w, redo, since)
        if nlink > 1 + len(others):
            self.fail(
                f"{os.path.join(w.root, rel)}: a unix socket with {nlink} names, "
                f"{nlink - 1 - len(others)} of them outside the tree (not coverable)"
            )

    async def _hold(self, w: Watched, redo: Redo) -> bool:
        """A held file the payload made (plan/hostrun.py), moved to the quarantine; its
        judging (a config's keys) is parsed apart. True when it was. One that could not
        be moved stops the session (the check after the run tries again), as do more
        than live.HOLD_MAX of them."""
        assert redo.hold is not None
        got = await pools.run(
            pools.LIVE,
            call_apart,
            self._apart,
            functools.partial(
                self._holder,
                w.root,
                redo.rel,
                redo.hold,
                w.symlinks.get(redo.rel, ""),
                _judged_as(w, redo.rel),
            ),
        )
        if got is None:
            return False
        line, moved = got
        self._record("fs.hold", path=os.path.join(w.root, redo.rel), finding=line)
        self._notice(f"live guard: {line}")
        if not moved:
            self.fail(line)
            return False
        self._holds += 1
        if self._holds > live.HOLD_MAX:
            self.fail(f"more than {live.HOLD_MAX} files that host tools obey made in one session")
        return True

    async def _repin(self, w: Watched, rel: str, since: float) -> None:
        # what the host saved, read while the pin goes back on (the payload's window);
        # kept open until judged, so that its inode number is its own meanwhile
        saved = asyncio.ensure_future(
            pools.submit(
                pools.LIVE, walk.read_beneath_at, w.root, rel, discover.CONFIG_MAX, keep=True
            )
        )
        pinned = self._ask(
            functools.partial(LivePin, rel=rel, root=w.root), rel, "pinned again", since, w.root
        )
        key = (w.root, rel)
        # judged once pinned: from then on the payload cannot change what is judged
        done = await self._settle(
            pinned, w.root, rel, "pinned", functools.partial(self._superseded, key)
        )
        held = await saved
        try:
            if done:
                self._misses.pop(key, None)
            elif self._pinning.get(key) is not None:
                return  # renamed over again: the redo queued pins and judges what is there
            line = await pools.run(
                pools.LIVE,
                call_apart,  # the adopted file is parsed apart (parseproc.py)
                self._apart,
                functools.partial(self._adopt, w.root, rel, held),
            )
        finally:
            if held is not None:
                held.close()
        if line is not None:
            self._record("git", finding=line)
            self._notice(line)

    async def _settle(
        self,
        done: asyncio.Future[bool],
        root: str,
        rel: str,
        what: str,
        excused: Callable[[], bool] | None = None,
    ) -> bool:
        """Stage 2's answer to a redo; True when done. Not done while the host's entry is
        still there (a mount budget full, a stand-in that did not fit, no answer in
        LIVE_TIMEOUT): the session is stopped, unless EXCUSED says a newer redo of it
        will do it. An entry gone meanwhile has nothing left to cover."""
        try:
            ok = await asyncio.wait_for(asyncio.shield(done), LIVE_TIMEOUT)
        except TimeoutError:
            ok = False
        if ok:
            return True
        if await pools.run(pools.LIVE, _present, root, rel) and not (excused and excused()):
            self.fail(f"{os.path.join(root, rel)} could not be {what} again")
        return False

    def _superseded(self, key: live.Key) -> bool:
        """A re-pin of KEY failed while its entry is there: the file it was put on was
        renamed over again meanwhile (the mount cannot go on a file no longer at its
        name) if that rename's redo is queued. Up to REPIN_MISSES in a row: a payload
        that wins that race in every window is stopped, not chased."""
        self._readable()  # what was renamed before now is seen now, not a tick later
        if self._pinning.get(key) is None:
            return False
        self._misses[key] = self._misses.get(key, 0) + 1
        return self._misses[key] <= REPIN_MISSES

    def _ask(
        self,
        op: Callable[[int], LiveCover | LivePin],
        rel: str,
        what: str,
        since: float,
        root: str,
    ) -> asyncio.Future[bool]:
        """OP (given its id) to stage 2; the future is its answer (True: done)."""
        self._ids += 1
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending[self._ids] = _Pending(os.path.join(root, rel), what, since, fut)
        self._send(op(self._ids))
        return fut

    def done(self, ident: int, error: str | None) -> None:
        """Stage 2's answer to one request (its LiveDone report)."""
        pending = self._pending.pop(ident, None)
        if pending is None:
            return
        ms = round((time.monotonic() - pending.since) * 1000, 1)
        if not pending.done.done():
            pending.done.set_result(error is None)
        if error is None:
            self._record("fs.live", path=pending.rel, action=pending.what, window_ms=ms)
            self._notice(f"live guard: {pending.rel}: {pending.what} ({ms:g} ms after the change)")
        else:
            self._record(
                "fs.live",
                path=pending.rel,
                action=f"{pending.what}: failed",
                error=str(error)[:300],
            )
            self._notice(
                f"live guard: {pending.rel}: could not be {pending.what}: {str(error)[:300]}"
            )

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_reader(self._fd)
            # closing an inotify instance waits for an RCU grace period (~10 ms measured
            # here): not on the event loop, nor on the session's way to its end
            pools.CLOSING.submit(self._watches.close)
            self._fd = -1
        for task in self._tasks:
            task.cancel()


def _judged_as(w: Watched, rel: str) -> str:
    """The name REL's tool knows it by (where a held symlink led: the symlink's)."""
    got = hostrun.held_as(rel, w.absent.get(rel, ""))
    return got[1] if got is not None else rel.rpartition("/")[2]


def _rule(redo: Redo) -> Rule | None:
    """What covers REDO's entry: its own rule again (git's config has credentials' own)."""
    parent, _, name = redo.rel.rpartition("/")
    if redo.mask is not None and redo.mask.kind == credentials.GIT_CONFIG.kind:
        return credentials.GIT_CONFIG
    is_dir = redo.mask.is_dir if redo.mask is not None else bool(redo.rule and redo.rule.is_dir)
    return credentials.rule_for(parent.rpartition("/")[2], name, is_dir) or redo.rule


def _lstat(root: str, rel: str) -> os.stat_result | None:
    """REL's entry in the tree ROOT (looked at through its fds, no symlink followed), or
    None when it is gone."""
    parent, _, name = rel.rpartition("/")
    try:
        pfd = walk.open_in_tree(root, parent)
    except OSError:
        return None
    try:
        return os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(pfd)


def _symlink(root: str, rel: str) -> bool:
    """REL is a symlink now."""
    st = _lstat(root, rel)
    return st is not None and stat.S_ISLNK(st.st_mode)


def _present(root: str, rel: str) -> bool:
    """REL is still an entry of the tree ROOT."""
    return _lstat(root, rel) is not None


def _stand_in(root: str, redo: Redo, rule: Rule | None) -> Found | None:
    """What covers REDO's entry now (read through the tree's own fds), or None."""
    if rule is None:
        return None
    parent, _, name = redo.rel.rpartition("/")
    try:
        pfd = walk.open_in_tree(root, parent)
    except OSError:
        return None
    try:
        found = masking.judge(pfd, name, rule)
    finally:
        os.close(pfd)
    return (
        None
        if found is None
        else Found(redo.rel, found.kind, found.action, found.is_dir, found.content)
    )


def bound_sockets(roots: list[str]) -> list[tuple[str, str]]:
    """(root, rel) of each unix socket a host process has bound at a path in one of the
    trees ROOTS, as /proc/net/unix lists them (this network namespace's: the host's;
    a path bound relative to its binder's directory is not known here)."""
    try:
        with open("/proc/net/unix", "rb") as f:
            data = f.read(8 << 20)
    except OSError:
        return []
    tops = [(r, r.rstrip("/") + "/") for r in roots]
    out = []
    for line in data.split(b"\n")[1:]:
        fields = line.split(None, 7)
        if len(fields) < 8 or not fields[7].startswith(b"/"):
            continue
        path = os.fsdecode(fields[7])
        out += [(r, path[len(top) :]) for r, top in tops if path.startswith(top)]
    return out


def _inotify_init() -> int:
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"inotify_init1: {os.strerror(e)}")
    return int(fd)
