"""`boxyctl stop [-k] ID...`: SIGTERM, then SIGKILL after the grace; the final state."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxy.errors import BoxyError, DaemonError
from boxyctl.output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    """stop [-k] ID...: each in turn (an unknown one is said, the others still
    stopped); the status of the worst."""
    from boxy.outcome import SessionInfo
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    status = 0
    client = connect()
    try:
        for sid in args["ids"]:
            say(_stopping_line(sid, bool(args["kill"])))  # the grace is waited out: say so
            try:
                got = client.call(f"{IFACE}.Stop", {"id": sid, "kill": bool(args["kill"])})
            except BoxyError as e:
                say(str(e))
                status = max(status, e.exit_status)
                continue
            info = SessionInfo.from_wire(got.get("session"))
            if info is None:
                raise DaemonError("stop: boxyd sent no session")
            print(text.stop_line(info), flush=True)
    finally:
        client.close()
    return status


def _stopping_line(session_id: str, kill: bool) -> str:
    from boxy.outcome import STOP_GRACE

    if kill:
        return f"stopping session {session_id}: SIGKILL"
    return (
        f"stopping session {session_id}: SIGTERM, then SIGKILL after {STOP_GRACE:g}s "
        "if it is still running (-k: at once)"
    )
