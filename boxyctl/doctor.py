"""`boxyctl doctor`: print what this machine gives boxy, one aligned line per check.

Imports only the standard library and boxyd.doctor, so the command starts fast.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from boxyd.doctor import Check, checks

RED, RESET = "\x1b[31m", "\x1b[0m"


def _color(stream: TextIO) -> bool:
    # Escapes only for a person at a terminal; a pipe gets plain text.
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def render(results: list[Check], color: bool = False) -> list[str]:
    """` + name  ok       detail` / ` - name  missing  detail`, names and verdicts aligned."""
    width = max((len(c.name) for c in results), default=0)
    lines = []
    for c in results:
        sign, verdict = ("+", "ok") if c.ok else ("-", "missing")
        line = f" {sign} {c.name:<{width}}  {verdict:<7}  {c.detail}"
        lines.append(f"{RED}{line}{RESET}" if color and not c.ok else line)
    return lines


def run() -> int:
    """Print the checks; 1 when a hard requirement is missing, else 0."""
    results = checks()
    for line in render(results, color=_color(sys.stdout)):
        print(line)
    sys.stdout.flush()
    blocking = [c.name for c in results if c.hard and not c.ok]
    if blocking:
        print(f"boxy cannot run here: {', '.join(blocking)} missing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
