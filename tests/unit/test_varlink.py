"""The varlink wire: framing and fd rule, boxyd's asyncio server, boxyctl's sync client.

Everything runs over real unix sockets; the peer-credential tests start real
processes under uid 65534 (root only).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from boxy.errors import DaemonError, NoSuchSession
from boxy.varlink import (
    MAX_FDS,
    MAX_MESSAGE,
    Client,
    Decoder,
    ProtocolError,
    VarlinkError,
    encode,
    recv_with_fds,
    send_with_fds,
    to_json,
)
from boxyd.api.varlink import (
    Call,
    VarlinkServer,
    encode_reply,
    interface_description,
    interface_methods,
)

M = "dev.boxy.Manager."
# Run's parameters as the IDL declares them (the server checks every call against it)
RUN = {"argv": ["true"], "cwd": "/w", "options": {}, "client_env": {}, "build": "b1"}
_ids = itertools.count()


def address() -> str:
    """An abstract socket address: reachable by any uid, so credentials decide."""
    return f"\0boxy-test-{os.getpid()}-{next(_ids)}"


def listener(addr: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(addr)
    sock.listen(16)
    return sock


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def open_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def pipe_eof_within(fd: int, timeout: float) -> bool:
    """True when the pipe's read end FD reports EOF (every write end closed) in time."""
    if not select.select([fd], [], [], timeout)[0]:
        return False
    return os.read(fd, 1) == b""


# --- framing -----------------------------------------------------------------------


def test_split_reads_reassemble_messages() -> None:
    dec = Decoder()
    wire = encode({"method": "a", "parameters": {"x": 1}}) + encode({"method": "b"})
    got = []
    for i in range(len(wire)):
        got += dec.feed(wire[i : i + 1])
    assert [m for m, _ in got] == [{"method": "a", "parameters": {"x": 1}}, {"method": "b"}]
    assert all(fds == [] for _, fds in got)


def test_several_messages_in_one_read() -> None:
    wire = b"".join(encode({"n": i}) for i in range(5))
    assert [m["n"] for m, _ in Decoder().feed(wire)] == list(range(5))


def test_fds_belong_to_the_message_holding_the_reads_last_byte() -> None:
    r, w = os.pipe()
    try:
        dec = Decoder()
        # A completes in this read, B is partial: the fd is B's.
        first = dec.feed(encode({"m": "A"}) + b'{"m":', [r])
        assert first == [({"m": "A"}, [])]
        assert dec.feed(b'"B"}\0') == [({"m": "B"}, [r])]
        # A read that ends on a NUL: the fd is the last complete message's.
        assert dec.feed(encode({"m": "C"}) + encode({"m": "D"}), [w]) == [
            ({"m": "C"}, []),
            ({"m": "D"}, [w]),
        ]
    finally:
        os.close(r)
        os.close(w)


def test_too_many_fds_for_one_message_are_rejected_and_closed() -> None:
    pipes = [os.pipe() for _ in range(5)]
    fds = [fd for p in pipes for fd in p][: MAX_FDS + 1]
    extra = [fd for p in pipes for fd in p][MAX_FDS + 1 :]
    dec = Decoder()
    assert dec.feed(b'{"m":', fds[:5]) == []
    with pytest.raises(ProtocolError, match="file descriptors"):
        dec.feed(b'"x"', fds[5:])
    assert not any(is_open(fd) for fd in fds)
    for fd in extra:
        os.close(fd)


def test_oversize_message_rejected() -> None:
    body = '{"a":"' + "x" * (MAX_MESSAGE - 8) + '"}'
    assert len(body) == MAX_MESSAGE
    assert Decoder().feed(body.encode() + b"\0")[0][0]["a"].startswith("x")
    dec = Decoder()
    with pytest.raises(ProtocolError, match="exceeds"):
        for _ in range(20):
            dec.feed(b" " * (MAX_MESSAGE // 16))
    with pytest.raises(ValueError):
        encode({"a": "x" * MAX_MESSAGE})


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.5, "b": 'x é \x00 "q" \\', "c": [1, None, True, {"d": []}]},
        {"t": 1796176599.114, "n": -0.0, "big": 1e300, "inf": float("inf"), 1: 2**70},
        [],
        "s",
    ],
)
def test_the_shared_encoder_writes_what_json_dumps_writes(value: object) -> None:
    assert to_json(value) == json.dumps(value, separators=(",", ":"))


