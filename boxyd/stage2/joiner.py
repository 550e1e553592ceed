"""A joiner: a child of the template that enters a running sandbox's namespaces to
do what only a process inside them can (docs/design.md, "Processes").

No long-lived process of the sandbox's stays outside its PID namespace (the outer
stage 2 hands PID 1 over to boxyd and exits: issue #18, memory per session), so
when the live guard must cover or pin an entry again (boxyd/stage2/live.py), or a
published port needs a socket in the sandbox's network namespace, boxyd forks a
joiner and sends it Join with the nsfs fds the outer stage 2 left it. The joiner

1. enters the user namespace (needs nothing: its user owns that namespace, so
   setns(2) grants every capability over it; the template is single-threaded, as
   setns(CLONE_NEWUSER) requires),
2. enters the mount namespace (CAP_SYS_ADMIN and CAP_SYS_CHROOT over it, from 1):
   its root becomes the sandbox's root, as the outer stage 2's did at pivot_root,
3. enters the network namespace (CAP_SYS_ADMIN over it, from 1),

then answers requests until boxyd closes its socket (boxyd lets an idle joiner go).
Like the outer stage 2 it runs nothing of the payload's, and the payload cannot
reach it: it is outside the sandbox's PID namespace (ptrace and pidfd_getfd are
denied by seccomp besides). It keeps the capabilities of step 1 for the live guard's
mounts and nothing else.
"""

from __future__ import annotations

import contextlib
import socket

from boxy.errors import SetupError
from boxyd.kernel.sys import CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWUSER, check, libc
from boxyd.stage2 import live
from boxyd.stage2 import protocol as p

_STEPS = ((CLONE_NEWUSER, "user"), (CLONE_NEWNS, "mount"), (CLONE_NEWNET, "network"))


def join(fds: list[int]) -> None:
    """Steps 1–3, in order; each nsfs fd closed once entered (setns checks its type)."""
    try:
        for fd, (flag, name) in zip(fds, _STEPS, strict=True):
            check(libc.setns(fd, flag), f"joiner: setns({name} namespace)")
    finally:
        p.close(fds)


def answer(ctl: socket.socket, msg: p.Request) -> None:
    """One request: a live-guard cover or pin, or a published port's socket."""
    match msg:
        case p.LiveCover() | p.LivePin():
            error = live.apply(msg)
            _send(ctl, p.LiveDone(msg.id, None if error is None else error[: p.MAX_TEXT]))
        case p.OpenSocket(id=ident, family=family):
            open_socket(ctl, ident, family)
        case _:  # nothing else is for a joiner
            pass


def open_socket(ctl: socket.socket, ident: int, family: int) -> None:
    """A published port's connection: a TCP socket in the sandbox's network namespace,
    unconnected; boxyd connects it to the sandbox's loopback (needs nothing: a socket
    is made in its maker's network namespace)."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError as e:
        _send(ctl, p.SocketMade(ident, f"socket: {e.strerror}"))
        return
    with sock:
        _send(ctl, p.SocketMade(ident, None), [sock.fileno()])


def _send(ctl: socket.socket, msg: p.Report, fds: list[int] | None = None) -> None:
    with contextlib.suppress(OSError):  # boxyd let us go: the read says so next
        p.send(ctl, msg, fds)


def serve(ctl: socket.socket, fds: list[int]) -> int:
    """Join FDS's namespaces, then answer until boxyd closes the socket. A join that
    fails is said as SetupFailed (boxyd answers the requests it holds with it)."""
    try:
        join(fds)
    except SetupError as e:
        _send(ctl, p.Done(p.SetupFailed(str(e)[: p.MAX_TEXT])))
        return 1
    while True:
        try:
            data, got = p.receive(ctl, 1)
        except p.ProtocolError:
            continue  # ours, cut short: a bug, not an attack; boxyd times it out
        except OSError:
            return 0
        if not data:
            return 0
        try:
            msg = p.decode_request(data, len(got))
        except p.ProtocolError:
            continue
        finally:
            p.close(got)
        answer(ctl, msg)
