"""`boxyctl allow ID HOST...` (and `deny`, boxyctl/commands/deny.py): a running
session's network policy, changed at once through boxyd (varlink Allow / Deny). The
hosts are checked here first, so a typo is one line and exit 2 before boxyd is asked;
what the session cannot widen (a port its Landlock rules fixed) boxyd says."""

from __future__ import annotations

from boxy import INTERFACE as IFACE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    return change("Allow", args)


def change(method: str, args: dict[str, Any]) -> int:
    """METHOD (Allow or Deny) of session args["id"] for args["hosts"]; prints the line
    boxyd recorded (show and the audit log have it too)."""
    from boxy.values import parse_denied_host, parse_host_spec
    from boxyctl.connect import connect

    for host in args["hosts"]:  # as boxyd checks them (NetPolicy.widened, narrowed)
        if method == "Deny":
            parse_denied_host(host)
        else:
            parse_host_spec(host, what="allow")
    client = connect()
    try:
        got = client.call(f"{IFACE}.{method}", {"id": args["id"], "hosts": list(args["hosts"])})
    finally:
        client.close()
    print(f"session {args['id']}: {got.get('line', '')}", flush=True)
    return 0
