"""What a client asks for when it runs a command: a typed request.

The CLI (and the Python library) build a RunRequest directly; each API adapter
decodes one from its wire with `RunRequest.from_wire`, which checks every shape
and reports a wrong one as a UsageError (a client bug or a hostile caller, never a
traceback). The daemon merges it with the profile into a RunSpec (boxyd.config.spec).

Plain classes, not dataclasses: the dataclasses module costs the client 13 ms of
every run.
"""

from __future__ import annotations

from boxy.errors import UsageError
from boxy.options import LIST_KINDS, RUN_OPTIONS
from boxy.values import HostSpec, PortMapping, parse_host_spec, parse_publish

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class Value:
    """Equality and repr from __slots__ (what dataclasses would give)."""

    __slots__: tuple[str, ...] = ()

    def _items(self) -> tuple[tuple[str, Any], ...]:
        return tuple((k, getattr(self, k)) for k in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._items() == other._items()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._items())})"


class EnvItem(Value):
    """-e NAME=VALUE, or -e NAME with the client's value (None: it has none)."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: str | None) -> None:
        self.name, self.value = name, value

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "present": self.value is not None}


class Secret(Value):
    """--secret NAME[@HOST,…]: the value from the client's environment. Its repr never
    shows the value (a request may end up in a log line or a traceback). HOSTS: the
    payload gets a placeholder, and the gateway puts the value in requests to these
    hosts alone (boxyd/net/secretflow.py)."""

    __slots__ = ("name", "value", "hosts")

    def __init__(self, name: str, value: str, hosts: tuple[str, ...] = ()) -> None:
        self.name, self.value, self.hosts = name, value, hosts

    def __repr__(self) -> str:
        at = f", hosts={list(self.hosts)!r}" if self.hosts else ""
        return f"Secret(name={self.name!r}, value=<hidden>{at})"

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "value": self.value}
        if self.hosts:  # (absent: what an older boxyd reads)
            out["hosts"] = list(self.hosts)
        return out


# -e and --secret as the command line and the library both read them (the value of a
# name given alone is the caller's environment's, never the daemon's)
_VAR_NAME = "[A-Za-z_][A-Za-z0-9_]*"


def _valid_name(name: str) -> bool:
    import re  # only for the flags that need a pattern: not on every start

    return re.fullmatch(_VAR_NAME, name) is not None


def env_entry(text: str, environ: Mapping[str, str], value: str | None = None) -> EnvItem:
    """-e NAME=VALUE, or -e NAME with ENVIRON's value (None when it has none); VALUE:
    one given in code (the library's {NAME: VALUE}: TEXT is the name alone)."""
    name, sep, val = (text, "=", value) if value is not None else text.partition("=")
    if not _valid_name(name):
        raise UsageError(f"-e {text!r}: not a valid variable name ({_VAR_NAME})")
    return EnvItem(name, val if sep else environ.get(name))


_HOST_NAME = (
    r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+"
)


def secret_hosts(text: str) -> tuple[str, tuple[str, ...]]:
    """NAME@HOST[,HOST…] → (NAME, hosts lowercase); NAME alone → (NAME, ())."""
    import re

    name, at, hosts = text.partition("@")
    if not at:
        return name, ()
    out = tuple(dict.fromkeys(h.strip().lower().rstrip(".") for h in hosts.split(",")))
    bad = [h for h in out if re.fullmatch(_HOST_NAME, h) is None]
    if bad:
        said = f"{bad[0]}: not a host name" if bad[0] else "a host name is missing"
        raise UsageError(
            f"--secret {text}: {said} (NAME@HOST[,HOST…]: the hosts the value is sent to, over TLS)"
        )
    return name, out


def secret_entry(text: str, environ: Mapping[str, str], value: str | None = None) -> Secret:
    """--secret NAME[@HOST,…]: its value from ENVIRON, never from a command line (ps
    shows every argv on the machine); VALUE: one given in code (the library's
    {NAME: VALUE}). The messages never hold a value."""
    name, hosts = secret_hosts(text) if "=" not in text else (text, ())
    if value is None and "=" in name:
        raise UsageError(
            f"--secret {name.partition('=')[0]}: takes a name; the value comes from "
            "your environment (for a setting that is no secret: -e NAME=VALUE)"
        )
    if not _valid_name(name):
        raise UsageError(f"--secret {name!r}: not a valid variable name ({_VAR_NAME})")
    if value is None and name not in environ:
        raise UsageError(f"--secret {name}: not set in your environment")
    return Secret(name, value if value is not None else environ[name], hosts)


class CopyItem(Value):
    """--copy SRC[:DST]; DST None means the same path inside."""

    __slots__ = ("src", "dst")

    def __init__(self, src: str, dst: str | None = None) -> None:
        self.src, self.dst = src, dst

    def to_wire(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst}


class Terminal(Value):
    """The client terminal's settings from before it went raw (boxy.termsettings):
    termios as tcgetattr gives it, and the window size."""

    __slots__ = ("termios", "winsize")

    def __init__(self, termios: list[Any], winsize: list[int]) -> None:
        self.termios, self.winsize = termios, winsize

    def to_wire(self) -> dict[str, Any]:
        return {"termios": self.termios, "winsize": self.winsize}

    @classmethod
    def from_wire(cls, value: object) -> Terminal | None:
        """Checked for shape only: they are the user's own; PID 1 applies them and
        refuses a bad one. A wrong shape means no settings, not an error."""
        if not isinstance(value, dict):
            return None
        attrs, size = value.get("termios"), value.get("winsize")
        if (
            isinstance(attrs, list)
            and len(attrs) == 7
            and all(type(a) is int for a in attrs[:6])
            and isinstance(attrs[6], list)
            and all(type(c) is int for c in attrs[6])
            and isinstance(size, list)
            and len(size) == 4
            and all(type(v) is int for v in size)
        ):
            return cls(attrs, size)
        return None


# Every option's wire kind, from the one table (boxy.options); the keys are the wire
# fields, in the table's order.
OPTIONS: dict[str, str] = {o.field: o.wire for o in RUN_OPTIONS}
_EXPECTED = {
    "str": "a string",
    "strs": "a list of strings",
    "hosts": "a list of strings",
    "bool": "true or false",
    "count": "a positive whole number",
    "size": "a size in bytes",
    "number": "a positive number",
    "ports": "a list of port numbers",
    "published": "a list of [ADDR:]HOST_PORT:PORT strings",
    "env": "a list of {name, value, present}",
    "secrets": "a list of {name, value}",
    "copies": "a list of {src, dst}",
}


class RunOptions(Value):
    """The run flags, as given (paths absolute against the client's cwd, sizes in
    bytes, durations in seconds); the profile fills what is None or empty. Fields and
    wire kinds are the option table's (boxy.options); the annotations below are for
    mypy, and tests/unit/test_options.py holds them to the table."""

    __slots__ = tuple(OPTIONS)
    profile: str | None
    ro: list[str]
    rw: list[str]
    protect: list[str]
    reveal: list[str]
    mkdir: list[str]
    copy: list[CopyItem]
    copy_ro: list[CopyItem]
    workdir: str | None
    net: str | None
    allow_host: list[HostSpec]  # parsed once, by the client or from the wire
    allow_port: list[int]
    allow_cidr: list[str]
    tailscale: bool
    ask: bool
    ask_timeout: float | None
    ask_notify: bool
    publish: list[PortMapping]  # parsed once, as allow_host is
    env: list[EnvItem]
    secret: list[Secret]
    memory: int | None
    pids: int | None
    cpus: float | None
    timeout: float | None
    review_limit: int | None
    audit_log: str | None
    net_log: str | None
    pcap: str | None
    pcap_max: int | None
    seccomp: str | None
    tty: bool
    tty_raw: bool
    verbose: bool
    detach: bool
    allow_git_write: bool
    review: bool
    edit_config: list[str]
    allow_host_config: list[str]

    def __init__(self, **values: Any) -> None:
        for key in values:
            if key not in OPTIONS:
                raise TypeError(f"RunOptions: unknown option {key!r}")
        for key, kind in OPTIONS.items():
            default: Any = [] if kind in LIST_KINDS else (False if kind == "bool" else None)
            value = values.get(key, default)
            if kind == "hosts":  # a caller's text is parsed here, once: the field is typed
                value = [h if isinstance(h, HostSpec) else parse_host_spec(h) for h in value]
            elif kind == "published":
                value = [m if isinstance(m, PortMapping) else parse_publish(m) for m in value]
            setattr(self, key, value)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, kind in OPTIONS.items():
            value = getattr(self, key)
            if kind in ("env", "secrets", "copies"):
                out[key] = [v.to_wire() for v in value]
            elif kind in ("hosts", "published"):  # the wire carries a host as its text
                out[key] = [str(v) for v in value]
            else:
                out[key] = list(value) if kind in LIST_KINDS else value
        return out

    @classmethod
    def from_wire(cls, options: object) -> RunOptions:
        if not isinstance(options, dict):
            raise UsageError("Run: options: expected an object")
        for key in options:
            if key not in OPTIONS:
                raise UsageError(f"Run: unknown option {key!r}")
        return cls(**{k: _decode(k, OPTIONS[k], v) for k, v in options.items() if v is not None})


def _fail(key: str, kind: str) -> UsageError:
    return UsageError(f"Run: options.{key}: expected {_EXPECTED[kind]}")


def _decode(key: str, kind: str, value: object) -> Any:
    """One option from JSON, checked (bool is an int to Python: refused as a number)."""
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind in ("count", "size"):
        ok = type(value) is int and value > 0  # no upper bound: a huge size is refused later
    elif kind == "number":
        ok = type(value) in (int, float) and 0 < value < 1e15  # type: ignore[operator]
        value = float(value) if ok else value  # type: ignore[arg-type]
    else:
        return _decode_list(key, kind, value)
    if not ok:
        raise _fail(key, kind)
    return value


def _decode_list(key: str, kind: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(key, kind)
    out: list[Any] = []
    for item in value:
        if kind == "strs" and isinstance(item, str):
            out.append(item)
        elif kind == "hosts" and isinstance(item, str):
            out.append(parse_host_spec(item))  # a bad one is refused as the flag's would be
        elif kind == "published" and isinstance(item, str):
            out.append(parse_publish(item))
        elif kind == "ports" and type(item) is int:
            out.append(item)  # the range is checked with the profile's ports (boxyd.config.network)
        elif (
            kind == "env"
            and isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and (item.get("value") is None or isinstance(item.get("value"), str))
        ):
            present = item.get("present", item.get("value") is not None) is not False
            out.append(EnvItem(item["name"], item.get("value") if present else None))
        elif (
            kind == "secrets"
            and isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("value"), str)
            and isinstance(item.get("hosts", []), list)
            and all(isinstance(h, str) for h in item.get("hosts", []))
        ):
            out.append(Secret(item["name"], item["value"], tuple(item.get("hosts", []))))
        elif (
            kind == "copies"
            and isinstance(item, dict)
            and isinstance(item.get("src"), str)
            and (item.get("dst") is None or isinstance(item.get("dst"), str))
        ):
            out.append(CopyItem(item["src"], item.get("dst")))
        else:
            raise _fail(key, kind)
    return out


class RunRequest(Value):
    """One run as a client asks for it: ARGV in CWD (the client's, absolute) with
    OPTIONS; CLIENT_ENV the part of the client's environment it sends
    (boxy.client.client_env) and ENV_UNSET the names a profile's env_pass asked for
    that it does not have; TERMINAL its settings when it went raw; BUILD its build id
    (a daemon of another build refuses the call)."""

    __slots__ = ("argv", "cwd", "options", "client_env", "env_unset", "terminal", "build")

    def __init__(
        self,
        argv: list[str],
        cwd: str,
        options: RunOptions | None = None,
        client_env: dict[str, str] | None = None,
        terminal: Terminal | None = None,
        build: str = "",
        env_unset: list[str] | None = None,
    ) -> None:
        self.argv, self.cwd = argv, cwd
        self.options = options if options is not None else RunOptions()
        self.client_env = client_env if client_env is not None else {}
        self.env_unset = env_unset if env_unset is not None else []
        self.terminal, self.build = terminal, build

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "options": self.options.to_wire(),
            "client_env": dict(self.client_env),
        }
        if self.env_unset:
            out["env_unset"] = list(self.env_unset)
        if self.terminal is not None:
            out["terminal"] = self.terminal.to_wire()
        if self.build:
            out["build"] = self.build
        return out

    @classmethod
    def from_wire(cls, params: object) -> RunRequest:
        """Decode and check the Run parameters; UsageError with one line."""
        if not isinstance(params, dict):
            raise UsageError("Run: parameters must be an object")
        argv = params.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise UsageError("missing command (boxyctl run [flags] -- COMMAND [ARGS...])")
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise UsageError("Run: cwd: expected an absolute path")
        client_env = params.get("client_env", {})
        if not isinstance(client_env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in client_env.items()
        ):
            raise UsageError("Run: client_env: expected an object of strings")
        env_unset = params.get("env_unset", [])
        if not isinstance(env_unset, list) or not all(isinstance(n, str) for n in env_unset):
            raise UsageError("Run: env_unset: expected a list of names")
        build = params.get("build", "")
        return cls(
            argv,
            cwd,
            RunOptions.from_wire(params.get("options", {})),
            client_env,
            Terminal.from_wire(params.get("terminal")),
            build if isinstance(build, str) else "",
            env_unset,
        )
