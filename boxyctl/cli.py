"""boxyctl's command line: argv → a Command, or one line saying what is wrong.

Only the standard library and ``boxy`` are imported: this runs on every client
start, so no YAML, asyncio or D-Bus here. For ``run`` the result is a typed
``boxy.request.RunRequest``, built from the option table (``boxy.options``: the
flags, how each one's text is read, the combinations refused); the daemon merges
it with the profile and re-checks it (``boxyd.config.spec.build_spec``). Everything
knowable without the profile is refused here, before a daemon is contacted. Paths
are made absolute against the client's cwd (with ``~`` from the client's HOME)
because the daemon's cwd and environment are not the user's.
"""

from __future__ import annotations

import os.path
import sys
from types import SimpleNamespace

from boxy.client import client_env
from boxy.errors import UsageError
from boxy.options import BY_FLAG, RUN_OPTIONS, Option, check_combinations
from boxy.pathcheck import directory_problem, length_problem, shown
from boxy.request import CopyItem, RunOptions, RunRequest, env_entry, secret_entry
from boxy.values import FROM_TEXT, from_text

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# as text: compiled on first use (by re's cache), not on every client start
_ID_RE = r"[A-Za-z0-9_-]{1,64}"


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


def _fast_run(argv: list[str]) -> SimpleNamespace | None:
    """`run`'s flags without argparse, for the plain command lines nearly every run
    has; None (argparse decides, with its help and errors) for anything else: an
    unknown flag, -h, joined short flags, a missing value or one that starts with
    '-', a value outside its choices, --flag=value on a switch."""
    ns = SimpleNamespace(
        command="run",
        **{
            o.field: [] if o.kind == "append" else (False if o.kind == "true" else None)
            for o in RUN_OPTIONS
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
        flag = BY_FLAG.get(name)
        if flag is None:
            return None
        if flag.kind == "true":
            if eq:
                return None
            setattr(ns, flag.field, True)
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
            getattr(ns, flag.field).append(value)
        else:
            setattr(ns, flag.field, value)
        i += 1
    ns.argv = argv[i:]
    return ns


class _Paths:
    """Client-side path handling: absolute against cwd, ~ from the client's HOME (and
    the client's environment, which -e and --secret read)."""

    def __init__(self, environ: dict[str, str], cwd: str) -> None:
        self.environ = environ
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
        path = os.path.normpath(os.path.join(self.cwd, value))
        problem = length_problem(path)
        if problem is not None:
            raise UsageError(f"{flag} {shown(value)}: {problem}")
        return path

    def copy(self, flag: str, value: str) -> CopyItem:
        src, sep, dst = value.partition(":")
        if not src or (sep and not dst):
            raise UsageError(f"{flag} {value!r}: expected SRC[:DST]")
        if dst and not (dst.startswith("/") or dst == "~" or dst.startswith("~/")):
            raise UsageError(f"{flag} {value}: DST must be an absolute path (or start with ~)")
        return CopyItem(self(flag, src), self(flag, dst) if dst else None)


def _session_id(value: str | None) -> str | None:
    import re  # only for the flags that need a pattern: not on every start

    if value is not None and not re.fullmatch(_ID_RE, value):
        raise UsageError(f"{value!r} is not a session id")
    return value


def _profile(ctx: _Paths, flag: str, name: str) -> str:
    """-p: a preset's name as given, a file's path made absolute."""
    if not name:
        raise UsageError(f"{flag}: empty name")
    if "/" in name or name.endswith((".yaml", ".yml")):
        return ctx(flag, name)
    _known_profile(flag, name, ctx.environ)
    return name


def _known_profile(flag: str, name: str, environ: dict[str, str]) -> None:
    """-p NAME that is neither a preset nor one of the user's profiles, refused before
    a daemon is started (the daemon says the same, later). Looked for where boxyd
    looks: the presets shipped beside this client, NAME.yaml under the config home
    (the client's $XDG_CONFIG_HOME and ~/.config: the daemon's may be either)."""
    presets_dir = os.path.join(os.path.dirname(os.path.dirname(__file__)), "boxyd", "profiles")
    try:
        presets = sorted(n.removesuffix(".yaml") for n in os.listdir(presets_dir))
    except OSError:
        return  # not installed as one tree: the daemon decides
    homes = [environ.get("XDG_CONFIG_HOME", ""), os.path.join(environ.get("HOME", ""), ".config")]
    mine = [os.path.join(h, "boxy", "profiles") for h in homes if h.startswith("/")]
    if name in presets or any(os.path.isfile(os.path.join(d, name + ".yaml")) for d in mine):
        return
    import difflib  # only on an error

    close = difflib.get_close_matches(name, presets, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    raise UsageError(
        f"{flag} {name}: no such profile ({hint}presets: {', '.join(presets)}; your own "
        f"as {mine[0] if mine else '~/.config/boxy/profiles'}/{name}.yaml; or a path to "
        "a .yaml file)"
    )


def _shared(kind: str) -> Callable[[_Paths, str, str], Any]:
    """The converter the library shares for KIND (no functools: the client's start-up)."""

    def convert(ctx: _Paths, flag: str, text: str) -> Any:
        return from_text(kind, text, flag)

    return convert


# How each option's text becomes its value (by the table's type; boxy.options). The
# environment is the client's: -e NAME and --secret NAME read it, never the daemon's.
_CONVERT: dict[str, Callable[[_Paths, str, str], Any]] = {
    "profile": _profile,
    "path": lambda ctx, flag, text: ctx(flag, text),
    "copy": lambda ctx, flag, text: ctx.copy(flag, text),
    "env": lambda ctx, flag, text: env_entry(text, ctx.environ),
    "secret": lambda ctx, flag, text: secret_entry(text, ctx.environ),
    "choice": lambda ctx, flag, text: text,  # argparse and the fast path checked it
    # the rest: the converters the library shares (boxy.values.FROM_TEXT)
    **{kind: _shared(kind) for kind in FROM_TEXT},
}


def _option_value(option: Option, got: Any, ctx: _Paths) -> Any:
    """One option's value for RunOptions from what the parser collected."""
    if option.kind == "true" or got is None:
        return got
    convert = _CONVERT[option.type]
    if option.kind == "value":
        return convert(ctx, option.flag, got)
    out: list[Any] = []
    for text in got:
        value = convert(ctx, option.flag, text)
        if option.type == "cidrs":
            out.extend(value)
        else:
            out.append(value)
    return out


# `run` without a command, on a terminal: the user's shell as the sandbox sees it
# (a path the host has may be missing inside), checked in there; $SHELL names the one
# started (the environment's fixed /bin/sh said otherwise: issue 33 §2).
SHELL_PICK = (
    'if [ -f "$0" ] && [ -x "$0" ]; then SHELL="$0"; '
    "elif [ -x /bin/bash ]; then SHELL=/bin/bash; else SHELL=/bin/sh; fi; "
    'export SHELL; exec "$SHELL"'
)


def shell_command(shell: str) -> list[str]:
    """$SHELL if it exists inside the sandbox, else /bin/bash, else /bin/sh."""
    return ["/bin/sh", "-c", SHELL_PICK, shell if shell.startswith("/") else ""]


def _on_terminal() -> bool:
    try:
        return os.isatty(0)
    except (OSError, ValueError):
        return False


def _run_request(ns: Any, environ: dict[str, str], cwd: str) -> RunRequest:
    command = list(ns.argv)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command and _on_terminal():
        command = shell_command(environ.get("SHELL", ""))
    if not command:
        raise UsageError(
            "run: missing command (run [flags] -- COMMAND [ARGS...]; "
            "without one, on a terminal, your shell)"
        )
    if not command[0]:
        raise UsageError("run: the command is an empty string (run [flags] -- COMMAND [ARGS...])")
    ctx = _Paths(environ, cwd)
    # a combination that can never work is the real conflict, before any value's
    # (`--net none --allow-cidr 10.0.2.0/24` is about --net none, not the range)
    check_combinations(ns)
    # in the table's order: the first bad value is the one reported
    options = RunOptions(
        **{o.field: _option_value(o, getattr(ns, o.field), ctx) for o in RUN_OPTIONS}
    )
    check_combinations(options)  # what can never work, whatever the profile says
    if options.workdir is not None:  # as boxyd checks it, but before one is started
        problem = directory_problem(options.workdir)
        if problem is not None:
            raise UsageError(f"--workdir {shown(options.workdir)}: {problem}")
    return RunRequest(command, cwd, options, client_env(environ))


def _refuse_negative(argv: list[str]) -> None:
    """`--timeout -5s`: argparse would take the value for a flag and say 'expected one
    argument'; the mistake is the sign."""
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--":
            return
        f = BY_FLAG.get(flag)
        if f is not None and f.kind != "true" and value[:1] == "-":
            import re  # only for a value that starts with '-': not every start

            if re.fullmatch(r"-\d[\w.]*", value):
                raise UsageError(f"{flag}: {value} is negative; give a positive value")


def _run_flags(argv: list[str]) -> tuple[list[tuple[Option, str | None]], int, bool]:
    """`run`'s flags as given (each option with its value's text, None for a switch),
    the index where the command starts, and whether a '--' ended the flags. Unknown
    tokens are passed over: argparse refuses them later."""
    flags: list[tuple[Option, str | None]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return flags, i + 1, True
        if not token.startswith("-") or token == "-":
            break
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        option = BY_FLAG.get(name)
        if option is None and not token.startswith("--") and len(token) > 2:
            option, eq, value = BY_FLAG.get(token[:2]), "joined", token[2:]  # -pnode
        if option is not None and option.kind != "true" and not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        if option is not None:
            flags.append((option, None if option.kind == "true" else value))
        i += 1
    return flags, i, False


def _refuse_repeated(flags: list[tuple[Option, str | None]]) -> None:
    """`--net none --net public`: the last one would win in silence, and a script that
    adds a flag to an alias's would get the opposite of what one of them says."""
    seen: dict[str, str | None] = {}
    for option, value in flags:
        if option.kind != "value":
            continue
        if option.field in seen and seen[option.field] != value:
            raise UsageError(
                f"{option.flag} given twice ({seen[option.field]}, then {value}); give it once"
            )
        seen[option.field] = value


# run's flags that a payload is unlikely to have of its own: short ones (`node -e`,
# `npm -v`) and common long ones (`pytest --timeout`, `npm --verbose`) would be said
# on every such run, and a line said on every run is a line nobody reads.
_LATE_FLAGS = frozenset(
    name
    for o in RUN_OPTIONS
    for name in o.names
    if name.startswith("--")
    and name not in ("--profile", "--workdir", "--env", "--verbose", "--timeout", "--detach",
                     "--tty", "--secret", "--memory", "--cpus", "--copy")
)  # fmt: skip


def late_flags(argv: list[str]) -> str | None:
    """The line said when a token after the command is one of run's own flags (ARGV:
    run's arguments): it goes to the command, as with docker; None when there is none
    or a '--' made the split explicit."""
    _, start, dashdash = _run_flags(argv)
    if dashdash or start >= len(argv):
        return None
    late = [t for t in argv[start + 1 :] if t.partition("=")[0] in _LATE_FLAGS]
    if not late:
        return None
    return (
        f"{' '.join(late)}: after the command {argv[start]}, so passed to it, not to "
        "boxyctl run (run's flags go before the command)"
    )


def _refuse_leading_run_flag(argv: list[str], prog: str) -> None:
    """`boxy --net none -- cmd`: run's flags and a command, without the word `run`
    (argparse would take `none` for the command and call it no command)."""
    first = argv[0] if argv else ""
    name = first.partition("=")[0] if first.startswith("--") else first[:2]
    if name in BY_FLAG or (first == "--" and argv[1:]):
        from boxyctl.shellquote import join

        what = f"{name} is a flag of run" if name in BY_FLAG else "no command before --"
        raise UsageError(f"{what}; did you mean: {prog} run {join(argv)}")


def _refuse_foreign_flag(argv: list[str]) -> None:
    """`watch --json`, `ps -k`: a flag of another command, said as such (argparse would
    call it unknown, and suggest the very flag); for --json, where the row points to."""
    from boxyctl.commands.table import BY_NAME, SUBCOMMANDS

    row = BY_NAME.get(argv[0]) if argv else None
    if row is None or not row.module:  # not a command, or `hook` (its own argv)
        return
    rest = argv[1:]
    if row.name == "run":
        given, own = rest[: _run_flags(rest)[1]], {*BY_FLAG, "--report"}
    else:
        given = rest[: rest.index("--")] if "--" in rest else rest
        own = {n for a in row.args for n in a.names}
    words = [t for t in given if not t.startswith("-")]
    action = next((a for a in row.actions if words[:1] == [a.name]), None)
    if action is not None:
        own |= {n for a in action.args for n in a.names}
    known = {*BY_FLAG, "--report", "--version"} | {
        n for r in SUBCOMMANDS for sub in (r, *r.actions) for a in sub.args for n in a.names
    }
    for token in given:
        name = token.partition("=")[0]
        if name in known and name not in own | {"-h", "--help"}:
            where = action or row
            note = f": {where.no_json}" if name == "--json" and where.no_json else ""
            label = f"{row.name} {action.name}" if action else row.name
            raise UsageError(f"{label} takes no {name}{note}")


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
    if argv[:1] != ["run"]:
        _refuse_leading_run_flag(argv, prog)
        return _parse_with_argparse(argv, environ=environ, cwd=cwd, prog=prog)
    _refuse_negative(argv[1:])
    _refuse_repeated(_run_flags(argv[1:])[0])
    fast = _fast_run(argv[1:])
    if fast is not None:
        cmd = Command("run", {"request": _run_request(fast, environ, cwd)})
    else:
        cmd = _parse_with_argparse(argv, environ=environ, cwd=cwd, prog=prog)
    line = late_flags(argv[1:]) if cmd.name == "run" else None
    if line is not None:  # the run goes on: a payload may take a flag of the same name
        print(f"{prog}: {line}", file=sys.stderr)
    return cmd


def _parse_with_argparse(
    argv: list[str], *, environ: dict[str, str], cwd: str, prog: str
) -> Command:
    from boxyctl import parser as p

    if not {"-h", "--help"} & set(argv):
        _refuse_foreign_flag(argv)
    try:
        ns = p.build_parser(prog, run_only=argv[:1] == ["run"]).parse_args(argv)
    except p.Help as h:
        return Command("help", {"text": h.text})
    except p.Version:
        return Command("version")
    name = ns.command
    if name == "run":
        for o in RUN_OPTIONS:  # argparse takes '--pids=--' as no value at all: a list
            got = getattr(ns, o.field)
            if isinstance(got, list) and (
                o.kind == "value" or any(isinstance(v, list) for v in got)
            ):
                raise UsageError(f"{o.flag}: expected one value")
    if name is None:
        from boxyctl.commands.table import SUBCOMMANDS

        names = ", ".join(s.name for s in SUBCOMMANDS)
        raise UsageError(f"missing command ({names}); see {prog} --help")
    if name == "run":
        return _run_command(ns, environ, cwd)
    return _subcommand(ns, cwd)


def _subcommand(ns: Any, cwd: str) -> Command:
    """Every subcommand but `run`, from argparse's namespace, as its row in the table
    says (boxyctl/commands/table.py): its fields, and its action's; session ids
    checked; the current directory when the row takes it."""
    from boxyctl.commands.table import BY_NAME

    row = BY_NAME[ns.command]
    args: dict[str, Any] = {}
    arguments = row.args
    if row.actions:
        if ns.action is None:
            choices = ", ".join(a.usage() for a in row.actions)
            raise UsageError(f"{row.name}: missing action ({choices})")
        args["action"] = ns.action
        arguments += row.action(ns.action).args
    for arg in arguments:
        value = getattr(ns, arg.field)
        if arg.kind == "ids":
            value = [_session_id(v) for v in value]
        elif arg.kind in ("id", "id?") and value is not None:
            value = _session_id(value)
        args[arg.field] = value
    for switch, needed in row.needs:
        if args.get(switch) and not args.get(needed):
            raise UsageError(f"{row.name}: --{switch} goes with --{needed}")
    if row.cwd:
        args["cwd"] = cwd
    return Command(row.name, args)


def _run_command(ns: Any, environ: dict[str, str], cwd: str) -> Command:
    """`run` parsed by argparse; --report FILE (the client's own flag) made absolute,
    and refused before anything starts when FILE's directory is not there."""
    request = _run_request(ns, environ, cwd)
    args: dict[str, Any] = {"request": request}
    if ns.report is not None:
        if request.options.detach:
            raise UsageError("--report: a run with -d does not end here; `show --json ID` has it")
        path = _Paths(environ, cwd)("--report", ns.report)
        if not os.path.isdir(os.path.dirname(path)):
            raise UsageError(f"--report {ns.report}: {os.path.dirname(path)} is not a directory")
        if os.path.isdir(path):
            raise UsageError(f"--report {ns.report}: is a directory")
        args["report"] = path
    return Command("run", args)


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
