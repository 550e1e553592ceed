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

# subcommand -> its description under `boxyctl COMMAND --help` (the one-line help is
# the list's; this is what the command does and what it prints)
DESCRIPTIONS = {
    "ps": "List the sessions boxyd is running (with -a, every session on record): id, "
    "state, start, running time, profile and command.",
    "show": "One session in full: its command, work directory, profile, state, exit, "
    "network totals, limits and, once it ended, its findings and destinations.",
    "watch": "Follow a session as it happens: its network, denials and events, repainted "
    "as they come (one line per event into a pipe), then its summary. Without ID, the "
    "only running session.",
    "attach": "Take over the terminal of a session started with -d (or left with Ctrl-]); "
    "Ctrl-] leaves it again, and the session lives on.",
    "stop": "Stop a session: SIGTERM, then SIGKILL after a grace of 5 seconds if it is "
    "still running; -k sends SIGKILL at once. Prints the session's final state.",
    "doctor": "Check what this kernel and host provide (user namespaces, Landlock, "
    "seccomp, cgroup delegation, nftables, the user manager) and what each missing "
    "layer costs a run.",
    "setup": "Install boxyd's systemd user units and enable its socket, so boxyd starts "
    "on demand; without a user manager, boxyctl starts boxyd itself.",
    "completion": "Print the completion script for SHELL on stdout, e.g.\n"
    "  boxyctl completion bash > ~/.local/share/bash-completion/completions/boxyctl",
}


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
    return f"{name}: unknown flag{_did_you_mean(name, flags)}"


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
        _add_sessions(sub)
        _add_admin(sub)
        _add_hook(sub)
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


def _add_sessions(sub: argparse._SubParsersAction[_Parser]) -> None:
    """ps, show, watch, attach, stop: the sessions."""
    ps = _command(sub, "ps", "list running sessions")
    ps.add_argument("-a", "--all", action="store_true", help="every session on record")
    ps.add_argument("-q", "--quiet", action="store_true", help="only the ids, one a line")
    _json(ps)
    show = _command(sub, "show", "one session in full")
    show.add_argument("id", metavar="ID", help=_ID)
    _json(show)
    logs = _command(sub, "logs", "a detached session's output")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    logs.add_argument("id", metavar="ID", help=_ID)
    _command(sub, "watch", "follow a session as it happens").add_argument(
        "id", metavar="ID", nargs="?", help=_ID + " (default: the only running one)"
    )
    _command(sub, "attach", "take over a session's terminal").add_argument(
        "id", metavar="ID", help=_ID
    )
    stop = _command(sub, "stop", "SIGTERM, then SIGKILL")
    stop.add_argument("-k", "--kill", action="store_true", help="SIGKILL now")
    stop.add_argument("id", metavar="ID", nargs="+", help=_ID + " (one or more)")


_ID = "a session id (as `boxyctl ps` lists them) or its unique prefix"


def _command(sub: argparse._SubParsersAction[_Parser], name: str, help: str) -> _Parser:
    """A subcommand with its one-line HELP and, when it has one, its description."""
    import textwrap  # not on the run path: `run` alone builds no other subcommand

    text = DESCRIPTIONS.get(name, help)
    wrapped = "\n".join(textwrap.fill(par, 78) for par in text.split("\n"))
    return sub.add_parser(name, help=help, description=wrapped)


def _json(parser: _Parser) -> None:
    """--json: one JSON document on stdout (its keys: the README's "JSON output")."""
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")


def _add_admin(sub: argparse._SubParsersAction[_Parser]) -> None:
    """doctor, profile, daemon, cache, setup, trust, completion (in the help's order)."""
    _json(_command(sub, "doctor", "check what this kernel and host provide"))
    profile = sub.add_parser("profile", help="list or show profiles")
    psub = profile.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    _json(psub.add_parser("list", help="the presets"))
    pshow = psub.add_parser("show", help="a preset's text")
    pshow.add_argument("name", metavar="NAME", help="a preset's name, or one of your own profiles'")
    _json(pshow)
    daemon = sub.add_parser("daemon", help="the boxyd daemon")
    dsub = daemon.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    dsub.add_parser("status", help="which build is running, and how busy it is")
    for action, what in (
        ("restart", "replace it with this build"),
        ("stop", "stop it (refused while sessions are running)"),
    ):
        dsub.add_parser(action, help=what).add_argument(
            "--force",
            action="store_true",
            help="stop running sessions first (SIGTERM, grace, SIGKILL; recorded)",
        )
    cache = sub.add_parser(
        "cache", help="the per-project package caches of the node and python profiles"
    )
    csub = cache.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    _json(
        csub.add_parser(
            "list", help="every project's cache: profile, size, last use, work directory"
        )
    )
    clean = csub.add_parser("clean", help="remove this work directory's caches")
    clean.add_argument("--all", action="store_true", help="every project's")
    _command(sub, "setup", "install boxyd's systemd user units and enable its socket")
    trust = sub.add_parser(
        "trust",
        help="approve this directory's .boxy.yaml and the registries its .npmrc or pip.conf names",
    )
    how = trust.add_mutually_exclusive_group()
    how.add_argument("--list", action="store_true", help="every approval: directory, hash, what")
    how.add_argument("--revoke", action="store_true", help="withdraw this directory's approvals")
    _json(trust)
    comp = _command(sub, "completion", "print the shell completion script")
    comp.add_argument(
        "shell", metavar="SHELL", choices=("bash", "zsh", "fish"), help="bash, zsh or fish"
    )


def _add_hook(sub: argparse._SubParsersAction[_Parser]) -> None:
    """hook: sandbox the commands an agent runs (boxyctl/hook.py)."""
    hook = sub.add_parser("hook", help="sandbox the commands an agent runs (Claude Code)")
    hsub = hook.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    hsub.add_parser("claude", help="Claude Code's PreToolUse hook (its JSON on stdin)")
    inst = hsub.add_parser("install", help="add the hook to Claude Code's settings")
    inst.add_argument("harness", metavar="HARNESS", choices=("claude",))
    inst.add_argument("--project", action="store_true", help="the project's .claude/settings.json")
    inst.add_argument("--remove", action="store_true", help="take the hook out")


def usage(prog: str = "boxyctl", command: str | None = None) -> str:
    """The help text of the program, or of one subcommand ('run', 'ps' …)."""
    argv = [command, "--help"] if command else ["--help"]
    try:
        build_parser(prog).parse_args(argv)
    except Help as h:
        return h.text
    raise AssertionError("--help did not produce help")
