"""The outer stage 2: step 0 (its scope), docs/design.md, steps 1–5, PID 1 (forked by
its zygote: boxyd/stage2/zygote.py), which it then hands over to boxyd before it exits
(no second long-lived process per session).

boxyd starts ONE template per daemon: ``python -I -m boxyd.stage2 DAEMON_PID CTL_FD``
— a fresh interpreter with an empty environment and nothing secret in its argv, that
imports everything a run needs once and then stays single-threaded, forking one
outer stage 2 per run (unshare(CLONE_NEWUSER) fails in a threaded process, and
forking the asyncio daemon itself is unsafe). Importing costs more than all of a
run's namespace work, so this is what makes start-up fast.

The template (boxyd/stage2/template.py) receives a fresh SOCK_SEQPACKET socket per run
(SCM_RIGHTS) and forks a child that owns it alone: it receives the plan (and
the payload's stdio) on it and sends back what happened, up to Started; the
template never reads a plan. A child sent Join instead is a joiner
(boxyd/stage2/joiner.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import traceback
import typing
from typing import Any

from boxy import wirejson
from boxy.errors import SetupError
from boxyd.plan.ops import Init, Outer, split_wire
from boxyd.stage2 import (
    caps,
    joiner,
    namespaces,
    netns,
    nft,
    notify,
    pid1,
    syscalls,
    template,
    zygote,
)
from boxyd.stage2 import protocol as p

MAX_PLAN = 256 << 20  # read from boxyd's sealed memfd; far beyond any argv or tree
HEAD_READ = 4096  # what is read for the plan's first line, which is far shorter


def send(ctl: socket.socket, msg: p.Report, fds: list[int] | None = None) -> None:
    """One report to boxyd; a boxyd that went away is noticed on the next read."""
    with contextlib.suppress(OSError):
        p.send(ctl, msg, fds)


def next_request(ctl: socket.socket, max_fds: int) -> tuple[p.Request, list[int]]:
    """The next message of a child's first ones (Prepare, the plan, Join) with its fds."""
    try:
        data, fds = p.receive(ctl, max_fds)
    except p.ProtocolError as e:
        raise SetupError(f"control: malformed first message ({e})") from None
    if not data:
        raise SetupError("control: boxyd went away before the plan came")
    try:
        return p.decode_request(data, len(fds)), fds
    except p.ProtocolError as e:
        p.close(fds)
        raise SetupError(f"control: malformed first message ({e})") from None


def receive_plan(
    ctl: socket.socket, msg: p.Request, fds: list[int]
) -> tuple[Outer, PlanRest, list[int], Prepared | None]:
    """The plan (a memfd, first) and the payload's stdio: four fds in one message
    (MSG, or the one after it). A spare told to Prepare first makes its network while
    it waits (prepare_network), with the ruleset it was sent loaded ahead."""
    prepared = None
    if isinstance(msg, p.Prepare):
        ruleset = read_ruleset(fds) if msg.ruleset else None
        prepared = prepare_network(ruleset, msg.gateway)
        msg, fds = next_request(ctl, p.PlanFds.FDS)
    if not isinstance(msg, p.PlanFds):
        p.close(fds)
        raise SetupError(f"control: {msg.KIND} where the plan was due")
    return (*read_plan(fds), prepared)


def read_ruleset(fds: list[int]) -> str:
    """The ruleset a Prepare carried, from its memfd (FDS[0], closed)."""
    try:
        size = os.fstat(fds[0]).st_size
        if size > MAX_PLAN:
            raise SetupError(f"control: the ruleset is larger than {MAX_PLAN >> 20} MiB")
        return os.pread(fds[0], size, 0).decode()
    except UnicodeDecodeError:
        raise SetupError("control: the ruleset is not UTF-8") from None
    finally:
        p.close(fds)


