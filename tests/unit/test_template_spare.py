"""A template's spare child (boxyd/daemon/stage2proc.py): forked ahead, handed to the
next call, replaced when it is gone. Real templates: the walk template's children
answer one frame, so a spare can be seen to work."""

from __future__ import annotations

import os
import resource
import socket
import time

from boxyd.daemon import walkproc
from boxyd.daemon.stage2proc import Template, _waiting

REQUEST = {"roots": [], "git_guard": False, "created": [], "user_hooks": None, "secrets": []}


def _ask(conn: socket.socket) -> object:
    conn.settimeout(20)
    walkproc.send_frame(conn, REQUEST)
    return walkproc.recv_frame(conn, walkproc.REPLY_MAX)


def test_the_spare_serves_the_next_call_and_a_dead_one_is_replaced() -> None:
    template = Template("boxyd.daemon.walkproc", socket.SOCK_STREAM, spare=True)
    template.start()
    try:
        template.prime()
        first = template._spare
        assert first is not None and _waiting(first)
        conn = template.spawn()
        assert conn is first  # the one forked ahead...
        assert template._spare is not None and template._spare is not first  # ...and the next
        assert _ask(conn) == {"trees": {}}
        conn.close()
        # the template dies, and its spare child with it (its death signal)
        assert template._proc is not None
        template._proc.kill()
        template._proc.wait()
        spare = template._spare
        deadline = time.monotonic() + 20
        while _waiting(spare) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _waiting(spare)
        conn = template.spawn()  # not the dead spare: a restarted template's child
        assert conn is not spare and _ask(conn) == {"trees": {}}
        conn.close()
    finally:
        template.close()


def test_without_spare_nothing_is_forked_ahead() -> None:
    template = Template("boxyd.daemon.walkproc", socket.SOCK_STREAM)
    template.start()
    try:
        template.prime()
        conn = template.spawn()
        assert template._spare is None and _ask(conn) == {"trees": {}}
        conn.close()
    finally:
        template.close()


def test_a_spare_whose_socket_is_numbered_past_1023_is_still_used() -> None:
    """boxyd holds about ten fds per running session: past about a hundred sessions the
    spare's socket had a number select() refused, every spare was taken for dead and
    each start forked its own child (the 200th start 1.7x the first)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1501), hard))
    template = Template("boxyd.daemon.walkproc", socket.SOCK_STREAM, spare=True)
    template.start()
    try:
        template.prime()
        spare = template._spare
        assert spare is not None
        template._spare = socket.socket(fileno=os.dup2(spare.fileno(), 1500))
        spare.close()
        first = template._spare
        assert _waiting(first)
        conn = template.spawn()
        assert conn is first and _ask(conn) == {"trees": {}}
        conn.close()
    finally:
        template.close()
