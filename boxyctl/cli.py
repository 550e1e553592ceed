"""boxyctl's command line: argv → a Command, or one line saying what is wrong.

Only the standard library and ``boxy`` are imported: this runs on every client
start, so no YAML, asyncio or D-Bus here. For ``run`` the result is a typed
``boxy.request.RunRequest``; the daemon merges it with the profile and re-checks
it (``boxyd.config.spec.build_spec``). Everything knowable without the profile is
refused here, before a daemon is contacted. Paths are made absolute against the
client's cwd (with ``~`` from the client's HOME) because the daemon's cwd and
environment are not the user's.
"""

from __future__ import annotations

import os.path
import re
import sys
from collections import namedtuple
from types import SimpleNamespace

from boxy.errors import UsageError
from boxy.request import CopyItem, EnvItem, RunOptions, RunRequest, Secret
from boxy.values import (
    parse_cidrs,
    parse_count,
    parse_cpus,
    parse_duration,
    parse_host_spec,
    parse_port,
    parse_size,
)

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import Any

# What the client tells the daemon about its environment. The first group may be
# passed on to the payload; the rest only feed the daemon's exposure check (which
# sockets must not be inside an exposed tree) and are never passed on.
CLIENT_ENV_NAMES = (
    "TERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "COLORTERM",
    "NO_COLOR",
    "HOME",
    "USER",
    # which registry a profile's {npm_registry}/{pip_index}… means: the
    # tools' own overrides, and the PATH that finds those tools
    "PATH",
    "npm_config_registry",
    "NPM_CONFIG_REGISTRY",
    "PIP_INDEX_URL",
    "GOPROXY",
    "GOSUMDB",
)
CLIENT_ENV_PREFIXES = ("LC_",)
EXPOSURE_ENV_NAMES = (
    "SSH_AUTH_SOCK",
    "GNUPGHOME",
    "DOCKER_HOST",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
)
PUBLIC_PORTS = (
    "--allow-port: cannot be combined with --net public (public mode allows every "
    "port; the list applies to --net allowlist)"
)
COMMANDS = (
    "run",
    "ps",
    "show",
    "watch",
    "attach",
    "stop",
    "doctor",
    "profile",
    "daemon",
    "cache",
    "setup",
    "trust",
    "completion",
)
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


class Flag(namedtuple("Flag", "names kind metavar choices help", defaults=(None, None, ""))):
    """One `run` flag: the argparse parser and the fast path read this same table.
    names: ('-p', '--profile'); kind: "value", "append" or "true" (a switch)."""

    __slots__ = ()

    @property
    def dest(self) -> str:
        return self.names[-1].lstrip("-").replace("-", "_")


# fmt: off
RUN_FLAGS: tuple[Flag, ...] = (
    Flag(('-p', '--profile'), 'value', metavar='NAME|PATH', help='preset (node, python, generic, offline, claude) or a YAML file'),
    Flag(('--ro',), 'append', metavar='PATH', help='expose a path read-only (repeatable)'),
    Flag(('--rw',), 'append', metavar='PATH', help='expose a path read-write (repeatable)'),
    Flag(('--protect',), 'append', metavar='PATH', help='keep a path read-only inside a writable mount (repeatable)'),
    Flag(('--reveal',), 'append', metavar='PATH', help='show a credential in the work tree as it is, instead of covered (repeatable)'),
    Flag(('--mkdir',), 'append', metavar='PATH', help='expose a directory read-write, creating it if absent (repeatable)'),
    Flag(('--allow-git-write',), 'true', help='let the sandbox write .git/hooks and .git/config'),
    Flag(('--copy',), 'append', metavar='SRC[:DST]', help='copy one file in, writable (repeatable)'),
    Flag(('--copy-ro',), 'append', metavar='SRC[:DST]', help='copy one file in, read-only (repeatable)'),
    Flag(('-w', '--workdir'), 'value', metavar='PATH', help='working directory, read-write (default: the current directory)'),
    Flag(('--net',), 'value', choices=('public', 'allowlist', 'none'), help="network mode (default: the profile's; public without one; allowlist with --allow-host)"),
    Flag(('--allow-host',), 'append', metavar='HOST[:PORT[,PORT]][/udp]', help='reachable host name, or an address (that address only); implies allowlist (repeatable)'),
    Flag(('--allow-port',), 'append', metavar='N', help='permitted outbound TCP port in allowlist mode; replaces the default 80, 443 (repeatable)'),
    Flag(('--allow-cidr',), 'append', metavar='CIDR', help='lift the private-address denial for a range (its hosts still need --allow-host) (repeatable)'),
    Flag(('--tailscale',), 'true', help="reach this machine's tailnet by MagicDNS name"),
    Flag(('-e', '--env'), 'append', metavar='NAME[=VAL]', help='pass (NAME) or set (NAME=VAL) an environment variable (repeatable)'),
    Flag(('--secret',), 'append', metavar='NAME', help="pass NAME's value from your environment as a secret: never in an argv, a log or a record (repeatable)"),
    Flag(('--memory',), 'value', metavar='SIZE', help='size of the scratch tmpfs ($HOME, /tmp, /dev/shm), and the memory limit where a controller is delegated (default 2GiB)'),
    Flag(('--pids',), 'value', metavar='N', help='process/thread limit (default 512)'),
    Flag(('--cpus',), 'value', metavar='N', help='CPU limit, fractions allowed'),
    Flag(('--timeout',), 'value', metavar='DURATION', help='stop the run after this long (e.g. 10m, 1h30m)'),
    Flag(('--audit-log',), 'value', metavar='FILE', help='policy decisions as JSON lines'),
    Flag(('--net-log',), 'value', metavar='FILE', help='every connection, hostname and SNI'),
    Flag(('--pcap',), 'value', metavar='FILE', help="every packet on the sandbox's link, pcap format"),
    Flag(('--pcap-max',), 'value', metavar='SIZE', help='stop the capture at this size (default 1GiB)'),
    Flag(('--seccomp',), 'value', choices=('strict', 'compat'), help='strict (default) or compat (kills become EPERM)'),
    Flag(('--tty',), 'true', help='require a terminal: refused unless stdin, stdout or stderr is one (a terminal is always relayed through a PTY)'),
    Flag(('--tty-raw',), 'true', help="pass the payload's output to the terminal unfiltered: clipboard writes (OSC 52) and queries whose answers the terminal would type included"),
    Flag(('-v', '--verbose'), 'true', help='report denials and skipped entries on stderr'),
    Flag(('-d', '--detach'), 'true', help='run in the background: print the session id (boxyctl attach ID takes it over)'),
)
# fmt: on
_BY_NAME = {name: f for f in RUN_FLAGS for name in f.names}


