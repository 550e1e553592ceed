"""`boxyctl deny ID HOST...`: HOSTS refused in a running session from now on
(boxyctl/commands/allow.py does both)."""

from __future__ import annotations

from boxyctl.commands.allow import change

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    return change("Deny", args)
