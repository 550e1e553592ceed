"""`boxyctl stop [-k] [--json] ID...`: SIGTERM, then SIGKILL after the grace; the
final states (--json: the IDL's Session objects, as ps --json has them)."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxy.errors import BoxyError, DaemonError
from boxyctl.output import print_json, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from boxy.outcome import SessionInfo
    from boxy.varlink import Client


def main(args: dict[str, Any]) -> int:
    """stop [-k] ID...: each in turn (an unknown one is said, the others still
    stopped); the status of the worst."""
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    status, stopped = 0, []
    client = connect()
    try:
        for sid in args["ids"]:
            try:
                info = _stop(client, sid, bool(args["kill"]))
            except BoxyError as e:
                say(str(e))
                status = max(status, e.exit_status)
                continue
            if args.get("json"):
                stopped.append(info.to_wire())
            else:
                print(text.stop_line(info), flush=True)
    finally:
        client.close()
    if args.get("json"):
        print_json({"sessions": stopped})
    return status


def _stop(client: Client, sid: str, kill: bool) -> SessionInfo:
    """SID stopped, as it ended. The waiting is said once boxyd has named a session
    that still runs: never for an id it does not know, nor for one already ended."""
    info = _session(client, "Show", sid)
    if not info.state.finished:
        say(_stopping_line(info.id, kill))  # the grace is waited out: say so
        info = _session(client, "Stop", info.id, kill=kill)
    return info


def _session(client: Client, method: str, sid: str, **params: object) -> SessionInfo:
    from boxy.outcome import SessionInfo

    got = client.call(f"{IFACE}.{method}", {"id": sid, **params})
    info = SessionInfo.from_wire(got.get("session"))
    if info is None:
        raise DaemonError(f"stop: boxyd sent no session ({method})")
    return info


def _stopping_line(session_id: str, kill: bool) -> str:
    from boxy.outcome import STOP_GRACE

    if kill:
        return f"stopping session {session_id}: SIGKILL"
    return (
        f"stopping session {session_id}: SIGTERM, then SIGKILL after {STOP_GRACE:g}s "
        "if it is still running (-k: at once)"
    )