def test_the_shared_encoder_refuses_what_json_does() -> None:
    with pytest.raises(TypeError):
        to_json({"a": object()})
    with pytest.raises(ValueError):
        encode({"a": "x" * MAX_MESSAGE})


@pytest.mark.parametrize(
    "raw",
    [b"{nope}\0", b"[1,2]\0", b'"str"\0', b'{"a":"\xff"}\0', b"\xef\xbb\xbf{}\0", b"{} x\0"],
)
def test_malformed_message_rejected_and_its_fds_closed(raw: bytes) -> None:
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(ProtocolError):
        Decoder().feed(raw, [r])
    assert not is_open(r)


def test_fds_travel_with_their_message_over_a_real_socket() -> None:
    """A (no fds), B (2 fds, large enough to be split by the kernel), C (no fds),
    read back in small pieces: only B carries fds, and they are close-on-exec."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    big = "y" * 300_000
    try:

        def send() -> None:
            a.sendall(encode({"m": "A"}))
            data = encode({"m": "B", "pad": big})
            sent = send_with_fds(a, data, [r, w])
            a.sendall(data[sent:])
            a.sendall(encode({"m": "C"}))

        sender = threading.Thread(target=send)
        sender.start()
        dec = Decoder()
        got: list[tuple[dict[str, Any], list[int]]] = []
        while len(got) < 3:
            data, fds = recv_with_fds(b, 4096)
            assert data
            got += dec.feed(data, fds)
        sender.join(5)
        assert [m["m"] for m, _ in got] == ["A", "B", "C"]
        assert got[0][1] == [] and got[2][1] == []
        fds = got[1][1]
        assert len(fds) == 2
        for fd in fds:
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        os.write(fds[1], b"!")
        assert os.read(r, 1) == b"!"
        for fd in fds:
            os.close(fd)
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_truncated_control_data_is_an_error_and_leaks_nothing() -> None:
    a, b = socket.socketpair()
    pipes = [os.pipe() for _ in range(5)]
    fds = [fd for p in pipes for fd in p][: MAX_FDS + 1]
    before = open_fd_count()
    try:
        a.sendmsg(
            [encode({"m": 1})],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
        )
        with pytest.raises(ProtocolError, match="truncated"):
            recv_with_fds(b)
        assert open_fd_count() == before
    finally:
        for p in pipes:
            for fd in p:
                os.close(fd)
        a.close()
        b.close()


def test_idl_declares_the_manager_interface() -> None:
    text = interface_description()
    assert interface_methods(text) == {
        M + m
        for m in (
            *("Run", "Resize", "Signal", "List", "Show", "Stop", "Watch", "Output", "Attach"),
            *("Version", "DaemonStatus", "Doctor", "Profiles", "ProfileShow", "Shutdown"),
            *("JoinBus", "Trust", "Revoke", "Approvals", "Trusted", "Allow", "Deny"),
            *("Diff", "Apply", "Discard"),
        )
    }
    for err in ("InvalidArgument", "NoSuchSession", "BuildMismatch", "Busy", "SetupFailed"):
        assert re.search(rf"^error {err} \(", text, re.M)
    assert text.count("(") == text.count(")")
    keywords = ("interface ", "type ", "method ", "error ", "#")
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith(")"):
            assert line.startswith(keywords), line


# --- a server in its own thread, for the synchronous client --------------------------


class Handler:
    """The test's daemon: a few methods with observable side effects."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.resized = asyncio.Event()
        self.size: tuple[int, int] | None = None
        self.closed_seen = asyncio.Event()

    async def __call__(self, call: Call) -> None:
        name = call.method.removeprefix(M)
        self.calls.append(name)
        if name == "Version":
            await call.reply({"build": "b1", "version": "0.1"})
        elif name == "Show":
            await call.error(M + "NoSuchSession", {"id": call.parameters["id"]})
        elif name == "Attach":  # takes its fd and writes through it
            (fd,) = call.take_fds()
            os.write(fd, b"hi")
            os.close(fd)
            await call.reply({"id": call.parameters["id"]})
        elif name == "Stop":  # leaves its fds alone: the server must close them
            await call.reply({})
        elif name == "Resize":
            self.size = (call.parameters["rows"], call.parameters["cols"])
            self.resized.set()
        elif name == "Run":
            await call.reply({"id": "s1", "state": "running"}, continues=True)
            closed = asyncio.ensure_future(call.connection_closed.wait())
            resized = asyncio.ensure_future(self.resized.wait())
            await asyncio.wait([closed, resized], timeout=5, return_when="FIRST_COMPLETED")
            closed.cancel()
            resized.cancel()
            if call.connection_closed.is_set():
                self.closed_seen.set()
                return
            try:
                await asyncio.wait_for(self.resized.wait(), 0.01)
            except TimeoutError:
                await call.error(M + "Busy", {"message": "no resize arrived"})
                return
            await call.reply({"id": "s1", "exit_status": 0, "size": list(self.size or ())})
        elif name == "Watch":
            await call.reply({"event": {"n": 0}}, continues=True)
            try:
                await asyncio.wait_for(call.connection_closed.wait(), 5)
                self.closed_seen.set()
            except TimeoutError:
                pass
            await call.reply({"event": {"n": 1}})  # dropped silently: nobody listens


