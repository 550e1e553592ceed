"""`boxyctl cache list | clean [--all]`: the per-project package caches."""

from __future__ import annotations

import os
import time

from boxyctl.output import print_json, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    """`cache list` / `cache clean [--all]`: boxy's own directories, no daemon needed."""
    from boxy import caches, values

    found = caches.entries()
    if args["action"] == "list" and args.get("json"):
        print_json(
            {
                "caches": [
                    {
                        "profile": e.profile,
                        "size": e.size,
                        "last_used": e.last_used,
                        "workdir": e.workdir,
                        "path": e.path,
                    }
                    for e in found
                ]
            }
        )
        return 0
    if args["action"] == "list":
        for e in found:
            age = values.format_duration(max(0.0, time.time() - e.last_used))
            print(f"{e.profile:<8}  {values.format_size(e.size):>9}  used {age} ago  {e.workdir}")
        return 0
    here = os.path.realpath(args["cwd"]) if args.get("cwd") else None
    gone = [e for e in found if args["all"] or e.workdir == here]
    for e in gone:
        caches.remove(e)
    say(
        f"removed {len(gone)} package cache{'s' if len(gone) != 1 else ''} "
        f"({values.format_size(sum(e.size for e in gone))})"
    )
    return 0
