"""The public servers: HTTP, HTTPS (SNI-selected test certificates), a server-first
banner protocol and UDP echo.

Every response body is JSON naming the server, the local address and port that
were reached, the Host header and SNI seen, so a test can tell exactly where its
connection landed. Paths:

  /                   identity JSON
  /redirect?to=NAME   302 to the same scheme and port on NAME (default www.boxy.test)
  /big, /big.sha256   plan.BIG_SIZE deterministic bytes, and their SHA-256 (hex)
  /bytes?n=N          the first N bytes of the same stream
  /slow?secs=S        one byte every 100 ms for S seconds (long-lived connections)
  POST anything       {"received": length, "sha256": ...} of the request body
  /npm/, /simple/, /packages/, /repo.git/   a package registry and git host that
                      take one token alone (registry.py)

On the "redirect" server every GET is a 302 to the same path on www.boxy.test.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from . import plan, registry
from .events import LineLog, Peer, peer_text

CHUNK = 1 << 20
IDLE = 60.0  # seconds a connection may sit idle (keeps threads from piling up)


class _BigStream:
    """Deterministic bytes: a 1 MiB pseudo-random block, each MiB stamped with its index."""

    def __init__(self) -> None:
        self._block = random.Random(0xB0C5).randbytes(CHUNK)
        self._sha: dict[int, str] = {}
        self._lock = threading.Lock()

    def chunks(self, n: int) -> Iterator[memoryview]:
        i = 0
        while n > 0:
            chunk = i.to_bytes(8, "big") + self._block[8:]
            yield memoryview(chunk)[: min(n, CHUNK)]
            n -= CHUNK
            i += 1

    def sha256(self, n: int) -> str:
        with self._lock:
            if n not in self._sha:
                h = hashlib.sha256()
                for c in self.chunks(n):
                    h.update(c)
                self._sha[n] = h.hexdigest()
            return self._sha[n]


BIG = _BigStream()


@dataclass(frozen=True)
class Endpoint:
    """One listening address of a public server."""

    server: str
    addr: str
    port: int
    tls: bool


class Certs:
    """Server TLS contexts, chosen by SNI; the SNI seen is left on the socket."""

    def __init__(self, state: Path) -> None:
        self.by_label: dict[str, ssl.SSLContext] = {}
        for label in plan.CERTS:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(state / f"{label}.pem", state / f"{label}.key")
            ctx.set_alpn_protocols(["http/1.1"])
            self.by_label[label] = ctx
        self.by_name = {
            name: self.by_label[label]
            for label, names in plan.CERTS.items()
            if label != "main"
            for name in names
        }
        self.main = self.by_label["main"]
        self.main.sni_callback = self._pick

    def _pick(
        self, sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        sock.boxyt_sni = name  # type: ignore[union-attr]  # our own, read by serve_http()
        alt = self.by_name.get(name or "")
        if alt is not None:
            sock.context = alt


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "boxyt"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stalls
    timeout = IDLE

    server: _Conn  # type: ignore[assignment]  # what serve_http() passes for "server"

    @property
    def ep(self) -> Endpoint:
        return self.server.ep

    @property
    def sni(self) -> str | None:
        return self.server.sni

    @property
    def log(self) -> LineLog:
        return self.server.log

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # events go to the JSON log instead

    def _identity(self, **extra: object) -> dict[str, object]:
        return {
            "server": self.ep.server,
            "addr": self.ep.addr,
            "port": self.ep.port,
            "family": 6 if ":" in self.ep.addr else 4,
            "tls": self.ep.tls,
            "sni": self.sni,
            "host": self.headers.get("Host"),
            "method": self.command,
            "path": self.path,
            "peer": peer_text(self.client_address),
            **extra,
        }

    def _send(
        self,
        code: int,
        body: bytes,
        ctype: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int = 200, **extra: object) -> None:
        self._send(code, json.dumps(self._identity(**extra)).encode() + b"\n")

    def _record(self) -> None:
        self.log.event(
            kind="http",
            server=self.ep.server,
            addr=self.ep.addr,
            port=self.ep.port,
            tls=self.ep.tls,
            sni=self.sni,
            host=self.headers.get("Host"),
            method=self.command,
            path=self.path,
            peer=peer_text(self.client_address),
            # /record… and the registry's: what a request to a secret's host carried
            # (--secret NAME@HOST)
            **(
                {"authorization": self.headers.get("Authorization")}
                if self.path.startswith(("/record", *registry.PREFIXES))
                else {}
            ),
        )

    def _redirect(self, host: str, path: str) -> None:
        scheme = "https" if self.ep.tls else "http"
        default = 443 if self.ep.tls else 80
        port = "" if self.ep.port == default else f":{self.ep.port}"
        self._send(302, b"", "text/plain", {"Location": f"{scheme}://{host}{port}{path}"})

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        self._record()
        url = urlsplit(self.path)
        qs = parse_qs(url.query)
        served = registry.reply(url.path, self.headers.get("Authorization"))
        if served is not None:
            code, ctype, body, headers = served
            self._send(code, body, ctype, headers)
        elif self.ep.server == "redirect":
            self._redirect(plan.fqdn("www"), self.path)
        elif url.path == "/redirect":
            self._redirect(qs.get("to", [plan.fqdn("www")])[0], "/")
        elif url.path == "/big":
            self._stream(plan.BIG_SIZE)
        elif url.path == "/big.sha256":
            self._send(200, (BIG.sha256(plan.BIG_SIZE) + "\n").encode(), "text/plain")
        elif url.path == "/bytes":
            self._stream(int(qs.get("n", ["0"])[0]))
        elif url.path == "/slow":
            self._slow(float(qs.get("secs", ["10"])[0]))
        else:
            self._json()

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        left = int(self.headers.get("Content-Length") or 0)
        h, total = hashlib.sha256(), 0
        while left > 0:
            data = self.rfile.read(min(left, CHUNK))
            if not data:
                break
            h.update(data)
            total += len(data)
            left -= len(data)
        self._json(received=total, sha256=h.hexdigest())

    def _stream(self, n: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.command != "HEAD":
            for c in BIG.chunks(n):
                self.wfile.write(c)

    def _slow(self, secs: float) -> None:
        n = max(1, int(secs * 10))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        for _ in range(n):
            self.wfile.write(b".")
            time.sleep(0.1)


@dataclass
class _Conn:
    """Per-connection facts, handed to the handler where socketserver passes its server."""

    ep: Endpoint
    sni: str | None
    log: LineLog


def serve_http(
    conn: socket.socket, peer: Peer, ep: Endpoint, log: LineLog, certs: Certs | None
) -> None:
    """Serve HTTP (or HTTPS, with the handshake done here, off the accept loop) on CONN."""
    conn.settimeout(IDLE)
    log.event(
        kind="accept",
        server=ep.server,
        addr=ep.addr,
        port=ep.port,
        tls=ep.tls,
        peer=peer_text(peer),
    )
    sock: socket.socket = conn
    try:
        if ep.tls and certs is not None:
            sock = certs.main.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            sock.do_handshake()
        # _Conn stands in for the socketserver the handler expects
        _Handler(sock, peer, _Conn(ep, getattr(sock, "boxyt_sni", None), log))  # type: ignore[arg-type]
    except ssl.SSLError as e:
        log.event(
            kind="tls-error",
            server=ep.server,
            addr=ep.addr,
            port=ep.port,
            sni=getattr(sock, "boxyt_sni", None),
            error=str(e),
            peer=peer_text(peer),
        )
    except OSError:
        pass
    finally:
        sock.close()


def serve_banner(conn: socket.socket, peer: Peer, ep: Endpoint, log: LineLog) -> None:
    """Server speaks first (like SSH): a banner line on accept, then echo lines back."""
    conn.settimeout(IDLE)
    log.event(kind="banner", server=ep.server, addr=ep.addr, port=ep.port, peer=peer_text(peer))
    with conn:
        try:
            conn.sendall(f"SSH-2.0-boxyt_{ep.server}\r\n".encode())
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass


def on_udp_echo(sock: socket.socket, data: bytes, peer: Peer, ep: Endpoint, log: LineLog) -> None:
    log.event(
        kind="udp",
        server=ep.server,
        addr=ep.addr,
        port=ep.port,
        size=len(data),
        peer=peer_text(peer),
    )
    sock.sendto(data, peer)
