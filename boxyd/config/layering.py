"""Which profile a run takes (build_spec's first step), and what `boxyctl trust` says
of a project before approving it: one layering for both.

The profile is the -p profile, else the one the project's .boxy.yaml names, else
DEFAULT_PROFILE. An approved .boxy.yaml is applied on top of it; an unapproved one
only in what is no wider than the run would be without it (widening.hold_back),
and what was held back is named in HELD. Reads the project's files, the approvals
and the profile files; changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from boxy import caches
from boxy.errors import ProfileError
from boxy.paths import config_home
from boxyd.config import profilemerge, profiles, projectconfig, projectregistries, widening
from boxyd.config.pathutil import absolute
from boxyd.config.profiles import Registry
from boxyd.config.profileschema import Profile
from boxyd.config.projectconfig import Project
from boxyd.config.runspec import DEFAULT_PROFILE


@dataclass
class Layers:
    """The profile a run uses, and what the later steps need of the project."""

    profile: Profile
    name: str  # RunSpec.profile: as asked for, or the base's when an unapproved file's failed
    project: Project
    trusted: bool  # the project's configuration is approved as it is now
    registry: Registry | None  # the template resolver, an approved project's registries first
    # an unapproved .boxy.yaml that is not valid or does not load, ignored: one line
    # each, naming the file and key (approving would not help: trust refuses it)
    invalid: list[str] = field(default_factory=list)


def profile_ref(name: str, home: str, cwd: str) -> str:
    """How a profile NAME is loaded: a path (a leading ~ is HOME) against CWD; a bare
    name as it is (a user profile or a preset)."""
    if not profiles.is_path(name):
        return name
    if name == "~" or name.startswith("~/"):
        name = home + name[1:]
    return absolute(name, cwd)


def profile_context(workdir: str, home: str, name: str) -> dict[str, str]:
    """The path templates of profile NAME's run in WORKDIR ({cache} is per profile)."""
    return {"workdir": workdir, "home": home, "cache": caches.project_dir(home, name, workdir)}


def layer(
    requested: str | None,
    *,
    cwd: str,
    workdir: str,
    home: str,
    user: str,
    client_env: Mapping[str, str],
    registry: Registry | None,
    notes: list[str],
    held: list[str],
) -> Layers:
    """The run's profile: REQUESTED (-p) or the project's or the default, with the
    project's .boxy.yaml layered on as its approval allows; REGISTRY widened by an
    approved project's registry files."""
    # the payload can write the project's files, so they are read as data (projectconfig)
    project = projectconfig.read(
        workdir, projectconfig.run_env(home, user, client_env), strict=False
    )
    trusted = not project.empty and projectconfig.is_trusted(project, config_home(home))
    invalid: list[str] = []
    doc = _project_doc(project, trusted, invalid)
    named = doc.get("profile") if doc is not None else None
    name = requested or named or DEFAULT_PROFILE
    ref = profile_ref(name, home, cwd)
    context = profile_context(workdir, home, name)
    if doc is None:
        prof = profiles.load_profile(ref, context=context)
    elif trusted:
        prof = _project_profile(ref, doc, project.path, context)
        notes.append(f"{project.path}: approved; applied on top of profile {name}")
    else:
        prof = _unapproved(
            requested or DEFAULT_PROFILE, ref, doc, project.path, context, held, invalid
        )
        name = prof.name
    if trusted and project.registries:
        registry = projectregistries.resolver(registry, project.registries, client_env)
        notes.append(
            f"{workdir}: approved registries: "
            f"{', '.join(r.host or r.shown for r in project.registries)}"
        )
    return Layers(prof, name, project, trusted, registry, invalid)


def project_widening(project: Project, home: str) -> list[widening.Held]:
    """What of PROJECT's .boxy.yaml is wider than the default profile, as a run without
    -p would take it: what `boxyctl trust` says before approving. What is approved must
    load: a file that does not is a ProfileError here (a run would hold it back)."""
    if project.config is None:
        return []
    try:
        if project.doc is None:  # parsed once, apart (projectconfig.project_doc): never here
            raise ProfileError(project.doc_error or f"profile {project.path}: not valid")
        doc = project.doc
        name = doc.get("profile") or DEFAULT_PROFILE
        context = profile_context(project.workdir, home, name)
        wanted = _project_profile(name, doc, project.path, context)
    except ProfileError as e:
        why = str(e).removeprefix(f"profile {project.path}: ")
        raise ProfileError(
            f"{project.path}: not valid, so not approved: {why}; fix it and run "
            "`boxyctl trust` again"
        ) from None
    base = _base_profile(DEFAULT_PROFILE, context)
    return widening.hold_back(base, wanted, own_cache=context["cache"])[1]


def _project_doc(project: Project, trusted: bool, invalid: list[str]) -> dict[str, Any] | None:
    """The parsed .boxy.yaml, or None when there is none or it is neither approved
    nor valid (then ignored whole, and said: the payload could have written it)."""
    if project.config is None:
        return None
    if project.doc is not None:  # parsed once, apart (projectconfig.project_doc)
        return project.doc
    e = ProfileError(project.doc_error or f"profile {project.path}: not valid")
    if trusted:
        raise e
    invalid.append(_invalid(project.path, e))
    return None


def _project_profile(
    ref: str, doc: Mapping[str, Any], label: str, context: Mapping[str, str]
) -> Profile:
    """Profile REF with the project's keys (DOC, from LABEL) on top."""
    return profilemerge.project_layer(
        profiles.load_profile(ref, context=context), doc, label, context
    )


def _base_profile(ref: str, context: Mapping[str, str]) -> Profile:
    """The profile an unapproved project is held to: its {cache} is its own (the
    profile's name is in it), not the one in use."""
    return profiles.load_profile(ref, context={k: v for k, v in context.items() if k != "cache"})


def _unapproved(
    base_ref: str,
    profile_ref: str,
    doc: dict[str, Any],
    label: str,
    context: dict[str, str],
    held: list[str],
    invalid: list[str],
) -> Profile:
    """The profile an unapproved .boxy.yaml asks for, less everything in which it is
    wider than BASE_REF's (widening.hold_back); BASE_REF's profile when it does not
    load (said: nothing of an unapproved file may stop the run)."""
    base = _base_profile(base_ref, context)
    try:
        candidate = _project_profile(profile_ref, doc, label, context)
    except ProfileError as e:
        invalid.append(_invalid(label, e))
        base.name = base_ref
        return base
    prof, keys = widening.hold_back(base, candidate, own_cache=context["cache"])
    if keys:
        held.append(f"{', '.join(map(str, keys))} of {label}")
    return prof


def _invalid(path: str, e: ProfileError) -> str:
    """The line for an unapproved .boxy.yaml at PATH that E refuses. E names the file
    and the key (profile PATH: key K: …): said once, without the file twice."""
    why = str(e).removeprefix(f"profile {path}: ")
    return f"{path}: not valid, so ignored (none of it applies): {why}; fix it and run again"
