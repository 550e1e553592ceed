"""The outer stage 2: step 0 (its scope), docs/design.md, steps 1–5, then it waits outside
the PID namespace.

boxyd starts ONE template per daemon: ``python -I -m boxyd.stage2 DAEMON_PID CTL_FD``
— a fresh interpreter with an empty environment and nothing secret in its argv, that
imports everything a run needs once and then stays single-threaded, forking one
outer stage 2 per run (unshare(CLONE_NEWUSER) fails in a threaded process, and
forking the asyncio daemon itself is unsafe). Importing costs more than all of a
run's namespace work, so this is what makes start-up fast.

The template (boxyd/stage2/template.py) receives a fresh SOCK_SEQPACKET socket per run
(SCM_RIGHTS) and forks a child that owns it alone: it receives the plan (and
the payload's stdio) on it and sends back what happened. The child is the only
process of the sandbox that talks to boxyd; the template never reads a plan.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import traceback
import typing
from typing import Any

from boxy import wirejson
from boxy.errors import SetupError
from boxyd.plan.ops import Outer, split_wire
from boxyd.stage2 import live, namespaces, netns, nft, pid1, template
from boxyd.stage2 import protocol as p

MAX_PLAN = 256 << 20  # read from boxyd's sealed memfd; far beyond any argv or tree
MAX_STATUS = 1 << 20  # PID 1's reports not yet read as lines: bounded


def send(ctl: socket.socket, msg: p.Report, fds: list[int] | None = None) -> None:
    """One report to boxyd; a boxyd that went away is noticed on the next read."""
    with contextlib.suppress(OSError):
        p.send(ctl, msg, fds)


def receive_plan(ctl: socket.socket) -> tuple[Outer, bytes, list[int], netns.Gateway | None]:
    """The plan (a memfd, first) and the payload's stdio: four fds in one message. A
    spare told to Prepare first makes its network while it waits (prepare_network)."""
    prepared = None
    while True:
        try:
            data, fds = p.receive(ctl, p.PlanFds.FDS)
        except p.ProtocolError as e:
            raise SetupError(f"control: malformed plan message ({e})") from None
        try:
            msg = p.decode_request(data, len(fds))
            if isinstance(msg, p.Prepare) and prepared is None:
                prepared = prepare_network()
                continue
            if not isinstance(msg, p.PlanFds):
                raise p.ProtocolError("not the plan")
        except p.ProtocolError as e:
            p.close(fds)
            raise SetupError(f"control: malformed plan message ({e})") from None
        return (*read_plan(fds), prepared)


def read_plan(fds: list[int]) -> tuple[Outer, bytes, list[int]]:
    """The plan from its memfd (FDS[0], closed): what this process needs of it decoded,
    the rest as it came (PID 1's line and the plan: PID 1 and its children decode
    them); and the payload's stdio."""
    plan_fd, stdio = fds[0], fds[1:]
    try:
        size = os.fstat(plan_fd).st_size
        if size > MAX_PLAN:
            raise SetupError(f"control: the plan is larger than {MAX_PLAN >> 20} MiB")
        text = os.pread(plan_fd, size, 0)
    finally:
        os.close(plan_fd)
    try:
        head, inner = split_wire(text)
        # json.loads's own wrapper is more of the template touched
        outer = Outer.from_json(typing.cast(dict[str, Any], wirejson.loads(head)))
    except (ValueError, TypeError) as e:
        p.close(stdio)
        raise SetupError(f"control: the plan cannot be read ({e})") from None
    return outer, inner, stdio


def request(ctl: socket.socket) -> p.Request | p.ProtocolError | None:
    """The next message from boxyd; None once it is gone. One that breaks the protocol
    comes back as its error, to be skipped (it is ours: a bug, not an attack)."""
    try:
        data, fds = p.receive(ctl, 1)
    except p.ProtocolError as e:
        return e
    except OSError:
        return None
    if not data:
        return None
    try:
        return p.decode_request(data, len(fds))
    except p.ProtocolError as e:
        return e
    finally:
        p.close(fds)  # no request of boxyd's carries fds after the plan


