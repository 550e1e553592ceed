"""`boxyctl attach ID`: take over a detached session's terminal (Ctrl-] leaves it)."""

from __future__ import annotations

from boxyctl.follow import follow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect

    client = connect()
    try:
        return follow(client, "Attach", {"id": args["id"]}, [args["id"]])
    finally:
        client.close()
