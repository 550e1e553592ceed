"""What a refused client hears after its first record (boxyd.net.denial, issue 34 §3)."""

from __future__ import annotations

import pytest

from boxyd.net import denial
from boxyd.net.policy import DNS, PORT, SNI, Verdict

HELLO = bytes([0x16, 3, 1, 0, 5]) + b"hello"


def test_a_tls_client_gets_a_fatal_access_denied_alert() -> None:
    v = Verdict(False, SNI, "SNI names evil.example: hostname not on the allowlist")
    assert denial.reply(HELLO, v, "evil.example", 443) == bytes([21, 3, 1, 0, 2, 2, 49])
    assert denial.tls_alert(4) == bytes([21, 3, 3, 0, 2, 2, 49])


def test_an_http_client_gets_a_403_naming_boxy_and_the_flag() -> None:
    v = Verdict(False, SNI, "Host names evil.example: hostname not on the allowlist")
    got = denial.reply(
        b"GET / HTTP/1.1\r\nHost: evil.example:8080\r\n\r\n", v, "evil.example:8080", 80
    )
    assert got is not None
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(
        b"HTTP/1.1 403 Forbidden by boxy: Host names evil.example: hostname not on the "
        b"allowlist; --allow-host evil.example allows it (a running session: boxyctl "
        b"allow ID evil.example)\r\n"
    ), head  # the line npm and pip print
    assert b"Connection: close" in head
    assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
    assert body.decode() == (
        "boxy refused this connection: Host names evil.example: hostname not on the "
        "allowlist.\n--allow-host evil.example allows it (a running session: boxyctl "
        "allow ID evil.example)\n"
    )


def test_a_port_refusal_names_the_port_in_the_flag() -> None:
    v = Verdict(False, PORT, "port 8080 not allowed for api.example")
    got = denial.reply(b"POST /x HTTP/1.1\r\n", v, "api.example", 8080)
    assert got is not None and b"--allow-host api.example:8080 allows it" in got


def test_a_record_naming_no_host_is_told_the_explicit_port_that_takes_it() -> None:
    """An HTTP request to an address (no Host name) passes only for a host allowed with
    the port: the hint names it, not the flag the run already has."""
    v = Verdict(False, SNI, "HTTP without Host: only a host allowed with :80 takes that")
    got = denial.reply(b"GET / HTTP/1.1\r\n", v, "www.example", 80)
    assert got is not None and b"--allow-host www.example:80 allows it" in got


def test_no_name_says_so() -> None:
    v = Verdict(False, DNS, "no DNS binding for this address (hard-coded IP?)")
    got = denial.reply(b"GET / HTTP/1.0\r\n\r\n", v, None, 80)
    assert got is not None and b"no host name came with it" in got


@pytest.mark.parametrize("first", [b"SSH-2.0-OpenSSH_9.2\r\n", b"\x00\x01", b"get / HTTP/1.1"])
def test_neither_tls_nor_http_is_reset_as_before(first: bytes) -> None:
    assert denial.reply(first, Verdict(False, SNI, "x"), "a.example", 22) is None


def test_what_the_client_sent_cannot_shape_the_reply() -> None:
    v = Verdict(False, SNI, "not allowed")
    got = denial.reply(b"GET / HTTP/1.1\r\n", v, "a.example\r\nSet-Cookie: x=1", 80)
    assert got is not None
    head, _, body = got.partition(b"\r\n\r\n")
    assert not [h for h in head.split(b"\r\n") if h.startswith(b"Set-Cookie")], head
    assert b"\r" not in body


def test_a_reason_cannot_break_the_status_line() -> None:
    v = Verdict(False, SNI, "odd\r\nSet-Cookie: x=1\x00" + "y" * 1000)
    got = denial.reply(b"GET / HTTP/1.1\r\n", v, "a.example", 80)
    assert got is not None
    status, _, rest = got.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 403 Forbidden by boxy: odd??Set-Cookie: x=1?yyy")
    assert len(status) < 450 and not rest.startswith(b"Set-Cookie")