def _fast_run(argv: list[str]) -> SimpleNamespace | None:
    """`run`'s flags without argparse, for the plain command lines nearly every run
    has; None (argparse decides, with its help and errors) for anything else: an
    unknown flag, -h, joined short flags, a missing value or one that starts with
    '-', a value outside its choices, --flag=value on a switch."""
    ns = SimpleNamespace(
        command="run",
        **{
            f.dest: [] if f.kind == "append" else (False if f.kind == "true" else None)
            for f in RUN_FLAGS
        },
    )
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            if token == "-":
                return None
            break  # like argparse.REMAINDER: the rest is the command
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        flag = _BY_NAME.get(name)
        if flag is None:
            return None
        if flag.kind == "true":
            if eq:
                return None
            setattr(ns, flag.dest, True)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        if value.startswith("-") or (flag.choices and value not in flag.choices):
            return None
        if flag.kind == "append":
            getattr(ns, flag.dest).append(value)
        else:
            setattr(ns, flag.dest, value)
        i += 1
    ns.argv = argv[i:]
    return ns


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

    def copy(self, flag: str, value: str) -> CopyItem:
        src, sep, dst = value.partition(":")
        if not src or (sep and not dst):
            raise UsageError(f"{flag} {value!r}: expected SRC[:DST]")
        if dst and not (dst.startswith("/") or dst == "~" or dst.startswith("~/")):
            raise UsageError(f"{flag} {value}: DST must be an absolute path (or start with ~)")
        return CopyItem(self(flag, src), self(flag, dst) if dst else None)


