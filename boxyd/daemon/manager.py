"""The core: a Manager owning every run as a Session. Both API front ends (varlink now,
D-Bus later) are thin adapters over this module; no policy lives in an adapter."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pwd
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from boxyd import caches, masking, mountplan, retention, units, worktree
from boxyd.buildid import build_id
from boxyd.daemon.launcher import Stage2, Template
from boxyd.daemon.pty import PtyRelay
from boxyd.errors import BoxyError, SetupError, UsageError
from boxyd.gitguard.scan import Snapshot, inherit_live
from boxyd.hostfile import Outputs, open_outputs, replaced
from boxyd.paths import ensure_private_dir, state_dir
from boxyd.policy.seccomp import build_filter
from boxyd.registries import Registries
from boxyd.spec import RunSpec, build_spec

if TYPE_CHECKING:
    from boxyd.daemon.network import Network

log = logging.getLogger("boxyd")

CACHE_PRUNE_EVERY = 3600.0  # seconds between bounding the package caches
GRACE = 5.0  # seconds between SIGTERM and SIGKILL (timeout, stop)
KEEP_FINISHED = 64  # finished sessions kept in memory (the rest live in their records)
MAX_AUDIT = 50_000  # records kept per session for --audit-log (a flood is counted, not kept)
EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_SETUP = 125
EXIT_NOEXEC = 126
EXIT_NOTFOUND = 127


@dataclass
class Session:
    id: str
    spec: RunSpec
    started_at: float = field(default_factory=time.time)
    state: str = "starting"
    stage2: Stage2 | None = None
    pty: PtyRelay | None = None
    result: dict | None = None
    timed_out: bool = False
    audit: list[dict] = field(default_factory=list)
    audit_dropped: int = 0
    net: Network | None = None
    # the git guard's baselines while the session runs: a session starting meanwhile on
    # an overlapping tree inherits them (scan.inherit_live)
    baselines: dict[str, Snapshot] = field(default_factory=dict)
    outputs: Outputs = field(default_factory=Outputs)  # --audit-log, --net-log, --pcap
    # the client terminal's settings from before it went raw (termsettings.capture)
    terminal: dict | None = None
    trees: dict[str, worktree.Tree] = field(default_factory=dict)  # the walk before the run
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def signal(self, sig: int) -> None:
        if self.stage2 is not None and self.state == "running":
            self.stage2.signal(sig)

    def record(self, layer: str, **fields: object) -> None:
        if len(self.audit) >= MAX_AUDIT:  # a flood of denials must not grow the daemon
            self.audit_dropped += 1
            return
        self.audit.append({"t": round(time.time(), 3), "session": self.id, "layer": layer, **fields})


def _terminal_settings(value: object) -> dict | None:
    """The client's termios and window size as it sent them (checked for shape only:
    they are the user's own; PID 1 applies them and refuses a bad one)."""
    if not isinstance(value, dict):
        return None
    attrs, size = value.get("termios"), value.get("winsize")
    if (isinstance(attrs, list) and len(attrs) == 7 and all(isinstance(a, int) for a in attrs[:6])
            and isinstance(attrs[6], list) and all(isinstance(c, int) for c in attrs[6])
            and isinstance(size, list) and len(size) == 4 and all(isinstance(v, int) for v in size)):
        return {"termios": attrs, "winsize": size}
    return None