def parse_status(line: bytes) -> p.Status | None:
    """PID 1 shares its namespaces with the payload: only a well-formed, bounded report
    from it is believed."""
    try:
        return p.decode_status(line)
    except p.ProtocolError:
        return None


def forward_pty(ctl: socket.socket, pty: socket.socket) -> None:
    """PID 1's one message on its socket: the session PTY's master, passed on to boxyd."""
    try:
        data, fds = p.receive(pty, 1)
    except (OSError, p.ProtocolError):
        return
    try:
        if isinstance(p.decode(data, len(fds), (p.Pty,)), p.Pty):
            send(ctl, p.Pty(), fds)
    except p.ProtocolError:
        pass
    finally:
        p.close(fds)


def ending(statuses: list[p.Status], wstatus: int) -> p.End:
    """How the run ended: a layer that failed, else a command that could not run, else
    the payload's last exit; PID 1 dead without a word (SIGKILL from stop -k, the
    kernel's OOM killer) is said from its wait status."""
    ends = [s for s in statuses if isinstance(s, p.End)]
    for kind in (p.SetupFailed, p.ExecFailed):
        found = [e for e in ends if isinstance(e, kind)]
        if found:
            return found[-1]
    if ends:
        return ends[-1]
    if os.WIFSIGNALED(wstatus):
        return p.Killed(os.WTERMSIG(wstatus))
    return p.SetupFailed(
        f"sandbox init exited with status {os.WEXITSTATUS(wstatus)} without a report"
    )


class Supervisor:
    """Relays, until PID 1 exits, signals from boxyd to it, its reports that the payload
    stopped to boxyd, the session PTY's master, and the live guard's requests."""

    def __init__(self, ctl: socket.socket, pid: int, status_r: int) -> None:
        self.ctl = ctl
        self.pid = pid
        self.status_r = status_r
        self.buf = b""  # PID 1's reports not yet relayed: the final ones stay for the end
        self.requests = LiveRequests(ctl)
        # PID 1 closed its end (it is exiting): a pipe at EOF stays readable, and polling
        # it until PID 1 is reaped made this loop spin through PID 1's whole teardown,
        # which it slowed by ~3 ms a run (docs/design.md, "Processes")
        self.status_open = True

    def from_boxyd(self) -> None:
        """A signal for PID 1, or a live-guard request (boxyd/stage2/live.py)."""
        match request(self.ctl):
            case None:  # boxyd is gone: so is the sandbox
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)
            case p.Signal(signal=sig):
                with contextlib.suppress(OSError):
                    os.kill(self.pid, sig)
            case p.LiveCover() | p.LivePin() as op:
                self.requests.ask(op)
            case p.OpenSocket(id=ident, family=family):
                open_socket(self.ctl, ident, family)
            case _:  # a second plan or placement: nothing to do now
                pass

    def from_pid1(self) -> None:
        chunk = os.read(self.status_r, 65536)
        self.status_open = bool(chunk)
        self.buf += chunk
        if len(self.buf) > MAX_STATUS:
            self.buf = b""
        self.buf = _relay_stops(self.ctl, self.buf, self.requests)

    def loop(self, pty: socket.socket | None) -> None:
        pidfd = os.pidfd_open(self.pid)
        try:
            while True:
                watched: list[socket.socket | int] = [self.ctl, pidfd]
                if self.status_open:
                    watched.append(self.status_r)
                if pty is not None:
                    watched.append(pty)
                ready = select.select(watched, [], [])[0]
                if pty is not None and pty in ready:
                    forward_pty(self.ctl, pty)
                    pty.close()
                    pty = None
                if self.ctl in ready:
                    self.from_boxyd()
                if self.status_r in ready:
                    self.from_pid1()
                if pidfd in ready:
                    return
        finally:
            os.close(pidfd)

    def finish(self) -> None:
        """PID 1 is gone: its last reports, then how it ended."""
        _, wstatus = os.waitpid(self.pid, 0)
        self.buf += _drain(self.status_r)
        statuses = [s for s in map(parse_status, self.buf.splitlines()) if s is not None]
        for s in statuses:
            if isinstance(s, p.Confined):
                send(self.ctl, s)
        send(self.ctl, p.Done(ending(statuses, wstatus)))


