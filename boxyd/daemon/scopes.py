"""Each run in a transient scope, boxy-<id>.scope, made by the user manager
(StartTransientUnit on org.freedesktop.systemd1, Delegate=yes, MemoryMax,
TasksMax, CPUQuota), and what the scope really enforces: the controllers it has,
read back from the v2 hierarchy. A limit without a controller is reported, not
faked (`limits`, pure): --pids falls back to RLIMIT_NPROC, --memory only sizes
the scratch tmpfs, --cpus is not enforced.

Stage 2 waits (its step 0) until boxyd has placed it, so everything the
sandbox runs starts inside the scope.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from boxy import values
from boxyd.spec import RunSpec

if TYPE_CHECKING:
    from dbus_fast.aio import MessageBus

log = logging.getLogger("boxyd")

SYSTEMD = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1",
           "org.freedesktop.systemd1.Manager")
PLACE_TIMEOUT = 3.0  # seconds for the user manager to move the process


@dataclass(frozen=True)
class Placement:
    unit: str | None = None  # boxy-<id>.scope, when the run is in one
    controllers: frozenset[str] = field(default_factory=frozenset)
    reason: str = ""  # why there is no scope


@dataclass(frozen=True)
class Limit:
    name: str  # memory, pids, cpus
    value: float | int
    enforced: bool
    by: str  # what enforces it, or why nothing does
    line: str  # for show and -v


def limits(spec: RunSpec, placement: Placement) -> list[Limit]:
    """What each limit amounts to in this placement (pure)."""
    unit = placement.unit
    have = placement.controllers if unit else frozenset()

    def missing(controller: str) -> str:
        return (f"no {controller} controller in {unit}" if unit else
                f"no {controller} controller: no scope ({placement.reason})")

    size = values.format_size(spec.memory)
    out = []
    if "memory" in have:
        out.append(Limit("memory", spec.memory, True, f"{unit} MemoryMax",
                         f"--memory {size}: MemoryMax of {unit}, and the scratch tmpfs's size"))
    else:
        out.append(Limit("memory", spec.memory, False, missing("memory"),
                         f"--memory {size}: sizes the scratch tmpfs ($HOME, /tmp, /dev/shm); the "
                         f"memory limit itself is not enforced ({missing('memory')})"))
    if "pids" in have:
        out.append(Limit("pids", spec.pids, True, f"{unit} TasksMax, RLIMIT_NPROC",
                         f"--pids {spec.pids}: TasksMax of {unit}, and RLIMIT_NPROC"))
    else:
        out.append(Limit("pids", spec.pids, True, "RLIMIT_NPROC",
                         f"--pids {spec.pids}: enforced with RLIMIT_NPROC in the sandbox's user "
                         f"namespace ({missing('pids')})"))
    if spec.cpus is not None:
        if "cpu" in have:
            out.append(Limit("cpus", spec.cpus, True, f"{unit} CPUQuota",
                             f"--cpus {spec.cpus:g}: CPUQuota of {unit}"))
        else:
            out.append(Limit("cpus", spec.cpus, False, missing("cpu"),
                             f"--cpus {spec.cpus:g}: not enforced ({missing('cpu')})"))
    return out


def unit_properties(pid: int, spec: RunSpec, sid: str) -> list[tuple[str, tuple[str, object]]]:
    """StartTransientUnit's properties, as (name, (signature, value))."""
    props: list[tuple[str, tuple[str, object]]] = [
        ("Description", ("s", f"boxy session {sid}")),
        ("PIDs", ("au", [pid])),
        ("Delegate", ("b", True)),
        ("CollectMode", ("s", "inactive-or-failed")),
        ("MemoryMax", ("t", spec.memory)),
        ("TasksMax", ("t", spec.pids)),
    ]
    if spec.cpus is not None:
        props.append(("CPUQuotaPerSecUSec", ("t", int(spec.cpus * 1_000_000))))
    return props


def _cgroup_of(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    return next((ln[3:] for ln in text.splitlines() if ln.startswith("0::")), None)


def _controllers(rel: str) -> frozenset[str]:
    from boxyd.doctor import cgroup_mounts

    for kind, mount, root in cgroup_mounts():
        if kind != "cgroup2":
            continue
        sub = rel[len(root):] if root != "/" and rel.startswith(root) else rel
        try:
            with open(os.path.join(mount, sub.lstrip("/"), "cgroup.controllers")) as f:
                return frozenset(f.read().split())
        except OSError:
            continue
    return frozenset()


class Scopes:
    """Places runs through the user manager on BUS (set once the bus is up; None:
    there is no session bus, so no scope)."""

    def __init__(self) -> None:
        self.bus: MessageBus | None = None

    async def place(self, sid: str, pid: int, spec: RunSpec) -> Placement:
        if self.bus is None:
            return Placement(reason="no session bus to reach a user manager")
        from dbus_fast import Message, MessageType, Variant

        unit = f"boxy-{sid}.scope"
        props = [(k, Variant(sig, v)) for k, (sig, v) in unit_properties(pid, spec, sid)]
        try:
            reply = await asyncio.wait_for(self.bus.call(Message(
                destination=SYSTEMD[0], path=SYSTEMD[1], interface=SYSTEMD[2],
                member="StartTransientUnit", signature="ssa(sv)a(sa(sv))",
                body=[unit, "fail", props, []])), PLACE_TIMEOUT)
        except (TimeoutError, OSError, Exception) as e:  # the bus is boxyd's; the run goes on
            return Placement(reason=f"the user manager did not answer ({type(e).__name__})")
        if reply.message_type == MessageType.ERROR:
            detail = reply.body[0] if reply.body else reply.error_name
            return Placement(reason=f"no scope: {detail}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PLACE_TIMEOUT
        while loop.time() < deadline:  # the job moves the process: wait to see it there
            rel = await asyncio.to_thread(_cgroup_of, pid)
            if rel is not None and rel.endswith("/" + unit):
                return Placement(unit, await asyncio.to_thread(_controllers, rel))
            await asyncio.sleep(0.01)
        return Placement(reason=f"{unit} was made but the run is not in it")
