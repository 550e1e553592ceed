"""`boxyctl discard ID`: a reviewed session's changes dropped (varlink Discard)."""

from __future__ import annotations

from boxy import INTERFACE as IFACE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect

    client = connect()
    try:
        client.call(f"{IFACE}.Discard", {"id": args["id"]})
    finally:
        client.close()
    print(f"session {args['id']}: its changes are discarded", flush=True)
    return 0
