"""The varlink adapter over the real server and the real core, with the fake launcher
of test_core: Run, the hang-up of a dropped client, Watch and its back-pressure, the
error table on the wire."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from boxy import INTERFACE
from boxy.buildid import build_id
from boxy.outcome import Counters, Destination, Outcome, Reason, State
from boxyd.api.service import (
    WATCH_BATCH,
    WATCH_LEAST,
    VarlinkService,
    watch_batch,
    watch_frame,
)
from boxyd.api.varlink import VarlinkServer, encode_reply
from boxyd.daemon import events
from boxyd.daemon.events import (
    Audited,
    ClientAttached,
    ClientDetached,
    CountersTick,
    Exited,
    Fanout,
    Lost,
    Noticed,
    PayloadStopped,
    RunStarted,
    SessionEvent,
    StateChanged,
)
from boxyd.daemon.manager import Manager
from tests.unit.test_core import FakeLauncher, request, started

M = INTERFACE + "."


def run_params(**over: object) -> dict[str, Any]:
    """Run's parameters as boxyctl sends them (every one the IDL requires)."""
    return {
        "argv": ["true"],
        "cwd": "/w",
        "options": {},
        "client_env": {},
        "build": build_id(),
        **over,
    }


class Peer:
    """A raw varlink client on the test's own loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, path: str) -> Peer:
        return cls(*await asyncio.open_unix_connection(path))

    def send(self, method: str, params: dict[str, Any], **flags: bool) -> None:
        self.writer.write(
            json.dumps({"method": M + method, "parameters": params, **flags}).encode() + b"\0"
        )

    async def reply(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.reader.readuntil(b"\0"), 30)
        return cast(dict[str, Any], json.loads(raw[:-1]))

    def close(self) -> None:
        self.writer.close()


async def until(pred: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Give the loop turns until PRED holds; a failure after TIMEOUT (not a bound:
    what a hang would be)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def serve(tmp_path: Path, manager: Manager) -> tuple[str, VarlinkServer, asyncio.Task[None]]:
    """The real varlink server over MANAGER, on a socket in TMP_PATH."""
    service = VarlinkService(manager)
    server = VarlinkServer(service.handle, first=service.other_build)
    path = str(tmp_path / "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen()
    return path, server, asyncio.create_task(server.serve(sock))


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[tuple[Manager, str]]:
    manager = Manager(FakeLauncher(), grace=0.05)
    path, server, task = serve(tmp_path, manager)
    yield manager, path
    server.close()
    task.cancel()


async def test_run_streams_the_start_and_replies_the_outcome(daemon: tuple[Manager, str]) -> None:
    manager, path = daemon
    peer = await Peer.connect(path)
    peer.send("Run", run_params(), more=True)
    first = await peer.reply()
    assert first["continues"] and first["parameters"]["state"] == "running"
    assert first["parameters"]["kind"] == "running"
    assert first["parameters"]["warnings"] == ["a warning"]
    sid = first["parameters"]["id"]
    manager.stop(sid)
    last = (await peer.reply())["parameters"]
    assert (last["id"], last["exit_status"], last["state"]) == (sid, 143, "killed")
    assert last["kind"] == "ended"
    peer.close()


@pytest.mark.parametrize("params, error", [
    (run_params(build="other"), "BuildMismatch"),
    (run_params(argv=[]), "InvalidArgument"),
    (run_params(argv=["bad"]), "InvalidArgument"),
])  # fmt: skip
async def test_refusals_are_named_errors(
    daemon: tuple[Manager, str], params: dict[str, Any], error: str
) -> None:
    _, path = daemon
    peer = await Peer.connect(path)
    peer.send("Run", params, more=True)
    got = await peer.reply()
    assert got["error"] == M + error and "message" in got["parameters"]
    peer.send("Show", {"id": "../../etc"})
    assert (await peer.reply())["error"] == M + "NoSuchSession"
    peer.close()


async def test_a_client_of_another_build_hears_so_before_its_parameters_are_checked(
    daemon: tuple[Manager, str],
) -> None:
    """A newer client sends options this daemon's IDL lacks: what it must hear is
    BuildMismatch (boxy.client then replaces an idle daemon), not InvalidParameter."""
    _, path = daemon
    peer = await Peer.connect(path)
    params = run_params(build="newer")
    params["options"] = {**params.get("options", {}), "an_option_of_a_later_build": ["x"]}
    peer.send("Run", params, more=True)
    got = await peer.reply()
    assert got["error"] == M + "BuildMismatch", got
    assert got["parameters"]["client_build"] == "newer"
    params["build"] = run_params()["build"]  # this build: the IDL has its say
    peer.send("Run", params, more=True)
    got = await peer.reply()
    assert got["error"] == "org.varlink.service.InvalidParameter", got
    peer.close()


async def test_a_dropped_client_hangs_its_session_up(daemon: tuple[Manager, str]) -> None:
    manager, path = daemon
    peer = await Peer.connect(path)
    peer.send("Run", run_params(), more=True)
    sid = (await peer.reply())["parameters"]["id"]
    peer.close()
    out = await asyncio.wait_for(manager.get(sid).wait(), 30)
    launcher = cast(FakeLauncher, manager.launcher)
    assert launcher.made[0].signals[0] == signal.SIGHUP and out.state is State.KILLED


async def test_a_watcher_that_never_reads_stalls_nothing(daemon: tuple[Manager, str]) -> None:
    manager, path = daemon
    s = await manager.start(request(), [])
    await started(s)
    stuck = await Peer.connect(path)
    stuck.send("Watch", {"id": s.id}, more=True)
    cast(asyncio.ReadTransport, stuck.writer.transport).pause_reading()  # never reads again
    await until(lambda: s.events.watchers == 1, "the watcher to be subscribed")
    (sub,) = s.events._subs
    for i in range(200_000):  # a flood: each record is an event for the watcher
        s.record("net", verdict="deny", n=i, pad="x" * 64)
    # Not a time (bench/events.py has the publish rate): the watcher's queue stayed
    # within its bound and, losing, it was parked, offered nothing: no work per event.
    assert sub.queued <= events.BOUND and sub not in s.events._open
    assert sub.lost_total >= 200_000 - events.BOUND, sub.lost_total
    other = await Peer.connect(path)
    other.send("Version", {})
    assert (await other.reply())["parameters"]["build"] == build_id()
    manager.stop(s.id)
    await asyncio.wait_for(s.wait(), 30)  # the session ended while the watcher sat there
    stuck.close()
    other.close()


async def test_a_slow_watcher_is_told_what_it_lost(daemon: tuple[Manager, str]) -> None:
    manager, path = daemon
    s = await manager.start(request(), [])
    await started(s)
    peer = await Peer.connect(path)
    peer.send("Watch", {}, more=True)  # no id: the only running session
    head = (await peer.reply())["parameters"]["session"]
    assert head["id"] == s.id and head["state"] == "running"
    cast(asyncio.ReadTransport, peer.writer.transport).pause_reading()
    for i in range(20_000):
        s.record("net", n=i, pad="y" * 200)
    (sub,) = s.events._subs
    assert sub.lost_total > 0, "the flood did not outrun the watcher: the case proves nothing"
    cast(asyncio.ReadTransport, peer.writer.transport).resume_reading()
    manager.stop(s.id)
    kinds, lost = [], 0
    while True:
        msg = (await peer.reply())["parameters"]
        if "event" not in msg:
            assert msg["session"]["state"] == "killed"
            break
        kinds.append(msg["event"]["kind"])
        lost += msg["event"].get("count", 0) if msg["event"]["kind"] == "lost" else 0
    assert lost > 0 and kinds.count("audit") + lost == 20_000
    assert kinds[-1] == "exited"
    peer.close()


EVERY_KIND: list[SessionEvent] = [
    StateChanged(State.RUNNING),
    RunStarted(["a warning"]),
    Noticed('denied "x", \x00 é'),
    PayloadStopped(19),
    Audited({"t": 1.5, "layer": "net", "host": 'a,"b}', "ports": [1, {"x": None}]}),
    Audited({}, t=0.0),
    Audited({"n": 1}, t=float("inf")),
    CountersTick(Counters(1, 2, 3, 4, 5), [Destination("example.org", 2, 1)]),
    ClientDetached(),
    ClientAttached(),
    Exited(Outcome(1, Reason.EXIT, "m", findings=["f"])),
    Lost(3),
]


@pytest.mark.parametrize("ev", EVERY_KIND, ids=lambda e: type(e).__name__)
def test_each_event_is_framed_once_as_its_reply(ev: SessionEvent) -> None:
    frame = watch_frame(ev)
    assert frame == encode_reply({"event": ev.to_wire()}, continues=True)
    assert watch_frame(ev) is frame  # encoded once: every watcher sends these bytes


def test_a_batch_stops_at_its_bytes_and_at_its_deadline() -> None:
    fan: Fanout[SessionEvent] = Fanout(bound=5000)
    sub = fan.subscribe()
    for i in range(3000):
        fan.publish(Audited({"n": i, "pad": "x" * 100}))
    first = watch_batch(sub)
    assert WATCH_BATCH <= sum(map(len, first)) < WATCH_BATCH + len(first[-1])
    assert len(watch_batch(sub, until=0.0)) == WATCH_LEAST  # past it: the least
    rest: list[bytes] = []
    while batch := watch_batch(sub):
        rest += batch
    assert len(first) + WATCH_LEAST + len(rest) == 3000 and sub.pop() is None


async def read_watch(peer: Peer) -> tuple[list[bytes], int]:
    """Every event frame of a Watch stream as sent (the session replies left out),
    until its last reply; and the events it was told it lost."""
    frames: list[bytes] = []
    lost = 0
    while True:
        raw = await asyncio.wait_for(peer.reader.readuntil(b"\0"), 30)
        msg = json.loads(raw[:-1])
        if not msg.get("continues"):
            return frames, lost
        if "event" in msg["parameters"]:
            frames.append(raw)
            if msg["parameters"]["event"]["kind"] == "lost":
                lost += msg["parameters"]["event"]["count"]


async def watching(
    path: str, sid: str, n: int
) -> list[tuple[Peer, asyncio.Task[tuple[list[bytes], int]]]]:
    """N peers watching SID, each read by its own task, every one subscribed."""
    peers = []
    for _ in range(n):
        peer = await Peer.connect(path)
        peer.send("Watch", {"id": sid}, more=True)
        assert "session" in (await peer.reply())["parameters"]
        peers.append((peer, asyncio.create_task(read_watch(peer))))
    return peers


async def test_ten_watchers_each_receive_every_event_and_the_same_bytes(
    daemon: tuple[Manager, str],
) -> None:
    manager, path = daemon
    s = await manager.start(request(), [])
    await started(s)
    peers = await watching(path, s.id, 10)
    subs = s.events._subs
    for i in range(3000):  # 100 at a time, well within a watcher's bounded queue
        s.record("net", verdict="deny", host="evil.example", n=i)
        if i % 100 == 99:  # each sent before the next 100: the subject is not loss
            await until(lambda: not any(sub.queued for sub in subs), "the watchers to drain")
    manager.stop(s.id)
    got = [await task for _, task in peers]
    for frames, lost in got:
        audits = [json.loads(f[:-1])["parameters"]["event"] for f in frames]
        assert lost == 0
        assert [e["record"]["n"] for e in audits if e["kind"] == "audit"] == list(range(3000))
    assert all(frames == got[0][0] for frames, _ in got)  # encoded once, sent to each
    for peer, _ in peers:
        peer.close()


async def test_a_flooded_watcher_that_reads_is_told_exactly_what_it_lost(
    daemon: tuple[Manager, str],
) -> None:
    """A publisher flooding the loop keeps most of it (the watcher's turns are a
    share), and the watcher's count still adds up: every record received or told."""
    manager, path = daemon
    s = await manager.start(request(), [])
    await started(s)
    ((peer, task),) = await watching(path, s.id, 1)
    for i in range(50_000):
        s.record("net", n=i)
        if i % 1000 == 999:
            await asyncio.sleep(0)
    (sub,) = s.events._subs
    # the flood's tail sent: the end's events are not lost too
    await until(lambda: not sub.queued, "the watcher to drain the flood")
    manager.stop(s.id)
    frames, lost = await task
    events = [json.loads(f[:-1])["parameters"]["event"] for f in frames]
    seen = [e["record"]["n"] for e in events if e["kind"] == "audit"]
    assert seen == sorted(seen) and len(seen) + lost == 50_000
    assert events[-1]["kind"] == "exited"
    peer.close()


