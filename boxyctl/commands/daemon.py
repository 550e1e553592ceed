"""`boxyctl daemon status [--json] | restart | stop [--force]`. status's exit status is
systemctl is-active's: 0 running, 3 not (--json too: {"running": false})."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxy.errors import Busy, DaemonError
from boxyctl.output import print_json, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect, wait_gone

    action = args.get("action", "status")
    if action == "status":
        return _status(bool(args.get("json")))
    try:
        client = connect(start=False)
        try:
            client.call(f"{IFACE}.Shutdown", {"force": bool(args.get("force"))})
        except Busy as e:
            say(f"daemon {action}: {e}")
            return 1
        wait_gone(timeout=15.0 if args.get("force") else 5.0)  # forced: sessions get a grace
    except DaemonError:
        pass
    if action == "restart":
        connect().close()
        print("boxyd: restarted")
    return 0


def _status(as_json: bool) -> int:
    from boxyctl.connect import connect

    try:
        client = connect(start=False)
    except DaemonError:
        if as_json:
            print_json({"running": False})
        else:
            print("boxyd: not running")
        return 3  # as `systemctl is-active`: scripts test the status
    try:
        st = client.call(f"{IFACE}.DaemonStatus", {})
    finally:
        client.close()
    if as_json:  # DaemonStatus's fields, as the IDL names them
        print_json({"running": True, **st})
        return 0
    print(
        f"boxyd: running  pid {st.get('pid')}  build {st.get('build')}  "
        f"sessions running {st.get('sessions_running')}  up {st.get('uptime')}s"
    )
    return 0