def open_socket(ctl: socket.socket, ident: int, family: int) -> None:
    """A published port's connection: a TCP socket in this network namespace (the
    sandbox's), unconnected; boxyd connects it to the sandbox's loopback. Needs
    nothing: any process may make a socket in its own network namespace."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError as e:
        send(ctl, p.SocketMade(ident, f"socket: {e.strerror}"))
        return
    with sock:
        send(ctl, p.SocketMade(ident, None), [sock.fileno()])


def supervise(ctl: socket.socket, pid: int, status_r: int, pty: socket.socket | None = None) -> int:
    """Relay signals from boxyd to PID 1 and PID 1's reports (and the session PTY's
    master) to boxyd until it exits."""
    supervisor = Supervisor(ctl, pid, status_r)
    supervisor.loop(pty)
    supervisor.finish()
    return 0


class LiveRequests:
    """The live guard's requests wait until PID 1 has pivoted into the sandbox's root
    (its "confined" report): before that, a path would resolve in the host's view."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.rooted = False
        self.waiting: list[p.LiveCover | p.LivePin] = []

    def ask(self, op: p.LiveCover | p.LivePin) -> None:
        if not self.rooted:
            self.waiting.append(op)
            return
        error = live.apply(op)
        send(self.ctl, p.LiveDone(op.id, None if error is None else error[: p.MAX_TEXT]))

    def now_rooted(self) -> None:
        self.rooted = True
        waiting, self.waiting = self.waiting, []
        for op in waiting:
            self.ask(op)


def _relay_stops(ctl: socket.socket, buf: bytes, requests: LiveRequests) -> bytes:
    """Pass on at once each complete report that the payload stopped (job control
    cannot wait for the end); everything else stays for the final report."""
    *lines, rest = buf.split(b"\n")
    kept = []
    for line in lines:
        msg = parse_status(line)
        if isinstance(msg, p.Confined) and not requests.rooted:
            requests.now_rooted()
        if isinstance(msg, p.Stopped):
            send(ctl, msg)
        else:
            kept.append(line)
    return b"".join(ln + b"\n" for ln in kept) + rest


def _drain(fd: int) -> bytes:
    out = b""
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def join_scope(ctl: socket.socket) -> int | None:
    """Step 0 (no privilege; before step 5 and before any process of the sandbox
    starts: a spare prepared ahead has made steps 1–3, which start none): boxyd moves
    this process into the run's transient scope through the user manager, and says
    when it is done; every process of the sandbox then starts in it, and step 5's
    CLONE_NEWCGROUP makes it the sandbox's cgroup root. A signal meanwhile (a stop)
    ends the run as if the payload had died of it: returned."""
    send(ctl, p.Pid(os.getpid()))
    while True:
        match request(ctl):
            case None:
                raise SetupError("control: boxyd went away before the run started")
            case p.Placed():
                return None
            case p.Signal(signal=sig):
                return sig
            case _:  # a live request cannot come yet; nothing else is for now
                pass


class Forked:
    """What the outer stage 2 keeps of PID 1: its pid, its status pipe, and the socket
    the session PTY's master comes back on."""

    def __init__(self, pid: int, status_r: int, pty: socket.socket | None) -> None:
        self.pid, self.status_r, self.pty = pid, status_r, pty


def prepare_network() -> netns.Gateway:
    """Steps 1–3 of a spare, ahead of its plan (protocol.Prepare; docs/design.md, "A run,
    step by step"): the user namespace, this process's own user mapped to itself as
    every plan maps it, then the gateway's network namespace without its ruleset and
    the payload's. Nothing is in them yet; the plan's ruleset is loaded before the
    listeners go to boxyd, and a plan without network discards them."""
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    gateway = netns.enter_gateway_netns(None)
    try:
        netns.enter_payload_netns(gateway, keep_gateway=True)
    except BaseException:
        gateway.close()
        raise
    return gateway


