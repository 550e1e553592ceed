"""Attacks on the secret swap (boxyd/net/secretswap.py) as a hostile payload writes
them: every request either is refused (Unswappable) or, read back by a lenient server
(Python's own, which takes a bare LF for a line end), carries the value in a credential
header of a request for the secret's host and nowhere else — not a header the server
reflects, not the target, not a body the server stores, not a request for another
name behind the same certificate. `ESCAPED` is printed, and the test fails, only when
the value went somewhere else."""

from __future__ import annotations

import base64
import io
from http.client import parse_headers

import pytest

from boxyd.net.secretswap import CREDENTIAL_HEADERS, Swap, Unswappable

PH, VALUE = "ghp_PLACEHOLDERxxxxxxxxxxxxxxxxxxxxxxxx", "ghp_REALVALUEyyyyyyyyyyyyyyyyyyyyyyyyyy"
HOST = "api.boxy.test"


def _swap() -> Swap:
    return Swap({PH: VALUE}, host=HOST)


def _lenient_requests(stream: bytes) -> list[tuple[bytes, dict[str, list[str]], bytes]]:
    """What a lenient server reads from STREAM: each request's line, headers (the
    first of each name counts, as Python's server takes it) and body by its
    Content-Length."""
    out = []
    f = io.BytesIO(stream)
    while line := f.readline():
        if not line.strip():
            continue
        msg = parse_headers(f)
        headers: dict[str, list[str]] = {}
        for k, v in msg.items():
            headers.setdefault(k.lower(), []).append(v)
        n = int((headers.get("content-length") or ["0"])[0].strip() or 0)
        out.append((line.rstrip(b"\r\n"), headers, f.read(n)))
    return out


def _escapes(req: bytes) -> list[str]:
    """Where the value went but for a credential header of a request for HOST."""
    s = _swap()
    try:
        sent = b"".join(s.feed(req[i : i + 1]) for i in range(len(req)))
    except Unswappable:
        return []
    assert sent == _swap().feed(req)  # the same, however the stream is split
    where = []
    for line, headers, body in _lenient_requests(sent):
        value = VALUE.encode()
        host = (headers.get("host") or [""])[0].strip().lower()
        target = line.split(b" ")[1] if line.count(b" ") == 2 else b""
        if b"://" in target:  # absolute-form: the server takes its authority
            host = target.split(b"/")[2].decode("latin-1").lower()
        for name, vals in headers.items():
            for v in vals:
                raw = v.encode("latin-1")
                if name == "authorization" and raw.strip()[:6].lower() == b"basic ":
                    raw = base64.b64decode(raw.strip()[6:])
                if value in raw and (name.encode() not in CREDENTIAL_HEADERS or host != HOST):
                    where.append(f"header {name} (Host {host!r})")
        if value in line:
            where.append("the request line")
        if value in body:
            where.append("a body")
    for w in where:
        print(f"ESCAPED: the value in {w}")
    return where


def _req(*lines: str, body: str = "") -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


_NEXT = f"GET / HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {PH}\r\n\r\n"
_CREDS = f"Authorization: Bearer {PH}\r\n\r\n"
ATTACKS = {
    "a reflected header: Host": _req("GET / HTTP/1.1", f"Host: {PH}"),
    "a reflected header: custom": _req("GET / HTTP/1.1", f"Host: {HOST}", f"X-Echo: {PH}"),
    "a reflected header: User-Agent": _req("GET / HTTP/1.1", f"Host: {HOST}", f"User-Agent: {PH}"),
    "userinfo in the target": _req(f"GET https://u:{PH}@{HOST}/ HTTP/1.1", f"Host: {HOST}"),
    "another name behind the certificate": _req(
        "GET / HTTP/1.1", "Host: other.boxy.test", f"Authorization: Bearer {PH}"
    ),
    "another name, port and all": _req(
        "GET / HTTP/1.1", f"Host: {HOST}.evil.test:443", f"Authorization: Bearer {PH}"
    ),
    "two Host headers": _req(
        "GET / HTTP/1.1", "Host: other.boxy.test", f"Host: {HOST}", f"Authorization: Bearer {PH}"
    ),
    "no Host (the server's default name)": _req("GET / HTTP/1.0", f"Authorization: Bearer {PH}"),
    "an absolute target for another name": _req(
        "GET https://other.boxy.test/ HTTP/1.1", f"Host: {HOST}", f"Authorization: Bearer {PH}"
    ),
    "a bare LF: a second header inside a credential": _req(
        "GET / HTTP/1.1", f"Authorization: Bearer {PH}\nX-Echo: {PH}", f"Host: {HOST}"
    ),
    "a bare LF: a Content-Length the swap did not see, the next head a body": _req(
        "POST /store HTTP/1.1",
        f"Host: {HOST}",
        f"X: a\nContent-Length: {len(_NEXT)}",
        body=_NEXT,
    ),  # fmt: skip
    "a bare LF ending the header block early, the rest a body": _req(
        "POST /store HTTP/1.1",
        f"Host: {HOST}",
        f"Content-Length: {len(_CREDS)}",
        f"X: a\n\n{_CREDS[:-4]}",
        body="p" * len(_CREDS),
    ),  # fmt: skip
}


@pytest.mark.parametrize("label", ATTACKS)
def test_the_value_goes_to_a_credential_header_for_the_host_alone(label: str) -> None:
    assert not _escapes(ATTACKS[label]), label


