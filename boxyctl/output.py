"""What boxyctl says: one line on stderr (say), one JSON document on stdout
(print_json), a terminal's bytes as they are (write_out)."""

from __future__ import annotations

import os
import sys


def prog() -> str:
    from boxyctl.cli import prog_name

    return prog_name(sys.argv[0] if sys.argv else "boxyctl")


def say(msg: str) -> None:
    """One line on stderr; \\r\\n when the terminal may be in raw mode. A control
    character in the message (a newline in a path, an escape sequence in a file name)
    is shown escaped: one line, and nothing that drives the terminal."""
    end = "\r\n" if os.isatty(2) else "\n"
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in msg)
    import contextlib  # here: not imported before a run is sent (docs/design.md)

    with contextlib.suppress(OSError):  # stderr closed or full: nowhere left to say it
        os.write(2, f"{prog()}: {text}{end}".encode(errors="replace"))


def print_json(doc: object) -> None:
    """--json: one document on stdout, its keys in a stable order."""
    import json

    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def write_out(data: bytes) -> None:
    """DATA to stdout as it is (a terminal's output: bytes, not text)."""
    sys.stdout.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
