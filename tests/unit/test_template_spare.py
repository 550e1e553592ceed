"""A template's spare child (boxyd/daemon/stage2proc.py): forked ahead, handed to the
next call, replaced when it is gone. Real templates: the walk template's children
answer one frame, so a spare can be seen to work."""

from __future__ import annotations

import os
import resource
import socket
import time

from boxyd.daemon import frames, walkproc
from boxyd.daemon.network import gateway_ruleset
from boxyd.daemon.stage2proc import RULED_SPARES, Spare, Template, _waiting
from boxyd.stage2 import protocol

REQUEST = {"roots": [], "git_guard": False, "created": [], "user_hooks": None, "secrets": []}


def _ask(conn: socket.socket) -> object:
    conn.settimeout(20)
    frames.send_frame(conn, REQUEST)
    return frames.recv_frame(conn, walkproc.REPLY_MAX)


def test_the_spare_serves_the_next_call_and_a_dead_one_is_replaced() -> None:
    template = Template("boxyd.daemon.walkproc", socket.SOCK_STREAM, spare=True)
    template.start()
    try:
        template.prime()
        first = template._spares[Spare.PLAIN]
        assert first is not None and _waiting(first)
        conn = template.spawn()
        assert conn is first  # the one forked ahead...
        assert (
            template._spares[Spare.PLAIN] is not None and template._spares[Spare.PLAIN] is not first
        )  # ...and the next
        assert _ask(conn) == {"trees": {}}
        conn.close()
        # the template dies, and its spare child with it (its death signal)
        assert template._proc is not None
        template._proc.kill()
        template._proc.wait()
        spare = template._spares[Spare.PLAIN]
        assert spare is not None
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
        assert template._spares[Spare.PLAIN] is None and _ask(conn) == {"trees": {}}
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
        spare = template._spares[Spare.PLAIN]
        assert spare is not None
        template._spares[Spare.PLAIN] = socket.socket(fileno=os.dup2(spare.fileno(), 1500))
        spare.close()
        first = template._spares[Spare.PLAIN]
        assert first is not None
        assert _waiting(first)
        conn = template.spawn()
        assert conn is first and _ask(conn) == {"trees": {}}
        conn.close()
    finally:
        template.close()


def _children(pid: int) -> set[int]:
    return {int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()}


def _net_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_each_kind_of_start_takes_a_spare_whose_network_is_made_and_no_other_does() -> None:
    """The real stage-2 template: the spares of networked and --net none starts are told
    to Prepare and make their network namespaces while they wait; the plain spare (a
    joiner's) never is, and a start never gets a spare of another kind."""
    template = Template(spare=True)
    template.start()
    try:
        template.prime()
        template.prime(Spare.LOOPBACK)
        plain, loopback = template._spares[Spare.PLAIN], template._spares[Spare.LOOPBACK]
        first = template.spawn(Spare.GATEWAY)  # none ready: forked now, not prepared
        prepared = template._spares[Spare.GATEWAY]
        assert prepared is not None and loopback is not None
        assert first not in (plain, loopback) and template._spares[Spare.PLAIN] is plain
        assert template._proc is not None
        ours = _net_of(template._proc.pid)
        deadline = time.monotonic() + 20
        nets: dict[int, str] = {}
        while time.monotonic() < deadline:
            nets = {c: _net_of(c) for c in _children(template._proc.pid)}
            if sum(n != ours for n in nets.values()) == 2:
                break
            time.sleep(0.01)
        assert len(nets) == 4 and sum(n != ours for n in nets.values()) == 2, nets
        assert len(set(nets.values())) == 3  # each prepared spare made its own
        assert template.spawn(Spare.PLAIN) is plain
        assert template.spawn(Spare.LOOPBACK) is loopback
        assert template.spawn(Spare.GATEWAY) is prepared
        for conn in (first, plain, loopback, prepared):
            conn.close()
    finally:
        template.close()


def test_a_spare_that_could_not_prepare_is_not_handed_out() -> None:
    """A spare whose Prepare failed has said so and ended: it reads as not waiting, and
    the start forks a child of its own."""
    template = Template(spare=True)
    template.start()
    try:
        template.prime(Spare.GATEWAY)
        spare = template._spares[Spare.GATEWAY]
        assert spare is not None
        spare.send(protocol.encode(protocol.Prepare()))  # a second one: malformed, ends it
        deadline = time.monotonic() + 20
        while _waiting(spare) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _waiting(spare)
        conn = template.spawn(Spare.GATEWAY)
        assert conn is not spare and _waiting(conn)
        conn.close()
    finally:
        template.close()


def _wait_gone(conn: socket.socket) -> None:
    deadline = time.monotonic() + 20
    while _waiting(conn) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_spare_that_loaded_a_ruleset_ahead_serves_only_a_run_with_that_ruleset() -> None:
    """The real stage-2 template: a spare told to Prepare with a ruleset loads it ahead
    (and stays, waiting: the ruleset was loaded); a run with another ruleset takes the
    bare prepared spare (or a child forked for it), a run without network the plain
    one; a spare whose ruleset was refused has ended and is not handed out."""
    public = gateway_ruleset("public", (), None, None)
    allowlist = gateway_ruleset("allowlist", (), (443,), None, ())
    template = Template(spare=True)
    template.start()
    try:
        template.prime()
        template.prime(Spare.GATEWAY)
        plain, bare = template._spares[Spare.PLAIN], template._spares[Spare.GATEWAY]
        assert plain is not None and bare is not None
        template.prime_ruled(public)
        template.prime_ruled("{not a ruleset")
        ruled, refused = template._ruled[public], template._ruled["{not a ruleset"]
        _wait_gone(refused)
        assert not _waiting(refused) and _waiting(ruled)
        # refused: it has ended and is not handed out; the bare spare serves the run
        assert template.spawn(Spare.GATEWAY, ruleset="{not a ruleset", prime=False) is bare
        other = template.spawn(Spare.GATEWAY, ruleset=allowlist, prime=False)
        assert other not in (bare, ruled, plain)  # forked for the run
        assert template.spawn(Spare.PLAIN) is plain
        assert template.spawn(Spare.GATEWAY, ruleset=public, prime=False) is ruled
        assert template._ruled == {} and template._spares[Spare.GATEWAY] is None
        assert _waiting(ruled)  # the plan would find its network and ruleset made
        for conn in (bare, other, plain, ruled):
            conn.close()
    finally:
        template.close()


def test_ruled_spares_are_kept_for_the_last_rulesets_run() -> None:
    """One spare per ruleset of the last RULED_SPARES networked runs; priming one already
    there forks nothing and makes it the most recent; the oldest one gives way (closed:
    it exits)."""
    template = Template(spare=True)
    template.start()
    try:
        texts = [f"{{not a ruleset {i}" for i in range(RULED_SPARES + 1)]
        for text in texts[:RULED_SPARES]:
            template.prime_ruled(text)
        first, second = template._ruled[texts[0]], template._ruled[texts[1]]
        template.prime_ruled(texts[0])
        assert template._ruled[texts[0]] is first
        template.prime_ruled(texts[RULED_SPARES])
        assert list(template._ruled) == [*texts[2:RULED_SPARES], texts[0], texts[RULED_SPARES]]
        assert second.fileno() == -1  # closed: the least recent gave way
    finally:
        template.close()
    assert template._ruled == {}