class PlanRest:
    """The plan's rest (PID 1's line and the plan, which PID 1 and its children decode),
    left in its memfd: FD from OFFSET, read by PID 1 (boxyd/stage2/zygote.py)."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset = fd, offset

    def close(self) -> None:
        os.close(self.fd)


def read_plan(fds: list[int]) -> tuple[Outer, PlanRest, list[int]]:
    """The plan from its memfd (FDS[0], kept for PID 1): this process's line of it
    decoded (only that is read here), where the rest begins; and the payload's stdio."""
    plan_fd, stdio = fds[0], fds[1:]
    try:
        size = os.fstat(plan_fd).st_size
        if size > MAX_PLAN:
            raise SetupError(f"control: the plan is larger than {MAX_PLAN >> 20} MiB")
        text = os.pread(plan_fd, min(size, HEAD_READ), 0)
        if b"\n" not in text and len(text) < size:  # a first line longer than that
            text = os.pread(plan_fd, size, 0)
        head, _ = split_wire(text)
        # json.loads's own wrapper is more of the template touched
        outer = Outer.from_json(typing.cast(dict[str, Any], wirejson.loads(head)))
    except (ValueError, TypeError) as e:
        os.close(plan_fd)
        p.close(stdio)
        raise SetupError(f"control: the plan cannot be read ({e})") from None
    except BaseException:
        os.close(plan_fd)
        p.close(stdio)
        raise
    return outer, PlanRest(plan_fd, len(head) + 1), stdio


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


def join_scope(ctl: socket.socket, zygote_pid: int) -> int | None:
    """Step 0 (no privilege; before step 5 and before any process of the sandbox
    starts: a spare prepared ahead has made steps 1–3, which start none): boxyd moves
    this process and PID 1's parent-to-be (ZYGOTE_PID) into the run's transient scope
    through the user manager, and says when it is done; every process of the sandbox
    then starts in it, and step 5's CLONE_NEWCGROUP makes it the sandbox's cgroup
    root. A signal meanwhile (a stop) ends the run as if the payload had died of it:
    returned."""
    send(ctl, p.Pid(os.getpid(), zygote_pid))
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
    """What the outer stage 2 holds of PID 1 until it hands it over: its pid and pidfd,
    its status pipe, the pipe whose hang-up ends it, the socket the session PTY's
    master comes back on, and the sandbox's namespaces (opened before the fork, while
    /proc is the host's: the builder's pivot_root moves this process's root too)."""

    def __init__(
        self, pid: int, pidfd: int, status_r: int, alive_w: int, pty: socket.socket | None,
        ns: list[int],
    ) -> None:  # fmt: skip
        self.pid, self.pidfd, self.status_r, self.alive_w = pid, pidfd, status_r, alive_w
        self.pty, self.ns = pty, ns

    def fds(self) -> list[int]:
        pty = [self.pty.fileno()] if self.pty is not None else []
        return [self.pidfd, self.status_r, self.alive_w, *self.ns, *pty]


class Prepared:
    """What a spare made ahead of its plan (protocol.Prepare): the user namespace and,
    in this process, the payload's network namespace; GATEWAY the gateway's, or None
    when that network is --net none's (loopback only)."""

    def __init__(self, gateway: netns.Gateway | None) -> None:
        self.gateway = gateway

    def close(self) -> None:
        if self.gateway is not None:
            self.gateway.close()


def prepare_network(ruleset: str | None, gateway: bool) -> Prepared:
    """Steps 1–3 of a spare, ahead of its plan (protocol.Prepare; docs/design.md, "A run,
    step by step"): the user namespace, this process's own user mapped to itself as
    every plan maps it, then with GATEWAY the gateway's network namespace, with
    RULESET (the last networked run's) or none yet, and the payload's; without,
    --net none's network (step 5's, made here instead: loopback only). Nothing is in
    them yet; the plan's ruleset is loaded (or found to be RULESET) before the
    listeners go to boxyd, and a plan of the other kind makes its own network."""
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    if not gateway:
        namespaces.enter_loopback_netns()
        return Prepared(None)
    made = netns.enter_gateway_netns(ruleset)
    try:
        netns.enter_payload_netns(made, keep_gateway=True)
    except BaseException:
        made.close()
        raise
    return Prepared(made)