class ServerThread:
    def __init__(
        self,
        exclusive: tuple[str, ...] = (),
        vet: Callable[[int, int | None], str | None] | None = None,
        before_serve: Callable[[str], None] | None = None,
    ) -> None:
        """BEFORE_SERVE(address): called once the listener is bound, before the
        server has it (a client connecting there stands for socket activation's)."""
        self.exclusive, self.vet, self.before_serve = exclusive, vet, before_serve
        self.address = address()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = Handler()
        self.server = VarlinkServer(self.handler, exclusive=self.exclusive, vet=self.vet)
        sock = listener(self.address)
        if self.before_serve is not None:
            self.before_serve(self.address)
        self._ready.set()
        await self.server.serve(sock)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self._thread.join(5)
        assert not self._thread.is_alive()

    def wait(self, event: Callable[[Handler], asyncio.Event], timeout: float = 5) -> bool:
        async def waiter() -> bool:
            try:
                await asyncio.wait_for(event(self.handler).wait(), timeout)
            except TimeoutError:
                return False
            return True

        return asyncio.run_coroutine_threadsafe(waiter(), self.loop).result(timeout + 1)


def test_call_and_error_reply() -> None:
    with ServerThread() as srv, Client.connect(srv.address) as client:
        assert client.call(M + "Version", {}) == {"build": "b1", "version": "0.1"}
        with pytest.raises(NoSuchSession) as err:  # boxy's own errors arrive as themselves
            client.call(M + "Show", {"id": "nope"})
        assert err.value.sid == "nope"
        # The connection is still usable after an error reply.
        assert client.call(M + "Version", {})["build"] == "b1"


def test_unknown_method_is_refused_without_reaching_the_handler() -> None:
    with ServerThread() as srv, Client.connect(srv.address) as client:
        with pytest.raises(VarlinkError) as err:
            client.call(M + "Explode", {})
        assert err.value.name == "org.varlink.service.MethodNotFound"
        assert srv.handler.calls == []
        desc = client.call(
            "org.varlink.service.GetInterfaceDescription", {"interface": "dev.boxy.Manager"}
        )
        assert desc["description"] == interface_description()


def test_fds_reach_the_handler_and_untaken_ones_are_closed() -> None:
    with ServerThread() as srv, Client.connect(srv.address) as client:
        r, w = os.pipe()
        client.call(M + "Attach", {"id": "s1"}, fds=[w])
        os.close(w)
        assert os.read(r, 10) == b"hi"
        assert pipe_eof_within(r, 5)  # the handler closed what it took
        os.close(r)

        r, w = os.pipe()
        client.call(M + "Stop", {"id": "s1", "kill": False}, fds=[w])
        os.close(w)
        assert pipe_eof_within(r, 5), "the server kept an fd the handler did not take"
        os.close(r)


