"""`boxyctl doctor [--json]`: what this machine gives boxy, one aligned line per
check, as boxyd finds it (Doctor: the checks run beside the daemon, in its session,
cgroup and environment). When boxyd cannot be reached, the checks run here, and the
doctor says so."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxy.checks import Check, probe, show
from boxy.errors import DaemonError
from boxyctl.output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    """Print the checks; 1 when a hard requirement is missing, else 0."""
    return show(_from_boxyd(), as_json=bool(args.get("json")))


def _from_boxyd() -> list[Check]:
    from boxyctl.connect import connect

    try:
        client = connect()
    except DaemonError as e:
        say(f"boxyd could not be reached ({e}): the checks ran in this client instead")
        return probe()
    try:
        reply = client.call(f"{IFACE}.Doctor", {})
    finally:
        client.close()
    checks = reply.get("checks")
    if not isinstance(checks, list):
        raise DaemonError("doctor: boxyd sent no checks")
    return [Check.from_wire(c) for c in checks]
