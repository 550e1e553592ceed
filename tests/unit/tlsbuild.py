"""Build TLS ClientHellos byte by byte for the SNI parser's tests, including the
malformed ones no real TLS library would produce."""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Sequence

HANDSHAKE = 22
EXT_SERVER_NAME = 0
EXT_ALPN = 16
EXT_ECH = 0xFE0D


def u8(n: int) -> bytes:
    return n.to_bytes(1, "big")


def u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def u24(n: int) -> bytes:
    return n.to_bytes(3, "big")


def vec8(data: bytes) -> bytes:
    return u8(len(data)) + data


def vec16(data: bytes) -> bytes:
    return u16(len(data)) + data


def extension(ext_type: int, data: bytes) -> bytes:
    return u16(ext_type) + vec16(data)


def server_name(*names: bytes | tuple[int, bytes]) -> bytes:
    """A server_name extension; a bare name is a host_name entry (type 0)."""
    entries = b""
    for name in names:
        name_type, raw = name if isinstance(name, tuple) else (0, name)
        entries += u8(name_type) + vec16(raw)
    return extension(EXT_SERVER_NAME, vec16(entries))


def alpn(*protocols: bytes) -> bytes:
    return extension(EXT_ALPN, vec16(b"".join(vec8(p) for p in protocols)))


def ech() -> bytes:
    # The outer ECH extension's content does not matter to the parser.
    return extension(
        EXT_ECH, b"\x00\x00\x01\x00\x01\x42" + vec16(b"\x00" * 32) + vec16(b"\x01" * 64)
    )


def client_hello_body(
    extensions: Sequence[bytes] | None = (),
    *,
    version: int = 0x0303,
    session_id: bytes = b"\x11" * 32,
    suites: bytes = b"\x13\x01\x13\x02\xc0\x2f",
    compression: bytes = b"\x00",
    trailer: bytes = b"",
) -> bytes:
    """The ClientHello body; extensions=None leaves the extensions field out."""
    body = u16(version) + b"\x5a" * 32 + vec8(session_id) + vec16(suites) + vec8(compression)
    if extensions is not None:
        body += vec16(b"".join(extensions))
    return body + trailer


def handshake(body: bytes, msg_type: int = 1) -> bytes:
    return u8(msg_type) + u24(len(body)) + body


def client_hello(*extensions: bytes, **kw: object) -> bytes:
    """A ClientHello handshake message (no record layer)."""
    # KW: client_hello_body's keywords, checked there at run time
    return handshake(client_hello_body(extensions, **kw))  # type: ignore[arg-type]


def record(fragment: bytes, content_type: int = HANDSHAKE, version: int = 0x0301) -> bytes:
    return u8(content_type) + u16(version) + vec16(fragment)


def records(message: bytes, sizes: Iterable[int], version: int = 0x0301) -> bytes:
    """MESSAGE framed into records of the given sizes (the last takes what is left)."""
    out, pos = b"", 0
    for size in sizes:
        if pos >= len(message):
            break
        out += record(message[pos : pos + size], version=version)
        pos += size
    if pos < len(message):
        out += record(message[pos:], version=version)
    return out


def split_records(data: bytes) -> list[tuple[int, bytes]]:
    """(content type, fragment) for each whole record in DATA."""
    out, pos = [], 0
    while pos + 5 <= len(data):
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        out.append((data[pos], data[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    return out


def real_client_hello(server_hostname: str | None, alpn_protocols: Sequence[str] = ()) -> bytes:
    """What Python's ssl module (OpenSSL) sends first, produced in memory: no socket."""
    ctx = ssl.create_default_context()
    if server_hostname is None:
        ctx.check_hostname = False
    if alpn_protocols:
        ctx.set_alpn_protocols(list(alpn_protocols))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    else:
        raise AssertionError("a handshake with no peer cannot complete")
    data = outgoing.read()
    assert data, "OpenSSL wrote no ClientHello"
    return data
