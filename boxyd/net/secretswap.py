"""The secret swap's HTTP/1.1 reader (`--secret NAME@HOST`): the decrypted request
stream to a secret's host goes through here, and what comes out is what goes upstream.
Pure; fed bytes as they come, linear in them, bounded in what it holds.

In each request's header block a placeholder of a secret for this host becomes the
value in a credential header alone (CREDENTIAL_HEADERS: Authorization, inside `Basic`
credentials too — decoded, swapped, encoded again: npm, pip and git send a token so —
and the API-key headers), as the whole credential, never where a server reflects what it was sent (Host, a
custom header, the request target): a placeholder there is refused. Every request
must be for HOST (its one Host header, an absolute target's authority): one
certificate or one front end serving many names would route a request for another
name there. Header lines are read as strictly as the grammar says (visible ASCII,
space and tab; no bare CR or LF, no control byte, no `Content_Length`), so no server
can read a line break or a framing header the swap did not see. Bodies pass
unchanged, framed by Content-Length or chunked coding so the next request's header
block is found where the server will find it. What cannot be read so (a header block
past MAX_HEAD, both framings, a coding other than chunked, an Upgrade, HTTP/2's
preface, a folded line, a placeholder of a secret for other hosts) raises
Unswappable: the gateway cuts the connection, since forwarding bytes it could not
read would be forwarding them unswapped and unchecked.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

MAX_HEAD = 64 * 1024  # one request's header block
MAX_LINE = 4096  # a chunk-size line, a trailer line
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([\x21-\x7e]+) (HTTP/1\.[01])")
# where clients send a token (the value goes here and nowhere else): Authorization and
# Proxy-Authorization, and the API-key headers of the common APIs (docs/design.md)
CREDENTIAL_HEADERS = frozenset(
    {b"authorization", b"proxy-authorization", b"x-api-key", b"api-key", b"x-auth-token",
     b"private-token", b"x-goog-api-key"}
)  # fmt: skip
# what a field value may hold (RFC 9110 5.5, without obs-text): a server that reads
# any other byte as a line break would see a header the swap did not
_FIELD_BYTES = bytes(range(0x20, 0x7F)) + b"\t"
# header names the swap reads: one with `_` for `-` is the same header to a server
# that maps them alike (CGI, WSGI), and a different one to the swap
_READ = frozenset({b"content-length", b"transfer-encoding", b"host", b"upgrade"})
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
    """One connection's request stream to HOST (on PORT: a Host header may say it).
    VALUES: placeholder → value of the secrets for this host; FOREIGN: the
    placeholders of the session's other secrets (refused here: their hosts are
    others)."""

    def __init__(self, values: Mapping[str, str], foreign: frozenset[str] = frozenset(),
                 *, host: str, port: int = 443) -> None:  # fmt: skip
        self._values = {p.encode(): v.encode() for p, v in values.items()}
        self._foreign = [p.encode() for p in foreign]
        self._host = host.lower().rstrip(".").encode()
        self._port = b":%d" % port
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
            if size is None or line.translate(None, _FIELD_BYTES):
                raise Unswappable("an unreadable chunk size")
            self._left = size
            self._state = "data" if self._left else "trailer"
        elif not line:  # the empty line after the trailers: the request is whole
            self._state = "head"
        else:
            _field(line)  # read as strictly as a header: no line break a server sees

    def _head(self, head: bytes) -> bytes:
        """One request's header block (its CRLF CRLF included), swapped; sets how its
        body is framed."""
        lines = head[:-4].split(b"\r\n")
        http10 = self._request_line(lines[0])
        swapped = [lines[0]]
        fields: dict[bytes, list[bytes]] = {}
        for line in lines[1:]:
            name, value = _field(line)
            key = name.lower()
            fields.setdefault(key, []).append(value.strip(b" \t"))
            swapped.append(name + b":" + self._value(key, value))
        self._frame(fields, http10)
        self.requests += 1
        return b"\r\n".join(swapped) + b"\r\n\r\n"

    def _request_line(self, line: bytes) -> bool:
        """Checks the request line: a method, a target for HOST holding no secret's
        placeholder where a swap could reach it, HTTP/1.x. True for HTTP/1.0."""
        m = _REQUEST_LINE.fullmatch(line)
        if m is None:  # said as it is: the end-of-run line quotes it (net/refusals.py)
            h2 = line == b"PRI * HTTP/2.0"
            raise Unswappable("HTTP/2 (the swap reads HTTP/1.1 alone)" if h2
                              else "not an HTTP/1.1 request line")  # fmt: skip
        method, target = m.group(1), m.group(2)
        if method in (b"CONNECT", b"PRI"):
            raise Unswappable(f"a {method.decode()} request")
        for p in self._foreign:
            if p in target:
                raise Unswappable("a placeholder of a secret for other hosts")
        scheme, sep, rest = target.partition(b"://")
        if sep:  # absolute-form: the server takes its authority for the Host
            authority = rest.split(b"/", 1)[0].split(b"?", 1)[0]
            if scheme.lower() not in (b"http", b"https") or b"@" in authority:
                raise Unswappable("an absolute target with userinfo or another scheme")
            if not self._for_host(authority):
                raise Unswappable("a request for another host")
        elif not target.startswith(b"/") and not (target == b"*" and method == b"OPTIONS"):
            raise Unswappable("a request target of no form HTTP/1.1 has")
        return m.group(3) == b"HTTP/1.0"

    def _for_host(self, authority: bytes) -> bool:
        """AUTHORITY (a Host header's, a target's) names HOST, on its port or none."""
        a = authority.lower()
        a = a.removesuffix(self._port)
        return a.rstrip(b".") == self._host

    def _frame(self, fields: dict[bytes, list[bytes]], http10: bool) -> None:
        """The request's Host checked and its body's framing read from its fields."""
        if b"upgrade" in fields:
            raise Unswappable("an Upgrade (the swap reads HTTP/1.1 alone)")
        hosts = fields.get(b"host", [])
        if len(hosts) != 1 or not self._for_host(hosts[0]):
            raise Unswappable("a request not for its connection's host (one Host, naming it)")
        coding, lengths = fields.get(b"transfer-encoding", []), fields.get(b"content-length", [])
        if coding and (http10 or [c.lower() for c in coding] != [b"chunked"]):
            raise Unswappable("a transfer coding other than chunked")
        if any(not n.isdigit() or n != lengths[0] for n in lengths):
            raise Unswappable("an unreadable Content-Length")
        if coding and lengths:
            raise Unswappable("both Content-Length and chunked (a smuggling shape)")
        self._state, self._left = "head", 0
        if coding:
            self._state = "size"
        elif lengths and int(lengths[0]):
            self._state, self._left = "body", int(lengths[0])

    def _check(self, text: bytes) -> None:
        """TEXT is where no value may go: any secret's placeholder in it is refused."""
        for p in self._foreign:
            if p in text:
                raise Unswappable("a placeholder of a secret for other hosts")
        for p in self._values:
            if p in text:
                raise Unswappable("a placeholder outside a credential header")

    def _whole(self, part: bytes) -> bytes:
        """PART, a whole credential, with the value for it if it is a placeholder: the
        server sees the value alone, never bytes of the payload's around it (an error
        that quotes a key's last characters would quote the value's)."""
        value = self._values.get(part)
        if value is None:
            self._check(part)
            return part
        self.swapped.add(part.decode())
        return value

    def _value(self, key: bytes, value: bytes) -> bytes:
        """A header's value as it goes upstream: in a credential header, a placeholder
        that is the whole credential (`Bearer PH`, `PH`, Basic's user or password)
        swapped; a placeholder anywhere else refused."""
        if key not in CREDENTIAL_HEADERS:
            self._check(value)
            return value
        v = value.strip(b" \t")
        m = _BASIC.fullmatch(v)
        if m is None and v[:6].lower() in (b"basic ", b"basic\t"):
            raise Unswappable("unreadable Basic credentials")
        if m is not None:
            try:
                creds = base64.b64decode(m.group(2), validate=True)
            except (binascii.Error, ValueError):
                raise Unswappable("unreadable Basic credentials") from None
            user, sep, password = creds.partition(b":")
            swapped = self._whole(user) + sep + self._whole(password)
            return value if swapped == creds else b" " + m.group(1) + base64.b64encode(swapped)
        scheme, sp, token = v.rpartition(b" ")
        self._check(scheme)
        swapped = self._whole(token)
        if swapped is token:
            return value
        if sp and _TOKEN.fullmatch(scheme.rstrip(b" ")) is None:
            raise Unswappable("a placeholder not the whole credential")
        return b" " + scheme + sp + swapped


def _field(line: bytes) -> tuple[bytes, bytes]:
    """A header (or trailer) line's name and value, read as strictly as the grammar
    says: a token, a colon, visible ASCII, spaces and tabs. Raises Unswappable."""
    name, sep, value = line.partition(b":")
    if not sep or _TOKEN.fullmatch(name) is None:
        raise Unswappable("an unreadable header line (folded, or no name)")
    if b"_" in name and name.replace(b"_", b"-").lower() in _READ:
        raise Unswappable("a header name with _ for - (read as the other by some servers)")
    if value.translate(None, _FIELD_BYTES):
        raise Unswappable("a control byte, bare CR or LF, or a byte past ASCII in a header")
    return name, value
