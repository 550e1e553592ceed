"""boxyctl's command line: argv → a Command, or one line saying what is wrong.

Only the standard library and ``boxyd.units`` are imported: this runs on every
client start, so no YAML, asyncio or D-Bus here. For ``run`` the result is exactly
the varlink Run parameters; the daemon merges them with the profile and re-checks
them (``boxyd.spec.build_spec``). Everything knowable without the profile is
refused here, before a daemon is contacted. Paths are made absolute against the
client's cwd (with ``~`` from the client's HOME) because the daemon's cwd and
environment are not the user's.
"""

from __future__ import annotations

import argparse
import os.path
import re
import sys
from typing import Any, NoReturn

from boxyd.errors import UsageError
from boxyd.units import (
    parse_cidrs,
    parse_count,
    parse_cpus,
    parse_duration,
    parse_host_spec,
    parse_port,
    parse_size,
)

# What the client tells the daemon about its environment. The first group may be
# passed on to the payload; the rest only feed the daemon's exposure check (which
# sockets must not be inside an exposed tree) and are never passed on.
CLIENT_ENV_NAMES = ("TERM", "LANG", "LANGUAGE", "TZ", "COLORTERM", "NO_COLOR", "HOME", "USER",
                    # which registry a profile's {npm_registry}/{pip_index}… means: the
                    # tools' own overrides, and the PATH that finds those tools
                    "PATH", "npm_config_registry", "NPM_CONFIG_REGISTRY", "PIP_INDEX_URL",
                    "GOPROXY", "GOSUMDB")
CLIENT_ENV_PREFIXES = ("LC_",)
EXPOSURE_ENV_NAMES = (
    "SSH_AUTH_SOCK",
    "GNUPGHOME",
    "DOCKER_HOST",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
)
COMMANDS = ("run", "ps", "show", "watch", "attach", "stop", "doctor", "profile", "daemon")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

RUN_DESCRIPTION = """\
Run COMMAND in a fresh sandbox: the work directory read-write, a fresh $HOME,
nothing else from the host unless a flag or the profile says so.
Paths may be relative (to the current directory) or start with ~."""


class Command:
    """One parsed invocation. name is a subcommand, or 'help' (args: text) or 'version'.
    (A plain class: the dataclasses module costs the client 13 ms of every run.)"""

    def __init__(self, name: str, args: dict[str, Any] | None = None) -> None:
        self.name = name
        self.args = args if args is not None else {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Command) and (self.name, self.args) == (other.name, other.args)

    def __repr__(self) -> str:
        return f"Command({self.name!r}, {self.args!r})"


class _Help(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


class _Version(Exception):
    pass


class _HelpAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show this help")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        raise _Help(parser.format_help())


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version")

    def __call__(self, *_: Any) -> None:
        raise _Version()


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse builds a formatter for every add_argument and asks shutil for the
    terminal width each time; shutil pulls in bz2, lzma and zlib (4 ms on every run).
    The width is only needed when help is printed: ask the terminal directly."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            try:
                width = os.get_terminal_size(sys.stdout.fileno()).columns - 2
            except (OSError, ValueError):
                width = 78
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line) instead of printing usage and exiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("add_help", False)
        kwargs.setdefault("formatter_class", _Formatter)
        # '--mem' must not silently mean '--memory': exact flags only.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.add_argument("-h", "--help", action=_HelpAction)

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        if message.startswith("the following arguments are required"):
            # 'boxyctl stop' → 'stop: …', so the line says which command is missing what
            sub = self.prog.partition(" ")[2]
            message = f"{sub}: {message}" if sub else message
        raise UsageError(message)


