"""Run the servers of one netns of the test internet, until killed.

    python -m tests.harness.fakenet.serve --role net|host --state DIR

`net` (the fake internet): the authoritative DNS server, every public server and
the recorders placed there; `host` (the netns boxyd runs in): the recorders for
that netns's loopback services and own interface address. The topology starts
this inside the right netns (run it with -m: this package has a `dns` module).
Everything is bound before DIR/ready-ROLE appears; one thread accepts and reads
datagrams, each TCP connection gets its own thread.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import selectors
import socket
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

from . import plan, recorder, web
from .dns import Authority, sentinel_answer
from .dns import Server as DnsServer
from .events import LineLog, Peer

QUERY_LOG = "dns-queries.log"
SERVER_LOG = "servers.jsonl"
RECORDER_LOG = "recorders.jsonl"

TcpHandler = Callable[[socket.socket, Peer], None]
UdpHandler = Callable[[socket.socket, bytes, Peer], None]
Listener = tuple[socket.socket, str, Callable[..., None]]


def _bind(addr: str, port: int, proto: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        s.bind((addr, port))
    except OSError as e:
        s.close()
        raise OSError(e.errno, f"cannot bind {proto} {addr} port {port}: {e.strerror}") from e
    if proto == "tcp":
        s.listen(4096)
    s.setblocking(False)
    return s


def _recorders(role: str, log: LineLog, qlog: LineLog) -> list[Listener]:
    out: list[Listener] = []
    for rec in plan.RECORDERS:
        if rec.where != role:
            continue
        dns = (
            DnsServer(qlog, functools.partial(sentinel_answer, who=rec.name), rec.name)
            if rec.dns
            else None
        )
        for addr in rec.addrs:
            for proto, ports, fn in (
                ("tcp", rec.tcp, recorder.on_tcp),
                ("udp", rec.udp, recorder.on_udp),
            ):
                for port in ports:
                    spot = recorder.Spot(rec.name, addr, port)
                    out.append(
                        (
                            _bind(addr, port, proto),
                            proto,
                            functools.partial(fn, spot=spot, log=log, dns=dns),
                        )
                    )
    return out


def _public(state: Path, log: LineLog, qlog: LineLog) -> list[Listener]:
    out: list[Listener] = []
    auth = DnsServer(qlog, Authority().answer, "auth")
    for addr in (plan.RESOLVER_V4, plan.RESOLVER_V6):
        out.append((_bind(addr, 53, "tcp"), "tcp", auth.on_stream))
        out.append((_bind(addr, 53, "udp"), "udp", auth.on_datagram))
    certs = web.Certs(state)
    for srv in plan.SERVERS:
        for addr in srv.addrs:
            for port, tls in [(p, False) for p in plan.HTTP_PORTS] + [
                (p, True) for p in plan.HTTPS_PORTS
            ]:
                ep = web.Endpoint(srv.name, addr, port, tls)
                out.append(
                    (
                        _bind(addr, port, "tcp"),
                        "tcp",
                        functools.partial(web.serve_http, ep=ep, log=log, certs=certs),
                    )
                )
            ep = web.Endpoint(srv.name, addr, plan.BANNER_PORT, False)
            out.append(
                (
                    _bind(addr, plan.BANNER_PORT, "tcp"),
                    "tcp",
                    functools.partial(web.serve_banner, ep=ep, log=log),
                )
            )
            for port in plan.UDP_ECHO_PORTS:
                ep = web.Endpoint(srv.name, addr, port, False)
                out.append(
                    (
                        _bind(addr, port, "udp"),
                        "udp",
                        functools.partial(web.on_udp_echo, ep=ep, log=log),
                    )
                )
    return out


def _serve(listeners: list[Listener]) -> None:
    sel = selectors.DefaultSelector()
    for sock, proto, fn in listeners:
        sel.register(sock, selectors.EVENT_READ, (proto, fn))
    while True:
        for key, _ in sel.select():
            proto, fn = key.data
            sock = cast(socket.socket, key.fileobj)
            while True:
                try:
                    if proto == "tcp":
                        conn, peer = sock.accept()
                    else:
                        data, peer = sock.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # EMFILE, ECONNABORTED...: try again on the next wakeup
                    break
                if proto == "tcp":
                    conn.setblocking(True)
                    threading.Thread(target=fn, args=(conn, peer), daemon=True).start()
                else:
                    try:
                        fn(sock, data, peer)
                    except OSError:
                        pass
                    except Exception:  # a bug in one handler must not stop every server
                        traceback.print_exc()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=("net", "host"), required=True)
    ap.add_argument("--state", type=Path, required=True)
    args = ap.parse_args(argv)
    # Floods and many parallel connections: plenty of fds, small thread stacks.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 << 10)
    state: Path = args.state
    log = LineLog(state / (SERVER_LOG if args.role == "net" else RECORDER_LOG))
    rlog = LineLog(state / RECORDER_LOG) if args.role == "net" else log
    qlog = LineLog(state / QUERY_LOG)
    listeners = _recorders(args.role, rlog, qlog)
    if args.role == "net":
        listeners += _public(state, log, qlog)
    ready = state / f"ready-{args.role}"
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    tmp.rename(ready)
    _serve(listeners)


if __name__ == "__main__":
    main()
