"""boxyd.net.secretswap: placeholders become values in credential headers (Basic
credentials too), bodies pass unchanged and framed, whatever the split of
the stream; anything unreadable is refused, never passed on."""

from __future__ import annotations

import base64
import time

import pytest

from boxyd.net.secretswap import MAX_HEAD, Swap, Unswappable

PH, VALUE = "ghp_PLACEHOLDERxxxxxxxxxxxxxxxxxxxxxxxx", "ghp_REALVALUEyyyyyyyyyyyyyyyyyyyyyyyyyy"
OTHER = "npm_OTHERPLACEHOLDERzzzzzzzzzzzzzzzzzzz"


def _swap() -> Swap:
    return Swap({PH: VALUE}, frozenset({OTHER}), host="api")


def _all_splits(data: bytes) -> list[bytes]:
    """What comes out when DATA arrives in one piece, byte by byte, and in pieces of 7."""
    outs = []
    for size in (len(data), 1, 7):
        s = _swap()
        outs.append(b"".join(s.feed(data[i : i + size]) for i in range(0, len(data), size)))
    return outs


def _one(data: bytes) -> bytes:
    outs = _all_splits(data)
    assert outs[0] == outs[1] == outs[2]
    return outs[0]


def test_bearer_header_is_swapped() -> None:
    req = f"GET /user HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {PH}\r\n\r\n".encode()
    assert _one(req) == req.replace(PH.encode(), VALUE.encode())


def test_basic_credentials_are_swapped_inside_the_base64() -> None:
    creds = base64.b64encode(f"x-access-token:{PH}".encode()).decode()
    req = f"GET / HTTP/1.1\r\nHost: api\r\nAuthorization: Basic {creds}\r\n\r\n".encode()
    out = _one(req)
    want = base64.b64encode(f"x-access-token:{VALUE}".encode())
    assert b"Authorization: Basic " + want + b"\r\n" in out
    assert PH.encode() not in base64.b64decode(want)


def test_an_absolute_target_for_the_host_passes_unchanged() -> None:
    req = f"GET https://API:443/x?q={OTHER[:5]} HTTP/1.1\r\nHost: api\r\nX-Api-Key: {PH}\r\n\r\n"
    assert _one(req.encode()) == req.replace(PH, VALUE).encode()


def test_bodies_pass_unchanged_and_the_next_request_is_found() -> None:
    body = f"token={PH}\r\n\r\nGET /fake HTTP/1.1\r\nX: {PH}\r\n\r\n".encode()
    req1 = b"POST /a HTTP/1.1\r\nHost: api\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    req2 = f"GET /b HTTP/1.1\r\nHost: api\r\nAuthorization: token {PH}\r\n\r\n".encode()
    out = _one(req1 + req2)
    assert out == req1 + req2.replace(PH.encode(), VALUE.encode())  # the body's own: kept


def test_chunked_bodies_with_extensions_and_trailers() -> None:
    chunks = f"5;ext=1\r\nhello\r\n1A\r\n{PH[:26]}\r\n0\r\nTrailer: x\r\n\r\n".encode()
    req1 = b"POST /a HTTP/1.1\r\nHost: api\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    req2 = f"GET /b HTTP/1.1\r\nHost: api\r\nAuthorization: token {PH}\r\n\r\n".encode()
    s = _swap()
    out = _one(req1 + req2)
    assert out == req1 + req2.replace(PH.encode(), VALUE.encode())
    s.feed(req1 + req2)
    assert s.requests == 2 and s.swapped == {PH}


@pytest.mark.parametrize(
    "req",
    [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # h2's preface
        b"GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
        b"CONNECT a:443 HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
        b"\x16\x03\x01\x00\x05hello\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
        b"GET / HTTP/1.1\r\nAuthorization: Basic !!!!\r\n\r\n",
        f"GET / HTTP/1.1\r\nX: {OTHER}\r\n\r\n".encode(),  # another host's secret
        f"GET /?{OTHER} HTTP/1.1\r\n\r\n".encode(),
        b"GET / HTTP/1.1\r\nAuthorization: Basic "
        + base64.b64encode(f"u:{OTHER}".encode())
        + b"\r\n\r\n",
    ],
)
def test_unreadable_is_refused(req: bytes) -> None:
    with pytest.raises(Unswappable):
        _swap().feed(req)


@pytest.mark.parametrize(
    ("req", "why"),
    [
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2 (the swap reads HTTP/1.1 alone)"),
        (b"GET / HTTP/1.1\r\nHost: other\r\n\r\n", "a request not for its connection's host"),
        (b"GET / HTTP/1.1\r\nHost: api\r\nUpgrade: h2c\r\n\r\n", "an Upgrade"),
    ],
)
def test_a_cut_says_why(req: bytes, why: str) -> None:
    """The reason is what boxyctl's end-of-run line says (boxyd/net/refusals.py)."""
    with pytest.raises(Unswappable) as e:
        _swap().feed(req)
    assert str(e.value).startswith(why), e.value
    s = _swap()
    with pytest.raises(Unswappable):
        for b in req:
            s.feed(bytes([b]))


def test_a_header_block_is_bounded() -> None:
    s = _swap()
    s.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(Unswappable):
        for _ in range(MAX_HEAD // 1000 + 2):
            s.feed(b"X: " + b"a" * 995 + b"\r\n")


def test_nothing_is_held_back_of_a_body() -> None:
    s = _swap()
    assert s.feed(b"POST / HTTP/1.1\r\nHost: api\r\nContent-Length: 10\r\n\r\nabc") == (
        b"POST / HTTP/1.1\r\nHost: api\r\nContent-Length: 10\r\n\r\nabc"
    )
    assert s.feed(b"defghij") == b"defghij"
    assert s.feed(b"GET / HTTP/1.1\r\n") == b""  # a header block waits whole


def test_linear_in_a_byte_by_byte_header_block() -> None:
    def cost(n: int) -> float:
        s = _swap()
        t = time.perf_counter()
        s.feed(b"GET / HTTP/1.1\r\n")
        for _ in range(n):
            s.feed(b"a")
        return time.perf_counter() - t

    small, large = cost(4000), cost(32000)
    assert large < small * 8 * 3  # linear, with room for noise


def test_a_chunk_size_is_read_as_the_grammar_says_and_linearly() -> None:
    """_chunk_size (string methods) against the pattern it replaced, as the oracle, on
    every short line over the characters that matter; and a 64 KiB line at once."""
    import itertools
    import re

    from boxyd.net.secretswap import _chunk_size

    oracle = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")
    for n in range(6):
        for chars in itertools.product(b"0aG \t;\r=", repeat=n):
            line = bytes(chars)
            m = oracle.fullmatch(line)
            assert _chunk_size(line) == (int(m.group(1), 16) if m else None), line
    assert _chunk_size(b"f" * 15) == 16**15 - 1 and _chunk_size(b"1" * 16) is None
    assert _chunk_size(b"a;" + b" " * 65536) == 10 and _chunk_size(b" " * 65536) is None