async def test_watch_without_an_id_needs_exactly_one_running(daemon: tuple[Manager, str]) -> None:
    manager, path = daemon
    peer = await Peer.connect(path)
    peer.send("Watch", {}, more=True)
    got = await peer.reply()
    assert (
        got["error"] == M + "InvalidArgument"
        and "no session is running" in got["parameters"]["message"]
    )
    a, b = await manager.start(request(), []), await manager.start(request(), [])
    peer.send("Watch", {}, more=True)
    got = await peer.reply()
    assert (
        f"several sessions are running ({a.id}, {b.id}); name one" in got["parameters"]["message"]
    )
    peer.close()


async def test_fds_of_a_refused_run_are_closed(daemon: tuple[Manager, str]) -> None:
    """BuildMismatch closes what came with the call: the pipe's reader sees EOF."""
    _, path = daemon
    r, w = os.pipe()

    def call() -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            msg = {"method": M + "Run", "parameters": run_params(build="x")}
            socket.send_fds(sock, [json.dumps(msg).encode() + b"\0"], [w, w, w])
            os.close(w)
            return cast(dict[str, Any], json.loads(sock.recv(65536).rstrip(b"\0")))

    assert (await asyncio.to_thread(call))["error"] == M + "BuildMismatch"
    os.set_blocking(r, False)
    assert os.read(r, 1) == b""  # every write end closed: the daemon kept none
    os.close(r)


