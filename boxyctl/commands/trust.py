"""`boxyctl trust [--list | --revoke]`: approve this directory's .boxy.yaml and the
registries its .npmrc or pip.conf names, as they are now. boxyd reads them as a run
reads them (its parses apart from it: config/trust.py) and approves exactly what it
read; this prints what that was."""

from __future__ import annotations

import os
import time

from boxy import INTERFACE as IFACE
from boxy.errors import DaemonError, UsageError
from boxyctl.output import print_json, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from boxy.varlink import Client


def main(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect

    if not args["list"] and not args.get("cwd"):
        raise UsageError("trust: the current directory was removed; cd to the project")
    client = connect()
    try:
        return _trust(client, args)
    finally:
        client.close()


def _trust(client: Client, args: dict[str, Any]) -> int:
    from boxy.client import client_env

    if args["list"]:
        approvals = client.call(f"{IFACE}.Approvals", {}).get("approvals")
        if not isinstance(approvals, list):
            raise DaemonError("trust --list: boxyd sent no approvals")
        if args.get("json"):
            print_json({"approvals": approvals})
        for line in [] if args.get("json") else _approval_lines(approvals):
            print(line)
        return 0
    workdir = os.path.realpath(args["cwd"])
    if args["revoke"]:
        n = int(client.call(f"{IFACE}.Revoke", {"cwd": workdir}).get("revoked", 0))
        say(f"revoked {n} approval{'s' if n != 1 else ''} for {workdir}")
        return 0
    got = client.call(f"{IFACE}.Trust", {"cwd": workdir, "client_env": client_env(os.environ)})
    _show(got)
    say(
        f"approved {workdir}'s configuration as shown; a change to what widens the sandbox "
        "needs `boxyctl trust` again"
    )
    return 0


def _show(got: dict[str, Any]) -> None:
    """What boxyd approved: .boxy.yaml's text, the registries, what is wider."""
    from boxyctl.sessions import clean

    if got.get("path"):
        print(f"{got['path']}:")
        for line in str(got.get("text", "")).splitlines():
            print(f"  {clean(line)}")
    for reg in got.get("registries") or []:
        print(f"{clean(reg['source'])}: {clean(reg['key'])} = {clean(reg['shown'])}")
    if got.get("wider"):
        say(f"beyond the default profile this allows: {clean('; '.join(got['wider']))}")


def _approval_lines(approvals: list[dict[str, Any]]) -> list[str]:
    """`trust --list`: one line per approval (when, digest, work directory, what)."""
    from boxy.paths import PROJECT_CONFIG
    from boxyctl.sessions import clean

    out = []
    for r in approvals:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("approved_at") or 0))
        what = [PROJECT_CONFIG] if r.get("boxy_yaml") else []
        what += [
            f"{x.get('key')} {x.get('url')}" for x in r.get("registries", []) if isinstance(x, dict)
        ]
        out.append(
            f"{when}  {str(r.get('digest', ''))[:12]}  {clean(str(r['workdir']))}  "
            f"{clean(', '.join(map(str, what)))}".rstrip()
        )
    return out
