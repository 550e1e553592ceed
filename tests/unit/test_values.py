"""boxy.values: every accepted spelling, every refusal, and the round trips."""

from collections.abc import Callable

import pytest

from boxy import values
from boxy.errors import UsageError
from boxy.values import (
    HostSpec,
    format_duration,
    format_size,
    parse_cidr,
    parse_cidrs,
    parse_count,
    parse_cpus,
    parse_duration,
    parse_host_name,
    parse_host_spec,
    parse_port,
    parse_publish,
    parse_size,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2GiB", 2 << 30),
        ("2G", 2 << 30),
        ("2g", 2 << 30),
        ("512MiB", 512 << 20),
        ("512M", 512 << 20),
        ("1KiB", 1024),
        ("1K", 1024),
        ("1KB", 1000),
        ("1MB", 10**6),
        ("1GB", 10**9),
        ("1TB", 10**12),
        ("1TiB", 1 << 40),
        ("1.5GiB", 3 << 29),
        ("100", 100),
        ("100B", 100),
        (" 2 GiB ", 2 << 30),
        ("0.5K", 512),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["2XB", "", "GiB", "-1G", "1e9", "0x10", "1.G", "2 G B", "1,5G", "∞"]
)
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="is not a size"):
        parse_size(text, what="--memory")


def test_parse_size_message_names_flag_and_examples() -> None:
    with pytest.raises(UsageError) as e:
        parse_size("2XB", what="--memory")
    assert str(e.value) == "--memory: '2XB' is not a size (examples: 512MiB, 2GiB)"


def test_parse_size_zero() -> None:
    with pytest.raises(UsageError, match="zero"):
        parse_size("0")
    with pytest.raises(UsageError, match="zero"):
        parse_size("0.1B")  # rounds down to nothing
    assert parse_size("0", allow_zero=True) == 0


def test_parse_size_too_large() -> None:
    with pytest.raises(UsageError, match="too large"):
        parse_size("99999999999TiB")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("10m", 600.0),
        ("2s", 2.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("90", 90.0),
        ("1.5h", 5400.0),
        ("1d", 86400.0),
        ("1m30s", 90.0),
        ("0.25", 0.25),
        ("2h5m3s100ms", 7503.1),
    ],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "m", "10x", "1h 30m", "-5s", "1h1h", "10mins", "1.s", "s10"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--timeout: .* is not a duration"):
        parse_duration(text, what="--timeout")


def test_parse_duration_zero_and_bounds() -> None:
    with pytest.raises(UsageError, match="zero"):
        parse_duration("0s")
    assert parse_duration("0", allow_zero=True) == 0.0
    with pytest.raises(UsageError, match="too long"):
        parse_duration("400d")


def test_parse_count() -> None:
    assert parse_count("512", what="--pids") == 512
    for bad in ["0", "-1", "1.5", "abc", "", "1e3", "0x10"]:
        with pytest.raises(UsageError, match="--pids"):
            parse_count(bad, what="--pids")
    with pytest.raises(UsageError, match="out of range"):
        parse_count(str(1 << 40), what="--pids")


