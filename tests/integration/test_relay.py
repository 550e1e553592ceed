"""The gateway's byte pump against real loopback TCP connections.

Each flow is built as the gateway sees it: ``client ⇄ a`` (the accepted side) and
``b ⇄ server`` (the dialled side), both over 127.0.0.1; the pump relays a ⇄ b.
Peers that move bulk data run in threads with blocking sockets, so the event
loop runs nothing but the pump.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from boxyd.net import relay
from boxyd.net.poller import Deadlines, Poller
from boxyd.net.relay import CloseReason, Counters, Flow, Mode, pump

MODES: list[Mode] = ["auto", "copy", "splice"]
MiB = 1024 * 1024
PEER_TIMEOUT = 60.0


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(connecting side, accepted side) of one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        c = socket.create_connection(listener.getsockname())
        s, _ = listener.accept()
    return c, s


class Topology:
    """client ⇄ a   [pump]   b ⇄ server"""

    def __init__(self) -> None:
        self.client, self.a = tcp_pair()
        self.b, self.server = tcp_pair()
        for s in (self.client, self.server):
            s.settimeout(PEER_TIMEOUT)

    def close_peers(self) -> None:
        self.client.close()
        self.server.close()


@pytest.fixture
def topo() -> Iterator[Topology]:
    t = Topology()
    yield t
    t.close_peers()
    for s in (t.a, t.b):  # the pump closes these; only a failed test leaves them open
        s.close()


def stream(seed: int, total: int) -> Iterator[bytes]:
    """Deterministic, incompressible-looking chunks; each carries its index, so a
    reordered or repeated chunk changes the digest."""
    block = hashlib.shake_256(seed.to_bytes(8, "little")).digest(MiB)
    i = 0
    while total > 0:
        n = min(total, MiB)
        yield (struct.pack("<Q", i) + block[8:])[:n]
        total -= n
        i += 1


def expected_digest(seed: int, total: int) -> str:
    h = hashlib.sha256()
    for chunk in stream(seed, total):
        h.update(chunk)
    return h.hexdigest()


class Sender(threading.Thread):
    def __init__(self, sock: socket.socket, seed: int, total: int, shut: bool = True) -> None:
        super().__init__(daemon=True)
        self.sock, self.seed, self.total, self.shut = sock, seed, total, shut
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for chunk in stream(self.seed, self.total):
                self.sock.sendall(chunk)
            if self.shut:
                self.sock.shutdown(socket.SHUT_WR)
        except BaseException as e:  # reported by the test
            self.error = e


class Receiver(threading.Thread):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.sha = hashlib.sha256()
        self.count = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        buf = memoryview(bytearray(MiB))
        try:
            while n := self.sock.recv_into(buf):
                self.sha.update(buf[:n])
                self.count += n
        except BaseException as e:
            self.error = e


async def join(*threads: Sender | Receiver) -> None:
    for t in threads:
        await asyncio.to_thread(t.join, PEER_TIMEOUT)
        assert not t.is_alive(), f"{t} did not finish"
        assert getattr(t, "error", None) is None, t.error


async def recv_exactly(sock: socket.socket, n: int) -> bytes:
    return await asyncio.to_thread(_recv_exactly, sock, n)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def sees_reset(sock: socket.socket) -> str:
    """How the stream on SOCK ends for a blocking reader: 'reset' or 'eof' (data
    still queued before the end is read and dropped)."""
    try:
        while sock.recv(MiB):
            pass
    except ConnectionResetError:
        return "reset"
    return "eof"


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- bulk ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_bulk_both_directions_at_once_arrives_intact(topo: Topology, mode: Mode) -> None:
    total = 200 * MiB
    counters = Counters()
    up_tx, down_tx = Sender(topo.client, 1, total), Sender(topo.server, 2, total)
    up_rx, down_rx = Receiver(topo.server), Receiver(topo.client)
    for t in (up_rx, down_rx, up_tx, down_tx):
        t.start()
    reason = await pump(topo.a, topo.b, counters=counters, idle_timeout=30, mode=mode)
    await join(up_tx, down_tx, up_rx, down_rx)
    assert reason is CloseReason.DONE
    assert (up_rx.count, down_rx.count) == (total, total)
    assert up_rx.sha.hexdigest() == expected_digest(1, total)
    assert down_rx.sha.hexdigest() == expected_digest(2, total)
    assert (counters.up, counters.down) == (total, total)
    assert topo.a.fileno() == -1 and topo.b.fileno() == -1, "the flow closes both sockets"


async def test_slow_reader_back_pressures_instead_of_buffering(topo: Topology) -> None:
    # Far more than every kernel buffer on the path plus one pipe can hold: if the
    # pump buffered without bound, the sender would finish while nobody reads.
    total = 128 * MiB
    flow = Flow(topo.a, topo.b, idle_timeout=30)
    task = asyncio.ensure_future(flow.run())
    tx = Sender(topo.client, 3, total)
    tx.start()
    await asyncio.sleep(1.0)
    assert tx.is_alive(), "the sender finished although nobody read: the pump buffered it all"
    stuck_at = flow.counters.up
    assert stuck_at < 64 * MiB
    rx = Receiver(topo.server)
    rx.start()
    await join(tx)
    topo.server.shutdown(socket.SHUT_WR)
    await join(rx)
    assert await task is CloseReason.DONE
    assert rx.sha.hexdigest() == expected_digest(3, total)
    assert flow.counters.up == total


# -- half-close -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("first", ["client", "server"])
async def test_half_close_keeps_the_other_direction(topo: Topology, mode: Mode, first: str) -> None:
    closer, other = (topo.client, topo.server) if first == "client" else (topo.server, topo.client)
    counters = Counters()
    task = asyncio.ensure_future(
        pump(topo.a, topo.b, counters=counters, idle_timeout=30, mode=mode)
    )
    closer.sendall(b"last words")
    closer.shutdown(socket.SHUT_WR)
    assert await recv_exactly(other, 10) == b"last words"
    assert await asyncio.to_thread(sees_reset, other) == "eof", "the EOF follows the data"
    # The closed direction is done; the other still carries data, a lot of it.
    tx, rx = Sender(other, 4, 3 * MiB), Receiver(closer)
    rx.start()
    tx.start()
    await join(tx, rx)
    assert rx.sha.hexdigest() == expected_digest(4, 3 * MiB)
    assert await asyncio.wait_for(task, 10) is CloseReason.DONE
    sent_first = 10
    if first == "client":
        assert (counters.up, counters.down) == (sent_first, 3 * MiB)
    else:
        assert (counters.up, counters.down) == (3 * MiB, sent_first)


# -- resets -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("who", ["client", "server"])
async def test_reset_is_propagated_as_reset(topo: Topology, mode: Mode, who: str) -> None:
    resetter, victim = (topo.client, topo.server) if who == "client" else (topo.server, topo.client)
    task = asyncio.ensure_future(
        pump(topo.a, topo.b, counters=Counters(), idle_timeout=30, mode=mode)
    )
    victim.sendall(b"ping")
    assert await recv_exactly(resetter, 4) == b"ping"
    relay.reset(resetter)
    assert await asyncio.to_thread(sees_reset, victim) == "reset"
    expected = CloseReason.RESET_BY_A if who == "client" else CloseReason.RESET_BY_B
    assert await asyncio.wait_for(task, 10) is expected


async def test_reset_after_a_half_close_is_still_a_reset(topo: Topology) -> None:
    # The client finished sending (FIN) and then aborts while the server streams
    # to it: the server must see a reset, not a clean end of a truncated reply.
    task = asyncio.ensure_future(pump(topo.a, topo.b, counters=Counters(), idle_timeout=30))
    topo.client.shutdown(socket.SHUT_WR)
    assert await asyncio.to_thread(sees_reset, topo.server) == "eof"
    topo.server.sendall(b"x" * 1000)
    assert await recv_exactly(topo.client, 1000) == b"x" * 1000
    relay.reset(topo.client)

    def write_until_reset() -> str:
        try:
            for _ in range(1000):
                topo.server.sendall(b"y" * 65536)
                time.sleep(0.005)
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        return "never reset"

    assert await asyncio.to_thread(write_until_reset) == "reset"
    assert await asyncio.wait_for(task, 10) is CloseReason.RESET_BY_A


def test_reset_helper_sends_rst() -> None:
    c, s = tcp_pair()
    try:
        s.settimeout(10)
        relay.reset(c)
        assert c.fileno() == -1
        assert sees_reset(s) == "reset"
        relay.reset(c)  # already closed: nothing to do, no error
    finally:
        s.close()


# -- idle, abort, initial bytes -------------------------------------------------------


class IdleChecks:
    """A flow's idle checks, watched: how many ran since the last that saw traffic,
    and whether each came within a tick of the one before. That is told by a loop
    timer armed just past the tick: the loop runs due timers in order, so a busy
    machine delays the check and the watch alike, and only a check scheduled late
    lets the watch go first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float) -> None:
        self.loop, self.tick = loop, tick
        self.quiet = 0  # checks since the last that saw bytes move
        self.late = 0
        self._watch: asyncio.TimerHandle | None = None

    def __call__(self, flow: Flow) -> None:
        if self._watch is not None:
            self._watch.cancel()
        since = flow._idle_since
        Flow._check_idle(flow)
        self.quiet = 0 if flow._idle_since != since else self.quiet + 1
        if not flow.finished:
            self._watch = self.loop.call_at(self.loop.time() + self.tick + 0.001, self._late)

    def _late(self) -> None:
        self._watch = None
        self.late += 1