def test_oneway_from_a_signal_handler_is_delivered_while_a_stream_is_in_progress() -> None:
    with ServerThread() as srv, Client.connect(srv.address) as client:
        replies = client.stream(M + "Run", RUN, fds=())
        assert next(replies) == {"id": "s1", "state": "running"}
        sent: list[bool] = []

        def on_alarm(_sig: int, _frame: object) -> None:
            sent.append(client.send_oneway(M + "Resize", {"id": "s1", "rows": 33, "cols": 99}))

        previous = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            final = next(replies)  # blocked in recv when SIGALRM arrives
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert sent == [True]
        assert final == {"id": "s1", "exit_status": 0, "size": [33, 99]}
        assert list(replies) == []


class InterruptedClient(Client):
    """A client whose send is interrupted half-way, as a signal handler would do."""

    interrupted = False

    def _send_now(self, data: bytes, fds: Any) -> None:
        half = len(data) // 2
        self._sock.sendall(data[:half])
        if not self.interrupted:
            self.interrupted = True
            self.send_oneway(M + "Resize", {"id": "s1", "rows": 5, "cols": 6})
        self._sock.sendall(data[half:])


def test_oneway_sent_in_the_middle_of_another_send_does_not_interleave() -> None:
    with ServerThread() as srv:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(srv.address)
        with InterruptedClient(sock) as client:
            assert client.call(M + "Version", {})["build"] == "b1"
            assert srv.wait(lambda h: h.resized)
            assert srv.handler.size == (5, 6)


def test_closing_the_client_sets_connection_closed() -> None:
    with ServerThread() as srv:
        client = Client.connect(srv.address)
        assert next(client.stream(M + "Watch", {})) == {"event": {"n": 0}}
        client.close()
        assert srv.wait(lambda h: h.closed_seen)


# --- server protocol enforcement, raw sockets on the server's own loop ----------------


@asynccontextmanager
async def serving(handler: Callable[[Call], Any], **kw: Any) -> AsyncIterator[str]:
    addr = address()
    server = VarlinkServer(handler, **kw)
    task = asyncio.create_task(server.serve(listener(addr)))
    try:
        yield addr
    finally:
        server.close()
        await asyncio.wait_for(task, 5)


async def raw_connect(addr: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, addr)
    return sock


