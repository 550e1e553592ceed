#!/usr/bin/env python3
"""The TLS swap's added time (`--secret NAME@HOST`): HTTPS requests to a loopback server
through the gateway's two paths, in the same run, interleaved by round: the byte
pump (`relay.Flow`: TLS end to end, uninspected) and the terminated connection
(`secretflow.SecretFlow`: the session CA's certificate to the client, TLS again
upstream, each request's header block swapped). Printed: the time per request on a
kept-alive connection and per new connection (handshakes included), and the swapped
path's ratio to the pump's.

The server and the client are threads of their own; the flows run on this process's
event loop, as in boxyd. Loopback only. Usage: `.venv/bin/python bench/secretswap.py
[-n 3] [--requests 2000] [--connections 200]`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from boxyd.net import relay  # noqa: E402
from boxyd.net.secretflow import SecretFlow  # noqa: E402
from boxyd.net.secretswap import Swap  # noqa: E402
from boxyd.net.sessionca import SessionCA  # noqa: E402

HOST = "api.bench.test"
PH, VALUE = "ghp_" + "P" * 36, "ghp_" + "V" * 36
REAL = SessionCA([HOST], label="bench upstream")  # stands for a public CA
SESSION = SessionCA([HOST])
REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
REQUEST = f"GET / HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {PH}\r\n\r\n".encode()


def _serve(listener: socket.socket) -> None:
    ctx = REAL.server_context(HOST)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no delayed-ACK waits
        threading.Thread(target=_one, args=(ctx, conn), daemon=True).start()


def _one(ctx: ssl.SSLContext, conn: socket.socket) -> None:
    try:
        with ctx.wrap_socket(conn, server_side=True) as s:
            buf = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return
                buf += chunk
                while b"\r\n\r\n" in buf:
                    _, _, buf = buf.partition(b"\r\n\r\n")
                    s.sendall(REPLY)
    except (ssl.SSLError, OSError):
        pass


def _dial(port: int) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return raw


def _client(port: int, ca: SessionCA, requests: int, connections: int) -> tuple[float, float]:
    """(seconds per request kept alive, seconds per new connection with one request)."""
    ctx = ssl.create_default_context(cadata=ca.pem().decode())

    def exchange(s: ssl.SSLSocket) -> None:
        s.sendall(REQUEST)
        got = b""
        while not got.endswith(b"ok"):
            got += s.recv(65536)

    raw = _dial(port)
    with ctx.wrap_socket(raw, server_hostname=HOST) as s:
        exchange(s)
        t = time.perf_counter()
        for _ in range(requests):
            exchange(s)
        kept = (time.perf_counter() - t) / requests
    t = time.perf_counter()
    for _ in range(connections):
        with ctx.wrap_socket(_dial(port), server_hostname=HOST) as s:
            exchange(s)
    return kept, (time.perf_counter() - t) / connections


async def _gateway(listener: socket.socket, upstream_port: int, swap: bool) -> None:
    loop = asyncio.get_running_loop()
    verify = ssl.create_default_context(cadata=REAL.pem().decode())
    verify.set_alpn_protocols(["http/1.1"])
    server = SESSION.server_context(HOST)
    while True:
        client, _ = await loop.sock_accept(listener)
        client.setblocking(False)
        up = socket.socket()
        up.setblocking(False)
        await loop.sock_connect(up, ("127.0.0.1", upstream_port))
        for s in (client, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        flow: relay.Flow | SecretFlow
        if swap:
            flow = SecretFlow(
                client, up, b"", HOST, server, verify, Swap({PH: VALUE}, host=HOST), 60.0
            )
        else:
            flow = relay.Flow(client, up, idle_timeout=60.0)
        flow.start(lambda _: None)


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


async def _round(upstream_port: int, swap: bool, n: int, conns: int) -> tuple[float, float]:
    listener = _listener()
    listener.setblocking(False)
    task = asyncio.create_task(_gateway(listener, upstream_port, swap))
    ca = SESSION if swap else REAL
    try:
        return await asyncio.to_thread(_client, listener.getsockname()[1], ca, n, conns)
    finally:
        task.cancel()
        listener.close()


async def main_async(rounds: int, requests: int, connections: int) -> None:
    upstream = _listener()
    threading.Thread(target=_serve, args=(upstream,), daemon=True).start()
    port = upstream.getsockname()[1]
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(rounds):
        for swap in (False, True):
            got[swap].append(await _round(port, swap, requests, connections))
    for i, what in ((0, "per request, kept alive"), (1, "per new connection")):
        pump = statistics.median(r[i] for r in got[False]) * 1000
        swapped = statistics.median(r[i] for r in got[True]) * 1000
        print(
            f"{what}: uninspected {pump:.3f} ms, swapped {swapped:.3f} ms "
            f"(+{swapped - pump:.3f} ms, {swapped / pump:.2f}x)"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=3, help="rounds, each path once per round")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--connections", type=int, default=200)
    a = p.parse_args()
    asyncio.run(main_async(a.n, a.requests, a.connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
