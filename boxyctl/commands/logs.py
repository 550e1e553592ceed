"""`boxyctl logs [-f] ID`: a detached session's output, as boxyd keeps it."""

from __future__ import annotations

import time

from boxy import INTERFACE as IFACE
from boxy.errors import BoxyError
from boxyctl.output import write_out

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOGS_POLL = 0.3  # seconds between asking for more of a followed session's output


def main(args: dict[str, Any]) -> int:
    """logs [-f] ID: the output boxyd keeps of a detached session (its record's
    output.log, bounded), as written; -f follows it until the session ends. Read
    through boxyd (Output): its state directory is the one that counts."""
    import base64

    from boxyctl.connect import connect

    client = connect()
    sid, offset = args["id"], 0
    try:
        while True:
            got = client.call(f"{IFACE}.Output", {"id": sid, "offset": offset})
            if not got.get("kept"):
                raise BoxyError(
                    f"logs: session {sid} kept no output (only a detached one's is: "
                    "run -d, or Ctrl-] in a run)"
                )
            sid = str(got.get("id") or sid)  # a prefix once: the id from then on
            data = base64.b64decode(str(got.get("data", "")))
            offset = int(got.get("offset", offset + len(data)))
            write_out(data)
            if not data and (got.get("ended") or not args.get("follow")):
                return 0
            if not data:
                time.sleep(LOGS_POLL)
    finally:
        client.close()
