"""The outer stage 2: DESIGN.md steps 1–5, then it waits outside the PID namespace.

Started by boxyd as ``python -I -m boxyd.stage2 DAEMON_PID CTL_FD`` — a fresh,
single-threaded process (unshare(CLONE_NEWUSER) fails in a threaded one) with an
empty environment and nothing secret in its argv. CTL_FD is a SOCK_SEQPACKET
control socket to boxyd: it receives the plan (and the payload's stdio as SCM_RIGHTS) and sends
back what happened. It is the only process of the sandbox that talks to boxyd.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys

from boxyd.errors import SetupError
from boxyd.plan import Plan
from boxyd.stage2 import caps, namespaces, pid1

MAX_PLAN = 1 << 20


def send(ctl: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        ctl.send(json.dumps(msg).encode())


def receive_plan(ctl: socket.socket) -> tuple[Plan, list[int]]:
    data, fds, flags, _ = socket.recv_fds(ctl, MAX_PLAN, 3, socket.MSG_CMSG_CLOEXEC)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 3:
        raise SetupError("control: malformed plan message")
    return Plan.from_json(json.loads(data)), fds


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
    if isinstance(msg.get("error"), str):
        out["error"] = msg["error"][:2000]
    if isinstance(msg.get("confined"), list):
        out["confined"] = [str(n)[:500] for n in msg["confined"][:32]]
    if "exec_error" in out:
        out["cmd"] = str(msg.get("cmd", ""))[:500]
    return out


def supervise(ctl: socket.socket, pid: int, status_r: int) -> int:
    """Relay signals from boxyd to PID 1 and PID 1's reports to boxyd until it exits."""
    pidfd = os.pidfd_open(pid)
    buf = b""
    final: dict = {}
    exited = False
    while not exited:
        ready = select.select([ctl, status_r, pidfd], [], [])[0]
        if ctl in ready:
            try:
                data = ctl.recv(4096)
            except OSError:
                data = b""
            if not data:  # boxyd is gone: so is the sandbox
                os.kill(pid, signal.SIGKILL)
            else:
                try:
                    sig = int(json.loads(data).get("signal", 0))
                except (ValueError, AttributeError, TypeError):
                    sig = 0
                if 0 < sig < 65:
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
        if status_r in ready:
            chunk = os.read(status_r, 65536)
            buf += chunk
            if len(buf) > 1 << 20:
                buf = b""
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
            final = {"error": f"sandbox init exited with status {os.WEXITSTATUS(wstatus)} without a report"}
    send(ctl, {"done": final})
    return 0


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


def main() -> int:
    daemon_pid, ctl_fd = int(sys.argv[1]), int(sys.argv[2])
    caps.die_with_parent(signal.SIGKILL)
    if os.getppid() != daemon_pid:  # boxyd died before the line above
        return 1
    ctl = socket.socket(fileno=ctl_fd)
    try:
        plan, stdio = receive_plan(ctl)
        namespaces.enter_user_namespace(plan.uid, plan.gid)
        namespaces.enter_sandbox_namespaces(plan)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()  # the child is PID 1 of the new PID namespace
    except SetupError as e:
        send(ctl, {"done": {"error": str(e)}})
        return 1
    if pid == 0:
        ctl.close()
        os.close(status_r)
        os.close(alive_w)
        pid1.main(plan, stdio, status_w, alive_r)
    os.close(status_w)
    os.close(alive_r)
    for fd in stdio:
        os.close(fd)
    send(ctl, {"started": pid})
    return supervise(ctl, pid, status_r)


if __name__ == "__main__":
    # Nothing to flush or finalise: skip interpreter shutdown, boxyd is waiting to reap us.
    os._exit(main())