def _env_entry(value: str, environ: dict[str, str]) -> EnvItem:
    name, sep, val = value.partition("=")
    if not _NAME_RE.fullmatch(name):
        raise UsageError(f"-e {value!r}: not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
    # -e NAME: the value is the client's, never the daemon's.
    return EnvItem(name, val if sep else environ.get(name))


def _secret_entry(name: str, environ: dict[str, str]) -> Secret:
    """--secret NAME: the value from our environment, never from the command line (ps
    shows every argv on the machine). The messages never hold a value."""
    if "=" in name:
        raise UsageError(
            f"--secret {name.partition('=')[0]}: takes a name; the value comes from "
            "your environment (for a setting that is no secret: -e NAME=VALUE)"
        )
    if not _NAME_RE.fullmatch(name):
        raise UsageError(f"--secret {name!r}: not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if name not in environ:
        raise UsageError(f"--secret {name}: not set in your environment")
    return Secret(name, environ[name])


def _session_id(value: str | None) -> str | None:
    if value is not None and not _ID_RE.fullmatch(value):
        raise UsageError(f"{value!r} is not a session id")
    return value


def _run_request(ns: Any, environ: dict[str, str], cwd: str) -> RunRequest:
    command = list(ns.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("run: missing command (run [flags] -- COMMAND [ARGS...])")
    if not command[0]:
        raise UsageError("run: the command is an empty string (run [flags] -- COMMAND [ARGS...])")
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
    options = RunOptions(
        **{
            "profile": profile,
            "ro": [path("--ro", p) for p in ns.ro],
            "rw": [path("--rw", p) for p in ns.rw],
            "protect": [path("--protect", p) for p in ns.protect],
            "reveal": [path("--reveal", p) for p in ns.reveal],
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
            "secret": [_secret_entry(n, environ) for n in ns.secret],
            "memory": parse_size(ns.memory, what="--memory") if ns.memory is not None else None,
            "pids": parse_count(ns.pids, what="--pids") if ns.pids is not None else None,
            "cpus": parse_cpus(ns.cpus) if ns.cpus is not None else None,
            "timeout": parse_duration(ns.timeout, what="--timeout")
            if ns.timeout is not None
            else None,
            "audit_log": opt_path("--audit-log", ns.audit_log),
            "net_log": opt_path("--net-log", ns.net_log),
            "pcap": opt_path("--pcap", ns.pcap),
            "pcap_max": pcap_max,
            "seccomp": ns.seccomp,
            "tty": ns.tty,
            "tty_raw": ns.tty_raw,
            "verbose": ns.verbose,
            "detach": ns.detach,
            "allow_git_write": ns.allow_git_write,
        }
    )
    _check_combinations(options)
    return RunRequest(command, cwd, options, client_env(environ))


def _check_combinations(o: RunOptions) -> None:
    """Refuse what can never work, whatever the profile says."""
    net = o.net
    if o.allow_host and net in ("none", "public"):
        raise UsageError(
            f"--allow-host: cannot be combined with --net {net} (it implies allowlist)"
        )
    if o.allow_port and net == "public":
        raise UsageError(PUBLIC_PORTS)
    if net == "none":
        for key, flag in (
            ("pcap", "--pcap"),
            ("net_log", "--net-log"),
            ("tailscale", "--tailscale"),
            ("allow_port", "--allow-port"),
            ("allow_cidr", "--allow-cidr"),
        ):
            if getattr(o, key):
                raise UsageError(f"{flag}: cannot be combined with --net none (no network at all)")
    if o.pcap_max is not None and o.pcap is None:
        raise UsageError("--pcap-max: needs --pcap")


def _refuse_negative(argv: list[str]) -> None:
    """`--timeout -5s`: argparse would take the value for a flag and say 'expected one
    argument'; the mistake is the sign."""
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--":
            return
        f = _BY_NAME.get(flag)
        if f is not None and f.kind != "true" and re.fullmatch(r"-\d[\w.]*", value):
            raise UsageError(f"{flag}: {value} is negative; give a positive value")


def parse(argv: list[str], *, environ: dict[str, str], cwd: str, prog: str = "boxyctl") -> Command:
    """Parse ``argv`` (without the program name). Raises UsageError with one line;
    --help gives Command('help', {'text': …}), --version Command('version')."""
    if argv[:1] == ["run"] and not cwd.startswith("/"):
        raise UsageError(
            "the current directory was removed (or is not reachable): cd to a "
            "project directory and run again"
            if not cwd
            else f"the current directory {cwd!r} is not an absolute path"
        )
    if argv[:1] == ["run"]:
        _refuse_negative(argv[1:])
        fast = _fast_run(argv[1:])
        if fast is not None:
            return Command("run", {"request": _run_request(fast, environ, cwd)})
    return _parse_with_argparse(argv, environ=environ, cwd=cwd, prog=prog)


def _parse_with_argparse(
    argv: list[str], *, environ: dict[str, str], cwd: str, prog: str
) -> Command:
    from boxyctl import parser as p

    try:
        ns = p.build_parser(prog, run_only=argv[:1] == ["run"]).parse_args(argv)
    except p.Help as h:
        return Command("help", {"text": h.text})
    except p.Version:
        return Command("version")
    name = ns.command
    if name == "run":
        for f in RUN_FLAGS:  # argparse takes '--pids=--' as no value at all: a list
            got = getattr(ns, f.dest)
            if isinstance(got, list) and (
                f.kind == "value" or any(isinstance(v, list) for v in got)
            ):
                raise UsageError(f"{f.names[-1]}: expected one value")
    if name is None:
        raise UsageError(f"missing command ({', '.join(COMMANDS)}); see {prog} --help")
    if name == "run":
        return Command("run", {"request": _run_request(ns, environ, cwd)})
    if name == "ps":
        return Command("ps", {"all": ns.all})
    if name in ("show", "attach", "watch"):
        return Command(name, {"id": _session_id(ns.id)})
    if name == "stop":
        return Command("stop", {"id": _session_id(ns.id), "kill": ns.kill})
    if name == "completion":
        return Command("completion", {"shell": ns.shell})
    if name == "trust":
        return Command("trust", {"list": ns.list, "revoke": ns.revoke, "cwd": cwd})
    if name == "cache":
        if ns.action is None:
            raise UsageError("cache: missing action (list, clean [--all])")
        return Command("cache", {"action": ns.action, "all": getattr(ns, "all", False), "cwd": cwd})
    if name in ("profile", "daemon"):
        if ns.action is None:
            choices = "list, show NAME" if name == "profile" else "status, restart, stop"
            raise UsageError(f"{name}: missing action ({choices})")
        args: dict[str, Any] = {"action": ns.action}
        if name == "profile" and ns.action == "show":
            args["name"] = ns.name
        if name == "daemon" and ns.action in ("restart", "stop"):
            args["force"] = ns.force
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


def usage(prog: str = "boxyctl", command: str | None = None) -> str:
    """The help text of the program, or of one subcommand ('run', 'ps' …)."""
    from boxyctl.parser import usage as parser_usage

    return parser_usage(prog, command)
