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
        if message.startswith("the following arguments are required"):
            # 'boxyctl stop' → 'stop: …', so the line says which command is missing what
            sub = self.prog.partition(" ")[2]
            message = f"{sub}: {message}" if sub else message
        raise UsageError(message)


def build_parser(prog: str, *, run_only: bool = False) -> _Parser:
    """RUN_ONLY: just the `run` subcommand — every sandboxed run pays for building the
    parser, and the other subcommands cost it several milliseconds."""
    parser = _Parser(
        prog=prog,
        description="Run an untrusted program with its project directory and nothing else.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_run(sub, prog)
    if not run_only:
        _add_sessions(sub)
        _add_admin(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction[_Parser], prog: str) -> None:
    """`run`: every flag from the option table (boxy.options)."""
    run = sub.add_parser(
        "run",
        help="run a command in a sandbox",
        usage=f"{prog} run [flags] -- COMMAND [ARGS...]",
        description=RUN_DESCRIPTION,
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
    ps = sub.add_parser("ps", help="list running sessions")
    ps.add_argument("-a", "--all", action="store_true", help="every session on record")
    ps.add_argument("-q", "--quiet", action="store_true", help="only the ids, one a line")
    _json(ps)
    show = sub.add_parser("show", help="one session in full")
    show.add_argument("id", metavar="ID")
    _json(show)
    logs = sub.add_parser("logs", help="a detached session's output")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    logs.add_argument("id", metavar="ID")
    sub.add_parser("watch", help="follow a session as it happens").add_argument(
        "id", metavar="ID", nargs="?"
    )
    sub.add_parser("attach", help="take over a session's terminal").add_argument("id", metavar="ID")
    stop = sub.add_parser("stop", help="SIGTERM, then SIGKILL")
    stop.add_argument("-k", "--kill", action="store_true", help="SIGKILL now")
    stop.add_argument("id", metavar="ID", nargs="+")


def _json(parser: _Parser) -> None:
    """--json: one JSON document on stdout (its keys: the README's "JSON output")."""
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")


def _add_admin(sub: argparse._SubParsersAction[_Parser]) -> None:
    """doctor, profile, daemon, cache, setup, trust, completion (in the help's order)."""
    _json(sub.add_parser("doctor", help="check what this kernel and host provide"))
    profile = sub.add_parser("profile", help="list or show profiles")
    psub = profile.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    _json(psub.add_parser("list", help="the presets"))
    pshow = psub.add_parser("show", help="a preset's text")
    pshow.add_argument("name", metavar="NAME")
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
    sub.add_parser("setup", help="install boxyd's systemd user units and enable its socket")
    trust = sub.add_parser(
        "trust",
        help="approve this directory's .boxy.yaml and the registries its .npmrc or pip.conf names",
    )
    how = trust.add_mutually_exclusive_group()
    how.add_argument("--list", action="store_true", help="every approval: directory, hash, what")
    how.add_argument("--revoke", action="store_true", help="withdraw this directory's approvals")
    _json(trust)
    comp = sub.add_parser("completion", help="print the shell completion script")
    comp.add_argument("shell", metavar="SHELL", choices=("bash", "zsh", "fish"))


def usage(prog: str = "boxyctl", command: str | None = None) -> str:
    """The help text of the program, or of one subcommand ('run', 'ps' …)."""
    argv = [command, "--help"] if command else ["--help"]
    try:
        build_parser(prog).parse_args(argv)
    except Help as h:
        return h.text
    raise AssertionError("--help did not produce help")