def _fuzz_cases(rng: random.Random) -> list[bytes]:
    """Framing and JSON gone wrong, and calls of the wrong shape: each one message."""
    valid = {
        "method": M + "Run",
        "parameters": {
            "argv": ["true"],
            "cwd": "/w",
            "build": "x",
            "options": {"memory": 1, "env": []},
        },
        "more": True,
    }
    text = json.dumps(valid)
    cases = [
        b"\0",
        b"{}\0",
        b"[]\0",
        b"null\0",
        b'"x"\0',
        b"{\0",
        b"\xff\xfe\0",
        b"[" * 100_000 + b"\0",
        json.dumps({"method": 3}).encode() + b"\0",
        json.dumps({"method": M + "Version", "more": True, "oneway": True}).encode() + b"\0",
        json.dumps({"method": M + "Version", "upgrade": True}).encode() + b"\0",
        json.dumps({"method": M + "Version", "parameters": []}).encode() + b"\0",
        json.dumps({"method": M + "Run", "parameters": {"argv": "true"}}).encode() + b"\0",
        json.dumps({"method": M + "Show", "parameters": {"id": {"x": 1}}}).encode() + b"\0",
        json.dumps(
            {"method": M + "Signal", "parameters": {"id": "x", "signal": "9"}, "oneway": True}
        ).encode()
        + b"\0",
        json.dumps({"method": M + "Watch", "parameters": {"id": 7}}).encode() + b"\0",
        json.dumps(
            {
                "method": "org.varlink.service.GetInterfaceDescription",
                "parameters": {"interface": []},
            }
        ).encode()
        + b"\0",
    ]
    for _ in range(300):
        raw = bytearray(text.encode())
        for _ in range(rng.randint(1, 8)):
            op = rng.randrange(3)
            pos = rng.randrange(len(raw))
            if op == 0:
                raw[pos] = rng.randrange(256)
            elif op == 1:
                del raw[pos]
            else:
                raw.insert(pos, rng.choice(b'{}[]",:0\\\x00'))
        cases.append(bytes(raw).replace(b"\0", b"") + b"\0")
    return cases


