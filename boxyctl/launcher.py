"""boxyctl's own scripts in the venv's bin directory, in place of those pip writes
(`make venv` runs `python -m boxyctl.launcher BIN`), and the entry points they call.

Every sandboxed command starts an interpreter, so its start-up is part of every run.
The scripts start it with -S: no site, so neither the venv's nor the system's .pth
files are read and run (8 ms of each start on the machines this is built on); the
script puts the package's own directory on sys.path instead, after the standard
library as site would. A run (and the hook, which reads its YAML only when there
is a file) needs nothing else; every other command, and anything that imports a
package from outside the standard library, first sets up the full site
(boxyctl.fullsite), so it finds exactly what it would have. With pip's scripts all of
this is the same, only slower.

Standard library only, and cheap to import: this is the first module a run loads.
"""

from __future__ import annotations

import os
import sys

from boxy import stdfds
from boxyctl.fullsite import ensure_site

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import NoReturn

# script name → the entry point in this module it calls
SCRIPTS = {"boxyctl": "boxyctl", "boxy": "boxyctl", "boxy-sh": "shim"}

SCRIPT = """#!{python} -S
# Written by `python -m boxyctl.launcher` (boxyctl/launcher.py says why -S).
import sys
sys.path.append({root!r})
from boxyctl.launcher import {entry}
{entry}()
"""


def _fast(argv: list[str]) -> bool:
    """Commands that import nothing outside the standard library before they call
    ensure_site themselves: `run` and `hook claude`, which precede every command."""
    return argv[:1] == ["run"] or argv == ["hook", "claude"]


def _leave(status: int) -> NoReturn:
    """Out without the interpreter's teardown (freeing every module: several ms of
    every run): stdout and stderr flushed first, nothing else is pending."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed, full, a closed pipe: main said so
            pass
    os._exit(status)


def boxyctl() -> NoReturn:
    """The boxyctl and boxy scripts."""
    stdfds.ensure()  # before anything is opened (boxy/stdfds.py)
    if not _fast(sys.argv[1:]):
        ensure_site()
    from boxyctl.main import main

    _leave(main())  # (a SystemExit leaves as it would from pip's script)


def shim() -> NoReturn:
    """The boxy-sh script (boxyctl/shim.py)."""
    stdfds.ensure()  # before anything is opened (boxy/stdfds.py)
    from boxyctl.shim import main

    _leave(main())


def write(bin_dir: str, python: str, root: str) -> list[str]:
    """The scripts in BIN_DIR (each replaced by a rename: a shell running one meanwhile
    reads the old one whole); the paths written."""
    written = []
    for name, entry in SCRIPTS.items():
        path = os.path.join(bin_dir, name)
        tmp = f"{path}.boxy-{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(SCRIPT.format(python=python, root=root, entry=entry))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not os.path.isdir(args[0]):
        print(
            "usage: python -m boxyctl.launcher BIN_DIR (the venv's bin directory)", file=sys.stderr
        )
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    write(args[0], sys.executable, root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
