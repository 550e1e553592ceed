"""Typed command-line values: sizes, durations, ports, host specs, CIDRs.

Pure (no I/O) and standard library only: the client imports this module at
start-up (so what only some flags need is imported when they are given: re,
fractions, ipaddress), and the daemon re-checks the same values with the same code. Every parse function raises
``UsageError`` with one line that names the flag (``what``) and the bad value.
"""

from __future__ import annotations

from boxy.errors import UsageError

TYPE_CHECKING = False  # typing costs the client at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Concatenate, ParamSpec, TypeVar

    P = ParamSpec("P")
    T = TypeVar("T")

# The sandbox's own link (its gateway and its address): never a range to open.
SANDBOX_NETS = ("10.0.2.0/24", "fd00::/64")

# K/M/G/T and KiB/MiB/… are binary (what --memory users mean); KB/MB/… decimal.
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
# patterns as text: re compiles (and caches) one when it is first used, not every
# client start
_SIZE_RE = r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)"
_SIZE_EXAMPLES = "examples: 512MiB, 2GiB"
# Nothing a sandbox does needs more; bounds what int() and the kernel are given.
_MAX_SIZE = 1 << 60

_DURATION_UNITS: dict[str, str] = {"ms": "1/1000", "s": "1", "m": "60", "h": "3600", "d": "86400"}
_DURATION_PART_RE = r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"
_DURATION_EXAMPLES = "examples: 90, 500ms, 10m, 1h30m"
_MAX_DURATION = 365 * 86400

_HOST_LABEL_RE = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"

# The longest text a value parser reads. A payload can write a profile or a .boxy.yaml
# whose values boxyd checks with these parsers: past this a value is refused before a
# pattern sees it, so no parser's cost (a pattern's, a message quoting the value)
# grows with what the payload wrote (one 30,000-digit duration held boxyd for 20 s).
MAX_VALUE = 1024


def _bounded(parse: Callable[Concatenate[str, P], T]) -> Callable[Concatenate[str, P], T]:
    """PARSE, refusing text longer than MAX_VALUE in one short line first."""

    def bounded(s: str, /, *args: P.args, **kw: P.kwargs) -> T:
        if isinstance(s, str) and len(s) > MAX_VALUE:
            what = kw.get("what") or (parse.__kwdefaults__ or {}).get("what", "value")
            raise UsageError(
                f"{what}: {s[:40]!r}... is {len(s)} characters long (at most {MAX_VALUE})"
            )
        return parse(s, *args, **kw)

    bounded.__name__, bounded.__doc__ = parse.__name__, parse.__doc__
    return bounded


def _bad(what: str, value: str, kind: str, examples: str) -> UsageError:
    return UsageError(f"{what}: {value!r} is not {kind} ({examples})")


