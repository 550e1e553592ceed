#!/usr/bin/env python3
"""What any relay that ends both TCP connections costs on this machine, beside boxyd's
pump: the floor under issue #18's gateway targets (docs/design.md, "Relay").

On loopback, three processes (client, relay, server) on the machine's cores, in one
run, cases interleaved round by round:

- short connections: COUNT sequential request/response connections (the client
  connects, sends a request, reads the answer to the server's EOF, closes), made
  directly, through a *minimal relay* (blocking sockets, one connection at a time:
  accept, read the request, dial, pass both ways, close; no policy, no events: the
  least such a relay can do); connections/s against direct and the relay's CPU per
  connection (getrusage: its own process only, the kernel's work on its sockets
  included). boxyd's own figures are bench/net.py's (its accept, dial and policy
  are the gateway's, in network namespaces);
- bulk: one SIZE download, direct, through a minimal relay (blocking splice) and
  through the pump (`bench/relay.py` measures the pump's modes).

The kernel runs both TCP connections' set-up, teardown and delivery in the relay's
own context (a send's softirq processes the receiver's side too), so the minimal
relay's CPU is mostly the kernel's: what no change to boxyd's Python can remove.
Loopback only. `.venv/bin/python bench/relayfloor.py [--conns 3000] [--size-mib 2048]
[-n 3] [--json]`.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import resource
import socket
import statistics
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.relay import _listener, _start, run_once  # noqa: E402
from bench.table import Figure, emit  # noqa: E402
from boxyd.net.relay import PIPE_SIZE  # noqa: E402

REQUEST = b"GET / HTTP/1.1\r\nHost: floor\r\nConnection: close\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
_F_SETPIPE_SZ = 1031


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _answer_forever(listener: socket.socket, _out: Connection) -> None:
    while True:
        c, _ = listener.accept()
        c.recv(4096)
        c.sendall(ANSWER)
        c.shutdown(socket.SHUT_WR)
        while c.recv(4096):
            pass
        c.close()


def _connect_loop(port: int, count: int, out: Connection) -> None:
    t0 = time.perf_counter()
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(REQUEST)
        while s.recv(65536):
            pass
        s.close()
    out.send(count / (time.perf_counter() - t0))


def _minimal_conns(listener: socket.socket, upstream: tuple[str, int], count: int) -> None:
    for _ in range(count):
        a, _ = listener.accept()
        first = a.recv(16384)
        b = socket.create_connection(upstream)
        b.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        b.sendall(first)
        while data := b.recv(65536):
            a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        while a.recv(65536):
            pass
        b.close()
        a.close()


def conns_once(count: int, relay: bool) -> tuple[float, float]:
    """Connections/s through a minimal relay (RELAY) or directly, and the relay's CPU
    per connection."""
    server_l = _listener()
    upstream = server_l.getsockname()
    server, _ = _start(_answer_forever, server_l)
    server_l.close()
    listener = _listener() if relay else None
    port = listener.getsockname()[1] if listener else upstream[1]
    client, out = _start(_connect_loop, port, count)
    cpu0 = _cpu()
    if listener is not None:
        _minimal_conns(listener, upstream, count)
    cpu = _cpu() - cpu0
    rate = out.recv()
    client.join()
    server.kill()
    if listener is not None:
        listener.close()
    return rate, cpu / count


def _download(port: int, total: int, out: Connection) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    buf = memoryview(bytearray(1 << 20))
    got = 0
    while n := sock.recv_into(buf):
        got += n
    out.send(got)
    sock.close()


def _send_forever(listener: socket.socket, total: int, _out: Connection) -> None:
    block = os.urandom(1 << 20)
    while True:
        c, _ = listener.accept()
        left = total
        while left:
            left -= c.send(block[: min(left, len(block))])
        c.close()


def _splice_down(a: socket.socket, b: socket.socket) -> None:
    """B's bytes to A through a pipe, blocking, until B's EOF."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_SIZE)
        while n := os.splice(b.fileno(), w, PIPE_SIZE, flags=os.SPLICE_F_MOVE):
            while n:
                n -= os.splice(r, a.fileno(), n, flags=os.SPLICE_F_MOVE)
    finally:
        os.close(r)
        os.close(w)


def bulk_minimal(total: int) -> tuple[float, float]:
    """Seconds for TOTAL bytes down through a minimal splice relay, and its CPU."""
    server_l = _listener()
    upstream = server_l.getsockname()
    server, _ = _start(_send_forever, server_l, total)
    server_l.close()
    listener = _listener()
    t0, cpu0 = time.perf_counter(), _cpu()
    client, out = _start(_download, listener.getsockname()[1], total)
    a, _ = listener.accept()
    b = socket.create_connection(upstream)
    _splice_down(a, b)
    a.shutdown(socket.SHUT_WR)
    got = out.recv()
    elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
    for s in (a, b, listener):
        s.close()
    client.join()
    server.kill()
    if got != total:
        raise SystemExit(f"bulk: {got} of {total} bytes")
    return elapsed, cpu


def _median_rounds(
    n: int, cases: dict[str, Callable[[], tuple[float, float]]]
) -> dict[str, tuple[float, float]]:
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(n):  # interleaved: drift hits every case alike
        for k, case in cases.items():
            runs[k].append(case())
    return {
        k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v))
        for k, v in runs.items()
    }


def conns_figures(count: int, n: int, say: Callable[[str], None]) -> list[Figure]:
    c = _median_rounds(
        n, {"direct": lambda: conns_once(count, False), "minimal": lambda: conns_once(count, True)}
    )
    (direct, _), (rate, cpu) = c["direct"], c["minimal"]
    say(
        f"short connections: minimal relay {rate:.0f}/s ({rate / direct:.2f}x direct "
        f"{direct:.0f}/s), relay CPU {cpu * 1000:.3f} ms/connection"
    )
    return [
        Figure("relay floor", "connections/s, minimal relay", rate, "/s", rate / direct,
               "information", True),
        Figure("relay floor", "relay CPU per connection, minimal", cpu * 1000, "ms", None,
               "information", True),
    ]  # fmt: skip


def bulk_figures(total: int, n: int, say: Callable[[str], None]) -> list[Figure]:
    b = _median_rounds(
        n,
        {
            "direct": lambda: run_once(total, False, None),
            "minimal": lambda: bulk_minimal(total),
            "pump": lambda: run_once(total, False, "auto"),
        },
    )
    figures = []
    for k in ("minimal", "pump"):
        secs, cpu = b[k]
        ratio, gbps = b["direct"][0] / secs, total * 8 / secs / 1e9
        say(
            f"bulk {total >> 20} MiB, {k} relay: {gbps:.2f} Gbit/s ({ratio:.2f}x direct), "
            f"relay CPU {cpu / (total / 1e9):.3f} s/GB"
        )
        figures.append(
            Figure("relay floor", f"bulk, {k} relay", gbps, "Gbit/s", ratio, "information", True)
        )
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", type=int, default=3000, help="sequential connections per case")
    ap.add_argument("--size-mib", type=int, default=2048, help="bytes per bulk download")
    ap.add_argument("-n", type=int, default=3, help="rounds (medians reported)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    a = ap.parse_args()
    say: Callable[[str], None] = (lambda s: print(s, file=sys.stderr)) if a.json else print
    say(f"loopback, {os.cpu_count()} CPUs, median of {a.n} interleaved rounds")
    figures = conns_figures(a.conns, a.n, say) + bulk_figures(a.size_mib << 20, a.n, say)
    emit(figures, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