async def dropped(sock: socket.socket, timeout: float = 5) -> bool:
    """True once the server has closed SOCK (EOF or reset), reading what it sent."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 65536), deadline - loop.time())
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        if not data:
            return True
    return False


async def test_frames_sent_in_one_write_arrive_as_streamed_replies() -> None:
    async def handler(call: Call) -> None:
        if not call.more:  # framed replies continue a stream: refused without "more"
            with pytest.raises(ValueError):
                call.send_frames([encode_reply({"n": 0}, continues=True)])
            await call.reply({"n": -1})
            return
        call.send_frames([encode_reply({"n": i}, continues=True) for i in range(3)])
        await call.reply({"n": 3})
        with pytest.raises(RuntimeError):  # nothing after the last reply
            call.send_frames([encode_reply({"n": 4}, continues=True)])

    async with serving(handler, methods={M + "Version", M + "Watch"}) as addr:
        reader, writer = await asyncio.open_unix_connection(addr)
        writer.write(encode({"method": M + "Watch", "parameters": {}, "more": True}))
        writer.write(encode({"method": M + "Version", "parameters": {}}))
        got = [json.loads((await reader.readuntil(b"\0"))[:-1]) for _ in range(5)]
        writer.close()
    assert got == [{"parameters": {"n": i}, "continues": True} for i in range(3)] + [
        {"parameters": {"n": 3}},
        {"parameters": {"n": -1}},
    ]


async def test_oversize_message_drops_the_connection() -> None:
    calls: list[Call] = []

    async def handler(call: Call) -> None:
        calls.append(call)

    async with serving(handler) as addr:
        sock = await raw_connect(addr)
        loop = asyncio.get_running_loop()
        # The server may drop us while we are still sending.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await loop.sock_sendall(sock, b'{"method":"' + b"x" * (MAX_MESSAGE + 16))
        assert await dropped(sock)
        sock.close()
    assert calls == []


@pytest.mark.parametrize("raw", [b"{not json}\0", b'{"method": 5}\0', b"[]\0"])
async def test_malformed_message_drops_the_connection(raw: bytes) -> None:
    async def handler(call: Call) -> None:
        raise AssertionError("dispatched a malformed call")

    async with serving(handler) as addr:
        sock = await raw_connect(addr)
        await asyncio.get_running_loop().sock_sendall(sock, raw)
        assert await dropped(sock)
        sock.close()


async def test_too_many_fds_drop_the_connection_and_leak_nothing() -> None:
    async def handler(call: Call) -> None:
        raise AssertionError("dispatched a call with too many fds")

    async with serving(handler) as addr:
        sock = await raw_connect(addr)
        before = open_fd_count()
        pipes = [os.pipe() for _ in range(5)]
        fds = [fd for p in pipes for fd in p][: MAX_FDS + 1]
        sock.sendmsg(
            [encode({"method": M + "Run", "parameters": {}})],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
        )
        for p in pipes:
            for fd in p:
                os.close(fd)
        assert await dropped(sock)
        sock.close()
        await asyncio.sleep(0)
        assert open_fd_count() == before - 1  # our socket; the server kept none


async def test_a_client_that_stops_reading_is_dropped_without_blocking_the_server() -> None:
    closed = asyncio.Event()
    written = 0

    async def handler(call: Call) -> None:
        nonlocal written
        if call.method == M + "Version":
            await call.reply({"build": "b", "version": "v"})
            return
        chunk = {"event": {"data": "e" * 65536}}
        while not call.connection_closed.is_set():
            await call.reply(chunk, continues=True)
            written += 65536
            await asyncio.sleep(0)
        closed.set()

    async with serving(handler, max_write_buffer=4 << 20) as addr:
        stuck = await raw_connect(addr)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(stuck, encode({"method": M + "Watch", "more": True}))
        await asyncio.wait_for(closed.wait(), 10)
        assert written > 4 << 20
        # The loop is still serving others.
        other = await asyncio.to_thread(Client.connect, addr)
        assert (await asyncio.to_thread(other.call, M + "Version", {}))["build"] == "b"
        other.close()
        stuck.close()


# --- peer credentials (needs root to become another uid) -----------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch uid")
NOBODY = 65534


@needs_root
async def test_server_refuses_a_peer_with_another_uid() -> None:
    calls: list[Call] = []

    async def handler(call: Call) -> None:
        calls.append(call)
        await call.reply({"build": "b", "version": "v"})

    script = (
        "import os, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.connect('\\0' + sys.argv[1])\n"
        "s.settimeout(5)\n"
        "try:\n"
        "    s.sendall(sys.argv[2].encode() + b'\\0')\n"
        "    data = s.recv(100)\n"
        "except (BrokenPipeError, ConnectionResetError):  # dropped before or after the send\n"
        "    data = b''\n"
        "print(os.getuid(), 'EOF' if data == b'' else repr(data))\n"
    )
    async with serving(handler) as addr:
        call = json.dumps({"method": M + "Version", "parameters": {}})
        proc = await asyncio.create_subprocess_exec(
            "/usr/bin/python3",
            "-c",
            script,
            addr[1:],  # argv cannot hold the abstract address's NUL
            call,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            stdout=subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
        # The same call from our own uid is answered, so the refusal is about the uid.
        own = await asyncio.to_thread(Client.connect, addr)
        assert (await asyncio.to_thread(own.call, M + "Version", {}))["build"] == "b"
        own.close()
    assert out.decode().split() == [str(NOBODY), "EOF"]
    assert len(calls) == 1


@needs_root
def test_client_refuses_a_server_with_another_uid() -> None:
    addr = address()
    script = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind('\\0' + sys.argv[1]); s.listen(1)\n"
        "print('ready', flush=True)\n"
        "c, _ = s.accept(); time.sleep(5)\n"
    )
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-c", script, addr[1:]],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        with pytest.raises(DaemonError, match=f"uid {NOBODY}, not by you"):
            Client.connect(addr)
    finally:
        proc.kill()
        proc.wait()


def test_connect_failure_is_a_daemon_error_with_errno() -> None:
    from boxy.varlink import DaemonUnavailable

    with pytest.raises(DaemonUnavailable) as err:
        Client.connect(address())
    assert err.value.errno == errno.ECONNREFUSED


def test_client_imports_no_asyncio() -> None:
    code = "import sys, boxy.varlink, boxyctl.tty; print('asyncio' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "False"


def test_stream_ends_at_the_first_reply_without_continues() -> None:
    with ServerThread() as srv, Client.connect(srv.address) as client:
        r = client.stream(M + "Run", RUN)
        next(r)
        assert client.send_oneway(M + "Resize", {"id": "s1", "rows": 1, "cols": 2})
        # the end once the resize came (without it: a Busy error after the server's 5 s)
        assert [x.get("exit_status") for x in r] == [0]


# --- a streaming call owns its connection (docs/design.md, "The front door") ---------

STREAMS = (M + "Run", M + "Attach", M + "Watch")


def _ended(client: Client) -> bool:
    """The server has closed CLIENT's connection (EOF or a reset)."""
    client._sock.settimeout(5)
    try:
        return client._sock.recv(1 << 16) == b"" or _ended(client)
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("oneway", [True, False])
def test_a_call_on_a_streaming_connection_ends_it(oneway: bool) -> None:
    """What a payload that inherited boxyctl's connection would send: a second call
    on it, oneway or not, ends the connection, and the stream's handler sees it go."""
    with ServerThread(STREAMS) as srv, Client.connect(srv.address) as client:
        replies = client.stream(M + "Run", RUN)
        assert next(replies) == {"id": "s1", "state": "running"}
        msg = {"method": M + "Resize", "parameters": {"id": "s1", "rows": 3, "cols": 4}}
        client._sock.sendall(encode({**msg, "oneway": True} if oneway else msg))
        assert srv.wait(lambda h: h.closed_seen)
        assert _ended(client)
        assert srv.handler.size is None  # the Resize never ran
        assert srv.handler.calls == ["Run"]


