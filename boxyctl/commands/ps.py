"""`boxyctl ps [-a] [-q] [--json]`: the sessions boxyd runs (-a: and every one on
record, which boxyd reads from the records when none runs). --json: the IDL's
Session objects as List sends them."""

from __future__ import annotations

import time

from boxy import INTERFACE as IFACE
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
        reply = client.call(f"{IFACE}.List", {"all": bool(args.get("all"))})
    finally:
        client.close()
    infos = [i for d in reply.get("sessions", []) if (i := SessionInfo.from_wire(d))]
    if args.get("json"):
        print_json({"sessions": [i.to_wire() for i in infos]})
        return 0
    if args.get("quiet"):
        lines = [i.id for i in infos]
    else:
        lines = text.ps_lines(infos, time.time(), dates=bool(args.get("all")))
    for line in lines:
        print(line)
    return 0
