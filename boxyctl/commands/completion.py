"""`boxyctl completion SHELL`: the completion script, generated from the parser
(boxyctl/completion.py)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxyctl import completion

    make = {"bash": completion.bash, "zsh": completion.zsh, "fish": completion.fish}
    sys.stdout.write(make[args["shell"]]())
    return 0
