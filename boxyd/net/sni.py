"""Learn which name a TCP client asks for from its first bytes: the TLS ClientHello's
server_name, or a plaintext HTTP/1.x request's Host. Pure: no I/O.

The gateway peeks at what the sandboxed client sends before anything reaches the
far end, and feeds each read to an ``Inspector``, which answers what ``inspect``
would of *all* bytes received so far while looking only at the new ones (so a
client sending a byte at a time costs linear time, not quadratic), and gives up
after ``MAX_INSPECT_READS`` reads. Nothing is decrypted or rewritten; this only
parses.

Results (small frozen dataclasses; ``Result`` is their union):

- ``NeedMore()``: not decidable yet; read more and call again (with a timeout and
  a byte cap in the caller: once ``len(data) >= MAX_INSPECT_BYTES`` the answer is
  never ``NeedMore``).
- ``TLS(sni, ech, alpn)``: a complete, well-formed ClientHello. ``sni`` is a
  normalised host name (lower-case, no trailing dot) or None when the client sent
  none or sent an IP literal (RFC 6066 forbids literals; one names nothing, and a
  client could as well omit the extension, so refusing it would gain nothing).
  ``ech`` is True when an encrypted_client_hello (or the older ESNI) extension is
  present: the outer SNI is then not necessarily the real destination.
- ``HTTP(host, method)``: a complete HTTP/1.x request head. ``host`` is the
  normalised name the server will route on, or None (no Host, an empty Host, or
  an IP literal).
- ``Opaque()``: neither TLS nor HTTP/1.x, so the address binding alone decides.
- ``Malformed(reason)``: looks like TLS or HTTP but is not well formed, is
  ambiguous (two names, a Host that disagrees with the request target), or breaks
  a bound. The caller refuses the flow; ``reason`` is one printable line.

Decisions are final: once a prefix gives anything but NeedMore, every longer input
gives the same result, so the caller stops peeking at the first decision.

Choices where the protocols leave room:

- A ClientHello split over several TLS records, or over any number of reads, is
  reassembled (legal, and a known way to slip past naive filters). Once it is
  complete, whatever follows (a ChangeCipherSpec, early data) is not examined.
- Anything a server could parse differently from us is Malformed rather than
  guessed at: duplicate extensions, a server_name list that is not exactly one
  host_name, trailing bytes inside the ClientHello, bare LF or obs-fold in an HTTP
  head, several Host headers.
- An SSLv2-compatible ClientHello is Malformed: obsolete (RFC 6176) and it cannot
  carry a server name, so the check it would need is impossible. Only a precise
  v2 hello header is taken for one; other high-bit first bytes are Opaque.
- HTTP absolute-form (``GET http://x/ HTTP/1.1``) and CONNECT's authority-form
  name the host the server actually uses (RFC 9112 §3.2.2: it ignores Host then),
  so that name is reported; a Host header naming anything else is Malformed.
  Hosts are compared without their ports.
- The HTTP/2 prior-knowledge preface (``PRI * HTTP/2.0``) is Opaque: the name
  would sit in HPACK-compressed HEADERS frames, h2c without TLS is rare outside
  clusters, and the binding still decides for it (only hosts allowed with an
  explicit port accept opaque flows).
- Empty lines before an HTTP request line (which some servers tolerate) make the
  flow Opaque, which fails closed in the same way.
- Only the first request of a connection is seen: keep-alive requests after it
  may name another Host on the same address, as with domain fronting in TLS.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass

# TLS bounds. A real ClientHello is under 2 KiB (a few KiB with PSKs or
# post-quantum key shares); these are generous and keep every call cheap.
MAX_CLIENT_HELLO = 64 * 1024  # handshake body length
MAX_RECORD_LEN = (1 << 14) + 256  # servers accept 2^14 for plaintext; a little slack
MAX_RECORDS = 512  # records the ClientHello may be split into
MAX_HTTP_HEAD = 16 * 1024  # request line + headers + the blank line
# From this many bytes on, inspect() never says NeedMore: the caller's buffer cap.
MAX_INSPECT_BYTES = max(MAX_RECORDS * 5 + 4 + MAX_CLIENT_HELLO, MAX_HTTP_HEAD)
# Reads an Inspector takes before it gives up: each costs the event loop a wake-up
# whatever it holds. Real clients send a ClientHello or request head in one to a
# few; MAX_RECORDS records each written as header and body is 1,024.
MAX_INSPECT_READS = 2048

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE")

_HANDSHAKE = 22
_CLIENT_HELLO = 1
_EXT_SERVER_NAME = 0
_EXT_ALPN = 16
# encrypted_client_hello (the final code point and drafts 8–12, still in the field)
# and the earlier encrypted_server_name: each hides the real name from us.
_EXT_ECH = frozenset({0xFE0D, 0xFE0C, 0xFE0B, 0xFE0A, 0xFE09, 0xFE08, 0xFFCE})
_NAME_TYPE_HOST = 0

_METHOD_TOKENS = tuple(m.encode() + b" " for m in HTTP_METHODS)
_REQUEST_LINE = re.compile(rb"([A-Z]+) ([\x21-\x7e]+) HTTP/(\d)\.(\d)")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CTL = re.compile(rb"[\x00-\x08\x0a-\x0c\x0e-\x1f\x7f]")  # HTAB is allowed; CR separately
_PORT = re.compile(r"\d{0,5}")
# Host-name labels as boxy.values reads --allow-host names (underscores included).
# Not shared with it: the command line also takes '*.' patterns, the wire never.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_LABELS = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")  # every label in one match, not one each


@dataclass(frozen=True, slots=True)
class NeedMore:
    """Not enough bytes to decide."""


@dataclass(frozen=True, slots=True)
class TLS:
    """A complete ClientHello."""

    sni: str | None
    ech: bool = False
    alpn: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HTTP:
    """A complete HTTP/1.x request head."""

    host: str | None
    method: str


@dataclass(frozen=True, slots=True)
class Opaque:
    """Neither TLS nor HTTP/1.x."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """TLS- or HTTP-shaped but not acceptable; the reason is one printable line."""

    reason: str


Result = NeedMore | TLS | HTTP | Opaque | Malformed


class _Bad(Exception):
    """Internal: unwinds a parse to a Malformed result."""


def inspect(data: bytes) -> Result:
    """Classify the first bytes a client sent (all of them so far; see the module doc)."""
    return Inspector().feed(data)


class Inspector:
    """inspect() over a stream: ``feed`` each read as it arrives and get what
    inspect() says of all bytes so far, in time linear in their total. Decisions
    are final: after one, feed returns it again and keeps nothing more."""

    def __init__(self) -> None:
        self.data = bytearray()  # every byte fed until the decision
        self.reads = 0
        self._result: Result = NeedMore()
        self._stream: _TLSStream | _HTTPStream | None = None

    def feed(self, chunk: bytes) -> Result:
        if not isinstance(self._result, NeedMore):
            return self._result
        self.data += chunk
        self.reads += 1
        if self._stream is None:
            first = _classify(self.data)
            if isinstance(first, _TLSStream | _HTTPStream):
                self._stream = first
                result = first.step(self.data)
            else:
                result = first
        else:
            result = self._stream.step(self.data)
        if isinstance(result, NeedMore) and len(self.data) >= MAX_INSPECT_BYTES:
            # Unreachable by construction; kept so the caller's byte cap always holds.
            result = Malformed(f"no decision after {len(self.data)} bytes")
        elif isinstance(result, NeedMore) and self.reads >= MAX_INSPECT_READS:
            result = Malformed(f"no decision after {self.reads} reads")
        self._result = result
        return result


def _classify(data: bytearray) -> Result | _TLSStream | _HTTPStream:
    """What the first bytes say: a result, or the parser for the rest. Looks at
    eight bytes at most."""
    if not data:
        return NeedMore()
    first = data[0]
    if first == _HANDSHAKE:
        if len(data) < 2:
            return NeedMore()
        # Any 3.x record version is taken as TLS: what a server might accept, we parse.
        return _TLSStream() if data[1] == 3 else Opaque()
    if first & 0x80:
        return _inspect_sslv2(bytes(data[:5]))
    maybe_http = False
    for token in _METHOD_TOKENS:
        if data.startswith(token):
            return _HTTPStream()
        if token.startswith(data):
            maybe_http = True
    return NeedMore() if maybe_http else Opaque()


# --- TLS ------------------------------------------------------------------------------


class _TLSStream:
    """Walk the records, reassembling handshake bytes until the ClientHello is whole;
    each record is taken once, when it is complete.

    Bytes of a record that has not fully arrived count too: a server parses the
    same bytes once the record completes, so deciding early changes nothing.
    """

    def __init__(self) -> None:
        self.pos = 0  # where the first record not yet complete starts
        self.records = 0  # complete ones
        self.handshake = bytearray()  # their bodies
        self.need = 0  # handshake bytes the ClientHello's header says are needed, once read

    def step(self, data: bytearray) -> Result:
        while self.pos < len(data):
            if self.records == MAX_RECORDS:
                return Malformed(f"ClientHello split over more than {MAX_RECORDS} TLS records")
            header = data[self.pos : self.pos + 5]
            if header[0] != _HANDSHAKE:
                return Malformed(
                    f"TLS record of content type {header[0]} before the ClientHello was complete"
                )
            if len(header) >= 2 and header[1] != 3:
                return Malformed(f"TLS record version {header[1]}.x is not 3.x")
            if len(header) < 5:
                return NeedMore()
            length = int.from_bytes(header[3:5], "big")
            if length == 0:
                return Malformed("empty TLS handshake record")  # RFC 8446 §5.1 forbids them
            if length > MAX_RECORD_LEN:
                return Malformed(f"TLS record of {length} bytes exceeds {MAX_RECORD_LEN}")
            start, end = self.pos + 5, self.pos + 5 + length
            if end > len(data):  # what has arrived of it, without copying it each time
                if len(self.handshake) + len(data) - start < self.need:
                    return NeedMore()

                def whole(s: int = start) -> bytearray:
                    return self.handshake + data[s:]

                more = data[start : start + 4]
                return (
                    _check_handshake(self.handshake, more, len(data) - start, whole) or NeedMore()
                )
            self.records += 1
            self.handshake += data[start:end]
            if len(self.handshake) >= self.need:  # else undecided still, as before
                result = _check_handshake(self.handshake)
                if result is not None:
                    return result
                if len(self.handshake) >= 4:
                    self.need = 4 + int.from_bytes(self.handshake[1:4], "big")
            self.pos = end
        return NeedMore()


def _check_handshake(
    hs: bytearray,
    more: bytes | bytearray = b"",
    more_len: int = 0,
    whole: Callable[[], bytearray] | None = None,
) -> Result | None:
    """A result once the handshake bytes decide; None while they do not yet. The
    bytes are HS followed by MORE_LEN more, whose first ones are MORE and which
    WHOLE joins to HS (called once, when they decide)."""
    head = bytes(hs[:4]) + bytes(more[: 4 - min(len(hs), 4)])
    total = len(hs) + more_len
    if not head:
        return None
    if head[0] != _CLIENT_HELLO:
        return Malformed(f"first TLS handshake message is type {head[0]}, not a ClientHello")
    if len(head) < 4:
        return None
    length = int.from_bytes(head[1:4], "big")
    if length > MAX_CLIENT_HELLO:
        return Malformed(f"ClientHello claims {length} bytes (limit {MAX_CLIENT_HELLO})")
    if total < 4 + length:
        return None
    body = whole() if whole is not None else hs
    try:
        return _parse_client_hello(bytes(body[4 : 4 + length]))
    except _Bad as e:
        return Malformed(str(e))


class _Reader:
    """Bounds-checked big-endian reads over one byte string."""

    __slots__ = ("buf", "pos", "end", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf, self.pos, self.end, self.what = buf, 0, len(buf), what

    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int, field: str) -> bytes:
        if n > self.remaining():
            raise _Bad(
                f"{self.what}: {field} runs past the end ({n} bytes, {self.remaining()} left)"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int, field: str) -> int:
        return int.from_bytes(self.take(size, field), "big")

    def vector(self, len_size: int, field: str) -> _Reader:
        return _Reader(self.take(self.uint(len_size, f"{field} length"), field), self.what)

    def take_all(self) -> bytes:
        return self.take(self.remaining(), "data")

    def done(self, field: str) -> None:
        if self.remaining():
            raise _Bad(f"{self.what}: {self.remaining()} stray bytes after {field}")


def _parse_client_hello(body: bytes) -> TLS:
    r = _Reader(body, "ClientHello")
    version = r.uint(2, "legacy_version")
    if version >> 8 != 3:
        raise _Bad(f"ClientHello: legacy_version 0x{version:04x} is not 3.x")
    r.take(32, "random")
    session_id = r.vector(1, "legacy_session_id")
    if session_id.remaining() > 32:
        raise _Bad("ClientHello: legacy_session_id longer than 32 bytes")
    suites = r.vector(2, "cipher_suites")
    if suites.remaining() == 0 or suites.remaining() % 2:
        raise _Bad("ClientHello: cipher_suites empty or of odd length")
    if r.vector(1, "legacy_compression_methods").remaining() == 0:
        raise _Bad("ClientHello: no compression methods")
    sni: str | None = None
    ech = False
    alpn: tuple[str, ...] = ()
    if r.remaining() == 0:  # TLS ≤ 1.2 may omit extensions entirely
        return TLS(None)
    extensions = r.vector(2, "extensions")
    r.done("extensions")
    seen: set[int] = set()
    while extensions.remaining():
        ext_type = extensions.uint(2, "extension type")
        ext = extensions.vector(2, f"extension {ext_type}")
        if ext_type in seen:  # RFC 8446 §4.2; a server might read the other copy
            raise _Bad(f"ClientHello: extension {ext_type} appears twice")
        seen.add(ext_type)
        if ext_type == _EXT_SERVER_NAME:
            sni = _parse_server_name(ext)
        elif ext_type == _EXT_ALPN:
            alpn = _parse_alpn(ext)
        elif ext_type in _EXT_ECH:
            ech = True
    return TLS(sni, ech, alpn)


def _parse_server_name(ext: _Reader) -> str | None:
    names = ext.vector(2, "server_name list")
    ext.done("server_name list")
    entries: list[tuple[int, bytes]] = []
    while names.remaining():
        name_type = names.uint(1, "server_name type")
        entries.append((name_type, names.vector(2, "server_name").take_all()))
    # OpenSSL and others accept exactly one host_name entry; anything else could be
    # read differently by the server than by us.
    if len(entries) != 1:
        raise _Bad(f"ClientHello: server_name lists {len(entries)} names, expected exactly one")
    name_type, raw = entries[0]
    if name_type != _NAME_TYPE_HOST:
        raise _Bad(f"ClientHello: server_name entry of unknown type {name_type}")
    return _host_name(raw, "ClientHello: server_name")


def _parse_alpn(ext: _Reader) -> tuple[str, ...]:
    protocols = ext.vector(2, "ALPN list")
    ext.done("ALPN list")
    out: list[str] = []
    while protocols.remaining():
        proto = protocols.vector(1, "ALPN protocol").take_all()
        if not proto:
            raise _Bad("ClientHello: empty ALPN protocol name")
        out.append(proto.decode("ascii", "backslashreplace"))
    if not out:
        raise _Bad("ClientHello: empty ALPN list")
    return tuple(out)


def _inspect_sslv2(data: bytes) -> Result:
    """A v2 CLIENT-HELLO header: [0x80|len hi][len lo][1][version: 0.2 or 3.x]."""
    if len(data) >= 3 and data[2] != 1:
        return Opaque()
    if len(data) >= 4 and data[3] not in (0, 3):
        return Opaque()
    if len(data) >= 5 and data[3] == 0 and data[4] != 2:
        return Opaque()
    if len(data) < 5:
        return NeedMore()
    return Malformed("SSLv2-compatible ClientHello: obsolete, and it cannot carry a server name")


# --- HTTP/1.x -------------------------------------------------------------------------


class _HTTPStream:
    """Validate each complete line as it arrives; decide at the blank line. Each
    byte is looked at once: lines already taken are not read again."""

    def __init__(self) -> None:
        self.pos = 0  # start of the line not yet complete
        self.scanned = 0  # bytes before this hold no line end and no bad byte
        self.request: tuple[str, bytes] | None = None
        self.hosts: list[bytes] = []

    def step(self, data: bytearray) -> Result:
        try:
            return self._lines(data)
        except _Bad as e:
            return Malformed(str(e))

    def _lines(self, data: bytearray) -> Result:
        limit = min(len(data), MAX_HTTP_HEAD)
        while True:
            new = max(self.pos, self.scanned)
            nl = data.find(b"\n", new, limit)
            end = nl if nl >= 0 else limit
            # Checked before the line is complete, so a bad byte is refused as soon as it
            # arrives (and the same reason is given whatever follows); a CR at the end
            # may be the first half of the line ending, one before the new bytes no more.
            if (
                _CTL.search(data, new, end)
                or data.find(b"\r", max(self.pos, new - 1), end - 1) >= 0
            ):
                raise _Bad("HTTP: control character in the request head")
            if nl < 0:
                self.scanned = limit
                break
            if nl == self.pos or data[nl - 1] != 0x0D:
                raise _Bad("HTTP: bare LF line ending")
            content = bytes(data[self.pos : nl - 1])
            self.pos = self.scanned = nl + 1
            if self.request is None:
                self.request = _request_line(content)
            elif not content:
                return _http_result(self.request, self.hosts)
            else:
                name, value = _header(content)
                if name.lower() == b"host":
                    self.hosts.append(value)
        if len(data) >= MAX_HTTP_HEAD:
            raise _Bad(f"HTTP: no end of the request head within {MAX_HTTP_HEAD} bytes")
        return NeedMore()


def _request_line(line: bytes) -> tuple[str, bytes]:
    m = _REQUEST_LINE.fullmatch(line)
    if not m or m.group(1).decode() not in HTTP_METHODS:
        raise _Bad(f"HTTP: malformed request line {_show(line)}")
    if m.group(3) != b"1":
        raise _Bad(f"HTTP: unsupported version HTTP/{m.group(3).decode()}.{m.group(4).decode()}")
    return m.group(1).decode(), m.group(2)


def _header(line: bytes) -> tuple[bytes, bytes]:
    if line[:1] in (b" ", b"\t"):  # obs-fold: RFC 9112 §5.2 lets servers differ
        raise _Bad("HTTP: folded header line")
    # name ":" value, blanks around the value dropped: split, not a regex, since
    # `:[ \t]*(.*?)[ \t]*` backtracks quadratically over a run of blanks
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        raise _Bad(f"HTTP: malformed header line {_show(line)}")
    return name, value.strip(b" \t")


def _http_result(request: tuple[str, bytes], hosts: list[bytes]) -> HTTP:
    method, target = request
    if len(hosts) > 1:
        raise _Bad(f"HTTP: {len(hosts)} Host headers")
    header = _authority(hosts[0], "Host header") if hosts and hosts[0] else None
    target_host = _target_authority(method, target)
    if target_host is None:
        return HTTP(header[0] if header else None, method)
    if header is not None and header[1] != target_host[1]:
        raise _Bad(
            f"HTTP: Host header {_show(hosts[0])} does not match the request target {_show(target)}"
        )
    return HTTP(target_host[0], method)


def _target_authority(method: str, target: bytes) -> tuple[str | None, str] | None:
    """The authority the request target names (absolute- or authority-form), if any."""
    if method == "CONNECT":
        return _authority(target, "CONNECT target", need_port=True)
    if target.startswith(b"/") or (target == b"*" and method == "OPTIONS"):
        return None
    scheme, sep, rest = target.partition(b"://")
    if not sep or not re.fullmatch(rb"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise _Bad(f"HTTP: unsupported request target {_show(target)}")
    authority = re.split(rb"[/?#]", rest, maxsplit=1)[0]
    if b"@" in authority:  # userinfo: deprecated, and a classic way to confuse a reader
        raise _Bad(f"HTTP: user information in the request target {_show(target)}")
    if not authority:
        raise _Bad(f"HTTP: no host in the request target {_show(target)}")
    return _authority(authority, "request target")


def _authority(raw: bytes, what: str, *, need_port: bool = False) -> tuple[str | None, str]:
    """host[:port] or [v6][:port] → (name or None for an IP literal, comparison key)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _Bad(f"HTTP: {what} {_show(raw)} is not ASCII") from None
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise _Bad(f"HTTP: {what} {_show(raw)} is not host[:port]")
        has_port, port = bool(rest), rest[1:]
        try:
            key = str(ipaddress.IPv6Address(inner))
        except ValueError:
            raise _Bad(f"HTTP: {what} {_show(raw)} is not an IPv6 address") from None
        name = None
    else:
        host, colon, port = text.partition(":")
        has_port = bool(colon)
        name = _host_name(host.encode(), f"HTTP: {what}")
        key = name if name is not None else str(ipaddress.ip_address(host.removesuffix(".")))
    if not _PORT.fullmatch(port) or (port and int(port) > 65535):
        raise _Bad(f"HTTP: {what} {_show(raw)} has a bad port")
    if need_port and not (has_port and port):
        raise _Bad(f"HTTP: {what} {_show(raw)} has no port")
    return name, key


_DIGITS_DOTS = "0123456789."


def _host_name(raw: bytes, what: str) -> str | None:
    """A DNS host name, normalised; None for an IP literal; _Bad for anything else."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _Bad(f"{what} {_show(raw)} is not ASCII") from None
    name = text.lower().removesuffix(".")
    if not name:
        raise _Bad(f"{what}: empty host name")
    # (a name with no colon and a byte other than digits and dots is no address:
    # ip_address would only raise, which costs more than the check)
    if ":" in name or not name.strip(_DIGITS_DOTS):
        try:
            ipaddress.ip_address(name)
        except ValueError:
            pass
        else:
            return None
    if (
        len(name) > 253
        or not _LABELS.fullmatch(name)
        # '10.1' or '2130706433': resolvers read these as addresses
        or name.rpartition(".")[2].isdigit()
    ):
        raise _Bad(f"{what} {_show(raw)} is not a valid host name")
    return name


def _show(raw: bytes, limit: int = 80) -> str:
    """Attacker-chosen bytes, made safe for a log line."""
    text = repr(raw[:limit])[1:]
    return text + ("…" if len(raw) > limit else "")
