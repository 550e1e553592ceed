"""boxyd/stage2/protocol.py: every message round-trips, and every way a frame can be
wrong (a missing or ill-typed field, an unknown field or kind, the wrong fd count,
an oversized frame) is a ProtocolError naming the message."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import typing

import pytest

from boxyd.stage2 import protocol as p

# One of every message, each field set (Done once per way to end).
SAMPLES: list[p._Message] = [
    p.PlanFds(),
    p.Prepare(),
    p.Prepare(ruleset=True),
    p.Prepare(gateway=False),
    p.Placed(in_scope=True),
    p.Signal(15),
    p.Release(),
    p.Join(),
    p.LiveCover(7, ".env", "/w", False, "c2VjcmV0"),
    p.LivePin(8, ".git/config", "/w"),
    p.OpenSocket(3, socket.AF_INET6),
    p.Confined(("no Landlock ABI 4: TCP ports unrestricted",)),
    p.Stopped(20),
    p.Refused("ptrace", 101, (16, 1, 0, 0, 0, 0), 12, 12, "node", "/usr/bin/node", "errno"),
    p.Refusals(("ptrace", "add_key"), (2, 1)),
    p.PortRefused("11.0.0.10", 8081, 12, 12, "node", "/usr/bin/node"),
    p.Exited(3),
    p.Killed(9, core=True),
    p.ExecFailed(2, "nosuchcmd"),
    p.SetupFailed("rootfs: /x: no such file"),
    p.Pid(4242, 4243),
    p.Listeners(("tcp4", "udp4", "dns")),
    p.Started(17),
    p.Started(18, pty=True),
    p.Pty(),
    p.LiveDone(7, None),
    p.LiveDone(8, "pin /w/.git/config again: not a file now (refused)"),
    p.SocketMade(3, None),
    p.SocketMade(4, "socket: Too many open files"),
    p.Done(p.Exited(0)),
    p.Done(p.Killed(9)),
    p.Done(p.ExecFailed(13, "./x")),
    p.Done(p.SetupFailed("stage 2: internal error")),
    p.ToolCall(("git", "ls-files"), "/w", {"HOME": "/h"}, 2.5, 1 << 20),
    p.ToolAnswer(0, False, None, 12, False),
    p.ToolAnswer(None, True, "git: No such file or directory", 0, True),
]
ALL = (*p.REQUESTS, *p.STATUSES, *p.REPORTS, *p.TOOLS)


def _direction(msg: p._Message) -> tuple[type[p._Message], ...]:
    return next(d for d in (p.REQUESTS, p.REPORTS, p.STATUSES, p.TOOLS) if type(msg) in d)


def _wire(msg: p._Message) -> dict[str, typing.Any]:
    wire: dict[str, typing.Any] = json.loads(p.encode(msg, msg.fd_count()))
    return wire


def _error(obj: object, allowed: tuple[type[p._Message], ...], nfds: int = 0) -> str:
    with pytest.raises(p.ProtocolError) as e:
        p.decode(json.dumps(obj).encode(), nfds, allowed)
    return str(e.value)


def test_every_message_kind_has_a_sample() -> None:
    assert {type(m) for m in SAMPLES} == set(ALL)
    assert len({c.KIND for c in ALL}) == len(set(ALL))  # kinds are unique


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_round_trip(msg: p._Message) -> None:
    data = p.encode(msg, msg.fd_count())
    assert p.decode(data, msg.fd_count(), _direction(msg)) == msg
    assert json.loads(data)["kind"] == msg.KIND


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_wrong_fd_count_is_refused_both_ways(msg: p._Message) -> None:
    n = msg.fd_count()
    data = p.encode(msg, n)
    for wrong in {0, 1, n - 1, n + 1} - {n}:
        if wrong < 0:
            continue
        with pytest.raises(p.ProtocolError, match=f"^{msg.KIND}: carries {n} fds"):
            p.decode(data, wrong, _direction(msg))
        with pytest.raises(p.ProtocolError, match=f"^{msg.KIND}: carries {n} fds"):
            p.encode(msg, wrong)


def test_fd_rules() -> None:
    assert p.PlanFds().fd_count() == 4
    assert p.Pty().fd_count() == 1
    assert p.Join().fd_count() == 3
    assert (p.Started(1).fd_count(), p.Started(1, pty=True).fd_count()) == (6, 7)
    assert p.Listeners(("a", "b", "c")).fd_count() == 3
    assert p.Listeners(()).fd_count() == 0
    assert p.SocketMade(1, None).fd_count() == 1 and p.SocketMade(1, "no").fd_count() == 0
    assert p.Prepare(ruleset=True).fd_count() == 1  # the ruleset's memfd
    with_fds = p.PlanFds | p.Pty | p.Listeners | p.SocketMade | p.Started | p.Join
    no_fds = [m for m in SAMPLES if not isinstance(m, with_fds) and m != p.Prepare(ruleset=True)]
    assert all(m.fd_count() == 0 for m in no_fds)


def _fields(msg: p._Message) -> list[str]:
    return [f.name for f in dataclasses.fields(msg)]  # type: ignore[arg-type]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_each_missing_field_is_named(msg: p._Message) -> None:
    for f in dataclasses.fields(msg):  # type: ignore[arg-type]
        if f.default is not dataclasses.MISSING:
            continue
        wire = _wire(msg)
        del wire[f.name]
        assert _error(wire, _direction(msg), msg.fd_count()) == (
            f"{msg.KIND}: field {f.name!r} is missing"
        )


# Values of the wrong type for each kind of field: a bool is never an int, a float
# never an int, a string never a list of strings.
WRONG: dict[str, list[object]] = {
    "int": [True, 1.0, "1", None, [], {}],
    "bool": [1, 0, "true", None],
    "str": [1, None, [], {"x": 1}],
    "str | None": [1, False, [], {}],
    "int | None": [True, 1.5, "1", [], {}],
    "float": [True, "1", None, [], {}, 1e999],
    "dict[str, str]": [[], "a=b", None, {"a": 1}, {"a": None}, {"a": ["b"]}],
    "tuple[str, ...]": ["abc", [1], [None], {}, None, [["a"]]],
    "tuple[int, ...]": ["1", [True], [1.0], [None], {}, None, [[1]]],
    "End": [None, 1, "exited", {"kind": "pid", "pid": 1}, {"kind": "exited"}, {}],
}


def _type_name(cls: type[p._Message], name: str) -> str:
    hint = typing.get_type_hints(cls)[name]
    if hint == p.End:
        return "End"
    return hint.__name__ if isinstance(hint, type) else str(hint)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_each_mistyped_field_is_named(msg: p._Message) -> None:
    for name in _fields(msg):
        kind = _type_name(type(msg), name)
        for bad in WRONG[kind]:
            wire = _wire(msg)
            wire[name] = bad
            err = _error(wire, _direction(msg), msg.fd_count())
            if kind == "End":
                assert err.startswith("done: field 'end': "), err
            else:
                assert err == f"{msg.KIND}: field {name!r} is not a valid {kind}", (name, bad)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_an_unknown_field_is_refused(msg: p._Message) -> None:
    wire = _wire(msg)
    wire["extra"] = 1
    assert _error(wire, _direction(msg), msg.fd_count()) == f"{msg.KIND}: unknown field 'extra'"


@pytest.mark.parametrize(
    "obj",
    [{"kind": "nonsense"}, {"kind": 1}, {"pid": 1}, {}, {"kind": None}, {"kind": ["pid"]}],
)
def test_unknown_kinds(obj: object) -> None:
    for direction in (p.REQUESTS, p.REPORTS, p.STATUSES, p.TOOLS):
        assert _error(obj, direction).startswith("unknown message kind")


def test_a_kind_of_the_other_direction_is_unknown() -> None:
    # the payload's PID 1 cannot send boxyd a Pid, nor stage 2 a Signal, nor boxyd a Done
    assert _error(_wire(p.Pid(1, 2)), p.STATUSES) == "unknown message kind 'pid'"
    assert _error(_wire(p.Signal(9)), p.REPORTS) == "unknown message kind 'signal'"
    assert _error(_wire(p.Done(p.Exited(0))), p.REQUESTS) == "unknown message kind 'done'"
    # and Done's end is an end, never another report
    assert _error({"kind": "done", "end": _wire(p.Confined(()))}, p.REPORTS) == (
        "done: field 'end': unknown message kind 'confined'"
    )


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe", b"[]", b"1", b"null", b'"pid"'])
def test_not_a_message(data: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_report(data)
    with pytest.raises(p.ProtocolError):
        p.decode_status(data)
    with pytest.raises(p.ProtocolError):
        p.decode_request(data)


def test_an_oversized_frame_is_refused_either_way() -> None:
    big = "x" * p.MAX_FRAME
    with pytest.raises(p.ProtocolError, match="more than"):
        p.decode_status(json.dumps({"kind": "setup-failed", "error": big}).encode())
    with pytest.raises(p.ProtocolError, match="live-cover: .* bytes"):
        p.encode(p.LiveCover(1, "a", "/w", False, big))


@pytest.mark.parametrize(
    "msg",
    [
        p.Prepare(ruleset=True, gateway=False),
        p.Signal(0),
        p.Signal(65),
        p.Stopped(-1),
        p.Killed(100),
        p.Exited(256),
        p.Exited(-1),
        p.ExecFailed(5000, "x"),
        p.ExecFailed(2, "x" * (p.MAX_NOTE + 1)),
        p.SetupFailed("x" * (p.MAX_TEXT + 1)),
        p.LiveDone(1, "x" * (p.MAX_TEXT + 1)),
        p.OpenSocket(1, socket.AF_UNIX),
        p.SocketMade(1, "x" * (p.MAX_TEXT + 1)),
        p.Confined(("n",) * (p.MAX_NOTES + 1)),
        p.Confined(("x" * (p.MAX_NOTE + 1),)),
        p.Pid(0, 1),
        p.Pid(1, 0),
        p.Started(-5),
        p.Listeners(("a", "a")),
        p.LivePin(1, "x" * (p.MAX_PATH + 1), "/w"),
        p.ToolCall((), "/w", {}, 1.0, 1),
        p.ToolCall(("git",), "/w", {}, -1.0, 1),
        p.ToolAnswer(0, False, None, -1, False),
    ],
    ids=lambda m: m.KIND,
)
def test_values_out_of_range_are_refused_both_ways(msg: p._Message) -> None:
    with pytest.raises(p.ProtocolError, match=f"^{msg.KIND}: "):
        p.encode(msg, msg.fd_count())
    raw = json.dumps(p._wire(msg)).encode()
    with pytest.raises(p.ProtocolError, match=f"^{msg.KIND}: "):
        p.decode(raw, msg.fd_count(), _direction(msg))


def test_over_a_socket_with_fds() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        p.send(ours, p.Listeners(("a", "b")), [r, w])
        data, fds = p.receive(theirs)
        assert p.decode_report(data, len(fds)) == p.Listeners(("a", "b")) and len(fds) == 2
        p.close(fds)
        p.send(ours, p.Started(3), [r, w, r, w, r, w])
        data, fds = p.receive(theirs)
        assert p.decode_report(data, len(fds)) == p.Started(3) and len(fds) == 6
        p.close(fds)
        ours.send(b"x" * (p.MAX_FRAME + 10))  # cut short on receipt: refused
        with pytest.raises(p.ProtocolError, match="cut short"):
            p.receive(theirs)
        socket.send_fds(ours, [p.encode(p.Pty(), 1)], [r, w])  # more fds than asked for
        with pytest.raises(p.ProtocolError, match="cut short"):
            p.receive(theirs, 1)
        ours.close()
        assert p.receive(theirs) == (b"", [])
    finally:
        os.close(r)
        os.close(w)
        theirs.close()


def test_a_tool_call_may_be_larger_than_a_control_frame() -> None:
    call = p.ToolCall(("git",), "/w", {"X": "y" * p.MAX_FRAME}, 1, 10)
    with pytest.raises(p.ProtocolError, match="more than"):
        p.encode(call)
    line = p.encode(call, limit=1 << 20)
    assert p.decode_tool_call(line, 1 << 20) == call
    with pytest.raises(p.ProtocolError, match="more than"):
        p.decode_tool_call(line, p.MAX_FRAME)
    # an int timeout is a float (JSON has one kind of number); a float limit is not an int
    assert p.decode_tool_call(p.encode(call, limit=1 << 20), 1 << 20).timeout == 1.0
    assert _error({**_wire(p.ToolAnswer(0, False, None, 0, False)), "rc": True}, p.TOOLS) == (
        "tool-answer: field 'rc' is not a valid int | None"
    )


def test_received_fds_are_close_on_exec() -> None:
    """Python 3.11's socket.recv_fds drops its flags (MSG_CMSG_CLOEXEC with them): an
    fd boxyd or stage 2 receives would be inherited by what they exec."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        os.set_inheritable(r, True)
        p.send(a, p.Pty(), [r])
        data, fds = p.receive(b, 1)
        assert len(fds) == 1 and not os.get_inheritable(fds[0])
        assert os.fstat(fds[0]).st_ino == os.fstat(r).st_ino
        os.close(fds[0])
        socket.send_fds(a, [b"x"], [r, w])
        with pytest.raises(p.ProtocolError):  # more fds than asked for: cut short, closed
            p.receive(b, 1)
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()
