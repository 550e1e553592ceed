"""The system calls seccomp refused, as PID 1 named them (boxyd/stage2/notify.py):
an audit record and a -v line for each it reported, and a line at the run's end
counting them by name, visible without -v (pure: reports in, text out). Every
field came from the sandbox's PID 1, beside the payload: bounded here too.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from boxy.values import plural
from boxyd.stage2 import protocol as p

MAX_NAMES = 64  # calls counted by name; past it under OTHER
OTHER = "other calls"
MAX_KILLS = 8  # processes named as killed in the end line; the rest counted
MAX_NOTICES = 20  # -v lines; the rest in the audit log


def arguments(args: tuple[int, ...]) -> list[str]:
    """The six arguments as the kernel passed them, in hex (pointers, flags)."""
    return [hex(a) for a in args]


def process(msg: p.Refused | p.PortRefused) -> str:
    """`pid 12 'node'`, with argv[0] where it says more than comm, and the thread."""
    out = f"pid {msg.tgid} {shlex.quote(msg.comm)}"
    if msg.argv0 and os.path.basename(msg.argv0) != msg.comm:
        out += f" ({shlex.quote(msg.argv0)})"
    return out + (f" thread {msg.pid}" if msg.pid != msg.tgid else "")


def describe(msg: p.Refused) -> str:
    """`seccomp: ptrace(0x10, 0x1, …) by pid 12 'node': EPERM` (a -v line, a reason)."""
    how = "killed" if msg.action == "kill" else "EPERM"
    return f"seccomp: {msg.call}({', '.join(arguments(msg.args))}) by {process(msg)}: {how}"


def record(msg: p.Refused) -> dict[str, object]:
    """The audit record's fields (layer seccomp)."""
    return {
        "verdict": "deny",
        "action": msg.action,
        "call": msg.call,
        "nr": msg.nr,
        "args": arguments(msg.args),
        "pid": msg.tgid,
        "tid": msg.pid,
        "comm": msg.comm,
        "argv0": msg.argv0,
        "reason": describe(msg),
    }


@dataclass
class RefusedCalls:
    """Counts by name from the reports, until PID 1's own totals (past its report rate
    too) replace them; the processes killed, for the end line."""

    counts: dict[str, int] = field(default_factory=dict)
    kills: list[p.Refused] = field(default_factory=list)
    killed: int = 0
    totals: bool = False  # counts are PID 1's totals
    notices: int = 0

    def add(self, msg: p.Refused) -> None:
        if not self.totals:
            self._count(msg.call, 1)
        if msg.action == "kill":
            self.killed += 1
            if len(self.kills) < MAX_KILLS:
                self.kills.append(msg)

    def ended(self, msg: p.Refusals) -> None:
        """PID 1's totals: every refusal, named one by one or not."""
        self.counts, self.totals = {}, True
        for call, n in zip(msg.calls, msg.counts, strict=True):
            self._count(call, n)

    def _count(self, call: str, n: int) -> None:
        if call not in self.counts and len(self.counts) >= MAX_NAMES:
            call = OTHER
        self.counts[call] = self.counts.get(call, 0) + n

    def notice(self) -> bool:
        """Whether one more -v line is said (MAX_NOTICES in all)."""
        self.notices += 1
        return self.notices <= MAX_NOTICES

    def first_kill(self) -> str | None:
        """The call the first killed process made."""
        return self.kills[0].call if self.kills else None

    def lines(self) -> list[str]:
        """`refused system calls: move_pages ×1 (killed pid 12 'python3'), add_key ×3`."""
        if not self.counts:
            return []
        said = []
        for call, n in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            killed = [k for k in self.kills if k.call == call]
            who = "; ".join(f"killed {process(k)}" for k in killed)
            said.append(f"{call} ×{n:,}" + (f" ({who})" if who else ""))
        out = ["refused system calls: " + ", ".join(said)]
        if self.killed > len(self.kills):
            out.append(
                f"seccomp: {plural(self.killed - len(self.kills), 'more process', 'more processes')} killed"
            )
        if self.notices > MAX_NOTICES:
            out.append(f"-v: {plural(self.notices - MAX_NOTICES, 'more refused call')} not shown")
        return out
