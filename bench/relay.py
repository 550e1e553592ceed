#!/usr/bin/env python3
"""Throughput of the gateway's byte pump: a bulk loopback transfer made directly and
through `boxyd.net.relay.pump`, printed as a ratio, with the CPU the relaying
process spends per GB (getrusage of this process, which runs only the relay).

The sender and the receiver are forked processes doing plain blocking I/O, so
the relayed case has one more process on the same cores, like the real gateway.
Mode `scan` is a flow in a run with a secret bound to a host (`--secret NAME@HOST`):
every byte sent up is copied and searched for the placeholders of three secrets
(docs/design.md, "Secrets"); down it is `auto`.

Loopback only. Usage: `.venv/bin/python bench/relay.py [--size-mib 2048] [-n 3]
[--mode auto|copy|splice|scan|all] [--direction up|down|both]`.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from boxyd.net import relay as relay_mod  # noqa: E402
from boxyd.net.hostsecrets import HostSecrets, make  # noqa: E402
from boxyd.net.relay import Counters, Flow  # noqa: E402

CHUNK = 1024 * 1024
_fork = multiprocessing.get_context("fork")


def _send(sock: socket.socket, total: int) -> None:
    block = os.urandom(CHUNK)
    left = total
    while left:
        n = min(left, CHUNK)
        sock.sendall(block[:n] if n < CHUNK else block)
        left -= n
    sock.shutdown(socket.SHUT_WR)
    while sock.recv(65536):  # wait for the peer's EOF, so the flow ends cleanly
        pass


def _receive(sock: socket.socket) -> int:
    buf = memoryview(bytearray(CHUNK))
    got = 0
    while n := sock.recv_into(buf):
        got += n
    sock.shutdown(socket.SHUT_WR)
    return got


def _server(listener: socket.socket, total: int, sending: bool, out: Connection) -> None:
    conn, _ = listener.accept()
    listener.close()
    if sending:
        _send(conn, total)
        out.send(total)
    else:
        out.send(_receive(conn))
    conn.close()


def _client(port: int, total: int, sending: bool, out: Connection) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    if sending:
        _send(sock, total)
        out.send(total)
    else:
        out.send(_receive(sock))
    sock.close()


def _listener() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


def _start(target, *args) -> tuple[multiprocessing.process.BaseProcess, Connection]:
    r, w = _fork.Pipe(duplex=False)
    p = _fork.Process(target=target, args=(*args, w), daemon=True)
    p.start()
    w.close()
    return p, r


def _secrets() -> HostSecrets:
    """Three secrets of a GitHub token's shape, as a session binding them holds them."""
    taken: frozenset[str] = frozenset()
    items = []
    for i in range(3):
        value = "ghp_" + os.urandom(18).hex()[:36]
        items.append(make(f"TOKEN{i}", value, ["git.example"], taken))
        taken |= {items[-1].placeholder}
    return HostSecrets(items)


def run_once(total: int, up: bool, mode: str | None) -> tuple[float, float]:
    """Seconds for TOTAL bytes, and this process's CPU seconds (relay only)."""
    server_l = _listener()
    server_addr = server_l.getsockname()
    server, server_out = _start(_server, server_l, total, not up)
    server_l.close()  # the server process holds its own copy
    if mode is None:
        t0 = time.perf_counter()
        client, client_out = _start(_client, server_addr[1], total, up)
        got = (client_out if not up else server_out).recv()
        elapsed = time.perf_counter() - t0
        cpu = 0.0
    else:
        relay_l = _listener()
        relay_l.setblocking(False)

        async def relay() -> tuple[float, float, int]:
            loop = asyncio.get_running_loop()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            client, client_out = _start(_client, relay_l.getsockname()[1], total, up)
            a, _ = await loop.sock_accept(relay_l)
            b = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            b.setblocking(False)
            await loop.sock_connect(b, server_addr)
            counters = Counters()
            scan = _secrets() if mode == "scan" else None
            await Flow(
                a,
                b,
                counters=counters,
                idle_timeout=60,
                mode="auto" if scan else mode,  # type: ignore[arg-type]
                scan=scan.found if scan else None,
                scan_keep=scan.longest - 1 if scan else 0,
            ).run()
            got = (client_out if not up else server_out).recv()
            elapsed = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            assert (counters.up if up else counters.down) == total, counters
            client.join()
            return elapsed, cpu, got

        elapsed, cpu, got = asyncio.run(relay())
        relay_l.close()
    server.join()
    if mode is None:
        client.join()
    if got != total:
        raise SystemExit(f"transfer incomplete: {got} of {total} bytes")
    return elapsed, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("-n", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--mode", choices=["auto", "copy", "splice", "scan", "all"], default="all")
    ap.add_argument("--direction", choices=["up", "down", "both"], default="both")
    ap.add_argument(
        "--pipe-kib", type=int, help=f"splice pipe size (default {relay_mod.PIPE_SIZE >> 10})"
    )
    ap.add_argument(
        "--copy-kib", type=int, help=f"copy buffer (default {relay_mod.COPY_BUFFER >> 10})"
    )
    args = ap.parse_args()
    if args.pipe_kib:
        relay_mod.PIPE_SIZE = args.pipe_kib * 1024
    if args.copy_kib:
        relay_mod.COPY_BUFFER = args.copy_kib * 1024
    total = args.size_mib * 1024 * 1024
    modes = ["auto", "copy", "splice", "scan"] if args.mode == "all" else [args.mode]
    dirs = ["up", "down"] if args.direction == "both" else [args.direction]
    print(
        f"{args.size_mib} MiB per transfer, median of {args.n}, {os.cpu_count()} CPUs, "
        f"pipe {relay_mod.PIPE_SIZE >> 10} KiB, copy buffer {relay_mod.COPY_BUFFER >> 10} KiB"
    )
    for d in dirs:
        up = d == "up"
        direct = statistics.median(run_once(total, up, None)[0] for _ in range(args.n))
        gbps_direct = total * 8 / direct / 1e9
        print(f"[{d:4}] direct        {gbps_direct:6.2f} Gbit/s")
        for mode in modes:
            runs = [run_once(total, up, mode) for _ in range(args.n)]
            elapsed = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            gbps = total * 8 / elapsed / 1e9
            print(
                f"[{d:4}] pump {mode:8} {gbps:6.2f} Gbit/s  ratio {gbps / gbps_direct:4.2f}"
                f"  relay CPU {cpu / (total / 1e9):5.3f} s/GB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
