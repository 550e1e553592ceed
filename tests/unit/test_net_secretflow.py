"""boxyd.net.secretflow: a payload's TLS to a secret's host ends in boxyd with the
session CA's certificate; upstream is verified; the server gets the value in every
request of a kept-alive connection, the payload only ever the placeholder; what the
swap cannot read is cut; an upstream with a certificate not trusted is cut."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

from boxyd.net import relay
from boxyd.net.secretflow import SecretFlow
from boxyd.net.secretswap import Swap
from boxyd.net.sessionca import SessionCA

HOST = "api.boxy.test"
PH, VALUE = "ghp_PLACEHOLDERxxxxxxxxxxxxxxxxxxxxxxxx", "ghp_REALVALUEyyyyyyyyyyyyyyyyyyyyyyyyyy"
REAL_CA = SessionCA([HOST], label="the test internet")  # stands for a public CA


def _server(sock: socket.socket, seen: list[bytes], replies: int) -> None:
    ctx = REAL_CA.server_context(HOST)
    try:
        with ctx.wrap_socket(sock, server_side=True) as s:
            buf = b""
            for _ in range(replies):
                while b"\r\n\r\n" not in buf:
                    chunk = s.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                seen.append(head)
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            # until the client's end has come through: closing with its close_notify
            # unread would reset the connection under the last reply (a test's race)
            while s.recv(65536):
                pass
    except (ssl.SSLError, OSError) as e:
        seen.append(f"error {e}".encode())


def _payload(sock: socket.socket, ca: SessionCA, requests: list[bytes], got: list[bytes]) -> None:
    ctx = ssl.create_default_context(cadata=ca.pem().decode())
    try:
        with ctx.wrap_socket(sock, server_hostname=HOST) as s:
            got.append(s.getpeercert(binary_form=True) or b"")
            for req in requests:
                s.sendall(req)
                data = b""
                while not data.endswith(b"ok"):
                    chunk = s.recv(65536)
                    if not chunk:
                        got.append(b"closed")
                        return
                    data += chunk
                got.append(data)
    except (ssl.SSLError, OSError) as e:
        got.append(f"error {e}".encode())


async def _flow(requests: list[bytes], *, verify_ca: SessionCA = REAL_CA) -> tuple[
    SecretFlow, list[bytes], list[bytes], relay.CloseReason
]:  # fmt: skip
    ca = SessionCA([HOST])
    pay, gw_client = socket.socketpair()
    gw_up, srv = socket.socketpair()
    for s in (gw_client, gw_up):
        s.setblocking(False)
    verify = ssl.create_default_context(cadata=verify_ca.pem().decode())
    flow = SecretFlow(
        gw_client, gw_up, b"", HOST, ca.server_context(HOST), verify,
        Swap({PH: VALUE}, host=HOST), idle_timeout=10,
    )  # fmt: skip
    seen: list[bytes] = []
    got: list[bytes] = []
    threads = [
        threading.Thread(target=_server, args=(srv, seen, len(requests))),
        threading.Thread(target=_payload, args=(pay, ca, requests, got)),
    ]
    for t in threads:
        t.start()
    done: asyncio.Future[relay.CloseReason] = asyncio.get_running_loop().create_future()
    flow.start(done.set_result)
    reason = await asyncio.wait_for(done, 10)
    for t in threads:
        t.join(5)
    return flow, seen, got, reason


async def test_the_server_gets_the_value_on_every_request() -> None:
    reqs = [
        f"GET /{i} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {PH}\r\n\r\n".encode()
        for i in range(3)
    ]
    flow, seen, got, reason = await _flow(reqs)
    assert len(seen) == 3 and all(VALUE.encode() in h and PH.encode() not in h for h in seen)
    assert got[1:] == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"] * 3
    assert flow.refused is None and flow.error is None
    assert reason is relay.CloseReason.DONE and flow.counters.up and flow.counters.down
    assert flow.swap.requests == 3


async def test_unreadable_is_cut_before_the_server_sees_it() -> None:
    flow, seen, got, reason = await _flow([b"GET / HTTP/1.1\r\nUpgrade: h2c\r\n\r\n"])
    assert seen == [] or all(b"error" in s for s in seen)
    assert flow.refused and "Upgrade" in flow.refused
    assert reason is relay.CloseReason.ABORTED


async def test_an_upstream_not_trusted_is_cut() -> None:
    other = SessionCA([HOST], label="someone else")
    flow, seen, got, reason = await _flow(
        [f"GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()], verify_ca=other
    )
    assert flow.error and "certificate" in flow.error
    assert reason is relay.CloseReason.ABORTED
    assert not any(g.endswith(b"ok") for g in got)
