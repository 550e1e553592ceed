"""boxyctl's argparse parser: help texts, every subcommand, and the one-line
errors. Imported only when the fast path in boxyctl.cli does not take a `run`
command line (help, an error, anything unusual) or for another subcommand: argparse
and building the parser cost every sandboxed run ~15 ms otherwise."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from boxy.errors import UsageError
from boxy.options import RUN_OPTIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from boxyctl.commands.table import Sub

RUN_DESCRIPTION = """\
Run COMMAND in a fresh sandbox: the work directory read-write, a fresh $HOME,
nothing else from the host unless a flag or the profile says so.
Paths may be relative (to the current directory) or start with ~."""


# said by --help (the program's and run's) and the man page
EXIT_STATUS = """\
exit status:
  the command's own status (128+N when it died of signal N); 124 when --timeout
  stopped it; 125 when the sandbox could not be set up; 126 and 127 when the
  command could not be run or was not found; 2 for bad input, refused before
  anything starts; 1 when boxyd failed or could not be reached."""


class Help(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


class Version(Exception):
    pass


class _HelpAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show this help")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        raise Help(parser.format_help())


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version")

    def __call__(self, *_: Any) -> None:
        raise Version()


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse builds a formatter for every add_argument and asks shutil for the
    terminal width each time; shutil pulls in bz2, lzma and zlib (4 ms on every run).
    The width is only needed when help is printed: ask the terminal directly."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            try:
                width = os.get_terminal_size(sys.stdout.fileno()).columns - 2
            except (OSError, ValueError, AttributeError):  # not a terminal, or no stdout
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
        sub = self.prog.partition(" ")[2]
        if message.startswith("the following arguments are required"):
            # 'boxyctl stop' → 'stop: …', so the line says which command is missing what
            message = f"{sub}: {message}" if sub else message
        elif ": invalid choice: " in message:
            message = _invalid_choice(message, sub)
        elif message.startswith("unrecognized arguments: "):
            message = _unrecognized(message, _option_strings(self))
        raise UsageError(message)


# argparse's placeholders (metavars) as the words a message says
_PLACES = {"COMMAND": "command", "ACTION": "action", "SHELL": "shell"}


def _did_you_mean(word: str, candidates: list[str]) -> str:
    """' (did you mean run?)', or '' when nothing is close."""
    import difflib  # only on an error

    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _invalid_choice(message: str, sub: str) -> str:
    """ "COMMAND: invalid choice: 'rn' (choose from 'run', …)" → "rn: not a command
    (did you mean run?); one of: run, ps, …"."""
    import re  # only on an error

    m = re.fullmatch(r"(\S+): invalid choice: '(.*)' \(choose from (.*)\)", message)
    if m is None:
        return message
    place, value, listed = m.groups()
    names = re.findall(r"'([^']*)'", listed)
    what = _PLACES.get(place)
    head = f"{sub}: " if sub else ""
    if what is None:  # a flag's value: --net open
        return f"{place}: {value!r} is not one of {', '.join(names)}{_did_you_mean(value, names)}"
    return f"{head}{value}: not a{'n' if what[0] in 'aeiou' else ''} {what}" + (
        f"{_did_you_mean(value, names)}; one of: {', '.join(names)}"
    )


def _unrecognized(message: str, flags: list[str]) -> str:
    """'unrecognized arguments: --nett none' → '--nett: unknown flag (did you mean
    --net?)' for a flag; other words as argparse says them."""
    tokens = message.partition(": ")[2].split()
    first = tokens[0] if tokens else ""
    if not first.startswith("-"):
        return message
    name = first.partition("=")[0]
    others = [f for f in flags if f != name]  # never the very flag: it is not this command's
    return f"{name}: unknown flag{_did_you_mean(name, others)}"


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag of PARSER and its subcommands (an unknown one is reported by the
    top parser, which does not know which subcommand it was meant for)."""
    out: list[str] = []
    for action in parser._actions:
        out += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                out += [f for f in _option_strings(child) if f not in out]
    return out


def build_parser(prog: str, *, run_only: bool = False) -> _Parser:
    """RUN_ONLY: just the `run` subcommand — every sandboxed run pays for building the
    parser, and the other subcommands cost it several milliseconds."""
    parser = _Parser(
        prog=prog,
        description="Run an untrusted program with its project directory and nothing else.",
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run(sub, prog)
    if not run_only:
        from boxyctl.commands.table import SUBCOMMANDS

        for row in SUBCOMMANDS[1:]:
            _add_subcommand(sub, row)
    return parser


def _add_run(sub: argparse._SubParsersAction[_Parser], prog: str) -> None:
    """`run`: every flag from the option table (boxy.options)."""
    run = sub.add_parser(
        "run",
        help="run a command in a sandbox",
        usage=f"{prog} run [flags] -- COMMAND [ARGS...]",
        description=RUN_DESCRIPTION,
        epilog=EXIT_STATUS,
        formatter_class=_Formatter,
    )
    for option in RUN_OPTIONS:
        kw: dict[str, Any] = {"help": option.help}
        if option.kind == "true":
            kw["action"] = "store_true"
        else:
            kw["metavar"] = option.metavar
            if option.kind == "append":
                kw.update(action="append", default=[])
            if option.choices:
                kw["choices"] = option.choices
        run.add_argument(*option.names, **kw)
    # the client's own: boxyd never sees it (the fast path leaves it to argparse)
    run.add_argument(
        "--report",
        metavar="FILE",
        help="write the run's summary as JSON to FILE when it ends (written atomically)",
    )
    # REMAINDER: like bwrap, the first non-option word starts the command; '--' is optional.
    run.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help=argparse.SUPPRESS
    )


def _add_subcommand(sub: argparse._SubParsersAction[_Parser], row: Sub) -> None:
    """A row of the subcommand table (boxyctl/commands/table.py): its help, its
    description, its arguments, and its actions with theirs."""
    import textwrap  # not on the run path: `run` alone builds no other subcommand

    text = "\n".join(textwrap.fill(par, 78) for par in row.description.split("\n"))
    parser = sub.add_parser(row.name, help=row.help, description=text)
    _add_arguments(parser, row)
    if row.actions:
        actions = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
        for action in row.actions:
            _add_arguments(actions.add_parser(action.name, help=action.help), action)


def _add_arguments(parser: _Parser, row: Sub) -> None:
    group = parser.add_mutually_exclusive_group() if row.exclusive else None
    for arg in row.args:
        where: Any = group if group is not None and arg.field in row.exclusive else parser
        if not arg.positional:
            where.add_argument(*arg.names, action="store_true", help=arg.help)
            continue
        kw: dict[str, Any] = {"metavar": arg.metavar, "help": arg.help}
        if arg.kind in ("id?", "ids", "words", "words?"):
            kw["nargs"] = {"id?": "?", "words?": "*"}.get(arg.kind, "+")
        if arg.choices:
            kw["choices"] = arg.choices
        where.add_argument(arg.field, **kw)


def usage(prog: str = "boxyctl", command: str | None = None) -> str:
    """The help text of the program, or of one subcommand ('run', 'ps' …)."""
    argv = [command, "--help"] if command else ["--help"]
    try:
        build_parser(prog).parse_args(argv)
    except Help as h:
        return h.text
    raise AssertionError("--help did not produce help")