@pytest.mark.parametrize("checks", ["own timer", "shared queue"])
@pytest.mark.parametrize("mode", ["copy", "splice"])
async def test_idle_flow_is_reset_after_the_bound(topo: Topology, mode: Mode, checks: str) -> None:
    """With its own timer, or with a queue of idle checks shared by many flows (the
    gateway's)."""
    idle = 0.4
    loop = asyncio.get_running_loop()
    tick = idle / 4  # what the overshoot is held to
    watch = IdleChecks(loop, tick)
    queue = Deadlines(loop, relay.idle_tick(idle), watch) if checks != "own timer" else None
    flow = Flow(topo.a, topo.b, idle_timeout=idle, mode=mode, idle_checks=queue)
    flow._check_idle = lambda: watch(flow)  # type: ignore[method-assign]
    task = asyncio.ensure_future(flow.run())
    # Traffic keeps it alive well past the bound...
    for i in range(8):
        if i:
            await asyncio.sleep(idle / 3)
        topo.client.sendall(b".")
        assert await recv_exactly(topo.server, 1) == b"."
        last = time.monotonic()
    assert not task.done()
    # ...and silence ends it: not before the bound, and at the first check past it
    # (checks a tick apart: a quarter of the bound more at most).
    assert await asyncio.wait_for(task, PEER_TIMEOUT) is CloseReason.IDLE
    assert time.monotonic() - last >= idle * 0.95
    assert watch.late == 0, "a check came more than a tick after the one before"
    assert watch.quiet <= round(idle / tick) + 1, f"ended only at quiet check {watch.quiet}"
    assert await asyncio.to_thread(sees_reset, topo.client) == "reset"
    assert await asyncio.to_thread(sees_reset, topo.server) == "reset"