def test_a_call_in_the_same_write_as_the_stream_ends_it() -> None:
    with ServerThread(STREAMS) as srv, Client.connect(srv.address) as client:
        stop = {"method": M + "Stop", "parameters": {"id": "s1", "kill": True}}
        run = {"method": M + "Run", "parameters": RUN, "more": True}
        client._sock.sendall(encode(run) + encode(stop))
        assert _ended(client)
        assert srv.handler.calls == []  # the Run had not started: neither runs


def test_a_streaming_method_called_oneway_ends_the_connection() -> None:
    with ServerThread(STREAMS) as srv, Client.connect(srv.address) as client:
        client._sock.sendall(encode({"method": M + "Run", "parameters": RUN, "oneway": True}))
        assert _ended(client)
        assert srv.handler.calls == []


def test_after_the_streams_last_reply_the_connection_takes_calls_again() -> None:
    """A Run refused at once (another build) is followed by Shutdown on the same
    connection (boxy.client.with_retries): the stream no longer owns it."""
    with ServerThread(STREAMS) as srv, Client.connect(srv.address) as client:
        replies = client.stream(M + "Run", RUN)
        assert next(replies) == {"id": "s1", "state": "running"}
        with Client.connect(srv.address) as controls:  # Resize on a connection of its own
            assert controls.send_oneway(M + "Resize", {"id": "s1", "rows": 7, "cols": 8})
            assert [x.get("size") for x in replies] == [[7, 8]]
        assert client.call(M + "Version", {})["build"] == "b1"


def test_a_server_without_exclusive_methods_takes_oneway_calls_beside_a_stream() -> None:
    """The rule is the server's EXCLUSIVE list (boxyd passes api.service.STREAMS)."""
    with ServerThread() as srv, Client.connect(srv.address) as client:
        replies = client.stream(M + "Run", RUN)
        next(replies)
        assert client.send_oneway(M + "Resize", {"id": "s1", "rows": 1, "cols": 2})
        assert [x.get("exit_status") for x in replies] == [0]
