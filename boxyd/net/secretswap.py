"""The secret swap's HTTP/1.1 reader (`--secret NAME@HOST`): the decrypted request
stream to a secret's host goes through here, and what comes out is what goes upstream.
Pure; fed bytes as they come, linear in them, bounded in what it holds.

In each request's header block a placeholder of a secret for this host becomes the
value: in header values, inside `Authorization: Basic` credentials (decoded,
swapped, encoded again: npm, pip and git send a token so) and in an absolute
request-target's userinfo. Bodies pass unchanged, framed by Content-Length or
chunked coding so the next request's header block is found where the server will
find it. What cannot be read so (a header block past MAX_HEAD, both framings, a
coding other than chunked, an Upgrade, HTTP/2's preface, a folded line, a
placeholder of a secret for other hosts) raises Unswappable: the gateway cuts the
connection, since forwarding bytes it could not read would be forwarding them
unswapped and unchecked.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

MAX_HEAD = 64 * 1024  # one request's header block
MAX_LINE = 4096  # a chunk-size line, a trailer line
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) (HTTP/1\.[01])")
_BASIC = re.compile(rb"([Bb][Aa][Ss][Ii][Cc][ \t]+)([A-Za-z0-9+/]+=*)[ \t]*")


class Unswappable(Exception):
    """The stream is not HTTP/1.1 this reader can swap; the message says why (no
    byte of the stream in it)."""


def _chunk_size(line: bytes) -> int | None:
    """A chunk-size line's size (1 to 15 hex digits, blanks, an extension after `;`
    with no CR or LF), or None. String methods: the line is the payload's."""
    size, _, ext = line.partition(b";")
    digits = size.rstrip(b" \t")
    if not 1 <= len(digits) <= 15 or digits.strip(_HEX) or b"\r" in ext or b"\n" in ext:
        return None
    return int(digits, 16)


_HEX = b"0123456789abcdefABCDEF"