@pytest.mark.parametrize("mode", MODES)
async def test_abort_resets_both_sides_promptly(topo: Topology, mode: Mode) -> None:
    flow = Flow(topo.a, topo.b, idle_timeout=30, mode=mode)
    task = asyncio.ensure_future(flow.run())
    tx, rx = Sender(topo.client, 5, 1024 * MiB), Receiver(topo.server)  # streaming when aborted
    rx.start()
    tx.start()
    while flow.counters.up < 4 * MiB:
        await asyncio.sleep(0.01)
        assert not task.done()
    flow.abort()
    # Promptly: ended and both sockets reset within the call, waiting on nothing.
    assert flow.finished and flow.reason is CloseReason.ABORTED
    assert topo.a.fileno() == -1 and topo.b.fileno() == -1
    assert await asyncio.wait_for(task, PEER_TIMEOUT) is CloseReason.ABORTED
    for t in (tx, rx):
        await asyncio.to_thread(t.join, PEER_TIMEOUT)
        assert isinstance(t.error, ConnectionResetError | BrokenPipeError), t.error
    assert rx.count < 1024 * MiB, "cut mid-stream, not after it"
    flow.abort()  # idempotent


async def test_cancelling_the_task_aborts_the_flow(topo: Topology) -> None:
    task = asyncio.ensure_future(pump(topo.a, topo.b, counters=Counters(), idle_timeout=30))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(sees_reset, topo.client) == "reset"
    assert await asyncio.to_thread(sees_reset, topo.server) == "reset"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [5, 8 * MiB])