def enter_namespaces(ctl: socket.socket, plan: Outer, prepared: netns.Gateway | None) -> None:
    """Steps 1–5: the user namespace (every capability over it from here on), the
    gateway's and the payload's network namespaces (the gateway's sockets go to boxyd
    and none stays here), then the mount, PID, IPC, UTS and cgroup namespaces. With
    PREPARED, steps 1–3 were made ahead: only the ruleset is left of them."""
    if prepared is not None and (plan.uid, plan.gid) != (os.getuid(), os.getgid()):
        prepared.close()
        raise SetupError("stage 2: the plan's user is not the one the network was made for")
    if prepared is None:
        namespaces.enter_user_namespace(plan.uid, plan.gid)
    elif plan.net == "none":  # made for nothing: step 5 gives the run a network of its own
        prepared.close()
    if plan.net != "none":
        if plan.net_ruleset is None:
            raise SetupError(f"--net {plan.net}: the plan holds no gateway ruleset")
        if prepared is None:
            gateway = netns.enter_gateway_netns(plan.net_ruleset)
            netns.enter_payload_netns(gateway)
        else:
            gateway = prepared
            netns.apply_ruleset(gateway, plan.net_ruleset)
        extra = {"pcap": netns.open_capture_socket()} if plan.pcap else {}
        netns.send_listeners(ctl, gateway, extra)
    namespaces.enter_sandbox_namespaces(plan)


def fork_pid1(ctl: socket.socket, plan: Outer, inner: bytes, stdio: list[int]) -> Forked:
    """Fork PID 1 of the new PID namespace; it never returns here. The outer stage 2
    keeps CAP_SYS_ADMIN over the user namespace (the live guard's mounts) and runs
    nothing of the payload's; PID 1 drops everything (boxyd/stage2/pid1.py)."""
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    # The session PTY's master comes back from PID 1 on this (a pipe carries no fds).
    pty_ours, pty_theirs = (
        socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if plan.pty else (None, None)
    )
    pid = os.fork()
    if pid == 0:
        ctl.close()
        os.close(status_r)
        os.close(alive_w)
        if pty_ours is not None:
            pty_ours.close()
        pid1.main(inner, stdio, status_w, alive_r, pty_theirs)
    os.close(status_w)
    os.close(alive_r)  # alive_w stays open (close-on-exec) until this process ends
    if pty_theirs is not None:
        pty_theirs.close()
    return Forked(pid, status_r, pty_ours)


def run(ctl: socket.socket) -> int:
    """One sandbox, in a child forked from the template: the plan, step 0 (the scope),
    steps 1–5 (namespaces), PID 1, then supervision until it exits."""
    try:
        plan, inner, stdio, prepared = receive_plan(ctl)
        stopped = join_scope(ctl)
        if stopped is not None:
            p.close(stdio)
            send(ctl, p.Done(p.Killed(stopped)))
            return 0
        enter_namespaces(ctl, plan, prepared)
        forked = fork_pid1(ctl, plan, inner, stdio)
    except SetupError as e:
        send(ctl, p.Done(p.SetupFailed(str(e)[: p.MAX_TEXT])))
        return 1
    p.close(stdio)
    send(ctl, p.Started(forked.pid))
    return supervise(ctl, forked.pid, forked.status_r, forked.pty)


def run_child(run_ctl: socket.socket) -> int:
    """One outer stage 2, in a child forked from the template (boxyd/stage2/template.py)."""
    try:
        return run(run_ctl)
    except BaseException as e:  # a bug, not a refusal: say so rather than die silently
        traceback.print_exc()
        why = f"stage 2: internal error: {type(e).__name__}: {e}"
        send(run_ctl, p.Done(p.SetupFailed(why[: p.MAX_TEXT])))
        return 1


if __name__ == "__main__":
    # missing: every networked run's child says so, and a run without network goes on
    with contextlib.suppress(SetupError):
        nft.preload()
    # Nothing to flush or finalise: skip interpreter shutdown.
    os._exit(template.main(run_child))