class Swap:
    """One connection's request stream to HOST. VALUES: placeholder → value of the
    secrets for this host; FOREIGN: the placeholders of the session's other secrets
    (refused here: their hosts are others)."""

    def __init__(self, values: Mapping[str, str], foreign: frozenset[str] = frozenset()) -> None:
        self._values = {p.encode(): v.encode() for p, v in values.items()}
        self._foreign = [p.encode() for p in foreign]
        self._buf = bytearray()
        self._scanned = 0  # of _buf, searched for the end of the header block
        self._state = "head"  # head | body | size | data | crlf | trailer
        self._left = 0  # body or chunk bytes still to pass
        self.requests = 0
        self.swapped: set[str] = set()  # placeholders swapped (for the record: no values)

    def feed(self, data: bytes) -> bytes:
        """DATA from the client; returns what goes upstream. Raises Unswappable."""
        out = bytearray()
        view = memoryview(data)
        while view:
            if self._state in ("body", "data"):
                take = min(self._left, len(view))
                out += view[:take]
                view = view[take:]
                self._left -= take
                if not self._left:
                    self._state = "head" if self._state == "body" else "crlf"
                continue
            self._buf += view
            view = memoryview(b"")
            view = self._step(out)
        return bytes(out)

    def _step(self, out: bytearray) -> memoryview:
        """Consume what _buf holds in a line-framed state; returns the bytes past it
        (to go through feed's loop again), or an empty view when more is needed."""
        while self._state in ("head", "size", "crlf", "trailer"):
            if self._state == "head":
                end = self._buf.find(b"\r\n\r\n", max(0, self._scanned - 3))
                if end < 0:
                    self._scanned = len(self._buf)
                    if len(self._buf) > MAX_HEAD:
                        raise Unswappable(f"a request's header block is over {MAX_HEAD} bytes")
                    return memoryview(b"")
                head, rest = bytes(self._buf[: end + 4]), bytes(self._buf[end + 4 :])
                out += self._head(head)
            else:
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > MAX_LINE:
                        raise Unswappable(f"a chunked body's line is over {MAX_LINE} bytes")
                    return memoryview(b"")
                line, rest = bytes(self._buf[:end]), bytes(self._buf[end + 2 :])
                out += line + b"\r\n"
                self._line(line)
            self._buf.clear()
            self._scanned = 0
            if self._state in ("body", "data"):
                return memoryview(rest)
            self._buf += rest
        return memoryview(b"")

    def _line(self, line: bytes) -> None:
        """One line of a chunked body: a size, the CRLF after a chunk, a trailer."""
        if self._state == "crlf":
            if line:
                raise Unswappable("a chunk not followed by CRLF")
            self._state = "size"
        elif self._state == "size":
            size = _chunk_size(line)
            if size is None:
                raise Unswappable("an unreadable chunk size")
            self._left = size
            self._state = "data" if self._left else "trailer"
        elif not line:  # the empty line after the trailers: the request is whole
            self._state = "head"

    def _head(self, head: bytes) -> bytes:
        """One request's header block (its CRLF CRLF included), swapped; sets how its
        body is framed."""
        lines = head[:-4].split(b"\r\n")
        m = _REQUEST_LINE.fullmatch(lines[0])
        if m is None:
            raise Unswappable("not an HTTP/1.1 request line")
        method, target = m.group(1), m.group(2)
        if method in (b"CONNECT", b"PRI"):
            raise Unswappable(f"a {method.decode()} request")
        swapped = [b" ".join((method, self._userinfo(target), m.group(3)))]
        length: bytes | None = None
        chunked = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or _TOKEN.fullmatch(name) is None:
                raise Unswappable("an unreadable header line (folded, or no name)")
            key = name.lower()
            if key == b"upgrade":
                raise Unswappable("an Upgrade (the swap reads HTTP/1.1 alone)")
            if key == b"transfer-encoding":
                if value.strip().lower() != b"chunked" or chunked:
                    raise Unswappable("a transfer coding other than chunked")
                chunked = True
            elif key == b"content-length":
                if not value.strip().isdigit() or length not in (None, value.strip()):
                    raise Unswappable("an unreadable Content-Length")
                length = value.strip()
            swapped.append(name + b":" + self._value(key, value))
        if chunked and length is not None:
            raise Unswappable("both Content-Length and chunked (a smuggling shape)")
        self.requests += 1
        self._state, self._left = "head", 0
        if chunked:
            self._state = "size"
        elif length is not None and int(length):
            self._state, self._left = "body", int(length)
        return b"\r\n".join(swapped) + b"\r\n\r\n"

    def _swap(self, text: bytes) -> bytes:
        for p in self._foreign:
            if p in text:
                raise Unswappable("a placeholder of a secret for other hosts")
        for p, v in self._values.items():
            if p in text:
                text = text.replace(p, v)
                self.swapped.add(p.decode())
        return text

    def _value(self, key: bytes, value: bytes) -> bytes:
        if key in (b"authorization", b"proxy-authorization"):
            m = _BASIC.fullmatch(value.strip())
            if m is None and value.strip()[:6].lower() == b"basic ":
                raise Unswappable("unreadable Basic credentials")
            if m is not None:
                try:
                    creds = base64.b64decode(m.group(2), validate=True)
                except (binascii.Error, ValueError):
                    raise Unswappable("unreadable Basic credentials") from None
                swapped = self._swap(creds)
                if swapped != creds:
                    return b" " + m.group(1) + base64.b64encode(swapped)
        return self._swap(value)

    def _userinfo(self, target: bytes) -> bytes:
        """An absolute-form target's userinfo (`https://user:TOKEN@host/…`) swapped;
        the rest checked for another host's placeholder and left as it is."""
        scheme, sep, rest = target.partition(b"://")
        authority = rest.split(b"/", 1)[0]
        if sep and b"@" in authority:
            info = authority.rpartition(b"@")[0]
            return scheme + sep + self._swap(info) + rest[len(info) :]
        for p in self._foreign:
            if p in target:
                raise Unswappable("a placeholder of a secret for other hosts")
        return target
