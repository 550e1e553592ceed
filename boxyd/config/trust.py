"""`boxyctl trust`, answered by boxyd: the project read as a run reads it (the same
files, the same environment: projectconfig.run_env), what of it is wider than the
default profile, and the approval of exactly what was read; the approvals listed and
revoked; and the hook's question, whether a project is approved as it is now.

The project's files are parsed through the door (parsedoor.py): the caller puts its
Parser in force (boxyd: a parse child; docs/design.md, "Nothing the payload wrote is
parsed in boxyd's process")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from boxy.errors import UsageError
from boxyd.config import layering, projectconfig, projectedit
from boxyd.config.runspec import DEFAULT_PROFILE


class Approval(NamedTuple):
    """What `trust` approved, as the client shows it: .boxy.yaml's path and text (when
    there is one), each registry named (its file, key, value as shown), and what goes
    beyond the default profile."""

    workdir: str
    path: str | None
    text: str
    registries: list[tuple[str, str, str]]
    wider: list[str]


def approve(
    workdir: str, home: str, user: str, client_env: Mapping[str, str], config_home: str
) -> Approval:
    """Read WORKDIR's configuration as USER's run would, check that it loads, approve
    it as read. UsageError when there is nothing to approve."""
    env = projectconfig.run_env(home, user, client_env)
    project = projectconfig.read(workdir, env)
    if project.empty:
        raise UsageError(
            f"trust: {workdir} has no {projectconfig.NAME}, and no .npmrc or "
            "pip.conf of its own naming a registry"
        )
    wider = [str(k) for k in layering.project_widening(project, home)]
    projectconfig.approve(project, config_home)
    return Approval(
        workdir,
        project.path if project.config is not None else None,
        project.text,
        [(r.source, r.key, r.shown) for r in project.registries],
        wider,
    )


def trusted(
    workdir: str, home: str, user: str, client_env: Mapping[str, str], config_home: str
) -> str | None:
    """The profile WORKDIR's .boxy.yaml names (the default one when it names none)
    when that file is approved as it is now, read as a run reads it, leniently (one
    that cannot be read is not approved); None otherwise. The hook passes the name on
    as the run's -p: a file swapped or removed before the run reads it then gets that
    profile, never the default's wider one (attack finding F2)."""
    env = projectconfig.run_env(home, user, client_env)
    try:
        project = projectconfig.read(workdir, env, strict=False)
    except (UsageError, OSError, ValueError):  # ValueError: a NUL in the path
        return None
    if project.config is None or not projectconfig.is_trusted(project, config_home):
        return None
    named = project.doc.get("profile") if project.doc is not None else None
    return named if isinstance(named, str) and named else DEFAULT_PROFILE


def allow_in_project(
    host: str, workdir: str, home: str, user: str, client_env: Mapping[str, str], config_home: str
) -> str:
    """--ask's `for this project`: HOST added to WORKDIR's .boxy.yaml allow_hosts and
    the result approved, as `trust` would after the person added it. Only over what
    the person approved (or no project configuration at all): a file the payload
    changed is never approved along with HOST. Returns the line for the user;
    UsageError (nothing written) when it cannot."""
    env = projectconfig.run_env(home, user, client_env)
    before = projectconfig.read(workdir, env)
    where = before.path
    if not before.empty and not projectconfig.is_trusted(before, config_home):
        raise UsageError(
            f"{where} is not approved as it is now (changed, or never trusted): not "
            "written; `boxyctl trust` in the project once you have read it"
        )
    if before.config is not None and before.doc is None:
        raise UsageError(f"{where}: {before.doc_error or 'unreadable'}: not written")
    doc = dict(before.doc or {})
    hosts = doc.get(projectedit.KEY) or []
    expected = {**doc, projectedit.KEY: [*hosts, host]}
    text = projectedit.with_allowed_host(before.text, host)
    new = text.encode() if text is not None else None
    if new is None or projectconfig.project_doc(new, where)[0] != expected:
        raise UsageError(
            f"{where}: not a shape boxy edits (add {host} to allow_hosts yourself, "
            "then `boxyctl trust`)"
        )
    projectconfig.replace_data(workdir, projectconfig.NAME, new, was=before.config)
    after = projectconfig.read(workdir, env)
    if after.config != new or after.registries != before.registries:
        raise UsageError(f"{where} changed as boxy wrote it: not approved")
    projectconfig.approve(after, config_home)
    return f"{host}: added to {where} and approved"


def approvals(config_home: str) -> list[dict[str, Any]]:
    """`trust --list`: each approval's work directory, when, digest, what."""
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
        for r in projectconfig.approvals(config_home)
    ]
