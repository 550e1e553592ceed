"""What outlives a session: its record under $XDG_STATE_HOME/boxy/sessions/<id>/
(0700), its audit records through the --audit-log descriptor opened before the run,
and the bounds on both (retention.py, and the package caches' size and age).

Blocking file I/O: the Manager calls `Records.write` in a worker thread, once the
session has its outcome and before anyone hears it, and `prune` after that.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from pathlib import Path

from boxy import caches
from boxy.errors import BoxyError
from boxy.outcome import SessionInfo, clip, clipped
from boxy.paths import ensure_private_dir, state_dir
from boxyd.daemon import retention
from boxyd.daemon.session import MAX_AUDIT, SESSION_ID, Session
from boxyd.plan.hostfile import replaced

log = logging.getLogger("boxyd")

CACHE_PRUNE_EVERY = 3600.0  # seconds between bounding the package caches (sizes cost a walk)
# seconds between bounding the records: a scan of up to 500 of them holds the GIL for
# milliseconds, which every run's end waited for; beyond KEEP meanwhile: the runs of
# these seconds, until the next prune
STATE_PRUNE_EVERY = 30.0
MAX_META = 1 << 24  # bytes of a meta.json read back (an argv is at most a few MiB)


def record_dir(sid: str) -> Path:
    """$XDG_STATE_HOME/boxy/sessions/<id>/, each level 0700 and checked."""
    return ensure_private_dir(
        ensure_private_dir(ensure_private_dir(state_dir()) / "sessions") / sid
    )


def save_file(sid: str, name: str, data: bytes) -> str:
    """A new file in the session's record; its path, or why there is none."""
    try:
        d = record_dir(sid)
        fd = os.open(
            d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return str(d / name)
    except (OSError, BoxyError) as e:
        return f"no file ({e})"


def bounded(lines: list[str], what: str, sid: str | None) -> list[str]:
    """LINES as a reply or a record holds them (outcome.clip); when cut, the whole
    list is a new file in session SID's record (0600, created O_EXCL|O_NOFOLLOW in
    the checked 0700 directory); SID None: not kept."""
    if not clipped(lines):
        return lines
    where = "not kept"
    if sid is not None:
        kept = save_file(
            sid, f"{what}.txt", "".join(x + "\n" for x in lines).encode(errors="replace")
        )
        where = f"the full list is in {kept}" if kept.startswith("/") else f"the full list: {kept}"
    return clip(lines, what, where)


def bound_outcome(s: Session) -> None:
    """The outcome's lists, bounded before anyone hears them (the Run reply, `show`,
    the record, watchers): counts and the first MAX_LINES, the rest in files."""
    out = s.outcome
    assert out is not None
    out.findings = bounded(out.findings, "findings", s.id)
    out.notes = bounded(out.notes, "notes", s.id)
    out.warnings = bounded(out.warnings, "warnings", s.id)


def audit_lines(s: Session) -> bytes:
    lines = [json.dumps(rec) + "\n" for rec in s.audit]
    if s.audit_dropped:
        lines.append(
            json.dumps(
                {
                    "t": round(time.time(), 3),
                    "session": s.id,
                    "layer": "audit",
                    "dropped": s.audit_dropped,
                    "reason": f"more than {MAX_AUDIT} records",
                }
            )
            + "\n"
        )
    return "".join(lines).encode()


def write_audit(s: Session, fd: int) -> str | None:
    """Through the descriptor opened before the run (O_APPEND: each write lands at the
    end, so concurrent sessions sharing one log interleave whole records). A note for
    the user when the log did not take them; they are then kept with the record."""
    data = audit_lines(s)
    rest, problem = data, ""
    try:
        while rest:
            rest = rest[os.write(fd, rest) :]
    except OSError as e:
        problem = f"not fully written: {e.strerror}"
    if not problem and replaced(fd):
        problem = "removed or replaced during the run (by the payload?)"
    if not problem:
        return None
    log.warning("audit log %s: %s", s.spec.audit_log, problem)  # never lose the trail silently
    kept = save_file(s.id, "audit.jsonl", data)
    return f"--audit-log {s.spec.audit_log}: {problem}; the records are in {kept}"


def write_meta(s: Session, info: SessionInfo) -> None:
    """meta.json: what `ps -a` and `show` read once the session is gone (or boxyd is).
    Written whole under another name, then renamed: a reader never sees half."""
    try:
        d = record_dir(s.id)
        tmp = d / "meta.json.tmp"
        tmp.write_text(json.dumps(info.to_wire(), indent=1) + "\n")
        os.replace(tmp, d / "meta.json")
    except (OSError, BoxyError) as e:
        log.warning("session record %s: %s", s.id, e)


def read_meta(sid: str) -> SessionInfo | None:
    """The record of session SID, or None (no such id, no record, not one)."""
    if not SESSION_ID.fullmatch(sid):  # the id names a directory: nothing else gets that far
        return None
    path = state_dir() / "sessions" / sid / "meta.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read(MAX_META)
        info = SessionInfo.from_wire(json.loads(data))
    except (OSError, ValueError):
        return None
    if info is not None and info.outcome is not None:  # a record written before the bounds
        out = info.outcome
        out.findings, out.notes, out.warnings = (
            bounded(x, what, None)
            for x, what in (
                (out.findings, "findings"),
                (out.notes, "notes"),
                (out.warnings, "warnings"),
            )
        )
    return info


def read_output(sid: str, offset: int, limit: int) -> bytes | None:
    """Up to LIMIT bytes of session SID's output.log from OFFSET; None: it has none."""
    if not SESSION_ID.fullmatch(sid) or offset < 0:
        return None
    path = state_dir() / "sessions" / sid / "output.log"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if offset >= st.st_size:  # past the end (pread refuses an offset near the limit)
            return b""
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def record_ids() -> list[str]:
    """The ids of every session on record (the directories' names)."""
    try:
        names = os.listdir(state_dir() / "sessions")
    except OSError:
        return []
    return [n for n in names if SESSION_ID.fullmatch(n)]


def read_all() -> list[SessionInfo]:
    """Every session on record (retention bounds how many)."""
    try:
        names = os.listdir(state_dir() / "sessions")
    except OSError:
        return []
    return [info for n in names if (info := read_meta(n)) is not None]


class Records:
    """Writes each finished session's record and keeps the history bounded."""

    def __init__(self, home: str) -> None:
        self.home = home
        self._lock = threading.Lock()  # two sessions ending together prune one at a time
        self._caches_pruned = -CACHE_PRUNE_EVERY
        self._state_pruned = -STATE_PRUNE_EVERY

    def write(self, s: Session) -> None:
        assert s.sandbox is not None and s.outcome is not None
        bound_outcome(s)
        fd = s.sandbox.audit_log()
        if fd is not None:
            note = write_audit(s, fd)
            if note:
                s.outcome.notes.append(note)
        write_meta(s, s.info())

    def begin(self, s: Session) -> None:
        write_meta(s, s.info())

    def prune(self) -> None:
        """Not awaited by anyone: the caches' sizes can take a while to add up. One at
        a time, and none queued behind it (the records' pool writes records too)."""
        if not self._lock.acquire(blocking=False):
            return  # one is under way: it prunes what this one would have
        try:
            if time.monotonic() - self._state_pruned > STATE_PRUNE_EVERY:
                self._state_pruned = time.monotonic()
                retention.prune_state(state_dir())
            if time.monotonic() - self._caches_pruned > CACHE_PRUNE_EVERY:
                self._caches_pruned = time.monotonic()
                caches.prune(self.home)
        finally:
            self._lock.release()
