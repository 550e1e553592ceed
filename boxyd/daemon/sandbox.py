"""The real launcher: a request becomes a RunSpec, host outputs opened, the trees
walked, a mount plan, stage 2 forked from the template, the gateway attached; and
afterwards the terminal drained, the network closed and the trees judged.

The core (Session, Manager) sees this only through boxyd.daemon.seam.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import pwd
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from boxy import caches, notices, termsettings
from boxy.errors import BoxyError, SetupError, UsageError
from boxy.outcome import Counters, Destination
from boxy.paths import config_home, state_dir
from boxy.request import RunRequest, Terminal
from boxy.varlink import close_fds
from boxyd.config import profileview
from boxyd.config.hostrun import Held
from boxyd.config.hosttools import resolve
from boxyd.config.profileview import ProfileView
from boxyd.config.registries import Registries
from boxyd.config.runspec import RunSpec
from boxyd.config.spec import build_spec
from boxyd.daemon import (
    afterproc,
    passedfds,
    pools,
    pty,
    records,
    refusedcalls,
    review,
    reviewproc,
    walks,
)
from boxyd.daemon.asking import Answerer, TerminalQuestions
from boxyd.daemon.liveguard import LiveGuard
from boxyd.daemon.parseproc import Apart, call_apart, call_with
from boxyd.daemon.pty import PtyRelay
from boxyd.daemon.reviewwatch import ReviewWatch
from boxyd.daemon.scopes import (
    Limit,
    Placement,
    Scopes,
    freeze_own,
    kill_frozen,
    limits,
    read_events,
    remove_subtree,
)
from boxyd.daemon.seam import Caller, Change, Exit, Report, SandboxEvent, Sink, Started, Stopped
from boxyd.daemon.stage2proc import (
    Gateway,
    NewSocket,
    PtyMaster,
    Received,
    Spare,
    Stage2,
    Template,
)
from boxyd.daemon.toolbox import Toolshed
from boxyd.daemon.walks import Walks
from boxyd.gitguard.discover import CONFIG_MAX, Protection
from boxyd.gitguard.quarantine import Budget, overwrite
from boxyd.gitguard.scan import Snapshot, adopt, inherit_live, restore
from boxyd.kernel.walk import FileRead, read_beneath_at
from boxyd.plan import heldfiles, live, masking, mountplan, worktree
from boxyd.plan.hostfile import Outputs, open_outputs
from boxyd.plan.masking import Found
from boxyd.plan.ops import NetPlan, Plan
from boxyd.plan.seccomp import build_filter, errno_calls, kernel_notifies, reader_filter
from boxyd.stage2 import protocol

if TYPE_CHECKING:
    from boxyd.daemon.network import Network
    from boxyd.daemon.publish import Publisher
    from boxyd.net.dnsproxy import DnsProxy

log = logging.getLogger("boxyd")
CHECKS_BUDGET = 30.0  # seconds: every tool call of one run's checks after it (git)
SETTINGS_BUDGET = 20.0  # seconds: the tools asked for one run's registry settings
_R = TypeVar("_R", bound=Received)


class StageLauncher:
    """Launches sandboxes through stage 2. Knows the sandboxes it launched that are
    still open: their trees count as hostile for every new run's host files, and
    their git baselines are inherited by a run on an overlapping tree."""

    def __init__(self, user: pwd.struct_passwd | None = None) -> None:
        self.user = user or pwd.getpwuid(os.getuid())
        self.template = Template(spare=True)  # a stage 2 forked ahead for the next run
        # the walks before a run, and the parses of what the payload wrote, in processes
        # of their own (a test names its own template module: walks.Walks)
        self.walks = Walks(os.environ.get("BOXY_WALK_MODULE") or walks.MODULE)
        self.scopes = Scopes()  # its bus is set once boxyd is on the session bus
        self.live: set[StageSandbox] = set()
        self._dns: DnsProxy | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """On the event-loop thread, before the first call: the stage-2 template
        imports while the first request is being read. If it cannot start, each run
        retries and reports why."""
        self._loop = asyncio.get_event_loop()
        try:
            self.template.start()
            # the first run's stage 2 (--net none's), forked once the template imported
            self.template.prime(Spare.LOOPBACK)
        except SetupError as e:
            log.warning("%s", e)
        self.walks.start()

    def close(self) -> None:
        self.template.close()
        self.walks.close()

    async def prepare(self, request: RunRequest, stdio: list[int], sink: Sink) -> StageSandbox:
        outputs = Outputs()
        listeners: list[socket.socket] = []
        # the run's parses of what the payload wrote, spec and walk: one child, one budget
        parser = self.walks.apart()
        try:
            if len(stdio) != 3:
                raise UsageError("Run needs exactly three file descriptors (stdin, stdout, stderr)")
            # none that carries the user's authority enters (fdpolicy.py), on every wire
            passedfds.check(stdio)
            spec = await self._spec(request, parser)
            if spec.review:
                await _overlay_or_refuse()
            if spec.tty and not any(os.isatty(fd) for fd in stdio):
                raise UsageError("--tty: none of boxyctl's stdin, stdout, stderr is a terminal")
            # before the payload starts, never by name afterwards (hostfile.py); the trees of
            # every live sandbox count as hostile, not only this one's
            hostile = [
                r
                for x in [spec, *(sb.spec for sb in self.live)]
                for r in mountplan.writable_roots(x)
            ]
            if spec.audit_log or spec.net_log or spec.pcap:  # none asked: no thread's turn
                outputs = await pools.run(
                    pools.START, open_outputs, spec.audit_log, spec.net_log, spec.pcap, hostile
                )
            if spec.publish:  # the relay's modules load with the first run that publishes
                from boxyd.daemon import publish

                listeners = publish.bind(spec.publish)  # a taken port: refused before the start
            net = await self._network(spec, sink, outputs) if spec.net != "none" else None
        except BaseException:  # a usage error, or a bug: either way every fd goes back
            parser.close()
            outputs.close()
            close_fds(stdio)
            for listener in listeners:
                listener.close()
            raise
        ports = None
        if listeners:
            from boxyd.daemon.publish import Publisher

            ports = Publisher(spec.publish, listeners, sink.record)
        sandbox = StageSandbox(
            self, spec, stdio, outputs, net, sink, request.terminal, ports, parser=parser,
            client_env=request.client_env,
        )  # fmt: skip
        self.live.add(sandbox)
        return sandbox

    def spawn_from_thread(self) -> socket.socket:
        """A control socket to a fresh outer stage 2, for a worker thread (a tool
        sandbox): the template is only ever (re)started on the event loop's thread,
        whose death signal it follows."""
        if self._loop is None:
            raise SetupError("stage 2: the daemon has not started its template")

        async def spawn() -> socket.socket:
            return self.template.spawn()

        return asyncio.run_coroutine_threadsafe(spawn(), self._loop).result(timeout=10)

    def tools(self, budget: float) -> Toolshed:
        return Toolshed(self.spawn_from_thread, budget)

    def parser(self) -> Apart:
        return self.walks.apart()

    async def profile(self, name: str, cwd: str, client_env: dict[str, str]) -> ProfileView:
        """`profile show NAME`: loaded as a run in CWD loads it; npm and pip asked in
        tool sandboxes, as a run's spec asks them (_spec), never from a writable tree."""
        registry = self._registries(client_env, [cwd, *self._live_roots()])

        def build() -> ProfileView:
            try:  # a profile file is parsed apart (profiles.py): a parse child of its own
                return call_apart(self.walks.apart, view)
            finally:
                registry.close()

        def view() -> ProfileView:
            return profileview.view(name, cwd, self.user.pw_dir, registry)

        return await pools.run(pools.ASKED, build)

    def _registries(self, client_env: dict[str, str], writable: list[str]) -> Registries:
        """npm's and pip's settings as a run gets them: asked in tool sandboxes, with the
        client's environment, never a tool from a WRITABLE tree."""
        environ = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
        return Registries(
            {**environ, **client_env}, tools=self.tools(SETTINGS_BUDGET), writable=writable
        )

    def _live_roots(self) -> list[str]:
        """The trees the payload of every live session can write."""
        return [r for sb in self.live for r in mountplan.writable_roots(sb.spec)]

    def writable_trees(self, request: RunRequest) -> list[str]:
        """Every tree the payload of a live session could write, and those this request
        names (its work directory, the client's cwd, --rw, --mkdir): no tool boxyd runs
        is taken from one."""
        o = request.options
        return [p for p in (o.workdir, request.cwd, *o.rw, *o.mkdir, *self._live_roots()) if p]

    async def _spec(self, request: RunRequest, parser: Apart) -> RunSpec:
        registry = self._registries(request.client_env, self.writable_trees(request))

        def build() -> RunSpec:
            try:
                spec = build_spec(
                    request,
                    uid=os.getuid(),
                    user=self.user.pw_name,
                    home=self.user.pw_dir,
                    registry=registry,
                )
            finally:
                registry.close()
            spec.notes += registry.notes
            return spec

        # Asking npm/pip for their registry runs a tool (in a sandbox): not on the event
        # loop; the project's files it reads are parsed apart (parseproc.py)
        return await pools.run(pools.START, call_with, parser, build)

    async def _network(self, spec: RunSpec, sink: Sink, outputs: Outputs) -> Network:
        # The gateway's modules (dnspython among them) load with the first networked
        # run, not with the daemon: --net none never pays for them.
        from boxyd.daemon.network import Network, make_dns_proxy
        from boxyd.net.tailscale import magicdns_suffix

        tailnet = None
        if spec.tailscale:  # never a tailscale from the client's PATH inside a writable tree
            hostile = [
                r
                for x in [spec, *(sb.spec for sb in self.live)]
                for r in mountplan.writable_roots(x)
            ]
            binary = resolve("tailscale", os.environ.get("PATH", os.defpath), hostile)
            if binary is not None:
                tailnet = await asyncio.to_thread(magicdns_suffix, binary=binary)
        net = Network(
            spec, record=sink.record, notice=sink.notice, tailnet=tailnet, outputs=outputs
        )
        if self._dns is None:
            self._dns = make_dns_proxy()
        await net.check_hosts(self._dns)  # said before the payload starts, not after
        return net


