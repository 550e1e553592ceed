"""`boxyctl profile list | show NAME`: the profiles, as boxyd loads them for a run in
this directory (Profiles, ProfileShow: npm and pip are asked as a run asks them)."""

from __future__ import annotations

import os

from boxy import INTERFACE as IFACE
from boxy.errors import DaemonError
from boxyctl.output import print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxy.client import client_env
    from boxyctl.connect import connect

    if args.get("action") == "list":
        method, params, key = "Profiles", {}, "profiles"
    else:
        method, key = "ProfileShow", "profile"
        params = {"name": _name(args["name"]), "cwd": _cwd(), "client_env": client_env(os.environ)}
    client = connect()
    try:
        reply = client.call(f"{IFACE}.{method}", params)
    finally:
        client.close()
    doc, lines = reply.get(key), reply.get("lines")
    if not isinstance(doc, dict) or not isinstance(lines, list):
        raise DaemonError(f"profile {args.get('action')}: boxyd sent no profile")
    if args.get("json"):
        print_json(doc)
        return 0
    for line in lines:
        print(line)
    return 0


def _name(name: str) -> str:
    """A path is made absolute here: against this directory, ~ from this HOME."""
    from boxy.options import is_profile_path

    if is_profile_path(name):
        return os.path.abspath(os.path.expanduser(name))
    return name


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # removed: as a run from home would
        return os.environ.get("HOME") or os.path.expanduser("~")
