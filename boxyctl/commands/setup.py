"""`boxyctl setup`: boxyd's systemd user units, its socket enabled (boxyctl/userunits.py)."""

from __future__ import annotations

import os

from boxy import INTERFACE as IFACE
from boxy.errors import Busy, DaemonError
from boxyctl.output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    """Install the user units; an idle boxyd started on demand makes way for the
    socket (one with sessions keeps them, and nobody reaches it once they end)."""
    from boxyctl import userunits
    from boxyctl.connect import connect, wait_gone

    environ = dict(os.environ)
    if (
        userunits.user_manager(environ)
        and userunits.systemctl("is-active", "boxyd.socket").stdout.strip() != "active"
    ):
        try:
            client = connect(start=False)
        except DaemonError:
            client = None
        if client is not None:
            try:
                client.call(f"{IFACE}.Shutdown", {})
                wait_gone()
            except Busy as e:
                say(f"setup: the running boxyd keeps its sessions ({e}); new runs go to the socket")
            finally:
                client.close()
    return userunits.setup(environ, print)