def enter_namespaces(ctl: socket.socket, plan: Outer, prepared: Prepared | None) -> None:
    """Steps 1–5: the user namespace (every capability over it from here on), the
    gateway's and the payload's network namespaces (the gateway's sockets go to boxyd
    and none stays here), then the mount, PID, IPC, UTS and cgroup namespaces. With
    PREPARED, steps 1–3 were made ahead: only the ruleset is left of them (or, made
    for --net none, nothing of its network)."""
    if prepared is not None and (plan.uid, plan.gid) != (os.getuid(), os.getgid()):
        prepared.close()
        raise SetupError("stage 2: the plan's user is not the one the network was made for")
    if prepared is None:
        namespaces.enter_user_namespace(plan.uid, plan.gid)
    gateway = prepared.gateway if prepared is not None else None
    if plan.net == "none":
        if gateway is not None:  # made for another kind of run: step 5 makes --net none's
            gateway.close()
        loopback_made = prepared is not None and gateway is None
        namespaces.enter_sandbox_namespaces(plan, loopback=not loopback_made)
        return
    if plan.net_ruleset is None:
        raise SetupError(f"--net {plan.net}: the plan holds no gateway ruleset")
    if gateway is None:  # (from a loopback one made ahead too: it is left behind, empty)
        gateway = netns.enter_gateway_netns(plan.net_ruleset)
        netns.enter_payload_netns(gateway)
    else:
        netns.apply_ruleset(gateway, plan.net_ruleset)
    extra = {"sockdiag": netns.open_sockdiag_socket()}
    if plan.pcap:
        extra["pcap"] = netns.open_capture_socket()
    netns.send_listeners(ctl, gateway, extra)
    namespaces.enter_sandbox_namespaces(plan, loopback=False)


