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
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from boxy import values
from boxyd.config.runspec import RunSpec

if TYPE_CHECKING:
    from dbus_fast.aio import MessageBus

log = logging.getLogger("boxyd")

SYSTEMD = (
    "org.freedesktop.systemd1",
    "/org/freedesktop/systemd1",
    "org.freedesktop.systemd1.Manager",
)
PLACE_TIMEOUT = 3.0  # seconds for the user manager to move the process


@dataclass(frozen=True)
class Placement:
    unit: str | None = None  # boxy-<id>.scope, when the run is in one
    controllers: frozenset[str] = field(default_factory=frozenset)
    reason: str = ""  # why there is no scope
    path: str | None = None  # the scope's directory in the v2 hierarchy
    # a cgroup boxyd made that holds the whole run, its cgroup.freeze boxyd's to write
    # (a scope's own is its user manager's): None when there is none
    freezer: str | None = None


def limit_events(files: dict[str, str]) -> list[tuple[str, int]]:
    """What the controllers counted (pure): FILES maps memory.events and pids.events
    to their text; (what, count) for each limit the run hit."""
    hits = []
    for name, key, what in (
        ("memory.events", "oom_kill", "the memory limit killed a process"),
        ("memory.events", "max", "the memory limit was reached"),
        ("pids.events", "max", "the pids limit refused a fork"),
    ):
        for line in files.get(name, "").splitlines():
            k, _, v = line.partition(" ")
            if k == key and v.strip().isdigit() and int(v) > 0:
                hits.append((what, int(v)))
    return hits


def read_events(path: str | None) -> list[tuple[str, int]]:
    """The scope's event counters, while it still exists (blocking: a thread)."""
    if path is None:
        return []
    files = {}
    for name in ("memory.events", "pids.events"):
        with contextlib.suppress(OSError):
            files[name] = Path(path, name).read_text()
    return limit_events(files)


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
        return (
            f"no {controller} controller in {unit}"
            if unit
            else f"no {controller} controller: no scope ({placement.reason})"
        )

    out = [
        _memory(spec.memory, unit, None if "memory" in have else missing("memory")),
        _pids(spec.pids, unit, None if "pids" in have else missing("pids")),
    ]
    if spec.cpus is not None:
        out.append(_cpus(spec.cpus, unit, None if "cpu" in have else missing("cpu")))
    return out


# Each limit below: MISSING is None when the scope's controller enforces it, else why not.
def _memory(memory: int, unit: str | None, missing: str | None) -> Limit:
    size = values.format_size(memory)
    if missing is None:
        return Limit(
            "memory",
            memory,
            True,
            f"{unit} MemoryMax",
            f"--memory {size}: MemoryMax of {unit}, and the scratch tmpfs's size",
        )
    return Limit(
        "memory",
        memory,
        False,
        missing,
        f"--memory {size}: sizes the scratch tmpfs ($HOME, /tmp, /dev/shm); the "
        f"memory limit itself is not enforced ({missing})",
    )


def _pids(pids: int, unit: str | None, missing: str | None) -> Limit:
    if missing is None:
        return Limit(
            "pids",
            pids,
            True,
            f"{unit} TasksMax, RLIMIT_NPROC",
            f"--pids {pids}: TasksMax of {unit}, and RLIMIT_NPROC",
        )
    return Limit(
        "pids",
        pids,
        True,
        "RLIMIT_NPROC",
        f"--pids {pids}: enforced with RLIMIT_NPROC in the sandbox's user namespace ({missing})",
    )


def _cpus(cpus: float, unit: str | None, missing: str | None) -> Limit:
    if missing is None:
        return Limit("cpus", cpus, True, f"{unit} CPUQuota", f"--cpus {cpus:g}: CPUQuota of {unit}")
    return Limit("cpus", cpus, False, missing, f"--cpus {cpus:g}: not enforced ({missing})")