@_bounded
def parse_size(s: str, *, what: str = "size", allow_zero: bool = False) -> int:
    """'2GiB' → 2147483648. A plain number is bytes; fractions of a byte round down."""
    import re  # only for the flags that need a pattern: not on every start

    m = re.fullmatch(_SIZE_RE, s.strip())
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise _bad(what, s, "a size", _SIZE_EXAMPLES)
    from fractions import Fraction  # exact decimals; imported only when a size is given

    n = int(Fraction(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if n == 0 and not allow_zero:
        raise UsageError(f"{what}: {s!r} is zero; give a positive size ({_SIZE_EXAMPLES})")
    if n > _MAX_SIZE:
        raise UsageError(f"{what}: {s!r} is too large")
    return n


@_bounded
def parse_duration(s: str, *, what: str = "duration", allow_zero: bool = False) -> float:
    """'1h30m' → 5400.0; a plain number is seconds. Parts may be ms, s, m, h, d."""
    import re  # only for the flags that need a pattern: not on every start
    from fractions import Fraction  # exact decimals; imported only when a duration is given

    text = s.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        total = Fraction(text)
    else:
        parts = re.findall(_DURATION_PART_RE, text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise _bad(what, s, "a duration", _DURATION_EXAMPLES)
        units = [u for _, u in parts]
        if len(set(units)) != len(units):
            raise _bad(what, s, "a duration (a unit is repeated)", _DURATION_EXAMPLES)
        total = sum((Fraction(n) * Fraction(_DURATION_UNITS[u]) for n, u in parts), Fraction(0))
    if total == 0 and not allow_zero:
        raise UsageError(f"{what}: {s!r} is zero; give a positive duration ({_DURATION_EXAMPLES})")
    if total > _MAX_DURATION:
        raise UsageError(f"{what}: {s!r} is too long (at most 365d)")
    return float(total)


@_bounded
def parse_count(s: str, *, what: str, minimum: int = 1, maximum: int = 1 << 31) -> int:
    """A positive decimal integer such as --pids 512 (no signs, no 0x, no '1e3')."""
    import re  # only for the flags that need a pattern: not on every start

    text = s.strip()
    if not re.fullmatch(r"\d{1,19}", text):
        raise UsageError(f"{what}: {s!r} is not a whole number")
    n = int(text)
    if not minimum <= n <= maximum:
        raise UsageError(f"{what}: {n} is out of range ({minimum}–{maximum})")
    return n


@_bounded
def parse_cpus(s: str, *, what: str = "--cpus") -> float:
    """A positive number of CPUs, fractions allowed (--cpus 0.5)."""
    import re  # only for the flags that need a pattern: not on every start

    if not re.fullmatch(r"\d{1,6}(?:\.\d{1,6})?", s.strip()):
        raise UsageError(f"{what}: {s!r} is not a number of CPUs (examples: 0.5, 2)")
    n = float(s)
    if n <= 0:
        raise UsageError(f"{what}: {s!r} is zero; give a positive number of CPUs")
    return n


def format_size(n: int) -> str:
    """38.4KiB, 6.1MiB, 0B: one decimal from KiB up, binary units (as parse_size reads them)."""
    if n < 0:
        return "-" + format_size(-n)
    if n < 1024:
        return f"{n}B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        # 1023.96KiB would print as "1024.0KiB": move up instead.
        if round(value, 1) < 1024 or unit == "PiB":
            return f"{value:.1f}{unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """500ms, 9s, 2.5s, 1m5s, 1h30m, 2d3h: parse_duration reads every result back."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    total = int(seconds)
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        q, total = divmod(total, size)
        if q:
            out.append(f"{q}{unit}")
    return "".join(out)


@_bounded
def parse_port(s: str, *, what: str = "--allow-port") -> int:
    """A TCP/UDP port number, 1–65535, in decimal."""
    import re  # only for the flags that need a pattern: not on every start

    if not re.fullmatch(r"\d{1,5}", s) or not 1 <= int(s) <= 65535:
        raise UsageError(f"{what}: {s!r} is not a port number (1–65535)")
    return int(s)


class _Frozen:
    """A value frozen by hand, not a dataclass (the client imports this module, and
    dataclasses or typing cost it milliseconds on every run): its fields are its
    __slots__, set once in __init__ with object.__setattr__; equality, hash and repr
    come from them."""

    __slots__: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name}")

    def _key(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, type(self)) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"


class HostSpec(_Frozen):
    """One --allow-host value, parsed once (``parse_host_spec``) and passed on typed:
    a name or address (lower-case, no trailing dot), its ports (empty: the global
    --allow-port list applies), and whether the ports are UDP. ``str()`` is its wire
    and record form, which ``parse_host_spec`` reads back to an equal value."""

    __slots__ = ("host", "ports", "udp")
    host: str
    ports: tuple[int, ...]
    udp: bool

    def __init__(self, host: str, ports: tuple[int, ...] = (), udp: bool = False) -> None:
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "ports", tuple(ports))
        object.__setattr__(self, "udp", udp)

    def __str__(self) -> str:
        text = f"[{self.host}]" if ":" in self.host and self.ports else self.host
        if self.ports:
            text += ":" + ",".join(str(p) for p in self.ports)
        return text + ("/udp" if self.udp else "")


@_bounded
def parse_host_name(s: str, *, what: str = "--allow-host") -> str:
    """A DNS name (single-label names such as a tailnet's 'nas' included), normalised.

    A leading '*.' over at least two labels ('*.example.com') is a wildcard for every
    name strictly below it; '*' anywhere else, or over a single label, is refused.
    """
    import ipaddress  # only for a flag that names a host or a range
    import re  # only for the flags that need a pattern: not on every start

    name = s.lower().removesuffix(".")
    body = name  # the name without its wildcard label
    if "*" in name:
        body = name.removeprefix("*.")
        if "*" in body or body == name or "." not in body:
            raise UsageError(
                f"{what}: {s!r}: a wildcard must be a leading '*.' over at least two labels "
                "(e.g. *.example.com)"
            )
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        pass
    else:
        raise UsageError(
            f"{what}: {s!r} is an address, not a host name (use --allow-cidr for addresses)"
        )
    labels = body.split(".")
    if (
        not body
        or len(name) > 253
        or not all(re.fullmatch(_HOST_LABEL_RE, label) for label in labels)
        or labels[-1].isdigit()  # 'a.123' or '123' would be read as an IPv4 address
    ):
        raise UsageError(f"{what}: {s!r} is not a host name")
    return name


@_bounded
def parse_denied_host(s: str) -> HostSpec:
    """One `boxyctl deny` host (a name, *.SUFFIX or an address): denied on every port,
    so one with ports is refused."""
    spec = parse_host_spec(s, what="deny")
    if spec.ports or spec.udp:
        raise UsageError(f"deny: {spec}: a host is denied on every port (no :PORT)")
    return spec


def parse_host_spec(s: str, *, what: str = "--allow-host") -> HostSpec:
    """HOST, HOST:PORT[,PORT...], HOST:PORT[,PORT...]/udp (or /tcp, the default). HOST
    may be an address (192.168.4.7:22, [fd00::7]:22): a device reached by its literal
    address is named as itself, and allows that address only."""
    import ipaddress  # only for a flag that names a host or a range

    if "://" in s:
        _refuse_url(s, what)
    text, udp = s, False
    for suffix, is_udp in (("/udp", True), ("/tcp", False)):
        if text.lower().endswith(suffix):
            text, udp = text[: -len(suffix)], is_udp
            break
    if text.startswith("[") or text.count(":") > 1:  # an IPv6 literal, bracketed or not
        literal, sep, port_text = (
            text[1:].partition("]") if text.startswith("[") else (text, "", "")
        )
        if sep and port_text and not port_text.startswith(":"):
            raise UsageError(f"{what}: {s!r} is not a host name")
        host, sep, port_text = literal, (":" if port_text else ""), port_text[1:]
        try:
            name = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise UsageError(f"{what}: {s!r} is not a host name") from None
    else:
        host, sep, port_text = text.partition(":")
        name = _ipv4_literal(host) or (parse_host_name(host, what=what) if host else "")
    if sep and not port_text:
        raise UsageError(f"{what}: {s!r}: no port after ':' (HOST[:PORT[,PORT]][/udp])")
    if not name:
        raise UsageError(f"{what}: {s!r}: no host name (HOST[:PORT[,PORT]][/udp])")
    ports: list[int] = []
    if sep:
        for p in port_text.split(","):
            port = parse_port(p, what=f"{what} {s}")
            if port not in ports:
                ports.append(port)
    if udp and not ports:
        raise UsageError(f"{what}: {s!r}: /udp needs explicit ports (HOST:PORT/udp)")
    if not udp and not ports and text != s:  # "/tcp" alone would silently mean nothing
        raise UsageError(
            f"{what}: {s!r}: /tcp needs explicit ports (HOST:PORT/tcp); "
            "HOST alone takes the --allow-port list"
        )
    return HostSpec(name, tuple(ports), udp)


def _refuse_url(s: str, what: str) -> None:
    """'https://example.com/': a URL pasted from a browser or a config file; say what
    to write instead (its host, and its port when it names one)."""
    rest = s.partition("://")[2]
    where = rest.split("/", 1)[0].rpartition("@")[2]  # no path, no user:password@
    if not where:
        raise UsageError(f"{what}: {s!r} is a URL; give a host name (HOST[:PORT])")
    raise UsageError(f"{what}: {s!r} is a URL; give its host alone: {what} {where}")


def _ipv4_literal(text: str) -> str:
    """A dotted-quad address as a host (its own binding: that address, nothing else)."""
    import ipaddress  # only for a flag that names a host or a range

    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        return ""


@_bounded
def parse_cidr(s: str, *, what: str = "--allow-cidr") -> str:
    """A v4/v6 prefix (a bare address is a /32 or /128), normalised; never 'everything'
    and never the sandbox's own link."""
    import ipaddress  # only for a flag that names a host or a range

    try:
        net = ipaddress.ip_network(s.strip(), strict=True)
    except ValueError as e:
        try:
            loose = ipaddress.ip_network(s.strip(), strict=False)
        except ValueError:
            raise UsageError(f"{what}: {s!r} is not an address range ({e})") from None
        raise UsageError(f"{what}: {s!r} has host bits set (did you mean {loose}?)") from None
    if net.prefixlen == 0:
        raise UsageError(f"{what}: {s!r} would permit every address; name the ranges you need")
    for own in map(ipaddress.ip_network, SANDBOX_NETS):
        if net.version == own.version and net.overlaps(own):
            raise UsageError(f"{what}: {s!r} overlaps the sandbox's own network {own}")
    return str(net)


@_bounded
def parse_cidrs(s: str, *, what: str = "--allow-cidr") -> list[str]:
    """A comma-separated list of prefixes ('192.168.4.0/24,fd12::/48'), each as
    ``parse_cidr`` reads it; duplicates dropped, order kept."""
    out: list[str] = []
    for part in s.split(","):
        if not part.strip():
            raise UsageError(f"{what}: {s!r}: empty entry in the list (CIDR[,CIDR...])")
        net = parse_cidr(part, what=what)
        if net not in out:
            out.append(net)
    return out


class PortMapping(_Frozen):
    """One --publish value, parsed once (``parse_publish``): the host's ADDR (an
    address literal) and HOST_PORT, relayed by boxyd to PORT on the sandbox's own
    loopback. ``str()`` is its wire and record form, which ``parse_publish`` reads
    back to an equal value."""

    __slots__ = ("addr", "host_port", "port")
    addr: str
    host_port: int
    port: int

    def __init__(self, addr: str, host_port: int, port: int) -> None:
        object.__setattr__(self, "addr", addr)
        object.__setattr__(self, "host_port", host_port)
        object.__setattr__(self, "port", port)

    @property
    def host(self) -> str:
        """Where the host reaches it: 127.0.0.1:8080, [::1]:8080."""
        return (
            f"[{self.addr}]:{self.host_port}"
            if ":" in self.addr
            else f"{self.addr}:{self.host_port}"
        )

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


PUBLISH_FORM = "[ADDR:]HOST_PORT:PORT"
DEFAULT_PUBLISH_ADDR = "127.0.0.1"  # this machine's processes only, never its network


@_bounded
def parse_publish(s: str, *, what: str = "--publish") -> PortMapping:
    """[ADDR:]HOST_PORT:PORT[/tcp], as docker's -p writes it: ADDR an IPv4 address or
    a bracketed IPv6 one ([::1]:8080:80), 127.0.0.1 when left out. Only TCP is
    relayed; a range, a host name, or a host port left to chance is refused."""
    import ipaddress  # only for a flag that publishes a port

    text = s[:-4] if s.lower().endswith("/tcp") else s
    if s.lower().endswith("/udp"):
        raise UsageError(f"{what}: {s!r}: only TCP ports are published")
    addr = DEFAULT_PUBLISH_ADDR
    if text.startswith("["):
        literal, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise UsageError(f"{what}: {s!r} is not {PUBLISH_FORM} ([::1]:8080:80)")
        try:
            addr = str(ipaddress.IPv6Address(literal))
        except ValueError:
            raise UsageError(f"{what}: {s!r}: {literal!r} is not an IPv6 address") from None
        parts = rest[1:].split(":")
    else:
        parts = text.split(":")
        if len(parts) == 3:
            given = parts.pop(0)
            addr = _ipv4_literal(given)
            if not addr:
                raise UsageError(
                    f"{what}: {s!r}: {given!r} is not an address "
                    "(an IPv4 address, or an IPv6 one in brackets)"
                )
    if len(parts) > 3 and text.count("::"):
        raise UsageError(f"{what}: {s!r}: an IPv6 address goes in brackets ([::1]:8080:80)")
    if len(parts) != 2 or not all(parts):
        raise UsageError(
            f"{what}: {s!r} is not {PUBLISH_FORM} (8080:80 publishes the sandbox's port 80 "
            "as 127.0.0.1:8080)"
        )
    if any("-" in p for p in parts):
        raise UsageError(f"{what}: {s!r}: give one port on each side, not a range")
    host_port = parse_port(parts[0], what=f"{what} {s}")
    port = parse_port(parts[1], what=f"{what} {s}")
    return PortMapping(addr, host_port, port)


# How an option's text becomes its value, by the option table's type (boxy.options):
# the one converter of each type the command line (boxyctl.cli) and the library
# (boxy.library) share. The types whose value depends on the caller (a path against
# its cwd, -e NAME from its environment, a profile name) each side reads itself.
FROM_TEXT: dict[str, Callable[..., object]] = {
    "host": parse_host_spec,
    "port": parse_port,
    "publish": parse_publish,
    "cidrs": parse_cidrs,  # several in one value: a list
    "size": parse_size,
    "count": parse_count,
    "cpus": parse_cpus,
    "duration": parse_duration,
}


def from_text(kind: str, text: str, flag: str) -> object:
    """TEXT of an option of type KIND (a FROM_TEXT key) as its value; UsageError
    naming FLAG when it is not one."""
    return FROM_TEXT[kind](text, what=flag)


def run_clock(seconds: float) -> str:
    """SECONDS into a run as watch's RECENT column and show's lines say them:
    MM:SS.mmm (never negative)."""
    ms = max(0, round(seconds * 1000))
    return f"{ms // 60000:02}:{ms // 1000 % 60:02}.{ms % 1000:03}"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 connection', '2 connections'; MANY for an irregular plural ('denials')."""
    return f"{n} {word if n == 1 else many or word + 's'}"