class StageSandbox:
    def __init__(
        self,
        launcher: StageLauncher,
        spec: RunSpec,
        stdio: list[int],
        outputs: Outputs,
        net: Network | None,
        sink: Sink,
        terminal: Terminal | None,
        ports: Publisher | None = None,
        *,
        parser: Apart,
        client_env: dict[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self._client_env = client_env or {}  # what the project is read with (`trust`'s)
        self._parser = parser  # the run's parse child (spec, walk): closed after the walk
        self.ports = ports  # --publish: accepting once the payload runs
        self._launcher = launcher
        self._stdio = stdio  # the client's 0–2: ours to close once stage 2 has them
        self.outputs = outputs  # --audit-log, --net-log, --pcap
        self.net = net
        self._sink = sink
        self._terminal = terminal
        self.pty: PtyRelay | None = None
        self.stage2: Stage2 | None = None
        self.trees: dict[str, worktree.Tree] = {}  # the walk before the run
        # what the start-up and the relay of stage 2's reports tell the session
        self._events: asyncio.Queue[SandboxEvent] = asyncio.Queue()
        self._held: protocol.Done | None = None  # a Done that came during the start-up
        self._relay: asyncio.Task[None] | None = None
        self._kill_early = False  # a stop came before stage 2 could take it
        self.refused_calls = refusedcalls.RefusedCalls()  # seccomp's, named by PID 1
        self.limits: list[Limit] = []
        self._scope_path: str | None = None
        self._placement: Placement | None = None
        self._limit_hits: list[tuple[str, int]] = []
        # the git guard's baselines while the session runs: a session starting meanwhile on
        # an overlapping tree inherits them (scan.inherit_live)
        self.baselines: dict[str, Snapshot] = {}
        self._watched: list[live.Watched] = []  # what the live guard keeps covered
        self.live_guard: LiveGuard | None = None
        self._live_start: asyncio.Task[None] | None = None
        self.live_findings: list[str] = []  # what the live guard moved aside
        self._user_hooks: str | None = None
        self._edit: dict[str, list[str]] = {}  # --edit-config, by tree: rels left to the run
        self._checking = threading.Lock()  # one check of the trees at a time (_check)
        self._hold_budget: Budget | None = None  # the live guard's moves (_hold)
        self._review_layers: tuple[str, str] | None = None  # --review: (upper, work)
        self.review_watch: ReviewWatch | None = None  # --review-limit, while it runs
        self._review_task: asyncio.Task[None] | None = None
        self._outer_pid: int | None = None  # the outer stage 2's (it reports the end)
        self._frozen_kill: asyncio.Task[None] | None = None

    # -- before the payload ----------------------------------------------------------
    async def start(self) -> list[str]:
        """Ordered steps: the terminal, the walk, the plan, stage 2; then, as stage 2
        reports them, its scope, the network, PID 1 and the terminal's hand-over. It
        returns once the sandbox runs (or stage 2 has ended: events() says how), with
        every warning to say before the payload runs, the scope's limits among them."""
        warnings = self._limit_warnings() + (self.net.warnings if self.net is not None else [])
        fds, self._stdio = self._stdio, []
        placeholders: list[int] = []
        try:
            ttys = self._make_terminal(fds)
            stdio = self._placeholders(fds, ttys, placeholders)
            await self._walk()
            plan = self._plan(warnings, ttys)
            self._sink.record("seccomp", mode=self.spec.seccomp)
            self.stage2 = Stage2.start(self._launcher.template, plan, stdio)
            if self._kill_early:  # stopped meanwhile: step 0 ends the run
                self.stage2.signal(signal.SIGKILL)
        finally:
            close_fds([*placeholders, *fds])  # stage 2 has its own copies now
        await self._come_up(warnings)
        return warnings

    async def _come_up(self, warnings: list[str]) -> None:
        """Stage 2's start-up, step by step as it reports them; then the live guard, and
        the relay of what it reports later (a Done that came early included)."""
        running = (
            await self._place(warnings)
            and await self._attach_network()
            and await self._pid1_forked()
            and await self._hand_over_terminal()
        )
        if running:
            self._start_live_guard()
            self._watch_review()
        self._relay = asyncio.get_running_loop().create_task(self._relay_reports())

    def _ask_on(self) -> None:
        """--ask: the session's questions go to the client's terminal while one is here
        to answer (PtyRelay.ask), then to the bus's answerers; when nobody can answer,
        the name is refused at once. `for this project` writes the work directory's
        .boxy.yaml (config/trust.py), its parses apart as `trust`'s are."""
        if self.net is None or not self.spec.ask:
            return
        terminal = TerminalQuestions(lambda: self.pty)

        def answerers() -> list[Answerer]:
            return [terminal, self._sink.questions]

        self.net.ask_on(answerers, self._remember if self.spec.workdir else None)

    async def _remember(self, host: str) -> str:
        from boxyd.config import trust

        me, workdir, env = self._launcher.user, self.spec.workdir, self._client_env

        def write() -> str:
            return trust.allow_in_project(
                host, workdir, me.pw_dir, me.pw_name, env, config_home(me.pw_dir)
            )

        return await pools.run(pools.ASKED, call_apart, self._launcher.parser, write)

    def _make_terminal(self, fds: list[int]) -> list[int]:
        """The session's PTY, if it has one (boxyd owns it; the client's terminal is
        never passed in): which of 0–2 get its slave."""
        spec = self.spec
        if spec.detach:  # a terminal of its own for all three, attachable later
            settings = self._terminal.to_wire() if self._terminal else termsettings.defaults()
            self.pty = PtyRelay(None, None, settings=settings)
            self.pty.log_to(self._output_log())
            ttys = [0, 1, 2]
        else:
            self.pty = _terminal(fds)
            ttys = [i for i, fd in enumerate(fds) if os.isatty(fd)]
        if self.pty is None:
            return []
        self.pty.on_detach = self._sink.detach_requested
        self.pty.raw = spec.tty_raw  # --tty-raw: the output unfiltered (termfilter)
        if self._terminal is not None:  # the client is raw already: its settings from before
            self.pty.settings = self._terminal.to_wire()
        return ttys

    @staticmethod
    def _placeholders(fds: list[int], ttys: list[int], opened: list[int]) -> list[int]:
        """The stdio stage 2 gets: PID 1 puts the slave of the PTY in the sandbox's own
        devpts at TTYS; until then they hold /dev/null (OPENED, the caller's to close),
        never the host terminal."""
        stdio = list(fds)
        for i in ttys:
            opened.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
            stdio[i] = opened[-1]
        return stdio

    async def _walk(self) -> None:
        """The run's one walk per writable tree; it blocks: another process (walkproc),
        so no other session or API call waits. boxy's own package caches are writable
        but no project: not walked."""
        spec, home = self.spec, self._launcher.user.pw_dir
        walked = [r for r in mountplan.writable_roots(spec) if not caches.is_cache(r, home)]
        try:
            self._user_hooks, self.trees = await self._launcher.walks.prepare(
                walked,
                home=home,
                git_guard=not spec.allow_git_write,
                created=[e.path for e in spec.mkdir],
                secrets=spec.secrets,
                parser=self._parser,
            )
        finally:
            self._parser.close()  # its child exits: the run's next parses have their own
        others = [b for x in self._launcher.live if x is not self for b in x.baselines.values()]
        self.baselines = inherit_live(
            {r: t.baseline for r, t in self.trees.items() if t.baseline is not None}, others
        )

    def _plan(self, warnings: list[str], ttys: list[int]) -> Plan:
        """The mount plan from the walk: what is covered and pinned, and what the live
        guard keeps so."""
        spec = self.spec
        masks = self._credentials(warnings)
        protect = [e.path for e in spec.protect]
        pins = self._held_pins(warnings)
        self._watched = [
            live.watched(
                r,
                pins[r],
                masks.get(r, []),
                spec.reveal,
                t.dirs,
                [p for p in protect if _innermost(p, self.trees) == r],
                spec.secrets,
                t.stamps,
                t.unlisted,
                {p.rel: p.target for p in t.held.values() if p.type == "symlink"},
                self._edit[r],
                t.gitdirs,
                {p.rel: p.via for p in t.held.values() if p.type == "absent"},
                t.hookdirs,
            )
            for r, t in self.trees.items()
        ]
        net = self.net.plan() if self.net is not None else None
        bpf, naming = self._seccomp(net)
        layers = review.prepare(self._sink.id, spec) if spec.review else None
        self._review_layers = layers
        return mountplan.build(
            spec,
            review=layers,
            seccomp_bpf=bpf,
            seccomp_notify=naming,
            protections=pins,
            masks=masks,
            ctty=self.pty is not None,
            net=net,
            pty={**self.pty.settings, "fds": ttys} if self.pty is not None else None,
        )

    def _seccomp(self, net: NetPlan | None) -> tuple[bytes, dict[str, Any] | None]:
        """The filter, and how PID 1 names what it refuses (boxyd/stage2/notify.py): every
        connect() too where Landlock holds a port set and the run asked to hear of
        refusals (-v, --audit-log, --net-log), as each then waits on PID 1 (bench/
        connectnotify.py)."""
        spec = self.spec
        if not kernel_notifies():
            return build_filter(spec.seccomp), None
        naming: dict[str, Any] = {
            "seccomp_notify": spec.seccomp,
            "seccomp_errno": list(errno_calls()),
        }
        ports = net.landlock_ports if net is not None else None
        connect = ports is not None and bool(spec.verbose or spec.audit_log or spec.net_log)
        if connect:
            reader = base64.b64encode(reader_filter()).decode()
            naming |= {"connect_ports": ports, "seccomp_reader": reader}
        return build_filter(spec.seccomp, True, connect), naming

    def _held_pins(self, warnings: list[str]) -> dict[str, list[Protection]]:
        """Each tree's pins: git's, then the files host programs obey (heldfiles.pins),
        but what --edit-config leaves to the run (said, and in the audit log)."""
        self._edit = {
            r: [p[len(r) + 1 :] for p in self.spec.edit_config if _innermost(p, self.trees) == r]
            for r in self.trees
        }
        out = {}
        for r, t in self.trees.items():
            held = heldfiles.pins(t.held.values(), self._edit[r])
            out[r] = heldfiles.merged(t.protections, held)
            for rel in self._edit[r]:
                path = os.path.join(r, rel)
                self._sink.record("fs.hold", path=path, action="left to the run (--edit-config)")
                warnings.append(f"--edit-config {path}: the run may create or change it")
        for path in self.spec.allow_host_config:  # said by build_spec; recorded here
            self._sink.record("fs.hold", path=path, action="writable (--allow-host-config)")
        return out

    async def _expect(self, kind: type[_R]) -> _R | None:
        """Stage 2's next report of the start-up, KIND; None once it has ended instead
        (its Done held for the relay). What may come between (Landlock's notes) is
        dealt with as it would be later."""
        assert self.stage2 is not None
        while (msg := await self.stage2.next()) is not None:
            if isinstance(msg, kind):
                return msg
            if isinstance(msg, protocol.Done):
                self._held = msg
                return None
            self._aside(msg)
        return None

    def _credentials(self, warnings: list[str]) -> dict[str, list[Found]]:
        """Which credentials found in the trees are covered (all but --reveal's), said
        once before the payload starts and listed under -v and in the audit log."""
        masks: dict[str, list[Found]] = {}
        covered_all: list[tuple[str, Found]] = []
        shown_all: list[tuple[str, Found]] = []
        for root, tree in self.trees.items():
            covered, shown = masking.revealed(tree.credentials, root, self.spec.reveal)
            masks[root] = covered
            covered_all += [(root, f) for f in covered]
            shown_all += [(root, f) for f in shown]
        for what, items in (("covered", covered_all), ("revealed", shown_all)):
            for root, f in items:
                path = os.path.join(root, f.rel)
                self._sink.record(
                    "fs.secret",
                    path=path,
                    kind=f.kind,
                    action=what if what == "revealed" else f.action.value,
                    **({"note": f.note} if f.note else {}),
                )
                if self.spec.verbose:
                    how = {"scrub": "a copy without its credentials", "empty": "an empty stand-in"}
                    told = (
                        "revealed (--reveal): the payload can read it"
                        if what == "revealed"
                        else f"shown as {how[f.action.value]}"
                    )
                    warnings.append(
                        f"{path}: {f.kind}, {told}" + (f" ({f.note})" if f.note else "")
                    )
        sockets = sum(f.kind == masking.SOCKET.kind for _, f in covered_all)
        if n := len(covered_all) - sockets:
            warnings.append(
                f"{n} credential file{'s' if n != 1 else ''} masked "
                "(-v lists them; --reveal PATH exposes one)"
            )
        if sockets:
            warnings.append(
                f"{sockets} unix socket{'s' if sockets != 1 else ''} in the work tree covered: "
                "connections to them are refused inside (-v lists them; --reveal PATH "
                "exposes one)"
            )
        return masks

    def _limit_warnings(self) -> list[str]:
        """What the user should hear before the payload starts. A limit without a
        controller is reported, not faked (until transient scopes arrive)."""
        spec = self.spec
        out: list[str] = list(spec.warnings)
        if os.getuid() == 0:
            out.append(
                "running as root: the payload runs as uid 0 (with no capabilities, mapped to "
                "itself); prefer an unprivileged user"
            )
        if spec.seccomp == "compat":
            out.append(
                "--seccomp compat: forbidden system calls fail with EPERM instead of killing the "
                "process; this is for diagnosis, do not leave it on"
            )
        if spec.publish:
            from boxyd.daemon.publish import exposure

            out += [exposure(m) for m in spec.publish]
        if spec.verbose:
            out.extend(spec.notes)
        return out

    async def _place(self, warnings: list[str]) -> bool:
        """Step 0 of stage 2: the run's scope, and what its limits amount to (among
        WARNINGS, said before the payload starts). False: stage 2 ended first."""
        reported = await self._expect(protocol.Pid)
        if reported is None:
            return False
        placement = await self._launcher.scopes.place(
            self._sink.id, (reported.pid, reported.zygote), self.spec
        )
        self._outer_pid = reported.pid
        self._scope_path = placement.path
        self._placement = placement
        self.limits = limits(self.spec, placement)
        record = self._sink.record
        record(
            "cgroup",
            scope=placement.unit,
            controllers=sorted(placement.controllers),
            **({"reason": placement.reason} if placement.reason else {}),
        )
        for lim in self.limits:
            record("cgroup", limit=lim.name, value=lim.value, enforced=lim.enforced, by=lim.by)
            if (not lim.enforced and lim.name == "cpus") or self.spec.verbose:
                warnings.append(lim.line)
        assert self.stage2 is not None
        self.stage2.send(protocol.Placed(in_scope=placement.unit is not None))
        return True

    async def _attach_network(self) -> bool:
        """Step 4: the gateway's sockets, to the network boxyd runs for the sandbox; one
        that cannot take them ends the run (the payload would have no network)."""
        if self.net is None:
            return True
        got = await self._expect(Gateway)
        if got is None:
            return False
        if self._launcher._dns is None:
            _close_sockets(got)
            return True
        self._ask_on()  # before the gateway's DNS session is made
        try:
            self.net.attach(got.sockets, self._launcher._dns)
        except SetupError as e:
            log.warning("session %s: %s", self._sink.id, e)
            self.signal(signal.SIGKILL)
        return True

    async def _pid1_forked(self) -> bool:
        """Stage 2 forked PID 1: the payload is under way (Started, for the session)."""
        if await self._expect(protocol.Started) is None:
            return False
        userns = self.stage2.userns() if self.stage2 is not None else None
        if self.net is not None and userns is not None:  # --ask names who asked
            self.net.started(userns)
        if self.ports is not None and self.stage2 is not None:  # stage 2 answers requests now
            self.ports.start(self.stage2.send)
        self._events.put_nowait(Started())
        return True

    async def _hand_over_terminal(self) -> bool:
        """PID 1 made the session's PTY in the sandbox's devpts: its master, to the relay."""
        if self.pty is None:
            return True
        got = await self._expect(PtyMaster)
        if got is None:
            return False
        self.pty.attach(got.master)
        return True

    # -- while it runs ---------------------------------------------------------------
    def _aside(self, msg: Received) -> None:
        """A report that is not a step of the start-up, at whatever moment it comes."""
        match msg:
            case protocol.Confined(notes=notes):
                for note in notes:
                    self._sink.record("landlock", note=note)
            case protocol.Refused():
                self._refused_call(msg)
            case protocol.Refusals():
                self.refused_calls.ended(msg)
            case protocol.PortRefused(addr=addr, port=port):
                if self.net is not None:
                    self.net.landlock_refused(addr, port, refusedcalls.process(msg))
            case protocol.LiveDone(id=ident, error=error):
                if self.live_guard is not None:
                    self.live_guard.done(ident, error)
            case protocol.Stopped(signal=sig):
                if self.pty is not None:  # job control needs a terminal
                    self.pty.pause_input()  # before the client stops and its shell reads again
                    self._events.put_nowait(Stopped(sig))
            case Gateway():  # not asked for (now): stage 2 keeps no copy, nor do we
                _close_sockets(msg)
            case PtyMaster(master=fd):
                os.close(fd)
            case NewSocket(id=ident, sock=sock, error=error):
                if self.ports is not None:
                    self.ports.made(ident, sock, error)
                elif sock is not None:
                    sock.close()
            case _:  # a second Pid or Started: nothing to do
                log.warning(
                    "session %s: stage 2: %s out of turn", self._sink.id, type(msg).__name__
                )

    def _refused_call(self, msg: protocol.Refused) -> None:
        """A system call seccomp refused, named by PID 1: recorded, and said with -v."""
        self.refused_calls.add(msg)
        self._sink.record("seccomp", **refusedcalls.record(msg))
        if self.spec.verbose and self.refused_calls.notice():
            self._sink.notice(refusedcalls.describe(msg))

    async def _relay_reports(self) -> None:
        """Stage 2's reports once the start-up is over, until its end; then the Exit."""
        assert self.stage2 is not None
        done, self._held = self._held, None
        if done is None:
            while (msg := await self.stage2.next()) is not None:
                if isinstance(msg, protocol.Done):
                    done = msg
                    break
                self._aside(msg)
        # the scope goes with its last process: its counters now (none without one)
        if done is not None and self._scope_path is not None:
            self._limit_hits = await pools.run(pools.START, read_events, self._scope_path)
        # Done is stage 2's last word, sent once PID 1 and with it every process of the
        # payload is gone: the run ends now, not once stage 2's own exit has torn its
        # namespaces down (finish() waits for the cgroup to empty where it must)
        self._events.put_nowait(_exit(done.end if done is not None else None))
        while done is not None and (msg := await self.stage2.next()) is not None:
            self._aside(msg)

    async def events(self) -> AsyncIterator[SandboxEvent]:
        """What the start-up and the relay queued: Started, Stopped…, one Exit."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Exit):
                return

    def _start_live_guard(self) -> None:
        """The payload runs: from now on a host change to a covered or pinned entry is
        covered again at once (boxyd/plan/live.py). Its watches are set up beside the run."""
        if not self._watched or self.stage2 is None:
            return
        quiet = not self.spec.verbose
        self.live_guard = LiveGuard(
            self._watched,
            self.stage2.send,
            self._sink.record,
            self._adopt,
            (lambda _: None) if quiet else self._sink.notice,
            self._launcher.walks.apart,
            self._stopped_by_guard,
            self._launcher.walks.rescan,
            self._hold,
            self._live_git_check,
        )
        self._live_start = asyncio.get_running_loop().create_task(self._watch(self.live_guard))

    def _hold(
        self, root: str, rel: str, held: Held, target: str, judged_as: str
    ) -> tuple[str, bool] | None:
        """A held file the payload made during the run (in a worker thread), moved to
        the session's quarantine at once (heldfiles.hold); its line said at the end and
        left for the hook's next answer (boxy/notices.py)."""
        if self._hold_budget is None:  # counted once a session (a walk of the quarantine)
            self._hold_budget = Budget(str(state_dir() / "quarantine"))
        got = heldfiles.hold(
            root, rel, held, target, self._quarantine(root), self._hold_budget, judged_as
        )
        if got is not None:
            self.live_findings.append(f"live guard: {got[0]}")
            notices.leave(self._sink.id, [got[0]])
        return got

    def _check(self, live: bool = False) -> tuple[list[str], list[str]]:
        """The git guard's scan, the tools' files and the held files of every tree, in
        a child (afterproc.py; a worker thread's call). One at a time: the live guard's
        (LIVE: what it moved is kept here, for the end and the hook's next answer, even
        when the session ends meanwhile) and the one after the run never move the same
        entry, and the one after the run comes after the live guard's lines."""
        check = afterproc.Check(
            self.trees,
            self.baselines,
            str(state_dir() / "quarantine" / self._sink.id),
            self._launcher.user.pw_dir,
            self._launcher.tools(CHECKS_BUDGET),
            self._user_hooks,
            self._launcher.walks.apart,
            self._edit,
        )
        with self._checking:
            got = self._launcher.walks.after(check)
            if live:
                moved = [x for x in got[0] + got[1] if _moved(x)]
                self.live_findings += [f"live guard: {x}" for x in moved]
                notices.leave(self._sink.id, moved)
            return got

    async def _live_git_check(self) -> list[str]:
        """A change git would read, made during the run (plan/live.py git_event): the
        check now, and what it moved (the git guard's findings, the held files),
        kept by _check; the tools' reports wait for the end (they compare with the
        start)."""
        if not self.baselines:
            return []  # --allow-git-write: no git guard
        git_lines, tool_lines = await pools.run(pools.CHECKS, self._check, True)
        return [x for x in git_lines + tool_lines if _moved(x)]

    def _quarantine(self, root: str) -> str:
        """Where this session's quarantine keeps what it moves out of the tree ROOT."""
        top = state_dir() / "quarantine" / self._sink.id
        return os.path.join(str(top), root.strip("/").replace("/", "_"))

    async def _watch(self, guard: LiveGuard) -> None:
        for note in await guard.start():
            self._sink.record("fs.live", note=note)
            self._sink.notice(note)

    def _watch_review(self) -> None:
        """--review: its layer held to --review-limit while the payload runs."""
        layers = self._review_layers
        if layers is None:
            return
        freezer = self._freezer()
        freeze = None
        if freezer is not None:  # a cgroup of the run's own

            def freeze(on: bool) -> Awaitable[bool]:
                return asyncio.to_thread(freeze_own, freezer, on)

        self.review_watch = ReviewWatch(
            layers[0], self.spec.review_limit, self._stopped_by_guard, freeze
        )
        self._review_task = asyncio.get_running_loop().create_task(self.review_watch.run())

    def _freezer(self) -> str | None:
        """The run's own cgroup, its cgroup.freeze boxyd's to write (scopes.Placement)."""
        return self._placement.freezer if self._placement is not None else None

    def _stopped_by_guard(self, line: str) -> None:
        """The live guard cannot keep the trees covered: the payload ends now (its
        whole PID namespace); LINE is said with the outcome (its notes)."""
        log.info("session %s: %s", self._sink.id, line)
        self.signal(signal.SIGKILL)

    def _adopt(self, root: str, rel: str, saved: FileRead | None) -> str | None:
        """The host replaced a pinned file (in a worker thread; SAVED: what it held as the
        guard first read it). Written to in the moment it was unpinned, it gets SAVED
        back in place; another file there now was renamed over it again, and that
        rename's own redo judges it (the user's next save is not undone as a write). A
        git control file is then taken as the user's new baseline, unless it adds keys
        that run commands: then the version from before it is put back at once, so no
        host git meanwhile runs what the payload may have raced into it. The line to
        say, or None."""
        quarantine = self._quarantine(root)
        lines = []
        path = os.path.join(root, rel)
        now = read_beneath_at(root, rel, CONFIG_MAX)
        if (
            saved is not None
            and now is not None
            and now.file == saved.file
            and now.data != saved.data
        ):
            dest = overwrite(root, rel, saved.data, quarantine)
            lines.append(
                f"live guard: {path} was written in the moment it was unpinned; "
                + (
                    f"put back as the host saved it (the write is in {dest})"
                    if dest
                    else "it could not be put back: check it"
                )
            )
        if root in self.baselines:
            self.baselines[root], why = adopt(self.baselines[root], rel)
            if why is not None and why != "gone":
                try:
                    dest, back = restore(self.baselines[root], rel, quarantine)
                except OSError as e:
                    lines.append(f"git guard: {rel}: {why}; could not be moved: {e.strerror}")
                else:
                    lines.append(
                        f"git guard: moved {rel} to {dest} during the run: {why}"
                        + ("; the version from before it is back" if back else "")
                    )
        self.live_findings += lines
        return "; ".join(lines) or None

    def signal(self, sig: int) -> None:
        """To the payload, through stage 2. A stop while start() still walks the trees
        is kept for stage 2, which then ends the run before anything runs."""
        if self.stage2 is None:
            if sig == signal.SIGKILL:
                self._kill_early = True
            return
        if sig == signal.SIGCONT and self.pty is not None:  # the client is back (fg)
            self.pty.resume_input()
        freezer = self._freezer()
        if sig == signal.SIGKILL and freezer is not None and self._outer_pid is not None:
            with contextlib.suppress(RuntimeError):  # (a guard's thread: the kill as before)
                loop = asyncio.get_running_loop()
                self.stage2.killing()
                self._frozen_kill = loop.create_task(self._kill_frozen(freezer))
                return
        self.stage2.signal(sig)

    async def _kill_frozen(self, freezer: str) -> None:
        """boxyd's SIGKILL (--timeout past its grace, stop --kill) to a run with a cgroup
        of its own: every process killed while frozen, so none runs in the instant
        between PID 1's listener closing and the kernel killing the rest; then the
        signal as before (PID 1 is gone or going)."""
        assert self._outer_pid is not None
        killed = await asyncio.to_thread(kill_frozen, freezer, self._outer_pid)
        self._sink.record("cgroup", killed_frozen=killed)
        if self.stage2 is not None:
            self.stage2.signal(signal.SIGKILL)

    def resize(self, rows: int, cols: int) -> None:
        if self.pty is not None:
            self.pty.resize(rows, cols)

    def limit_lines(self) -> list[str]:
        return [lim.line for lim in self.limits]

    def change_policy(self, change: Change, hosts: list[str], caller: Caller, t: float) -> str:
        if self.net is None:
            raise UsageError(f"{change.value}: the session has no network (--net none)")
        return self.net.change(change, hosts, caller, t)

    def counters(self) -> Counters:
        gateway = self.net.gateway if self.net is not None else None
        return gateway.totals() if gateway is not None else Counters()

    def destinations(self, limit: int) -> list[Destination]:
        gateway = self.net.gateway if self.net is not None else None
        return gateway.netlog.summary()[:limit] if gateway is not None else []

    def detach(self) -> bool:
        """The client leaves: its terminal is let go, the output goes on into the
        ring and the session's output log. False without a terminal to keep."""
        if self.pty is None:
            return False
        self.pty.disconnect()
        self.pty.log_to(self._output_log())
        return True

    def attach_client(self, stdio: list[int], terminal: Terminal | None) -> None:
        """A new client takes over the session's terminal (its fds are ours)."""
        try:
            if self.pty is None:
                raise UsageError(
                    "this session has no terminal to attach to (it was started without one)"
                )
            ttys = [os.isatty(fd) for fd in stdio]
            if len(stdio) != 3 or not any(ttys):
                raise UsageError("attach: none of boxyctl's stdin, stdout, stderr is a terminal")
            in_fd = os.dup(stdio[0]) if ttys[0] else None
            out = next((fd for fd, t in zip(stdio[1:], ttys[1:], strict=True) if t), stdio[0])
            # the new size first: once connected, the client's keys can reach the
            # payload (and its `stty size`) before this thread runs again
            if terminal is not None:
                self.pty.resize(terminal.winsize[0], terminal.winsize[1])
            self.pty.connect(in_fd, os.dup(out))
        finally:
            close_fds(stdio)

    def _output_log(self) -> int:
        """sessions/<id>/output.log: what a detached session writes (bounded)."""
        path = records.record_dir(self._sink.id) / "output.log"
        return os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )

    # -- afterwards ------------------------------------------------------------------
    async def finish(self) -> Report:
        self._parser.close()  # (a run that ended before its walk)
        if self._live_start is not None:
            self._live_start.cancel()
        if self.live_guard is not None:
            self.live_guard.close()
        if self.stage2 is not None:
            self.stage2.close()
        if self.ports is not None:
            self._sink.record(
                "publish", connections=self.ports.connections, reset_full=self.ports.reset_full
            )
            self.ports.close()
        # The gateway waits a moment for the last refusal reports: meanwhile, the
        # terminal drains and the git scan runs.
        net_done = asyncio.create_task(self.net.finish()) if self.net is not None else None
        if self.pty is not None:
            if self.pty.attached:
                await self.pty.wait_drained()
            self.pty.close()
        report = Report(notes=self._bounds_reached())
        report.notes += self.refused_calls.lines()  # said without -v, like the network's
        report.seccomp_kill = self.refused_calls.first_kill()
        if self.spec.review and self.stage2 is not None:
            report.notes += await self._review_end()
        if self.live_guard is not None:  # a budget it reached, and what it did instead
            report.notes += self.live_guard.said
        # after the live guard's last check (it holds _checking): its lines are in
        git_lines, tool_lines = await pools.run(pools.CHECKS, self._check)
        report.findings += self.live_findings
        for line in git_lines:
            self._sink.record("git", finding=line)
            report.findings.append(line)
        for line in tool_lines:
            self._sink.record("fs.exec", finding=line)
            report.findings.append(f"tools' files: {line}")
        # what was moved aside, for the hook's next answer (the live guard's: as it came)
        notices.leave(self._sink.id, [x for x in git_lines + tool_lines if _moved(x)])
        if net_done is not None:
            got = await net_done
            report.notes += got.get("notes", [])
            report.destinations = got.get("destinations", [])
            report.refusals = got.get("refusals", [])
        pause = 0.002
        for _ in range(30):  # a child of boxyd's cgroup empties as stage 2 exits (~1 s)
            if self._placement is None or remove_subtree(self._placement):
                self._placement = None
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
        return report

    async def _review_end(self) -> list[str]:
        """--review's last words: why the watch stopped the run, if it did; the layer
        measured once more (the payload gone) and its size kept with it."""
        if self._review_task is not None:
            self._review_task.cancel()
        watch, notes = self.review_watch, []
        size: tuple[int, int] | None = None
        if watch is not None:
            if watch.stopped is not None:
                notes.append(watch.stopped)
                self._sink.record("review", stopped=watch.stopped)
            with contextlib.suppress(BoxyError):
                size = await watch.measure(running=False)
            self._sink.record("review", measures_frozen=watch.frozen, held=size)
            over = watch.over(*size) if size is not None and watch.stopped is None else None
            notes += [over] if over is not None else []
        notes.append(await pools.run(pools.CHECKS, review.after_run, self._sink.id, size))
        # the trees it wrote as it ran (--rw, --mkdir outside the work directory; not
        # boxy's own package caches): said, so nobody takes them for held
        home = self._launcher.user.pw_dir
        live = [
            r
            for r in mountplan.writable_roots(self.spec)
            if r != self.spec.workdir and not caches.is_cache(r, home)
        ]
        if live:
            notes.append(f"--review: not held, written as it ran: {', '.join(live)}")
        return notes

    def _bounds_reached(self) -> list[str]:
        """What the run's last lines say of a bound it reached (README, "When a budget
        runs out")."""
        notes = []
        if self.ports is not None and self.ports.reset_full:
            from boxyd.daemon.publish import MAX_CONNECTIONS  # loaded: ports were published

            notes.append(
                f"--publish: {self.ports.reset_full:,} connections reset at the accept: "
                f"{MAX_CONNECTIONS} were open at once"
            )
        if self.pty is not None and self.pty.log_cut:
            notes.append(f"output log: stopped at {pty.MAX_LOG >> 20} MiB; the rest was not kept")
        for what, count in self._limit_hits:  # only where a controller counted them
            self._sink.record("cgroup", event=what, count=count)
            notes.append(f"{what} ({count}x)")
        return notes

    def audit_log(self) -> int | None:
        return self.outputs.audit

    def close(self) -> None:
        """Everything a finished (or never started) run still holds; its baselines are
        no longer the user's state for a session starting now."""
        self._launcher.live.discard(self)
        close_fds(self._stdio)
        self._stdio = []
        if self.pty is not None:
            self.pty.close()
        if self._live_start is not None:
            self._live_start.cancel()
        if self._relay is not None:
            self._relay.cancel()
        if self.live_guard is not None:
            self.live_guard.close()
            self.live_guard = None
        if self.stage2 is not None:
            self.stage2.close()
        if self.ports is not None:
            self.ports.close()
        self.outputs.close()
        if self._placement is not None:  # a child of boxyd's own cgroup: ours to remove
            remove_subtree(self._placement)
            self._placement = None
        if self.net is not None:
            self.net.discard()
            self.net = None
        self.trees, self.baselines = {}, {}


async def _overlay_or_refuse() -> None:
    """--review where the kernel gives no unprivileged overlay: one line, before anything."""
    ok, why = await reviewproc.overlay_works()
    if not ok:
        raise UsageError(
            f"--review: this kernel gives no unprivileged overlay ({why}); "
            "`boxyctl doctor` says more"
        )


def _moved(line: str) -> bool:
    """A finding that moved something to the quarantine (git guard's, held files'), or
    could not: said at once. (What is only named is said once, at the end.)"""
    return line.startswith(("quarantined ", "git guard: moved ")) or (
        "could not be quarantined" in line
    )


def _innermost(path: str, trees: dict[str, worktree.Tree]) -> str | None:
    """The deepest walked tree holding PATH (its protect binds are based on it)."""
    holding = [r for r in trees if path.startswith(r.rstrip("/") + "/")]
    return max(holding, key=len) if holding else None


def _terminal(fds: list[int]) -> PtyRelay | None:
    """Decided per fd: every terminal among the client's 0–2 is replaced by one PTY
    that boxyd owns (its slave becomes the sandbox's controlling terminal); pipes
    and files pass straight through. No host terminal fd enters the sandbox."""
    ttys = [os.isatty(fd) for fd in fds]
    if not any(ttys):
        return None
    in_fd = os.dup(fds[0]) if ttys[0] else None
    out = next((fd for fd, t in zip(fds[1:], ttys[1:], strict=True) if t), None)
    if out is None and ttys[0]:
        out = fds[0]  # only stdin is a terminal: echo goes back to it
    return PtyRelay(in_fd=in_fd, out_fd=os.dup(out) if out is not None else None)


def _exit(end: protocol.End | None) -> Exit:
    """Stage 2's account of the end as the seam's value (None: it died unheard)."""
    match end:
        case protocol.SetupFailed(error=error):
            return Exit(error=error)
        case protocol.ExecFailed(errno=errno, cmd=cmd):
            return Exit(exec_errno=errno, cmd=cmd)
        case protocol.Exited(code=code):
            return Exit(code=code)
        case protocol.Killed(signal=sig):
            return Exit(signal=sig)
        case _:
            return Exit()


def _close_sockets(gateway: Gateway) -> None:
    for sock in gateway.sockets.values():
        sock.close()
