"""`boxyctl profile list | show NAME`: the profiles, as a run here would load them."""

from __future__ import annotations

import os

from boxyctl.output import print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    """`profile list` / `profile show NAME`: as a run in this directory would load it."""
    from boxyd.config import layering, profiles, profileview
    from boxyd.config.registries import Registries
    from boxyd.daemon.stage2proc import Template
    from boxyd.daemon.toolbox import Toolshed

    home = os.environ.get("HOME") or os.path.expanduser("~")
    if args.get("action") == "list" and args.get("json"):
        print_json({"profiles": profileview.list_rows(home)})
        return 0
    if args.get("action") == "list":
        for line in profileview.list_lines(home):
            print(line)
        return 0
    name = args["name"]
    if profiles.is_path(name):
        name = os.path.abspath(os.path.expanduser(name))
    kind, location = profiles.where(name, home)
    try:
        workdir = os.getcwd()
    except OSError:  # removed: as a run from home would
        workdir = home
    # the templates filled as a run here fills them ({cache} is per profile)
    context = layering.profile_context(workdir, home, name)
    prof = profiles.load_profile(name, context=context)  # a file that is no profile: refused
    # npm and pip are asked as boxyd asks them: in a tool sandbox, never from this tree
    template = Template()
    template.start()
    registry = Registries(
        dict(os.environ), tools=Toolshed(template.spawn, 30.0), writable=[workdir]
    )
    try:
        if args.get("json"):
            print_json(profileview.show_doc(prof, registry, kind, location))
        else:
            for line in profileview.show_lines(prof, registry, kind, location):
                print(line)
    finally:
        registry.close()
        template.close()
    return 0
