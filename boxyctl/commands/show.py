"""`boxyctl show [--json] ID`: one session in full (a finished one from its record).
--json: the IDL's Session object as Show sends it."""

from __future__ import annotations

import time

from boxy import INTERFACE as IFACE
from boxy.errors import DaemonError
from boxyctl.output import print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxy.outcome import SessionInfo
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    client = connect()
    try:
        info = SessionInfo.from_wire(
            client.call(f"{IFACE}.Show", {"id": args["id"]}).get("session")
        )
    finally:
        client.close()
    if info is None:
        raise DaemonError("show: boxyd sent no session")
    if args.get("json"):
        print_json(info.to_wire())
        return 0
    for line in text.show_lines(info, time.time()):
        print(line)
    return 0
