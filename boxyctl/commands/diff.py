"""`boxyctl diff [--stat] [--json] ID`: what a session held for review changed (varlink
Diff): the summary, then the unified diff boxyd's review child made."""

from __future__ import annotations

from boxy import INTERFACE as IFACE
from boxyctl.output import print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    from boxy import shown
    from boxyctl.connect import connect
    from boxyctl.review import summary_lines

    client = connect()
    try:
        got = client.call(f"{IFACE}.Diff", {"id": args["id"], "text": not args.get("stat")})
    finally:
        client.close()
    if args.get("json"):
        print_json(got)
        return 0
    out = "\n".join(summary_lines(got.get("changes") or [])) + "\n"
    text = shown.lines(got.get("text") or "")  # the payload's: nothing a terminal acts on
    print(out + ("\n" + text if text else ""), end="", flush=True)
    return 0
