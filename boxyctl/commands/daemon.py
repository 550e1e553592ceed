"""`boxyctl daemon status | restart | stop [--force]`."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxy.errors import Busy, DaemonError
from boxyctl.output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect, wait_gone

    action = args.get("action", "status")
    if action == "status":
        try:
            client = connect(start=False)
        except DaemonError:
            print("boxyd: not running")
            return 3  # as `systemctl is-active`: scripts test the status
        st = client.call(f"{IFACE}.DaemonStatus", {})
        print(
            f"boxyd: running  pid {st.get('pid')}  build {st.get('build')}  "
            f"sessions running {st.get('sessions_running')}  up {st.get('uptime')}s"
        )
        return 0
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
