"""Frames between boxyd and the children of its walk template (walkproc.py,
afterproc.py): an 8-byte length, then JSON; raw bytes only where a wire says so."""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

FRAME = struct.Struct("!Q")


def frame(obj: Any) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return FRAME.pack(len(data)) + data


def send_frame(sock: socket.socket, obj: Any) -> None:
    sock.sendall(frame(obj))


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError("the request ended early")
        out += chunk
    return bytes(out)


def recv_exact_after(sock: socket.socket, got: bytes, n: int) -> bytes:
    """N bytes of which GOT came already (a recvmsg's share)."""
    return got + recv_exact(sock, n - len(got)) if len(got) < n else got[:n]


def recv_frame(sock: socket.socket, limit: int) -> Any:
    (size,) = FRAME.unpack(recv_exact(sock, FRAME.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes (more than {limit})")
    return json.loads(recv_exact(sock, size))
