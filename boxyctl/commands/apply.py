"""`boxyctl apply [--json] ID [PATH...]`: a reviewed session's changes landed (varlink
Apply); what was refused is named, one line each, and makes the exit status 1."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxyctl.output import print_json, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxyctl.connect import connect

    paths = list(args.get("paths") or [])
    client = connect()
    try:
        got = client.call(f"{IFACE}.Apply", {"id": args["id"], "paths": paths or None})
    finally:
        client.close()
    refused = got.get("refused") or []
    if args.get("json"):
        print_json(got)
        return 1 if refused else 0
    applied = got.get("applied") or []
    from boxy import shown
    from boxyctl.review import folded_git, git_line

    listed, gitwork = folded_git([(str(p), str(w)) for p, w in refused])
    for path, why in listed:
        say(f"apply: {shown.name(path)}: refused: {why}")
    for gitdir, n in gitwork.items():
        say(f"apply: refused: {git_line(gitdir, n)}")
    left = got.get("left", 0)
    rest = "nothing left; the review is closed" if got.get("closed") else f"{left} left held"
    print(
        f"session {args['id']}: {len(applied)} applied, {len(refused)} refused, {rest}", flush=True
    )
    return 1 if refused else 0
