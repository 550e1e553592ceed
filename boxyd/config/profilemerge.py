"""One profile on another: what `extends` does (the loader, profiles.py, finds the
base) and what a project's .boxy.yaml does to the profile it names or the run's. Lists
concatenate, the base's first; scalars and env keys override.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from boxyd.config.profileschema import Profile, build


def merge(base: Profile, child: Profile) -> Profile:
    """child extends base: lists concatenate (base first), scalars and env keys override."""
    out = Profile(name=child.name, source=child.source)
    out.description = child.description or base.description
    for attr in (
        "net",
        "memory",
        "pids",
        "cpus",
        "timeout",
        "seccomp",
        "tailscale",
        "tty",
        "tty_raw",
    ):
        child_value = getattr(child, attr)
        setattr(out, attr, child_value if child_value is not None else getattr(base, attr))
    for attr in (
        "allow_hosts",
        "allow_ports",
        "ro",
        "rw",
        "mkdir",
        "protect",
        "reveal",
        "copy",
        "copy_ro",
    ):
        setattr(out, attr, getattr(base, attr) + getattr(child, attr))
    out.env = {**base.env, **child.env}
    for attr in (
        "env_pass",
        "env_secrets",
        "allow_cidrs",
        "tmpfs",
        "secrets",
        "ports",
    ):  # no repeats
        got = getattr(base, attr)
        setattr(out, attr, got + [n for n in getattr(child, attr) if n not in got])
    return out


def project_layer(
    base: Profile, doc: Mapping[str, Any], label: str, context: Mapping[str, str]
) -> Profile:
    """A .boxy.yaml's keys (DOC, from project_doc) on top of BASE, the profile it names
    or the run's: merged as `extends` merges; messages name both."""
    merged = merge(
        base, build(label, label, {k: v for k, v in doc.items() if k != "profile"}, context)
    )
    merged.name, merged.source = base.name, f"{base.source} + {label}"
    return merged