@pytest.mark.parametrize(
    "req",
    [
        _req("GET / HTTP/1.1", f"Host: {HOST}", "X: a\rContent-Length: 5"),  # a bare CR
        _req("GET / HTTP/1.1", f"Host: {HOST}", "X: a\x00b"),
        _req("GET / HTTP/1.1", f"Host: {HOST}", "X: a\x0bb"),  # str.splitlines() breaks here
        ("GET / HTTP/1.1\r\nHost: " + HOST + "\r\nX: a\x85b\r\n\r\n").encode("latin-1"),
        _req("POST / HTTP/1.1", f"Host: {HOST}", "Content_Length: 5"),  # CGI reads it as -
        _req("POST / HTTP/1.1", f"Host: {HOST}", "transfer_encoding: chunked"),
        _req("POST / HTTP/1.0", f"Host: {HOST}", "Transfer-Encoding: chunked"),
        _req("GET /\x01 HTTP/1.1", f"Host: {HOST}"),
        _req("GET evil HTTP/1.1", f"Host: {HOST}"),
        _req("POST / HTTP/1.1", f"Host: {HOST}", "Transfer-Encoding: chunked", body="5;\x0b\r\n"),
        _req(
            "POST / HTTP/1.1", f"Host: {HOST}", "Transfer-Encoding: chunked", body="0\r\nX\n:y\r\n"
        ),
    ],
)
def test_what_a_server_could_read_otherwise_is_refused(req: bytes) -> None:
    """Bytes a server may read as a line break or a framing header the swap does not:
    refused before any of the request goes on."""
    with pytest.raises(Unswappable):
        _swap().feed(req)


@pytest.mark.parametrize("host", [HOST, HOST.upper(), f"{HOST}:443", f"{HOST}.", f" {HOST} "])
def test_the_host_as_clients_write_it_is_swapped(host: str) -> None:
    req = _req("GET /x?y=1 HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {PH}")
    assert _swap().feed(req) == req.replace(PH.encode(), VALUE.encode())
    creds = base64.b64encode(f"x:{PH}".encode()).decode()
    req = _req(f"GET https://{HOST}/x HTTP/1.1", f"Host: {host}", f"Authorization: Basic {creds}")
    assert VALUE.encode() in base64.b64decode(_swap().feed(req).split(b"Basic ")[1][:-4])
    req = _req("GET / HTTP/1.1", f"host: {host}", f"x-api-key: {PH}")
    assert _swap().feed(req) == req.replace(PH.encode(), VALUE.encode())


# The placeholder (boxyd/net/placeholder.py) is in the payload's hands: beyond each
# position's class, the punctuation and a token's public kind (`ghp_`), it must say
# nothing of the value. A position that is the same in every placeholder drawn for a
# value is one the payload reads off the value.
VALUES = [
    "correct-horse-battery-staple-4821",  # a passphrase: its words are the value
    "hunter_Sup3rSecretPassw0rdXyz",
    "prod-db-Pa55word-Xy7zQ2",
    "kQzVb-8fJ2mTq9LwX3pRn5YsD7hKc1Vg",  # a random url-safe token that began so
]


@pytest.mark.parametrize("value", VALUES)
def test_the_placeholder_keeps_no_letter_or_digit_of_the_value(value: str) -> None:
    from boxyd.net import placeholder

    drawn = [placeholder.make(value) for _ in range(40)]
    kept = [
        i
        for i, ch in enumerate(value)
        if ch.isalnum() and all(p[i] == ch for p in drawn)  # every draw: the value's own
    ]
    if kept:
        print(f"ESCAPED: the placeholder shows {''.join(value[i] for i in kept)!r} of the value")
    assert not kept


def _credential_shaped(req: bytes) -> list[str]:
    """Where a credential header sent the value with the payload's bytes around it
    (`Bearer junkVALUE`): a server's error that quotes a bad key's first or last
    characters would quote the value's."""
    try:
        sent = _swap().feed(req)
    except Unswappable:
        return []
    where = []
    for _, headers, _ in _lenient_requests(sent):
        for name, vals in headers.items():
            for v in (x.strip().encode("latin-1") for x in vals):
                if v[:6].lower() == b"basic ":
                    whole = base64.b64decode(v[6:]).split(b":", 1)
                else:
                    words = v.split()
                    whole = [words[-1]] if len(words) <= 2 else []
                if VALUE.encode() in v + b"".join(whole) and VALUE.encode() not in whole:
                    where.append(f"{name}: {v!r}")
    for w in where:
        print(f"ESCAPED: the value sent inside the payload's bytes: {w}")
    return where


def _basic(creds: str) -> str:
    return "Authorization: Basic " + base64.b64encode(creds.encode()).decode()


@pytest.mark.parametrize(
    "header",
    [
        f"Authorization: Bearer junk{PH}",
        f"Authorization: Bearer {PH}junk",
        f"Authorization: Bearer junk {PH}",
        f"Authorization: {PH}{PH}",
        f"X-Api-Key: sk-{PH}",
        _basic(f"u:junk{PH}"),
        _basic(f"{PH}x:y"),
    ],
)
def test_the_server_sees_the_value_whole_or_nothing(header: str) -> None:
    assert not _credential_shaped(_req("GET / HTTP/1.1", f"Host: {HOST}", header))