def unit_properties(
    pids: Sequence[int], spec: RunSpec, sid: str
) -> list[tuple[str, tuple[str, object]]]:
    """StartTransientUnit's properties, as (name, (signature, value))."""
    props: list[tuple[str, tuple[str, object]]] = [
        ("Description", ("s", f"boxy session {sid}")),
        ("PIDs", ("au", list(pids))),
        ("Delegate", ("b", True)),
        ("CollectMode", ("s", "inactive-or-failed")),
        ("MemoryMax", ("t", spec.memory)),
        ("TasksMax", ("t", spec.pids)),
    ]
    if spec.cpus is not None:
        props.append(("CPUQuotaPerSecUSec", ("t", int(spec.cpus * 1_000_000))))
    return props


class NotDelegated(Exception):
    """boxyd's own cgroup cannot hold runs, for a reason that lasts as long as boxyd
    (it does not move): said at once to every later run."""


def own_parent() -> str:
    """boxyd's own cgroup directory, delegated to us (ours and writable); raises
    NotDelegated (blocking: a thread)."""
    rel = _cgroup_of(os.getpid())
    if rel is None or rel == "/":
        raise NotDelegated("boxyd's own cgroup is the root, not delegated")
    parent, _ = _cgroup_dir(rel)
    if parent is None:
        raise NotDelegated("no cgroup v2 hierarchy")
    try:
        st = os.stat(parent)
    except OSError as e:
        raise NotDelegated(f"cannot use boxyd's cgroup {parent}: {e.strerror}") from None
    if st.st_uid != os.getuid() or not os.access(os.path.join(parent, "cgroup.procs"), os.W_OK):
        raise NotDelegated(f"boxyd's cgroup {parent} is not delegated to you")
    return parent


def place_in_own_subtree(sid: str, pids: Sequence[int], spec: RunSpec, why: str) -> Placement:
    """Without a user manager: a child boxy-<id> of boxyd's own cgroup, when that
    cgroup is delegated to us; its limits where the parent enables the controller.
    Else no placement, and WHY (blocking: a thread); raises NotDelegated."""
    parent = own_parent()
    try:
        child = os.path.join(parent, f"boxy-{sid}")
        os.mkdir(child, 0o755)
        enabled = frozenset(Path(parent, "cgroup.subtree_control").read_text().split())
        for controller, name, value in (
            ("memory", "memory.max", str(spec.memory)),
            ("pids", "pids.max", str(spec.pids)),
            ("cpu", "cpu.max", f"{int((spec.cpus or 0) * 100_000)} 100000"),
        ):
            if controller in enabled and (controller != "cpu" or spec.cpus is not None):
                Path(child, name).write_text(value)
        for pid in pids:  # (one pid per write: cgroup.procs takes no more)
            Path(child, "cgroup.procs").write_text(str(pid))
    except OSError as e:
        return Placement(reason=f"{why}; cannot use boxyd's cgroup {parent}: {e.strerror}")
    controllers = frozenset(Path(child, "cgroup.controllers").read_text().split())
    return Placement(f"boxy-{sid}", controllers, path=child, freezer=child)


FREEZE_TIMEOUT = 2.0  # seconds a freeze may take before the run is taken as not frozen
RUN_CGROUP = "run"  # the child of a scope that holds the run, for its cgroup.freeze


def run_cgroup(scope: str, pids: Sequence[int]) -> str | None:
    """A child of the (delegated) scope's cgroup holding PIDS, made before the payload
    runs (all it forks follows them there): boxyd's own cgroup.freeze, where the scope's
    is its user manager's and FreezeUnit needs a unified hierarchy. None when it cannot
    be made (blocking: a thread); no controller is enabled, so the scope keeps its
    limits and its counters over the whole run."""
    child = os.path.join(scope, RUN_CGROUP)
    try:
        os.mkdir(child, 0o755)
        for pid in pids:  # (one pid per write: cgroup.procs takes no more)
            Path(child, "cgroup.procs").write_text(str(pid))
        if not os.path.exists(os.path.join(child, "cgroup.freeze")):
            return None
    except OSError as e:
        log.info("no cgroup of the run's own in %s: %s", scope, e.strerror)
        return None
    return child


