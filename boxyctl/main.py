"""boxyctl (also installed as boxy): the client's entry point. It parses the command
line (boxyctl/cli.py) and hands the Command to its subcommand's module, named in the
subcommand table (boxyctl/commands/). Imports neither asyncio, D-Bus nor dnspython
to run a command: start-up time is part of every sandboxed run."""

from __future__ import annotations

import errno
import io
import os
import sys

from boxy import VERSION
from boxy.errors import BoxyError
from boxyctl.output import prog, say


class _ClosedStdout(io.TextIOBase):
    """sys.stdout when boxyctl was started with it closed: a write fails as it would."""

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "it is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "it is closed")


def _cwd() -> str:
    """The current directory, or "" when it was removed (cli.parse says so for `run`)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """Never a traceback, whatever state stdout or the current directory is in: one
    line on stderr and an exit status (BOXY_DEBUG=1 shows the traceback of a bug)."""
    from boxy import stdfds

    stdfds.ensure()  # no socket of ours may land on 0-2 (the launcher did it first)
    if sys.stdout is None:  # started with fd 1 closed: it holds /dev/null now
        sys.stdout = _ClosedStdout()
    try:
        status = _main(argv)
        sys.stdout.flush()
        return status
    except OSError as e:  # stdout closed, full (/dev/full) or a closed pipe
        if e.errno not in (errno.EBADF, errno.ENOSPC, errno.EPIPE, errno.EIO):
            raise
        say(f"cannot write to standard output: {e.strerror}")
        # the interpreter flushes stdout again at exit: let that one land nowhere
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        return 1
    except Exception as e:  # a bug: still one line
        if os.environ.get("BOXY_DEBUG"):
            raise
        say(f"internal error: {type(e).__name__}: {e} (BOXY_DEBUG=1 shows where)")
        return 1


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["hook"]:  # before cli.parse: `hook claude` runs before every command
            from boxyctl import hook

            return hook.main(argv[1:], _cwd(), say)
        from boxyctl import cli

        cmd = cli.parse(
            argv,
            environ=dict(os.environ),
            cwd=_cwd(),
            prog=prog(),
        )
        if cmd.name == "help":
            sys.stdout.write(cmd.args["text"])
            return 0
        if cmd.name == "version":
            from boxy.buildid import build_id

            print(f"boxy {VERSION} (build {build_id()})")
            return 0
        if cmd.name == "run":  # named, not looked up: the table is not read on a run's way
            from boxyctl.commands import run

            return run.main(cmd.args)
        return _dispatch(cmd.name, cmd.args)
    except BoxyError as e:
        say(str(e))
        return e.exit_status
    except KeyboardInterrupt:
        return 130


def _dispatch(name: str, args: dict[str, object]) -> int:
    """The subcommand's module, as its row in the table names it."""
    import importlib

    from boxyctl.commands.table import BY_NAME

    module = importlib.import_module(f"boxyctl.commands.{BY_NAME[name].module}")
    status: int = module.main(args)
    return status