async def test_initial_bytes_go_first(topo: Topology, mode: Mode, size: int) -> None:
    # 8 MiB exceeds what the server's socket buffers take at once, so the initial
    # bytes are themselves sent in several rounds under back-pressure.
    initial = b"HELLO"[:size] if size < 6 else bytes(range(256)) * (size // 256)
    counters = Counters()
    task = asyncio.ensure_future(
        pump(topo.a, topo.b, counters=counters, idle_timeout=30, initial_a_to_b=initial, mode=mode)
    )
    topo.client.sendall(b"WORLD")
    topo.client.shutdown(socket.SHUT_WR)
    await asyncio.sleep(0.2)  # the server is late: everything waits in buffers
    assert await recv_exactly(topo.server, len(initial) + 6) == initial + b"WORLD"
    topo.server.shutdown(socket.SHUT_WR)
    assert await asyncio.wait_for(task, 10) is CloseReason.DONE
    assert counters.up == len(initial) + 5


def segments_in(sock: socket.socket) -> int:
    """tcpi_segs_in of SOCK (struct tcp_info, linux/tcp.h): every segment received."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 144)
    return int(struct.unpack_from("=I", info, 140)[0])


@pytest.mark.parametrize("mode", ["auto", "copy"])
async def test_an_eof_right_behind_the_last_bytes_leaves_with_them(
    topo: Topology, mode: Mode
) -> None:
    """The server answers and closes before the relay reads a byte (an HTTP/1.0-style
    response): the client gets the answer and the FIN in one segment, not two."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    topo.server.sendall(answer)
    topo.server.shutdown(socket.SHUT_WR)
    await asyncio.sleep(0.05)  # (both are in the relay's receive queue before it starts)
    before = segments_in(topo.client)
    task = asyncio.ensure_future(
        pump(topo.a, topo.b, counters=Counters(), idle_timeout=30, mode=mode)
    )
    got = b""
    while True:
        chunk = await asyncio.to_thread(topo.client.recv, 4096)
        if not chunk:
            break
        got += chunk
    assert got == answer
    assert segments_in(topo.client) - before == 1, "the answer and its FIN in one segment"
    topo.client.shutdown(socket.SHUT_WR)
    assert await asyncio.wait_for(task, 10) is CloseReason.DONE


# -- counters ---------------------------------------------------------------------------


async def test_counters_are_exact_and_may_be_shared() -> None:
    session = Counters()
    sizes = [(0, 0), (1, 0), (0, 1), (1000, 7), (300_000, 2 * MiB + 3)]
    topos = [Topology() for _ in sizes]
    try:
        tasks = [
            asyncio.ensure_future(pump(t.a, t.b, counters=session, idle_timeout=30)) for t in topos
        ]
        threads: list[Sender | Receiver] = []
        for t, (up, down) in zip(topos, sizes, strict=True):
            threads += [
                Sender(t.client, 6, up),
                Sender(t.server, 7, down),
                Receiver(t.server),
                Receiver(t.client),
            ]
        for th in threads:
            th.start()
        await join(*threads)
        assert set(await asyncio.gather(*tasks)) == {CloseReason.DONE}
        assert session.up == sum(u for u, _ in sizes)
        assert session.down == sum(d for _, d in sizes)
    finally:
        for t in topos:
            t.close_peers()


async def test_counters_move_while_the_flow_runs(topo: Topology) -> None:
    flow = Flow(topo.a, topo.b, idle_timeout=30)
    task = asyncio.ensure_future(flow.run())
    topo.server.sendall(b"z" * 12345)
    assert await recv_exactly(topo.client, 12345) == b"z" * 12345
    assert (flow.counters.up, flow.counters.down) == (0, 12345)
    flow.abort()
    await task


# -- resources --------------------------------------------------------------------------


def _loop_registrations(loop: asyncio.AbstractEventLoop) -> int:
    selector = getattr(loop, "_selector", None)
    assert selector is not None, "test needs the selector event loop"
    return len(selector.get_map())


async def _short_flow(i: int, poller: Poller | None = None) -> CloseReason:
    """One flow, ending in one of the ways a flow ends (by i)."""
    t = Topology()
    try:
        idle = 0.2 if i % 5 == 4 else 30
        flow = Flow(t.a, t.b, idle_timeout=idle, mode=MODES[i % 3], poller=poller)
        task = asyncio.ensure_future(flow.run())
        kind = i % 5
        payload = b"q" * (300_000 if i % 7 == 0 else 100)  # some flows switch to splice
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(t.client, payload)
        got = await asyncio.to_thread(_recv_exactly, t.server, len(payload))
        assert got == payload
        if kind == 0:  # clean close both ways
            t.client.shutdown(socket.SHUT_WR)
            t.server.shutdown(socket.SHUT_WR)
        elif kind == 1:
            relay.reset(t.client)
        elif kind == 2:
            relay.reset(t.server)
        elif kind == 3:
            flow.abort()
        return await asyncio.wait_for(task, 10)  # kind 4: idle
    finally:
        t.close_peers()


@pytest.mark.parametrize("ready", ["loop", "poller"])
async def test_no_fd_or_callback_leak_over_1000_flows(ready: str) -> None:
    """Through the loop's add_reader or the gateway's own epoll set (poller.py)."""
    loop = asyncio.get_running_loop()
    poller = Poller(loop) if ready == "poller" else None
    await _short_flow(0, poller)  # warm up lazily created fds (thread pool, self-pipe)
    gc.collect()  # sockets earlier tests dropped unclosed must not close during this one
    fds, regs = fd_count(), _loop_registrations(loop)
    reasons: list[CloseReason] = []
    for start in range(0, 1000, 50):
        reasons += await asyncio.gather(*(_short_flow(i, poller) for i in range(start, start + 50)))
    assert set(reasons) == set(CloseReason), "every way of ending was exercised"
    assert fd_count() == fds
    assert _loop_registrations(loop) == regs
    assert relay._Pipes.in_use == 0
    if poller is not None:
        assert len(poller) == 0, "every flow dropped its interest"
        poller.close()


@pytest.mark.parametrize("ready", ["loop", "poller"])
async def test_200_parallel_flows(ready: str) -> None:
    n, size = 200, 512 * 1024
    topos = [Topology() for _ in range(n)]
    session = Counters()
    loop = asyncio.get_running_loop()
    poller = Poller(loop) if ready == "poller" else None
    try:
        for t in topos:
            for s in (t.client, t.server):
                s.setblocking(False)
        flows = [Flow(t.a, t.b, counters=session, idle_timeout=30, poller=poller) for t in topos]
        tasks = [asyncio.ensure_future(f.run()) for f in flows]

        async def peer_pair(i: int, t: Topology) -> None:
            up = b"".join(stream(i, size))
            down = b"".join(stream(i + 1000, size))

            async def send(s: socket.socket, data: bytes) -> None:
                await loop.sock_sendall(s, data)
                s.shutdown(socket.SHUT_WR)

            async def recv(s: socket.socket) -> bytes:
                out = bytearray()
                while chunk := await loop.sock_recv(s, 65536):
                    out += chunk
                return bytes(out)

            _, _, got_up, got_down = await asyncio.gather(
                send(t.client, up), send(t.server, down), recv(t.server), recv(t.client)
            )
            assert got_up == up and got_down == down, f"flow {i} corrupted"

        await asyncio.wait_for(asyncio.gather(*(peer_pair(i, t) for i, t in enumerate(topos))), 120)
        assert set(await asyncio.gather(*tasks)) == {CloseReason.DONE}
        assert (session.up, session.down) == (n * size, n * size)
    finally:
        if poller is not None:
            poller.close()
        for t in topos:
            t.close_peers()
            for s in (t.a, t.b):
                with contextlib.suppress(OSError):
                    s.close()


async def test_bad_arguments_are_refused() -> None:
    c, s = tcp_pair()
    try:
        with pytest.raises(ValueError, match="idle_timeout"):
            Flow(c, s, idle_timeout=0)
        queue = Deadlines(asyncio.get_running_loop(), 1.0, Flow._check_idle)
        with pytest.raises(ValueError, match="a quarter of the idle timeout"):
            Flow(c, s, idle_timeout=1.0, idle_checks=queue)
        with pytest.raises(ValueError, match="two different sockets"):
            Flow(c, c, idle_timeout=1)
    finally:
        c.close()
        s.close()


async def test_start_calls_back_once_without_a_task(topo: Topology) -> None:
    """The callback form the gateway uses: ON_DONE once, with the reason."""
    done: list[CloseReason] = []
    flow = Flow(topo.a, topo.b, idle_timeout=30)
    flow.start(done.append)
    topo.client.sendall(b"ping")
    assert await asyncio.to_thread(_recv_exactly, topo.server, 4) == b"ping"
    topo.client.shutdown(socket.SHUT_WR)
    topo.server.shutdown(socket.SHUT_WR)
    for _ in range(500):
        if done:
            break
        await asyncio.sleep(0.01)
    assert done == [CloseReason.DONE]
    assert topo.a.fileno() == -1 and topo.b.fileno() == -1
    with pytest.raises(RuntimeError, match="only once"):
        flow.start(done.append)


async def test_aborted_before_start_calls_back_at_once(topo: Topology) -> None:
    flow = Flow(topo.a, topo.b, idle_timeout=30)
    flow.abort()
    done: list[CloseReason] = []
    flow.start(done.append)
    assert done == [CloseReason.ABORTED]
    assert topo.a.fileno() == -1 and topo.b.fileno() == -1
    topo.client.settimeout(5)
    with pytest.raises(ConnectionResetError):
        topo.client.recv(1)


# -- a secret's placeholder, looked for in every byte (--secret NAME@HOST) ---------------

PLACEHOLDER = b"ghp_" + b"Q" * 36


def _found(data: bytes) -> str | None:
    return "TOKEN" if PLACEHOLDER in data else None


@pytest.mark.parametrize("split", [0, 1, 20, 39])
async def test_a_placeholder_split_between_reads_ends_the_flow_unsent(
    topo: Topology, split: int
) -> None:
    """SCAN sees what a→b sends, the last bytes of one read kept for the next: a
    placeholder split between two sends (or behind the first record) is found, and
    the flow ends with a reset before the bytes holding its end are sent."""
    first = b"POST / HTTP/1.1\r\n\r\n" + PLACEHOLDER[:split]
    flow = Flow(topo.a, topo.b, idle_timeout=30, initial_a_to_b=b"GET", scan=_found,
                scan_keep=len(PLACEHOLDER) - 1)  # fmt: skip
    task = asyncio.ensure_future(flow.run())
    topo.client.sendall(first)
    assert await recv_exactly(topo.server, 3 + len(first)) == b"GET" + first
    topo.client.sendall(PLACEHOLDER[split:] + b" and more")
    assert await asyncio.wait_for(task, 10) is CloseReason.RESET_BY_A
    assert isinstance(flow.error, relay.Placeholder) and str(flow.error) == "TOKEN"
    assert await asyncio.to_thread(sees_reset, topo.server) == "reset"


async def test_a_placeholder_sent_a_few_bytes_a_read_ends_the_flow_unsent(
    topo: Topology,
) -> None:
    """Reads shorter than the bytes kept: the tail carries over more than one read
    (a placeholder sent 7 bytes at a time is still found whole)."""
    flow = Flow(topo.a, topo.b, idle_timeout=30, scan=_found,
                scan_keep=len(PLACEHOLDER) - 1)  # fmt: skip
    task = asyncio.ensure_future(flow.run())
    sent = b""
    for i in range(0, len(PLACEHOLDER) - 7, 7):  # each piece relayed before the next
        piece = PLACEHOLDER[i : i + 7]
        topo.client.sendall(piece)
        sent += piece
        assert await recv_exactly(topo.server, len(piece)) == piece
    topo.client.sendall(PLACEHOLDER[len(sent) :])
    assert await asyncio.wait_for(task, 10) is CloseReason.RESET_BY_A
    assert isinstance(flow.error, relay.Placeholder) and str(flow.error) == "TOKEN"
    assert await asyncio.to_thread(sees_reset, topo.server) == "reset"