class Manager:
    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.user = pwd.getpwuid(os.getuid())
        self.started_at = time.time()
        self.template = Template()
        self._caches_pruned = -CACHE_PRUNE_EVERY
        self._dns = None

    def start(self) -> None:
        """On the event-loop thread, before the first call: the stage-2 template
        imports while the first request is being read. If it cannot start, each run
        retries and reports why."""
        try:
            self.template.start()
        except SetupError as e:
            log.warning("%s", e)

    def close(self) -> None:
        self.template.close()

    # -- queries ---------------------------------------------------------------------
    def version(self) -> dict:
        return {"build": build_id(), "version": "0.1.0"}

    def status(self) -> dict:
        running = [s.id for s in self.sessions.values() if s.state in ("starting", "running")]
        return {**self.version(), "pid": os.getpid(), "uptime": round(time.time() - self.started_at, 1),
                "sessions_running": len(running)}

    def busy(self) -> bool:
        return any(s.state in ("starting", "running") for s in self.sessions.values())

    def get(self, sid: str) -> Session | None:
        return self.sessions.get(sid)

    # -- control ---------------------------------------------------------------------
    def resize(self, sid: str, rows: int, cols: int) -> None:
        s = self.sessions.get(sid)
        if s is not None and s.pty is not None:
            s.pty.resize(rows, cols)

    def signal(self, sid: str, sig: int) -> None:
        s = self.sessions.get(sid)
        if s is not None and 0 < sig < 65:
            if sig == signal.SIGCONT and s.pty is not None:  # the client is back (fg)
                s.pty.resume_input()
            s.signal(sig)

    def stop(self, sid: str, kill: bool) -> None:
        s = self.sessions.get(sid)
        if s is None:
            raise KeyError(sid)
        if kill:
            s.signal(signal.SIGKILL)
        else:
            s.signal(signal.SIGTERM)
            asyncio.get_running_loop().call_later(GRACE, s.signal, signal.SIGKILL)

    # -- run -------------------------------------------------------------------------
    async def run(self, params: dict, fds: list[int],
                  on_started: Callable[[Session, list[str]], Awaitable[None]],
                  on_notice: Callable[[str], None] | None = None,
                  on_stopped: Callable[[int], None] | None = None) -> dict:
        """ON_STOPPED: the payload stopped (^Z): the client stops too, and continues it
        with SIGCONT when it is continued itself."""
        """Validate, launch, wait. FDS (the client's stdin, stdout, stderr) are ours to close."""
        outputs = Outputs()
        try:
            client_env = params.get("client_env") if isinstance(params.get("client_env"), dict) else {}
            registry = Registries({**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME")},
                                   **{k: str(v) for k, v in client_env.items()}})
            # Asking npm/pip for their registry runs a tool: not on the event loop.
            spec = await asyncio.to_thread(build_spec, params, uid=os.getuid(), user=self.user.pw_name,
                                           home=self.user.pw_dir, registry=registry)
            if len(fds) != 3:
                raise UsageError("Run needs exactly three file descriptors (stdin, stdout, stderr)")
            if spec.tty and not any(os.isatty(fd) for fd in fds):
                raise UsageError("--tty: none of boxyctl's stdin, stdout, stderr is a terminal")
            # before the payload starts, never by name afterwards (hostfile.py); the trees of
            # every live session count as hostile, not only this one's
            hostile = [r for x in [spec, *(x.spec for x in self.sessions.values() if x.state != "exited")]
                       for r in mountplan.writable_roots(x)]
            outputs = await asyncio.to_thread(open_outputs, spec.audit_log, spec.net_log, spec.pcap,
                                              hostile)
            session = Session(id=secrets.token_hex(4), spec=spec, outputs=outputs,
                              terminal=_terminal_settings(params.get("terminal")))
            if spec.net != "none":
                # The gateway's modules (dnspython among them) load with the first
                # networked run, not with the daemon: --net none never pays for them.
                from boxyd.daemon.network import Network, make_dns_proxy
                from boxyd.net.tailscale import magicdns_suffix

                tailnet = await asyncio.to_thread(magicdns_suffix) if spec.tailscale else None
                session.net = Network(spec, record=session.record, notice=on_notice, tailnet=tailnet,
                                      outputs=outputs)
                if self._dns is None:
                    self._dns = make_dns_proxy()
        except BaseException:  # a usage error, or a bug: either way every fd goes back
            outputs.close()
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        self.sessions[session.id] = session
        try:
            return await self._run(session, fds, on_started, on_stopped)
        finally:
            session.state = "exited"
            session.done.set()

    async def _run(self, s: Session, fds: list[int], on_started: Callable[[Session, list[str]], Awaitable[None]],
                   on_stopped: Callable[[int], None] | None = None) -> dict:
        spec = s.spec
        warnings = self._limit_warnings(s) + (s.net.warnings if s.net is not None else [])
        stdio = list(fds)
        placeholders: list[int] = []
        try:
            s.pty = self._terminal(fds)
            if s.pty is not None and s.terminal is not None:
                s.pty.settings = s.terminal  # the client is raw already: its settings from before
            if s.pty is not None:
                # PID 1 puts the slave of a PTY in the sandbox's own devpts at these
                # positions; until then they hold /dev/null, never the host terminal.
                ttys = [i for i, fd in enumerate(fds) if os.isatty(fd)]
                for i in ttys:
                    placeholders.append(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
                    stdio[i] = placeholders[-1]
            # the run's one walk per writable tree; it blocks: a worker thread, so no
            # other session or API call waits
            # boxy's own package caches are writable but no project: not walked
            walked = [r for r in mountplan.writable_roots(spec) if not caches.is_cache(r, self.user.pw_dir)]
            trees = await asyncio.to_thread(worktree.prepare, walked,
                                            git_guard=not spec.allow_git_write,
                                            created=[e.path for e in spec.mkdir])
            live = [b for x in self.sessions.values() if x is not s for b in x.baselines.values()]
            s.trees = trees
            s.baselines = inherit_live(
                {r: t.baseline for r, t in trees.items() if t.baseline is not None}, live)
            masks = self._credentials(s, trees, warnings)
            plan = mountplan.build(spec, seccomp_bpf=build_filter(spec.seccomp),
                                   protections={r: t.protections for r, t in trees.items()},
                                   masks=masks, ctty=s.pty is not None)
            if s.net is not None:
                s.net.configure(plan)
            if s.pty is not None:
                plan.pty = {**s.pty.settings, "fds": ttys}
            s.record("seccomp", mode=spec.seccomp)
            s.stage2 = Stage2.start(self.template, plan, stdio)
        except BoxyError as e:  # the user's input (2), or a layer that cannot be applied (125)
            self._close_all(fds, s)
            status = e.exit_status if isinstance(e, UsageError) else EXIT_SETUP
            return self._finish(s, {"exit_status": status, "reason": "setup", "message": str(e)})
        except Exception as e:  # a bug, not the user's doing: still one line, every fd closed
            log.exception("session %s: setup failed", s.id)
            self._close_all(fds, s)
            return self._finish(s, {"exit_status": EXIT_SETUP, "reason": "setup",
                                    "message": f"internal error in boxyd ({type(e).__name__}: {e}); "
                                               "see its log"})
        finally:
            for fd in [*placeholders, *fds]:
                with contextlib.suppress(OSError):
                    os.close(fd)
        timer = None
        final: dict = {}
        async for msg in s.stage2.messages():
            if "listeners" in msg:
                if s.net is None:
                    for sock in msg["sockets"].values():
                        sock.close()
                    continue
                try:
                    s.net.attach(msg["sockets"], self._dns)
                except BoxyError as e:
                    log.warning("session %s: %s", s.id, e)
                    s.stage2.signal(signal.SIGKILL)
            elif "pty" in msg:
                if s.pty is not None:
                    s.pty.attach(msg["pty_fd"])
                else:
                    os.close(msg["pty_fd"])
            elif "started" in msg:
                s.state = "running"
                if spec.timeout:
                    timer = asyncio.get_running_loop().call_later(spec.timeout, self._timeout, s)
                await on_started(s, warnings)
            elif "stopped" in msg:
                if on_stopped is not None and s.pty is not None:  # job control needs a terminal
                    s.pty.pause_input()  # before the client stops and its shell reads again
                    on_stopped(int(msg["stopped"]))
            elif "confined" in msg:
                for note in msg["confined"]:
                    s.record("landlock", note=note)
            elif "done" in msg:
                final = msg["done"] if isinstance(msg["done"], dict) else {}
        if timer is not None:
            timer.cancel()
        s.stage2.close()
        # The gateway waits a moment for the last refusal reports: meanwhile, the
        # terminal drains and the git scan runs.
        net_done = asyncio.create_task(s.net.finish()) if s.net is not None else None
        if s.pty is not None:
            if s.pty.attached:
                await s.pty.wait_drained()
            s.pty.close()
        result = self._result(s, final)
        if s.state == "starting":  # setup failed before the payload started
            await on_started(s, warnings)
        git_lines, tool_lines = await asyncio.to_thread(
            worktree.after, s.trees, s.baselines, str(self._quarantine(s)), self.user.pw_dir)
        for line in git_lines:
            s.record("git", finding=line)
            result.setdefault("findings", []).append(line)
        for line in tool_lines:
            s.record("fs.exec", finding=line)
            result.setdefault("findings", []).append(f"tools' files: {line}")
        if net_done is not None:
            result.update(await net_done)
        return self._finish(s, result)

    @staticmethod
    def _credentials(s: Session, trees: dict[str, worktree.Tree], warnings: list[str]) -> dict[str, list]:
        """Which credentials found in the trees are covered (all but --reveal's), said
        once before the payload starts and listed under -v and in the audit log."""
        masks: dict[str, list] = {}
        covered_all, shown_all = [], []
        for root, tree in trees.items():
            covered, shown = masking.revealed(tree.credentials, root, s.spec.reveal)
            masks[root] = covered
            covered_all += [(root, f) for f in covered]
            shown_all += [(root, f) for f in shown]
        for what, items in (("covered", covered_all), ("revealed", shown_all)):
            for root, f in items:
                path = os.path.join(root, f.rel)
                s.record("fs.secret", path=path, kind=f.kind, action=what if what == "revealed"
                         else f.action.value)
                if s.spec.verbose:
                    how = {"scrub": "a copy without its credentials", "empty": "an empty stand-in"}
                    told = "revealed (--reveal): the payload can read it" if what == "revealed" \
                        else f"shown as {how[f.action.value]}"
                    warnings.append(f"{path}: {f.kind}, {told}")
        if covered_all:
            n = len(covered_all)
            warnings.append(f"{n} credential file{'s' if n != 1 else ''} masked "
                            "(-v lists them; --reveal PATH exposes one)")
        return masks

    @staticmethod
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

    def _close_all(self, fds: list[int], s: Session) -> None:
        if s.pty is not None:
            s.pty.close()

    def _limit_warnings(self, s: Session) -> list[str]:
        """What the user should hear before the payload starts. A limit without a
        controller is reported, not faked (until transient scopes arrive)."""
        spec = s.spec
        out: list[str] = []
        if os.getuid() == 0:
            out.append("running as root: the payload runs as uid 0 (with no capabilities, mapped to "
                       "itself); prefer an unprivileged user")
        if spec.seccomp == "compat":
            out.append("--seccomp compat: forbidden system calls fail with EPERM instead of killing the "
                       "process; this is for diagnosis, do not leave it on")
        if spec.cpus is not None:
            out.append(f"--cpus {spec.cpus:g}: not enforced (no cpu controller is delegated to boxy)")
            s.record("cgroup", limit="cpus", value=spec.cpus, enforced=False, reason="no cpu controller")
        s.record("cgroup", limit="memory", value=spec.memory, enforced=False, reason="no memory controller",
                 note="sizes the scratch tmpfs only")
        s.record("cgroup", limit="pids", value=spec.pids, enforced=True, by="RLIMIT_NPROC")
        if spec.verbose:
            out.append(f"--memory {units.format_size(spec.memory)}: sizes the scratch tmpfs ($HOME, /tmp, "
                       "/dev/shm); the memory limit itself is not enforced (no memory controller)")
            out.append(f"--pids {spec.pids}: enforced with RLIMIT_NPROC in the sandbox's user namespace")
            out.extend(spec.notes)
        return out

    def _timeout(self, s: Session) -> None:
        s.timed_out = True
        s.signal(signal.SIGTERM)
        asyncio.get_running_loop().call_later(GRACE, s.signal, signal.SIGKILL)

    def _result(self, s: Session, final: dict) -> dict:
        if "error" in final:
            return {"exit_status": EXIT_SETUP, "reason": "setup", "message": final["error"]}
        if "exec_error" in final:
            err = final["exec_error"]
            cmd = final.get("cmd", "")
            if err == 2:
                return {"exit_status": EXIT_NOTFOUND, "reason": "exec", "message": f"{cmd}: command not found"}
            return {"exit_status": EXIT_NOEXEC, "reason": "exec", "message": f"{cmd}: {os.strerror(err)}"}
        if "signal" in final:
            sig = int(final["signal"])
            out = {"exit_status": 128 + sig, "signal": sig, "reason": "signal"}
            if sig == signal.SIGSYS:
                out["reason"] = "seccomp"
                out["message"] = "killed by seccomp: the payload made a forbidden system call"
                s.record("seccomp", action="kill", signal=sig)
            if s.timed_out:
                out.update(self._timed_out(s))
            return out
        code = int(final.get("exit", EXIT_SETUP))
        out = {"exit_status": code, "reason": "exit"}
        if s.timed_out:  # even a payload that caught SIGTERM and exited 0
            out.update(self._timed_out(s))
        return out

    @staticmethod
    def _timed_out(s: Session) -> dict:
        """timeout(1)'s status, 124, and a line that says so."""
        return {"exit_status": EXIT_TIMEOUT, "reason": "timeout",
                "message": f"timed out after {units.format_duration(s.spec.timeout or 0)}"}

    def _quarantine(self, s: Session):
        return state_dir() / "quarantine" / s.id

    def _finish(self, s: Session, result: dict) -> dict:
        result["id"] = s.id
        s.result = result
        s.state = "exited"
        if s.outputs.audit is not None:
            self._write_audit(s, s.outputs.audit)
        s.outputs.close()
        self._write_record(s)
        self._forget_old(s)
        return result

    def _forget_old(self, s: Session) -> None:
        """A long-lived daemon keeps only what a finished run still needs in memory:
        its audit records are written out, and only the newest finished sessions
        stay listed (their records on disk are the history)."""
        s.audit = []
        s.baselines = {}  # checked: no longer the user's state for a session starting now
        s.trees = {}
        if s.net is not None:
            s.net.discard()
            s.net = None
        finished = [x for x in self.sessions.values() if x.state == "exited"]
        for old in finished[:-KEEP_FINISHED]:
            self.sessions.pop(old.id, None)

    def _write_audit(self, s: Session, fd: int) -> None:
        """Through the descriptor opened before the run (O_APPEND: each write lands at
        the end, so concurrent sessions sharing one log interleave whole records)."""
        lines = [json.dumps(rec) + "\n" for rec in s.audit]
        if s.audit_dropped:
            lines.append(json.dumps({"t": round(time.time(), 3), "session": s.id, "layer": "audit",
                                     "dropped": s.audit_dropped,
                                     "reason": f"more than {MAX_AUDIT} records"}) + "\n")
        data = "".join(lines).encode()
        problem = ""
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError as e:
            problem = f"not fully written: {e.strerror}"
        if not problem and replaced(fd):
            problem = "removed or replaced during the run (by the payload?)"
        if problem:  # never lose the trail silently: it is kept with the session's record
            log.warning("audit log %s: %s", s.spec.audit_log, problem)
            kept = self._save_record_file(s, "audit.jsonl", "".join(lines).encode())
            if s.result is not None:
                s.result.setdefault("notes", []).append(
                    f"--audit-log {s.spec.audit_log}: {problem}; the records are in {kept}")

    @staticmethod
    def _record_dir(s: Session) -> Path:
        """$XDG_STATE_HOME/boxy/sessions/<id>/, each level 0700 and checked."""
        return ensure_private_dir(ensure_private_dir(ensure_private_dir(state_dir()) / "sessions") / s.id)

    def _save_record_file(self, s: Session, name: str, data: bytes) -> str:
        try:
            d = self._record_dir(s)
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return str(d / name)
        except (OSError, BoxyError) as e:
            return f"no file ({e})"

    def _write_record(self, s: Session) -> None:
        """$XDG_STATE_HOME/boxy/sessions/<id>/ (0700): meta and exit status, for later inspection."""
        try:
            d = self._record_dir(s)
            meta = {"id": s.id, "argv": s.spec.argv, "workdir": s.spec.workdir, "profile": s.spec.profile,
                    "started_at": s.started_at, "result": s.result}
            (d / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        except (OSError, BoxyError) as e:
            log.warning("session record %s: %s", s.id, e)
            return
        # a bounded history: pruning lists directories, so not on the event loop
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, retention.prune_state, state_dir())
        if time.monotonic() - self._caches_pruned > CACHE_PRUNE_EVERY:  # sizes cost a walk
            self._caches_pruned = time.monotonic()
            loop.run_in_executor(None, caches.prune, self.user.pw_dir)
