"""`boxyctl trust [--list | --revoke]`: approve this directory's .boxy.yaml and the
registries its .npmrc or pip.conf names, as they are now."""

from __future__ import annotations

import os
import pwd
import time

from boxy.errors import UsageError
from boxyctl.output import print_json, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from boxyd.config.projectconfig import Project


def main(args: dict[str, Any]) -> int:
    """`trust`: approve this directory's .boxy.yaml as it is now (printed: what is
    approved is what you see); --list, --revoke. No daemon needed."""
    from boxy.paths import config_home
    from boxyctl.sessions import clean
    from boxyd.config import projectconfig

    home = config_home(os.environ.get("HOME"))
    me = pwd.getpwuid(os.getuid())
    if args["list"]:
        if args.get("json"):
            print_json({"approvals": _approvals(home)})
            return 0
        for line in _approval_lines(home):
            print(line)
        return 0
    if not args.get("cwd"):
        raise UsageError("trust: the current directory was removed; cd to the project")
    workdir = os.path.realpath(args["cwd"])
    if args["revoke"]:
        n = projectconfig.revoke(workdir, home)
        say(f"revoked {n} approval{'s' if n != 1 else ''} for {workdir}")
        return 0
    # read as a run reads it: the same files, the same environment (projectconfig.run_env);
    # parsed here, in this command's own process (boxyd parses them apart: parsedoor.py)
    from boxyd.config import parsedoor

    parsedoor.allow_local()
    project = projectconfig.read(workdir, projectconfig.run_env(me.pw_dir, me.pw_name, os.environ))
    if project.empty:
        raise UsageError(
            f"trust: {workdir} has no {projectconfig.NAME}, and no .npmrc or "
            "pip.conf of its own naming a registry"
        )
    wider = _check_project(project, me.pw_dir)
    if project.config is not None:
        print(f"{project.path}:")
        for line in project.text.splitlines():
            print(f"  {clean(line)}")
    for reg in project.registries:
        print(f"{clean(reg.source)}: {clean(reg.key)} = {clean(reg.shown)}")
    if wider:
        say(f"beyond the default profile this allows: {clean('; '.join(wider))}")
    projectconfig.approve(project, home)
    say(
        f"approved {workdir}'s configuration as shown; a change to what widens the sandbox "
        "needs `boxyctl trust` again"
    )
    return 0


def _approvals(home: str) -> list[dict[str, Any]]:
    """`trust --list --json`: each approval's work directory, when, digest, what."""
    from boxyd.config import projectconfig

    return [
        {
            "workdir": r["workdir"],
            "approved_at": r.get("approved_at"),
            "digest": r.get("digest"),
            "boxy_yaml": bool(r.get("boxy_yaml")),
            "registries": [
                {"key": x.get("key"), "url": x.get("url")}
                for x in r.get("registries", [])
                if isinstance(x, dict)
            ],
        }
        for r in projectconfig.approvals(home)
    ]


def _approval_lines(home: str) -> list[str]:
    """`trust --list`: one line per approval (when, digest, work directory, what)."""
    from boxyctl.sessions import clean
    from boxyd.config import projectconfig

    out = []
    for r in projectconfig.approvals(home):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("approved_at", 0)))
        what = [projectconfig.NAME] if r.get("boxy_yaml") else []
        what += [
            f"{x.get('key')} {x.get('url')}" for x in r.get("registries", []) if isinstance(x, dict)
        ]
        out.append(
            f"{when}  {str(r.get('digest', ''))[:12]}  {clean(r['workdir'])}  "
            f"{clean(', '.join(map(str, what)))}".rstrip()
        )
    return out


def _check_project(project: Project, home: str) -> list[str]:
    """What is approved must load: its profile and keys, as a run would take them.
    Returns what of it is wider than the default profile (said before approving)."""
    from boxyd.config import layering

    return [str(k) for k in layering.project_widening(project, home)]