async def test_malformed_varlink_never_takes_the_daemon_down(daemon: tuple[Manager, str]) -> None:
    import random

    manager, path = daemon
    rng = random.Random(1234)  # the same cases every run
    replies = {"error": 0, "reply": 0, "closed": 0, "silent": 0}
    for case in _fuzz_cases(rng):
        peer = await Peer.connect(path)
        peer.writer.write(case)
        # Then a call of our own: replies come in order, so its answer first means
        # the case got none (a oneway call that still parsed), not a time waited.
        peer.send("Marker", {})
        try:
            got = json.loads((await asyncio.wait_for(peer.reader.readuntil(b"\0"), 30))[:-1])
        except asyncio.IncompleteReadError:
            replies["closed"] += 1
        else:
            if got.get("parameters") == {"method": M + "Marker"}:
                replies["silent"] += 1
            else:
                replies["error" if "error" in got else "reply"] += 1
        peer.close()
        for s in manager.running():  # a mutated Run that still parsed: end it
            s.stop(kill=True)
    check = await Peer.connect(path)
    check.send("Version", {})
    assert (await check.reply())["parameters"]["build"] == build_id()
    check.close()
    assert replies["error"] > 250 and replies["closed"] == 0, replies


async def test_a_malformed_message_after_a_call_is_answered_in_order(
    daemon: tuple[Manager, str],
) -> None:
    _, path = daemon
    peer = await Peer.connect(path)
    peer.writer.write(
        json.dumps({"method": M + "Version", "parameters": {}}).encode() + b"\0{oops\0"
    )
    first, second = await peer.reply(), await peer.reply()
    assert first["parameters"]["build"] == build_id()
    assert second["error"] == "org.varlink.service.InvalidParameter"
    assert "malformed JSON" in second["parameters"]["message"]
    assert await peer.reader.read() == b""  # and then closed
    peer.close()


async def test_a_final_reply_over_the_wire_limit_still_brings_the_status(tmp_path: Path) -> None:
    """No records (so nothing bounded the outcome): the reply would be 45 MB; the
    client still hears how the payload ended, and the connection goes on."""
    huge = [f"finding {i:06d} " + "x" * 400 for i in range(100_000)]
    manager = Manager(FakeLauncher(findings=huge), grace=0.05)
    path, server, task = serve(tmp_path, manager)
    try:
        peer = await Peer.connect(path)
        peer.send("Run", run_params(), more=True)
        sid = (await peer.reply())["parameters"]["id"]
        manager.stop(sid)
        last = (await peer.reply())["parameters"]
        assert (last["id"], last["exit_status"], last["state"]) == (sid, 143, "killed")
        assert "too large to send" in last["message"] and "findings" not in last
        peer.send("Version", {})
        assert "version" in (await peer.reply())["parameters"]
        peer.close()
    finally:
        server.close()
        task.cancel()
