"""A pre-imported, single-threaded process that forks one child per request.

boxyd keeps two: the stage-2 template (every sandbox's outer stage 2) and the walk
template (the walks before a run, in a process of their own so that a walk of
300,000 directories holds no GIL another session's start-up needs). Each is a fresh
interpreter (``python -I -m MODULE DAEMON_PID CTL_FD``, empty environment) that
imports what its children need once. Its CTL_FD only ever carries one thing: a fresh
socket per request (SCM_RIGHTS), which the forked child owns alone.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import gc
import os
import signal
import socket
import sys
from collections.abc import Callable

from boxyd.stage2 import caps, protocol

Child = Callable[[socket.socket], int]  # one request on its socket; the exit status
# Plain ints, and _signal's signal(): MsgFlag's operators and signal.signal's enum of
# the old handler are enum's Python code, whose pages the template would touch in its
# loop and every child after its fork, each then holding its own copy (issue #18)
_CTRUNC = int(socket.MSG_CTRUNC)


def serve(ctl: socket.socket, child: Child) -> int:
    """Wait for request sockets from boxyd and fork one CHILD for each."""
    # Children are reaped by the kernel: boxyd learns a request ended from its socket,
    # a sandbox's end from its PID 1's pidfd. PID 1s are ours once their outer stage 2
    # has handed them over and exited (a subreaper's orphans are reaped so too).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    caps.adopt_orphans()
    # Everything imported is here for good: the collector of a forked child never walks
    # it, so the child copies none of the template's pages for a collection.
    gc.freeze()
    while True:
        try:
            data, fds, flags = protocol.recv_fds(ctl, 16, 1)
        except InterruptedError:
            continue
        except OSError:
            return 1
        if not data:
            return 0  # boxyd closed its end
        if flags & _CTRUNC or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        _fork(ctl, fds[0], child)


def _fork(template_ctl: socket.socket, conn: int, child: Child) -> None:
    """Fork the child of one request (its socket CONN, made a socket object in the
    child: every object the template's loop touches is a page each child keeps a copy
    of, issue #18); it never returns into the template's loop."""
    template_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(conn)  # (no object of ours would close it)
        raise
    if pid != 0:
        os.close(conn)
        return
    status = 1
    try:
        template_ctl.close()
        _signal.signal(signal.SIGCHLD, _signal.SIG_DFL)  # it may wait for children of its own
        os.setsid()  # its own session: no terminal of any earlier request can follow it
        # The death signal follows the parent: the template dies with boxyd, children with it.
        caps.die_with_parent(signal.SIGKILL)
        if os.getppid() == template_pid:
            status = child(socket.socket(fileno=conn))
    finally:
        os._exit(status)


def main(child: Child) -> int:
    """The template's main: ``MODULE DAEMON_PID CTL_FD``."""
    daemon_pid, ctl_fd = int(sys.argv[1]), int(sys.argv[2])
    caps.die_with_parent(signal.SIGKILL)
    if os.getppid() != daemon_pid:  # boxyd died before the line above
        return 1
    return serve(socket.socket(fileno=ctl_fd), child)
