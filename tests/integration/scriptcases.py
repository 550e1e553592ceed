"""Tests that are also the script the unprivileged test user runs (``python -I FILE
ROOT CASE``): each case runs in a fresh single-threaded interpreter, as stage 2
would, and prints one JSON report for the tests to assert on
(tests/integration/test_zygote.py, test_spare_network.py)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from tests.conftest import User

ROOT = Path(__file__).resolve().parents[2]
Case = Callable[[], dict[str, Any]]


def report(user: User, script: str, case: str) -> dict[str, Any]:
    """SCRIPT's CASE, run as USER; its report."""
    proc = user.run(
        [sys.executable, "-I", str(Path(script).resolve()), str(ROOT), case], timeout=60, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out: dict[str, Any] = json.loads(proc.stdout.decode().splitlines()[-1])
    return out


def main(cases: dict[str, Case]) -> NoReturn:
    """The script's side: the case named on the command line, its report on stdout."""
    if len(sys.argv) != 3 or sys.argv[2] not in cases:
        sys.exit(f"usage: {Path(sys.argv[0]).name} ROOT {{{','.join(cases)}}}")
    print(json.dumps(cases[sys.argv[2]]()))
    sys.stdout.flush()
    os._exit(0)  # the namespaces go with the process; skip interpreter shutdown
