"""PID 1's status pipe as boxyd reads it (docs/design.md, "Processes"): one JSON line per
report (boxyd/stage2/protocol.py's Status). PID 1 shares its namespaces with the
payload, so only a well-formed, bounded line is believed; and how the run ended is
decided from what was believed. Pure: no I/O (boxyd/daemon/stage2proc.py reads).
"""

from __future__ import annotations

import signal

from boxyd.stage2 import protocol as p

MAX_PENDING = 1 << 20  # bytes of PID 1's that are not yet a whole line: bounded


def parse_status(line: bytes) -> p.Status | None:
    """LINE as a report, or None when it is not a well-formed one."""
    try:
        return p.decode_status(line)
    except p.ProtocolError:
        return None


class InitReports:
    """Lines from the pipe as they come: each whole one believed or dropped; the ends
    among them kept for ``ending``."""

    def __init__(self) -> None:
        self._pending = b""
        self.ends: list[p.End] = []

    def feed(self, chunk: bytes) -> list[p.Status]:
        """The reports CHUNK completes, in order (a line cut across chunks waits for
        its end; one longer than MAX_PENDING is dropped whole)."""
        data = self._pending + chunk
        *lines, rest = data.split(b"\n")
        self._pending = rest if len(rest) <= MAX_PENDING else b""
        got = [s for s in map(parse_status, lines) if s is not None]
        self.ends += [s for s in got if isinstance(s, p.End)]
        return got


def ending(ends: list[p.End], killed: bool) -> p.End:
    """How the run ended: a layer that failed, else a command that could not run, else
    the payload's last exit. PID 1 dead without a word is said as SIGKILL when boxyd
    sent one (KILLED: a stop -k); boxyd is not its parent, so nothing else tells."""
    for kind in (p.SetupFailed, p.ExecFailed):
        found = [e for e in ends if isinstance(e, kind)]
        if found:
            return found[-1]
    if ends:
        return ends[-1]
    if killed:
        return p.Killed(signal.SIGKILL)
    return p.SetupFailed("sandbox init ended without a report (killed from outside?)")