def open_namespaces() -> list[int]:
    """The user, mount and network namespaces this process made (steps 1–5), as nsfs
    fds for boxyd: a joiner enters them later (boxyd/stage2/joiner.py). Needs nothing."""
    return [
        os.open(f"/proc/self/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC) for ns in ("user", "mnt", "net")
    ]


def fork_pid1(plan: Outer, zyg: zygote.Zygote, rest: PlanRest, stdio: list[int]) -> Forked:
    """PID 1 of the new PID namespace, forked by the zygote in this process's
    namespaces (boxyd/stage2/zygote.py: it inherits none of what steps 0–5 wrote
    here). PID 1 drops every capability (boxyd/stage2/pid1.py); the outer stage 2 runs
    nothing of the payload's and hands PID 1 over to boxyd (hand_over)."""
    ns = open_namespaces()
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    # The session PTY's master comes back from PID 1 on this (a pipe carries no fds).
    pty_ours, pty_theirs = (
        socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if plan.pty else (None, None)
    )
    try:
        pid, pidfd = zyg.start(rest.fd, rest.offset, stdio, status_w, alive_r, pty_theirs)
    except BaseException:
        p.close([*ns, status_r, alive_w])
        if pty_ours is not None:
            pty_ours.close()
        raise
    finally:
        zyg.close()  # (it exits: PID 1 is the template's from here)
        p.close([status_w, alive_r])
        if pty_theirs is not None:
            pty_theirs.close()
    return Forked(pid, pidfd, status_r, alive_w, pty_ours, ns)


def hand_over(ctl: socket.socket, forked: Forked) -> None:
    """PID 1 to boxyd (docs/design.md, "Processes"): its pidfd, status pipe, the pipe
    whose hang-up ends it, the namespaces and the PTY's socket go with Started, and
    this process exits once boxyd says Release, passing on meanwhile the signals
    boxyd sent before it had PID 1 itself. PID 1 is then the template's (a subreaper
    that ignores SIGCHLD: the kernel reaps it)."""
    send(ctl, p.Started(forked.pid, forked.pty is not None), forked.fds())
    while True:
        match request(ctl):
            case p.Signal(signal=sig):
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(forked.pidfd, sig)
            case p.Release() | None:
                return
            case _:  # nothing else is for this process now
                pass


def run(ctl: socket.socket, zyg: zygote.Zygote, first: p.Request, fds: list[int]) -> int:
    """One sandbox, in a child forked from the template: the plan (FIRST or after it),
    step 0 (the scope), steps 1–5 (namespaces), PID 1 (forked by ZYG), then PID 1
    handed over to boxyd."""
    try:
        plan, rest, stdio, prepared = receive_plan(ctl, first, fds)
        try:
            stopped = join_scope(ctl, zyg.pid)
            if stopped is not None:
                send(ctl, p.Done(p.Killed(stopped)))
                return 0
            enter_namespaces(ctl, plan, prepared)
            forked = fork_pid1(plan, zyg, rest, stdio)
        finally:
            rest.close()
            p.close(stdio)
    except SetupError as e:
        send(ctl, p.Done(p.SetupFailed(str(e)[: p.MAX_TEXT])))
        return 1
    hand_over(ctl, forked)
    return 0


def serve(ctl: socket.socket) -> int:
    """One child of the template: a run (its plan first, or Prepare), or a joiner of
    a running sandbox (Join first: boxyd/stage2/joiner.py). PID 1's parent is forked
    before anything is read (boxyd/stage2/zygote.py)."""
    zyg = zygote.fork(pid1.main, ctl)
    try:
        first, fds = next_request(ctl, p.MAX_FDS)
    except SetupError as e:
        zyg.close()
        send(ctl, p.Done(p.SetupFailed(str(e)[: p.MAX_TEXT])))
        return 1
    if isinstance(first, p.Join):
        zyg.close()
        return joiner.serve(ctl, fds)
    try:
        return run(ctl, zyg, first, fds)
    finally:
        zyg.close()


def run_child(run_ctl: socket.socket) -> int:
    """One child of the template (boxyd/stage2/template.py)."""
    try:
        return serve(run_ctl)
    except BaseException as e:  # a bug, not a refusal: say so rather than die silently
        traceback.print_exc()
        why = f"stage 2: internal error: {type(e).__name__}: {e}"
        send(run_ctl, p.Done(p.SetupFailed(why[: p.MAX_TEXT])))
        return 1


WARM_ROUNDS = 16  # past CPython 3.11's warm-up (8 calls): each function is quickened


def warm_up() -> None:
    """In the template, before it forks: the pure code every child runs (the protocol's
    encoding and decoding, the plan's lines) run until quickened, so that no child
    rewrites those code objects' pages into copies of its own: what the outer stage 2
    writes is PID 1's for the session (issue #18). Touches no file and no socket."""
    msgs: list[tuple[p._Message, tuple[type[p._Message], ...]]] = [
        (p.PlanFds(), p.REQUESTS), (p.Placed(True), p.REQUESTS), (p.Signal(15), p.REQUESTS),
        (p.Release(), p.REQUESTS), (p.Pid(1, 2), p.REPORTS), (p.Started(1), p.REPORTS),
        (p.Done(p.SetupFailed("x")), p.REPORTS), (p.Confined(("x",)), p.STATUSES),
        (p.Exited(0), p.STATUSES), (p.Refusals(("x",), (1,)), p.STATUSES),
        (p.Refused("x", 1, (0,) * 6, 2, 2, "c", "a", "errno"), p.STATUSES),
        (p.PortRefused("::1", 1, 2, 2, "c", "a"), p.STATUSES),
    ]  # fmt: skip
    tally = notify.Tally(per_second=0)  # PID 1's notifier: its pure parts
    outer = Outer(1, 1, "h", "none", None, pcap=False, pty=False).__dict__
    init = Init(1, None, ctty=False, pty_fds=None, seccomp_bpf="").__dict__
    for _ in range(WARM_ROUNDS):
        for msg, way in msgs:
            p.decode(p.encode(msg, msg.fd_count()), msg.fd_count(), way)
        head, _rest = split_wire(wirejson.dumps(outer).encode() + b"\n{}")
        Outer.from_json(typing.cast(dict[str, Any], wirejson.loads(head)))
        Init.from_json(typing.cast(dict[str, Any], wirejson.loads(wirejson.dumps(init))))
        tally.count(syscalls.name(notify.CONNECT))
        notify.decide(1, "strict", frozenset())


if __name__ == "__main__":
    # missing: every networked run's child says so, and a run without network goes on
    with contextlib.suppress(SetupError):
        nft.preload()
    warm_up()
    pid1.remember_argv_area()
    caps.last_cap()  # (kept: the kernel's, the same for every child)
    # Nothing to flush or finalise: skip interpreter shutdown.
    os._exit(template.main(run_child))
