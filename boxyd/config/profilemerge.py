"""One profile on another: what `extends` does (the loader, profiles.py, finds the
base) and what a project's .boxy.yaml does to the profile it names or the run's. Lists
concatenate, the base's first; scalars and env keys override.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from boxy import options
from boxyd.config.profileschema import Profile, build


def merge(base: Profile, child: Profile) -> Profile:
    """CHILD on BASE (`extends`, a .boxy.yaml), key by key as each key's MERGE says
    (boxy/options.py's PROFILE_KEYS)."""
    out = Profile(name=child.name, source=child.source)
    for key in options.PROFILE_KEYS:
        mine, theirs = getattr(base, key.attr), getattr(child, key.attr)
        setattr(out, key.attr, MERGES[key.merge](mine, theirs))
    return out


def _union(base: list[Any], child: list[Any]) -> list[Any]:
    """BASE, then what of CHILD is not in it yet (entries compared by their text)."""
    seen = {str(e) for e in base}
    out = list(base)
    for e in child:
        if str(e) not in seen:
            seen.add(str(e))
            out.append(e)
    return out


# how a key of CHILD goes on BASE's (the table's MERGE column)
MERGES: dict[str, Callable[[Any, Any], Any]] = {
    "replace": lambda base, child: child if child is not None else base,
    "first": lambda base, child: child or base,
    "append": lambda base, child: base + child,
    "union": _union,
    "map": lambda base, child: {**base, **child},
}


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