def freeze_own(path: str, on: bool) -> bool:
    """cgroup.freeze of a cgroup boxyd made, and the wait until cgroup.events says it
    is so (blocking: a thread)."""
    try:
        Path(path, "cgroup.freeze").write_text("1" if on else "0")
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while time.monotonic() < deadline:
            if f"frozen {int(on)}" in Path(path, "cgroup.events").read_text().splitlines():
                return True
            time.sleep(0.002)
    except OSError:
        pass
    return False


def kill_frozen(path: str, keep: int) -> int:
    """Every process of the run's cgroup PATH but KEEP (the outer stage 2, which reports
    the end) SIGKILLed while the cgroup is frozen, then thawed: none runs another
    instruction of its own, so none can take the seccomp listener that PID 1's death
    lets go (docs/design.md, "Syscalls"). The processes killed; 0 when the cgroup
    could not be frozen (the caller's kill goes on as before). Blocking: a thread.
    A frozen process cannot exit but by this SIGKILL, so no pid read here is reused."""
    if not freeze_own(path, True):
        freeze_own(path, False)
        return 0
    killed = 0
    try:
        pids = [int(word) for word in Path(path, "cgroup.procs").read_text().split()]
        # a PID namespace's init last: its death has the kernel kill (and reap) the rest
        # at once, and a pid gone before its own kill would go uncounted
        for pid in sorted((p for p in pids if p != keep), key=_is_ns_init):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    except (OSError, ValueError):
        pass
    finally:
        freeze_own(path, False)
    return killed


