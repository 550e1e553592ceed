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
import json
import os
import select
import signal
import socket
import traceback

from boxy.errors import SetupError
from boxyd.plan.ops import Plan
from boxyd.stage2 import live, namespaces, netns, pid1, template

MAX_PLAN = 256 << 20  # read from boxyd's sealed memfd; far beyond any argv or tree


def send(ctl: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        ctl.send(json.dumps(msg).encode())


def receive_plan(ctl: socket.socket) -> tuple[Plan, list[int]]:
    """The plan (a memfd, first) and the payload's stdio: four fds in one message."""
    data, fds, flags, _ = socket.recv_fds(ctl, 16, 4, socket.MSG_CMSG_CLOEXEC)
    if data != b"plan" or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        raise SetupError("control: malformed plan message")
    plan_fd, stdio = fds[0], fds[1:]
    try:
        size = os.fstat(plan_fd).st_size
        if size > MAX_PLAN:
            raise SetupError(f"control: the plan is larger than {MAX_PLAN >> 20} MiB")
        text = os.pread(plan_fd, size, 0)
    finally:
        os.close(plan_fd)
    return Plan.from_json(json.loads(text)), stdio


def parse_status(line: bytes) -> dict:
    """PID 1 shares its namespaces with the payload: believe only well-formed, bounded
    values from it."""
    try:
        msg = json.loads(line)
    except ValueError:
        return {}
    if not isinstance(msg, dict):
        return {}
    out: dict = {}
    for key in ("exit", "signal", "exec_error"):
        if isinstance(msg.get(key), int) and 0 <= msg[key] < 4096:
            out[key] = msg[key]
    if isinstance(msg.get("stopped"), int) and 0 < msg["stopped"] < 65:
        out["stopped"] = msg["stopped"]
    if isinstance(msg.get("error"), str):
        out["error"] = msg["error"][:2000]
    if isinstance(msg.get("confined"), list):
        out["confined"] = [str(n)[:500] for n in msg["confined"][:32]]
    if "exec_error" in out:
        out["cmd"] = str(msg.get("cmd", ""))[:500]
    return out


def forward_pty(ctl: socket.socket, pty: socket.socket) -> None:
    """PID 1's one message: the session PTY's master, passed on to boxyd."""
    try:
        _, fds, _, _ = socket.recv_fds(pty, 16, 1, socket.MSG_CMSG_CLOEXEC)
    except OSError:
        return
    try:
        if len(fds) == 1:
            socket.send_fds(ctl, [json.dumps({"pty": True}).encode()], fds)
    except OSError:
        pass
    finally:
        for fd in fds:
            os.close(fd)


def supervise(ctl: socket.socket, pid: int, status_r: int, pty: socket.socket | None = None) -> int:
    """Relay signals from boxyd to PID 1 and PID 1's reports (and the session PTY's
    master) to boxyd until it exits."""
    pidfd = os.pidfd_open(pid)
    buf = b""
    final: dict = {}
    exited = False
    requests = LiveRequests(ctl)
    while not exited:
        watched: list = [ctl, status_r, pidfd] + ([pty] if pty is not None else [])
        ready = select.select(watched, [], [])[0]
        if pty is not None and pty in ready:
            forward_pty(ctl, pty)
            pty.close()
            pty = None
        if ctl in ready:
            try:
                data = ctl.recv(4096)
            except OSError:
                data = b""
            if not data:  # boxyd is gone: so is the sandbox
                os.kill(pid, signal.SIGKILL)
            else:
                from_boxyd(pid, data, requests)
        if status_r in ready:
            chunk = os.read(status_r, 65536)
            buf += chunk
            if len(buf) > 1 << 20:
                buf = b""
            buf = _relay_stops(ctl, buf, requests)
        if pidfd in ready:
            exited = True
    _, wstatus = os.waitpid(pid, 0)
    buf += _drain(status_r)
    for line in buf.splitlines():
        msg = parse_status(line)
        if "confined" in msg:
            send(ctl, {"confined": msg["confined"]})
        elif msg:
            final.update(msg)
    if not final:
        # PID 1 died without a word (SIGKILL from stop -k, or the kernel's OOM killer).
        if os.WIFSIGNALED(wstatus):
            final = {"signal": os.WTERMSIG(wstatus), "killed": True}
        else:
            final = {
                "error": f"sandbox init exited with status {os.WEXITSTATUS(wstatus)} without a report"
            }
    send(ctl, {"done": final})
    return 0


class LiveRequests:
    """The live guard's requests wait until PID 1 has pivoted into the sandbox's root
    (its "confined" report): before that, a path would resolve in the host's view."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.rooted = False
        self.waiting: list[dict] = []

    def ask(self, msg: dict) -> None:
        if not self.rooted:
            self.waiting.append(msg)
            return
        send(self.ctl, {"live_done": msg["id"], "error": live.apply(msg["live"])})

    def now_rooted(self) -> None:
        self.rooted = True
        waiting, self.waiting = self.waiting, []
        for msg in waiting:
            self.ask(msg)


def from_boxyd(pid: int, data: bytes, requests: LiveRequests) -> None:
    """A signal for PID 1, or a live-guard request (boxyd/stage2/live.py)."""
    try:
        msg = json.loads(data)
    except ValueError:
        return
    if not isinstance(msg, dict):
        return
    if isinstance(msg.get("live"), dict) and isinstance(msg.get("id"), int):
        requests.ask(msg)
        return
    sig = msg.get("signal")
    if isinstance(sig, int) and 0 < sig < 65:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _relay_stops(ctl: socket.socket, buf: bytes, requests: LiveRequests) -> bytes:
    """Pass on at once each complete report that the payload stopped (job control
    cannot wait for the end); everything else stays for the final report."""
    *lines, rest = buf.split(b"\n")
    kept = []
    for line in lines:
        msg = parse_status(line)
        if "confined" in msg and not requests.rooted:
            requests.now_rooted()
        if "stopped" in msg:
            send(ctl, {"stopped": msg["stopped"]})
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
    """Step 0 (no privilege; before anything is unshared): boxyd moves this process
    into the run's transient scope through the user manager, and says when it is
    done; every process of the sandbox then starts in it, and step 5's
    CLONE_NEWCGROUP makes it the sandbox's cgroup root. A signal meanwhile (a stop)
    ends the run as if the payload had died of it: returned."""
    send(ctl, {"pid": os.getpid()})
    while True:
        data = ctl.recv(4096)
        if not data:
            raise SetupError("control: boxyd went away before the run started")
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if isinstance(msg, dict) and "placed" in msg:
            return None
        if isinstance(msg, dict) and isinstance(msg.get("signal"), int) and 0 < msg["signal"] < 65:
            return int(msg["signal"])


def run(ctl: socket.socket) -> int:
    """One sandbox, in a child forked from the template."""
    try:
        plan, stdio = receive_plan(ctl)
        stopped = join_scope(ctl)
        if stopped is not None:
            for fd in stdio:
                os.close(fd)
            send(ctl, {"done": {"signal": stopped}})
            return 0
        namespaces.enter_user_namespace(plan.uid, plan.gid)
        if plan.net != "none":
            if plan.net_ruleset is None:
                raise SetupError(f"--net {plan.net}: the plan holds no gateway ruleset")
            gateway = netns.enter_gateway_netns(plan.net_ruleset)
            netns.enter_payload_netns(gateway)
            extra = {"pcap": netns.open_capture_socket()} if plan.pcap else {}
            netns.send_listeners(ctl, gateway, extra)
        namespaces.enter_sandbox_namespaces(plan)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
        # The session PTY's master comes back from PID 1 on this (a pipe carries no fds).
        pty_ours, pty_theirs = (
            socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            if plan.pty is not None
            else (None, None)
        )
        pid = os.fork()  # the child is PID 1 of the new PID namespace
    except SetupError as e:
        send(ctl, {"done": {"error": str(e)}})
        return 1
    if pid == 0:
        ctl.close()
        os.close(status_r)
        os.close(alive_w)
        if pty_ours is not None:
            pty_ours.close()
        pid1.main(plan, stdio, status_w, alive_r, pty_theirs)
    os.close(status_w)
    os.close(alive_r)
    if pty_theirs is not None:
        pty_theirs.close()
    for fd in stdio:
        os.close(fd)
    send(ctl, {"started": pid})
    return supervise(ctl, pid, status_r, pty_ours)


def run_child(run_ctl: socket.socket) -> int:
    """One outer stage 2, in a child forked from the template (boxyd/stage2/template.py)."""
    try:
        return run(run_ctl)
    except BaseException as e:  # a bug, not a refusal: say so rather than die silently
        traceback.print_exc()
        send(run_ctl, {"done": {"error": f"stage 2: internal error: {type(e).__name__}: {e}"}})
        return 1


if __name__ == "__main__":
    # Nothing to flush or finalise: skip interpreter shutdown.
    os._exit(template.main(run_child))