def test_parse_cpus() -> None:
    assert parse_cpus("2") == 2.0
    assert parse_cpus("0.5") == 0.5
    for bad in ["0", "0.0", "-1", "two", "", "1e2", "nan", "inf"]:
        with pytest.raises(UsageError, match="--cpus"):
            parse_cpus(bad)


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (1024, "1.0KiB"),
        (39322, "38.4KiB"),
        (6396314, "6.1MiB"),
        (5120, "5.0KiB"),
        (1048575, "1.0MiB"),  # not "1024.0KiB"
        (2 << 30, "2.0GiB"),
        (-2048, "-2.0KiB"),
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize(
    "seconds,text",
    [
        (0.5, "500ms"),
        (0, "0ms"),
        (9, "9s"),
        (2.5, "2.5s"),
        (65, "1m5s"),
        (5400, "1h30m"),
        (600, "10m"),
        (183600, "2d3h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("seconds", [1, 59, 60, 61, 3599, 3600, 3661, 86400, 90061, 0.25, 2.5])
def test_format_duration_round_trips(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("n", [1, 1023, 1024, 5 << 20, 3 << 30])
def test_format_size_reads_back_close(n: int) -> None:
    assert abs(parse_size(format_size(n)) - n) <= n * 0.05


def test_parse_port() -> None:
    assert parse_port("1") == 1
    assert parse_port("65535") == 65535
    for bad in ["0", "65536", "-1", "http", "", "443 ", "1e3", "080808"]:
        with pytest.raises(UsageError, match="not a port number"):
            parse_port(bad)


@pytest.mark.parametrize(
    "text,spec",
    [
        ("github.com", HostSpec("github.com")),
        ("GitHub.COM.", HostSpec("github.com")),
        ("nas", HostSpec("nas")),
        ("nas:22", HostSpec("nas", (22,))),
        ("db.tail0a1b2.ts.net:5432", HostSpec("db.tail0a1b2.ts.net", (5432,))),
        ("h.example:80,443", HostSpec("h.example", (80, 443))),
        ("h.example:443,443", HostSpec("h.example", (443,))),
        ("dns.example:53/udp", HostSpec("dns.example", (53,), True)),
        ("h.example:22/tcp", HostSpec("h.example", (22,))),
        ("_srv.x-y.example", HostSpec("_srv.x-y.example")),
        ("*.example.com", HostSpec("*.example.com")),
        ("*.Example.COM.", HostSpec("*.example.com")),
        ("*.example.com:443,8443", HostSpec("*.example.com", (443, 8443))),
        ("*.a.b.example:5353/udp", HostSpec("*.a.b.example", (5353,), True)),
        # an address is a host of its own (that address only)
        ("192.168.4.7", HostSpec("192.168.4.7")),
        ("192.168.4.7:22", HostSpec("192.168.4.7", (22,))),
        ("[fd00:0::7]:22,80", HostSpec("fd00::7", (22, 80))),
        ("fd00::7", HostSpec("fd00::7")),
        ("[fd00::7]", HostSpec("fd00::7")),
        ("[fd00::7]:5353/udp", HostSpec("fd00::7", (5353,), True)),
    ],
)
def test_parse_host_spec(text: str, spec: HostSpec) -> None:
    assert parse_host_spec(text) == spec


def test_host_spec_str_round_trips() -> None:
    for text in [
        "a.example",
        "a.example:1,2",
        "a.example:53/udp",
        "10.1.2.3:22",
        "[fd00::7]:22",
        "fd00::7",
    ]:
        assert str(parse_host_spec(text)) == text


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "no host name"),
        (":443", "no host name"),
        ("host:", "no port"),
        ("host:0", "not a port"),
        ("host:http", "not a port"),
        ("host:1,", "not a port"),
        ("host/udp", "needs explicit ports"),
        ("[::1]:", "no port"),
        ("[::1]x", "not a host name"),
        ("[::1]:x", "not a port"),
        ("1.2.3.4:", "no port"),
        ("1.2.3:80", "not a host name"),
        ("[bad", "not a host name"),
        ("a:1:2", "not a host name"),
        ("-bad.example", "not a host name"),
        ("bad-.example", "not a host name"),
        ("a..b", "not a host name"),
        ("a.123", "not a host name"),
        ("ex ample.com", "not a host name"),
        ("x" * 64 + ".com", "not a host name"),
        ("https://example.com", "is a URL; give its host alone: --allow-host example.com"),
    ],
)
def test_parse_host_spec_refuses(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_host_spec(text)


WILDCARD_RULE = "a wildcard must be a leading '\\*\\.' over at least two labels"


@pytest.mark.parametrize(
    "text",
    [
        "*",
        "*.",
        "*.com",
        "*.com.",
        "a.*.com",
        "*foo.com",
        "*.*.example.com",
        "**.example.com",
        "example.*",
        "*.example.*",
        "f*o.example.com",
    ],
)
def test_parse_host_name_wildcard_refused(text: str) -> None:
    with pytest.raises(UsageError, match=WILDCARD_RULE) as e:
        parse_host_name(text)
    assert str(e.value).startswith(f"--allow-host: {text!r}: ")


@pytest.mark.parametrize(
    "text", ["*.-bad.example", "*.a..b", "*.a.123", "*.1.2.3.4", "*.ex ample.com"]
)
def test_parse_host_name_wildcard_body_checked(text: str) -> None:
    with pytest.raises(UsageError, match=f"{text!r} is not a host name".replace("*", "\\*")):
        parse_host_name(text)


def test_parse_host_name_wildcard_length() -> None:
    body = ".".join(["a" * 62] * 4)  # 251 characters: fine alone, 253 with "*."
    assert parse_host_name(body + "x") == body + "x"
    assert parse_host_name("*." + body) == "*." + body
    with pytest.raises(UsageError, match="not a host name"):
        parse_host_name("*." + body + "x")


def test_parse_host_name_length() -> None:
    long = ".".join(["a" * 60] * 5)  # 304 characters
    with pytest.raises(UsageError):
        parse_host_name(long)


@pytest.mark.parametrize(
    "text,norm",
    [
        ("192.168.4.0/24", "192.168.4.0/24"),
        ("192.168.4.7", "192.168.4.7/32"),
        ("100.64.0.0/10", "100.64.0.0/10"),
        ("fd7a:115c:a1e0::/48", "fd7a:115c:a1e0::/48"),
        ("10.0.3.0/24", "10.0.3.0/24"),
        ("fd00:0:0:1::/64", "fd00:0:0:1::/64"),
    ],
)
def test_parse_cidr(text: str, norm: str) -> None:
    assert parse_cidr(text) == norm


@pytest.mark.parametrize(
    "text,message",
    [
        ("0.0.0.0/0", "every address"),
        ("::/0", "every address"),
        ("10.0.0.0/8", "overlaps the sandbox's own network 10.0.2.0/24"),
        ("10.0.2.15", "overlaps"),
        ("10.0.2.128/25", "overlaps"),
        ("fd00::/8", "overlaps the sandbox's own network fd00::/64"),
        ("fd00::15", "overlaps"),
        ("192.168.4.1/24", "host bits set .did you mean 192.168.4.0/24"),
        ("192.168.4.0/33", "not an address range"),
        ("lan", "not an address range"),
        ("", "not an address range"),
    ],
)
def test_parse_cidr_refuses(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_cidr(text)


@pytest.mark.parametrize(
    "text,nets",
    [
        ("192.168.4.0/24", ["192.168.4.0/24"]),
        ("192.168.4.0/24,fd12::/48", ["192.168.4.0/24", "fd12::/48"]),
        (" 192.168.4.7 , 100.64.0.0/10 ", ["192.168.4.7/32", "100.64.0.0/10"]),
        ("192.168.4.0/24,192.168.4.0/24", ["192.168.4.0/24"]),
        ("fd12::/48,192.168.4.0/24", ["fd12::/48", "192.168.4.0/24"]),
    ],
)
def test_parse_cidrs(text: str, nets: list[str]) -> None:
    assert parse_cidrs(text) == nets


@pytest.mark.parametrize(
    "text,message",
    [
        ("", "empty entry"),
        ("192.168.4.0/24,", "empty entry"),
        ("192.168.4.0/24,,fd12::/48", "empty entry"),
        (",192.168.4.0/24", "empty entry"),
        ("192.168.4.0/24,lan", "'lan' is not an address range"),
        ("192.168.4.0/24,10.0.2.0/24", "overlaps the sandbox's own network"),
        ("192.168.4.0/24;10.1.0.0/16", "not an address range"),
        ("0.0.0.0/0,192.168.4.0/24", "every address"),
    ],
)
def test_parse_cidrs_refuses(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as e:
        parse_cidrs(text, what="--allow-cidr")
    assert str(e.value).startswith("--allow-cidr: ")


@pytest.mark.parametrize(
    "text,addr,host_port,port",
    [
        ("8080:80", "127.0.0.1", 8080, 80),
        ("8080:80/tcp", "127.0.0.1", 8080, 80),
        ("127.0.0.2:8080:80", "127.0.0.2", 8080, 80),
        ("0.0.0.0:1:65535", "0.0.0.0", 1, 65535),
        ("[::1]:8080:80", "::1", 8080, 80),
        ("[0:0::1]:8080:80", "::1", 8080, 80),  # normalised
        ("[::]:3000:3000/TCP", "::", 3000, 3000),
    ],
)
def test_parse_publish(text: str, addr: str, host_port: int, port: int) -> None:
    m = parse_publish(text)
    assert (m.addr, m.host_port, m.port) == (addr, host_port, port)
    assert parse_publish(str(m)) == m and hash(parse_publish(str(m))) == hash(m)


@pytest.mark.parametrize(
    "text,message",
    [
        ("8080", "is not [ADDR:]HOST_PORT:PORT"),
        (":80", "is not [ADDR:]HOST_PORT:PORT"),
        ("8080:", "is not [ADDR:]HOST_PORT:PORT"),
        ("1:2:3:4", "is not [ADDR:]HOST_PORT:PORT"),
        ("::1:8080:80", "an IPv6 address goes in brackets"),
        ("localhost:8080:80", "'localhost' is not an address"),
        ("[::1]8080:80", "is not [ADDR:]HOST_PORT:PORT"),
        ("[::1:8080:80", "is not [ADDR:]HOST_PORT:PORT"),
        ("[127.0.0.1]:8080:80", "is not an IPv6 address"),
        ("8080-8090:80", "not a range"),
        ("8080:80/udp", "only TCP ports are published"),
        ("0:80", "is not a port number"),
        ("8080:70000", "is not a port number"),
        ("8080:+80", "is not a port number"),
    ],
)
def test_parse_publish_refuses(text: str, message: str) -> None:
    with pytest.raises(UsageError, match="^--publish") as e:
        parse_publish(text)
    assert message in str(e.value)


def test_port_mapping_is_frozen() -> None:
    m = parse_publish("8080:80")
    with pytest.raises(AttributeError):
        m.port = 81
    assert m.host == "127.0.0.1:8080" and parse_publish("[::1]:1:2").host == "[::1]:1"


@pytest.mark.parametrize(
    "parse", [getattr(values, n) for n in dir(values) if n.startswith("parse_")], ids=str
)
def test_every_value_parser_refuses_a_huge_value_first_in_a_short_line(
    parse: Callable[..., object],
) -> None:
    """A payload writes a profile or a .boxy.yaml whose values boxyd checks with these
    parsers: a 30,000-digit duration took findall 20 s in boxyd's process. Past
    MAX_VALUE a value is refused before any pattern reads it, in a line of its own
    size, however long the value."""
    with pytest.raises(UsageError) as e:
        parse("1" * 30_000 + "x", what="key")
    assert "30001 characters long" in str(e.value) and len(str(e.value)) < 200