def _is_ns_init(pid: int) -> bool:
    """PID is its innermost PID namespace's init (NSpid ends in 1)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
    return len(nspid) > 1 and nspid[-1] == "1"


def remove_subtree(placement: Placement) -> bool:
    """The child made by place_in_own_subtree, once it is empty (no user manager
    collects it); True when there is nothing (more) to remove."""
    if placement.path is None or not placement.unit or placement.unit.endswith(".scope"):
        return True
    try:
        os.rmdir(placement.path)
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: not empty yet
        return False
    return True


def _cgroup_of(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    return next((ln[3:] for ln in text.splitlines() if ln.startswith("0::")), None)


def _cgroup_of_all(pids: Sequence[int]) -> str | None:
    """The cgroup PIDS are all in; None while they are not in one (or are gone)."""
    rels = {_cgroup_of(pid) for pid in pids}
    return rels.pop() if len(rels) == 1 else None


def _cgroup_dir(rel: str) -> tuple[str | None, frozenset[str]]:
    """The directory of REL in the v2 hierarchy, and its controllers."""
    from boxyd.daemon.doctor import cgroup_mounts

    for kind, mount, root in cgroup_mounts():
        if kind != "cgroup2":
            continue
        sub = rel[len(root) :] if root != "/" and rel.startswith(root) else rel
        path = os.path.join(mount, sub.lstrip("/"))
        try:
            with open(os.path.join(path, "cgroup.controllers")) as f:
                return path, frozenset(f.read().split())
        except OSError:
            continue
    return None, frozenset()


class Scopes:
    """Places runs through the user manager on BUS (set once the bus is up; None:
    there is no session bus, so no scope)."""

    def __init__(self) -> None:
        self.bus: MessageBus | None = None
        # NameHasOwner on BUS: the user manager is asked for only once it is on it (a
        # call to its name would start one, or wait for a start that never comes)
        self._owns: Callable[[str], Awaitable[bool]] | None = None
        self._manager_seen = self._waited = False
        self._own: str | None = None  # why boxyd's own cgroup cannot hold runs, once known

    def joined(
        self, bus: MessageBus | None, owns: Callable[[str], Awaitable[bool]] | None = None
    ) -> None:
        """On the session BUS, whose NameHasOwner is OWNS (None, None: the bus was lost)."""
        self.bus, self._owns = bus, owns if bus is not None else None
        self._manager_seen = self._waited = False

    async def _manager_on_bus(self) -> bool:
        """The user manager is on the bus: asked until it is, then kept. It joins the
        bus once the bus runs, and boxyd's own connection may have started it (socket
        activation): asked once at the join, the first run's answer was no, and no run
        of that boxyd got a scope (CI run 26). Where a user manager runs
        ($XDG_RUNTIME_DIR/systemd/private) it is waited for once per bus, up to
        PLACE_TIMEOUT; after that each run asks once (one not on this bus costs no wait)."""
        if self._manager_seen or self._owns is None:
            return self._manager_seen
        loop = asyncio.get_running_loop()
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        private = os.path.join(runtime, "systemd", "private")
        waits = bool(runtime) and not self._waited and os.path.exists(private)
        self._waited = self._waited or waits
        deadline, pause = loop.time() + (PLACE_TIMEOUT if waits else 0.0), 0.005
        while True:
            try:
                self._manager_seen = await asyncio.wait_for(self._owns(SYSTEMD[0]), PLACE_TIMEOUT)
            except Exception:  # the bus is boxyd's; the run goes on without a scope
                return False
            if self._manager_seen or loop.time() >= deadline:
                return self._manager_seen
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def place(self, sid: str, pids: Sequence[int], spec: RunSpec) -> Placement:
        """The run's scope, holding PIDS (the outer stage 2 and PID 1's parent)."""
        if self.bus is None:
            return await self._in_own_subtree(
                sid, pids, spec, "no session bus to reach a user manager"
            )
        if not await self._manager_on_bus():
            return await self._in_own_subtree(sid, pids, spec, "no user manager on the session bus")
        from dbus_fast import Message, MessageType, Variant

        unit = f"boxy-{sid}.scope"
        props = [(k, Variant(sig, v)) for k, (sig, v) in unit_properties(pids, spec, sid)]
        try:
            reply = await asyncio.wait_for(
                self.bus.call(
                    Message(
                        destination=SYSTEMD[0],
                        path=SYSTEMD[1],
                        interface=SYSTEMD[2],
                        member="StartTransientUnit",
                        signature="ssa(sv)a(sa(sv))",
                        body=[unit, "fail", props, []],
                    )
                ),
                PLACE_TIMEOUT,
            )
        except (TimeoutError, OSError, Exception) as e:  # the bus is boxyd's; the run goes on
            return await self._in_own_subtree(
                sid, pids, spec, f"the user manager did not answer ({type(e).__name__})"
            )
        if reply.message_type == MessageType.ERROR:
            detail = reply.body[0] if reply.body else reply.error_name
            return await self._in_own_subtree(
                sid, pids, spec, f"no scope from the user manager: {detail}"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PLACE_TIMEOUT
        pause = 0.001  # the job moves the process a moment after the reply: look soon
        while loop.time() < deadline:  # the job moves the processes: wait to see them there
            rel = await asyncio.to_thread(_cgroup_of_all, pids)
            if rel is not None and rel.endswith("/" + unit):
                path, controllers = await asyncio.to_thread(_cgroup_dir, rel)
                freezer = await asyncio.to_thread(run_cgroup, path, pids) if path else None
                return Placement(unit, controllers, path=path, freezer=freezer)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)
        return Placement(reason=f"{unit} was made but the run is not in it")

    async def _in_own_subtree(
        self, sid: str, pids: Sequence[int], spec: RunSpec, why: str
    ) -> Placement:
        """boxyd's cgroup does not move: once it is known not to be delegated, every
        later run is told so at once, with no thread and no file read."""
        if self._own is not None:
            return Placement(reason=f"{why}; {self._own}")
        try:
            return await asyncio.to_thread(place_in_own_subtree, sid, pids, spec, why)
        except NotDelegated as e:
            self._own = str(e)
            return Placement(reason=f"{why}; {self._own}")