def _build_parser(prog: str, *, run_only: bool = False) -> _Parser:
    """RUN_ONLY: just the `run` subcommand — every sandboxed run pays for building the
    parser, and the other subcommands cost it several milliseconds."""
    parser = _Parser(
        prog=prog,
        description="Run an untrusted program with its project directory and nothing else.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="run a command in a sandbox",
        usage=f"{prog} run [flags] -- COMMAND [ARGS...]",
        description=RUN_DESCRIPTION,
        formatter_class=_Formatter,
    )
    a = run.add_argument
    # fmt: off
    a("-p", "--profile", metavar="NAME|PATH", help="preset (node, python, generic, offline, claude) or a YAML file")
    a("--ro", action="append", default=[], metavar="PATH", help="expose a path read-only (repeatable)")
    a("--rw", action="append", default=[], metavar="PATH", help="expose a path read-write (repeatable)")
    a("--protect", action="append", default=[], metavar="PATH", help="keep a path read-only inside a writable mount (repeatable)")
    a("--mkdir", action="append", default=[], metavar="PATH", help="expose a directory read-write, creating it if absent (repeatable)")
    a("--allow-git-write", action="store_true", help="let the sandbox write .git/hooks and .git/config")
    a("--copy", action="append", default=[], metavar="SRC[:DST]", help="copy one file in, writable (repeatable)")
    a("--copy-ro", action="append", default=[], metavar="SRC[:DST]", help="copy one file in, read-only (repeatable)")
    a("-w", "--workdir", metavar="PATH", help="working directory, read-write (default: the current directory)")
    a("--net", choices=("public", "allowlist", "none"), help="network mode")
    a("--allow-host", action="append", default=[], metavar="HOST[:PORT[,PORT]][/udp]", help="reachable host name; implies allowlist (repeatable)")
    a("--allow-port", action="append", default=[], metavar="N", help="permitted outbound TCP port (repeatable)")
    a("--allow-cidr", action="append", default=[], metavar="CIDR", help="address range to permit despite the private-address denylist (repeatable)")
    a("--tailscale", action="store_true", help="reach this machine's tailnet by MagicDNS name")
    a("-e", "--env", action="append", default=[], metavar="NAME[=VAL]", help="pass (NAME) or set (NAME=VAL) an environment variable (repeatable)")
    a("--memory", metavar="SIZE", help="memory limit (default 2GiB)")
    a("--pids", metavar="N", help="process/thread limit (default 512)")
    a("--cpus", metavar="N", help="CPU limit, fractions allowed")
    a("--timeout", metavar="DURATION", help="stop the run after this long (e.g. 10m, 1h30m)")
    a("--audit-log", metavar="FILE", help="policy decisions as JSON lines")
    a("--net-log", metavar="FILE", help="every connection, hostname and SNI")
    a("--pcap", metavar="FILE", help="every packet on the sandbox's link, pcap format")
    a("--pcap-max", metavar="SIZE", help="stop the capture at this size (default 1GiB)")
    a("--seccomp", choices=("strict", "compat"), help="strict (default) or compat (kills become EPERM)")
    a("--tty", action="store_true", help="expose /dev/tty to the sandbox")
    a("-v", "--verbose", action="store_true", help="report denials and skipped entries on stderr")
    a("-d", "--detach", action="store_true", help="print the session id and do not attach")
    # REMAINDER: like bwrap, the first non-option word starts the command; '--' is optional.
    a("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help=argparse.SUPPRESS)

    if run_only:
        return parser
    ps = sub.add_parser("ps", help="list running sessions")
    ps.add_argument("-a", "--all", action="store_true", help="every session on record")
    sub.add_parser("show", help="one session in full").add_argument("id", metavar="ID")
    sub.add_parser("watch", help="follow a session as it happens").add_argument("id", metavar="ID", nargs="?")
    sub.add_parser("attach", help="take over a session's terminal").add_argument("id", metavar="ID")
    stop = sub.add_parser("stop", help="SIGTERM, then SIGKILL")
    stop.add_argument("-k", "--kill", action="store_true", help="SIGKILL now")
    stop.add_argument("id", metavar="ID")
    sub.add_parser("doctor", help="check what this kernel and host provide")

    profile = sub.add_parser("profile", help="list or show profiles")
    psub = profile.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    psub.add_parser("list", help="the presets")
    psub.add_parser("show", help="a preset's text").add_argument("name", metavar="NAME")

    daemon = sub.add_parser("daemon", help="the boxyd daemon")
    dsub = daemon.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    dsub.add_parser("status", help="which build is running, and how busy it is")
    dsub.add_parser("restart", help="replace it with this build")
    dsub.add_parser("stop", help="stop it (refused while sessions are running)")
    # fmt: on
    return parser


def usage(prog: str = "boxyctl", command: str | None = None) -> str:
    """The help text of the program, or of one subcommand ('run', 'ps' …)."""
    argv = [command, "--help"] if command else ["--help"]
    try:
        _build_parser(prog).parse_args(argv)
    except _Help as h:
        return h.text
    raise AssertionError("--help did not produce help")


def client_env(environ: dict[str, str]) -> dict[str, str]:
    """The subset of the client's environment sent with Run (see CLIENT_ENV_NAMES)."""
    return {
        k: v
        for k, v in environ.items()
        if k in CLIENT_ENV_NAMES or k in EXPOSURE_ENV_NAMES or k.startswith(CLIENT_ENV_PREFIXES)
    }


class _Paths:
    """Client-side path handling: absolute against cwd, ~ from the client's HOME."""

    def __init__(self, environ: dict[str, str], cwd: str) -> None:
        self.home = environ.get("HOME", "")
        self.cwd = cwd

    def __call__(self, flag: str, value: str) -> str:
        if not value:
            raise UsageError(f"{flag}: empty path")
        if value.startswith("~"):
            if value != "~" and not value.startswith("~/"):
                raise UsageError(f"{flag} {value}: only ~ and ~/ are expanded")
            if not self.home.startswith("/"):
                raise UsageError(f"{flag} {value}: HOME is not set to an absolute path")
            value = self.home + value[1:]
        return os.path.normpath(os.path.join(self.cwd, value))

    def copy(self, flag: str, value: str) -> dict[str, str | None]:
        src, sep, dst = value.partition(":")
        if not src or (sep and not dst):
            raise UsageError(f"{flag} {value!r}: expected SRC[:DST]")
        if dst and not (dst.startswith("/") or dst == "~" or dst.startswith("~/")):
            raise UsageError(f"{flag} {value}: DST must be an absolute path (or start with ~)")
        return {"src": self(flag, src), "dst": self(flag, dst) if dst else None}


def _env_entry(value: str, environ: dict[str, str]) -> dict[str, Any]:
    name, sep, val = value.partition("=")
    if not _NAME_RE.fullmatch(name):
        raise UsageError(f"-e {value!r}: not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if sep:
        return {"name": name, "value": val, "present": True}
    # -e NAME: the value is the client's, never the daemon's.
    if name in environ:
        return {"name": name, "value": environ[name], "present": True}
    return {"name": name, "value": None, "present": False}


def _session_id(value: str | None) -> str | None:
    if value is not None and not _ID_RE.fullmatch(value):
        raise UsageError(f"{value!r} is not a session id")
    return value


def _run_args(ns: argparse.Namespace, environ: dict[str, str], cwd: str) -> dict[str, Any]:
    command = list(ns.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("run: missing command (run [flags] -- COMMAND [ARGS...])")
    path = _Paths(environ, cwd)

    def opt_path(flag: str, value: str | None) -> str | None:
        return None if value is None else path(flag, value)

    profile = ns.profile
    if profile is not None:
        if not profile:
            raise UsageError("--profile: empty name")
        if "/" in profile or profile.endswith((".yaml", ".yml")):
            profile = path("--profile", profile)
    pcap_max = parse_size(ns.pcap_max, what="--pcap-max") if ns.pcap_max is not None else None
    options: dict[str, Any] = {
        "profile": profile,
        "ro": [path("--ro", p) for p in ns.ro],
        "rw": [path("--rw", p) for p in ns.rw],
        "protect": [path("--protect", p) for p in ns.protect],
        "mkdir": [path("--mkdir", p) for p in ns.mkdir],
        "copy": [path.copy("--copy", c) for c in ns.copy],
        "copy_ro": [path.copy("--copy-ro", c) for c in ns.copy_ro],
        "workdir": opt_path("--workdir", ns.workdir),
        "net": ns.net,
        "allow_host": [str(parse_host_spec(h)) for h in ns.allow_host],
        "allow_port": [parse_port(p) for p in ns.allow_port],
        "allow_cidr": [n for c in ns.allow_cidr for n in parse_cidrs(c)],
        "tailscale": ns.tailscale,
        "env": [_env_entry(e, environ) for e in ns.env],
        "memory": parse_size(ns.memory, what="--memory") if ns.memory is not None else None,
        "pids": parse_count(ns.pids, what="--pids") if ns.pids is not None else None,
        "cpus": parse_cpus(ns.cpus) if ns.cpus is not None else None,
        "timeout": parse_duration(ns.timeout, what="--timeout") if ns.timeout is not None else None,
        "audit_log": opt_path("--audit-log", ns.audit_log),
        "net_log": opt_path("--net-log", ns.net_log),
        "pcap": opt_path("--pcap", ns.pcap),
        "pcap_max": pcap_max,
        "seccomp": ns.seccomp,
        "tty": ns.tty,
        "verbose": ns.verbose,
        "detach": ns.detach,
        "allow_git_write": ns.allow_git_write,
    }
    _check_combinations(options)
    return {"argv": command, "cwd": cwd, "options": options, "client_env": client_env(environ)}


def _check_combinations(o: dict[str, Any]) -> None:
    """Refuse what can never work, whatever the profile says."""
    net = o["net"]
    if o["allow_host"] and net in ("none", "public"):
        raise UsageError(
            f"--allow-host: cannot be combined with --net {net} (it implies allowlist)"
        )
    if net == "none":
        for key, flag in (
            ("pcap", "--pcap"),
            ("tailscale", "--tailscale"),
            ("allow_port", "--allow-port"),
            ("allow_cidr", "--allow-cidr"),
        ):
            if o[key]:
                raise UsageError(f"{flag}: cannot be combined with --net none (no network at all)")
    if o["pcap_max"] is not None and o["pcap"] is None:
        raise UsageError("--pcap-max: needs --pcap")


def parse(argv: list[str], *, environ: dict[str, str], cwd: str, prog: str = "boxyctl") -> Command:
    """Parse ``argv`` (without the program name). Raises UsageError with one line;
    --help gives Command('help', {'text': …}), --version Command('version')."""
    if not cwd.startswith("/"):
        raise UsageError(f"the current directory {cwd!r} is not an absolute path")
    parser = _build_parser(prog, run_only=bool(argv) and argv[0] == "run")
    try:
        ns = parser.parse_args(argv)
    except _Help as h:
        return Command("help", {"text": h.text})
    except _Version:
        return Command("version")
    name = ns.command
    if name is None:
        raise UsageError(f"missing command ({', '.join(COMMANDS)}); see {prog} --help")
    if name == "run":
        return Command("run", _run_args(ns, environ, cwd))
    if name == "ps":
        return Command("ps", {"all": ns.all})
    if name in ("show", "attach", "watch"):
        return Command(name, {"id": _session_id(ns.id)})
    if name == "stop":
        return Command("stop", {"id": _session_id(ns.id), "kill": ns.kill})
    if name in ("profile", "daemon"):
        if ns.action is None:
            choices = "list, show NAME" if name == "profile" else "status, restart, stop"
            raise UsageError(f"{name}: missing action ({choices})")
        args: dict[str, Any] = {"action": ns.action}
        if name == "profile" and ns.action == "show":
            args["name"] = ns.name
        return Command(name, args)
    return Command(name)


def prog_name(argv0: str) -> str:
    """'boxy' or 'boxyctl', as the user typed it (anything else reads as boxyctl)."""
    base = os.path.basename(argv0)
    return base if base in ("boxy", "boxyctl") else "boxyctl"


def parse_or_exit(
    argv: list[str], *, environ: dict[str, str], cwd: str, prog: str = "boxyctl"
) -> Command:
    """parse(), but a usage error prints one line 'PROG: message' and exits 2."""
    try:
        return parse(argv, environ=environ, cwd=cwd, prog=prog)
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
