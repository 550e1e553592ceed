"""`boxyctl profile list` and `profile show NAME`: what a profile does, resolved — its
templates expanded, the registry hosts derived from the tools' configuration (and
where each came from), `extends` merged — in plain lines. Only profiles are shown: a
path that is not a valid profile is refused like any other invalid profile."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import NamedTuple

from boxy import options, values
from boxy.errors import ProfileError
from boxy.options import Key
from boxy.values import PortMapping
from boxyd.config import profiles
from boxyd.config.profiles import Registry
from boxyd.config.profileschema import Profile
from boxyd.config.runspec import CopyEntry, PathEntry

# where each template's value comes from, said next to what it became
ORIGIN = {
    "npm_registry": "npm's configured registry (NPM_CONFIG_REGISTRY, or `npm config get registry`)",
    "pip_index": "pip's configured index (PIP_INDEX_URL, pip.conf, or pip's own default)",
    "pip_files": "the host pip's index serves files from",
    "go_proxy": "the Go module proxy (GOPROXY)",
    "go_sumdb": "the Go checksum database (GOSUMDB)",
}


class ProfileView(NamedTuple):
    """What `profile list` and `profile show` print: the document (--json) and lines."""

    doc: dict[str, object]
    lines: list[str]


def listing(home: str | None = None) -> ProfileView:
    """`profile list`: every profile, by name."""
    return ProfileView({"profiles": list_rows(home)}, list_lines(home))


def view(name: str, workdir: str, home: str, registry: Registry | None) -> ProfileView:
    """`profile show NAME` (a preset's or the user's profile's name, or an absolute
    path) as a run in WORKDIR would load it: its templates filled as that run fills
    them ({cache} is per profile), the registries REGISTRY says. A file that is no
    profile is refused (ProfileError)."""
    from boxyd.config import layering

    kind, location = profiles.where(name, home)
    context = layering.profile_context(workdir, home, name)
    prof = profiles.load_profile(name, context=context)
    view = ProfileView(
        show_doc(prof, registry, kind, location), show_lines(prof, registry, kind, location)
    )
    size = len(json.dumps(view.doc)) + sum(len(line) for line in view.lines)
    if size > MAX_VIEW:  # measured here, in the worker: never encoded on the event loop
        raise ProfileError(
            f"profile {prof.source}: its view is {size} bytes (at most {MAX_VIEW}); "
            "a profile that large is no profile"
        )
    return view


# What `profile show` sends at most (a reply's bound is 16 MiB: aliases made one
# 600 KB profile a 121 MB reply, an internal error)
MAX_VIEW = 1 << 20


def list_rows(home: str | None = None) -> list[dict[str, object]]:
    """`profile list --json`: each profile's name, kind (user, preset), path (a user
    one's), whether it takes a preset's place, and description. By name."""
    out: list[dict[str, object]] = []
    users = profiles.user_profiles(home)
    presets = profiles.list_profiles()
    for name, path in users.items():
        out.append(
            {"name": name, "kind": "user", "path": str(path), "shadows_preset": name in presets}
        )
    out += [
        {"name": n, "kind": "preset", "path": None, "shadows_preset": False}
        for n in presets
        if n not in users
    ]
    for row in out:
        row["description"] = _description(str(row["name"]), home)
    return sorted(out, key=lambda r: str(r["name"]))


def list_lines(home: str | None = None) -> list[str]:
    """One line per profile: name, where it comes from, description. A user profile
    of a preset's name is the one used, and says so."""
    rows = []
    for r in list_rows(home):
        shadow = " (instead of the preset)" if r["shadows_preset"] else ""
        kind = f"user {r['path']}{shadow}" if r["kind"] == "user" else "preset"
        rows.append((str(r["name"]), kind, str(r["description"])))
    width = max((len(r[0]) for r in rows), default=0)
    kind_w = max((len(r[1]) for r in rows), default=0)
    return [f"{n:<{width}}  {k:<{kind_w}}  {d}".rstrip() for n, k, d in sorted(rows)]


def _description(name: str, home: str | None) -> str:
    try:
        context = {"workdir": "/nonexistent/workdir", "home": home or os.path.expanduser("~")}
        return profiles.load_profile(name, context=context).description
    except ProfileError as e:
        return f"(invalid: {e})"


def show_lines(profile: Profile, registry: Registry | None, kind: str, location: str) -> list[str]:
    """The resolved profile, one setting per line, every key of the table of profile
    keys (boxy/options.py) that is set, in its order."""
    out = [f"profile {profile.name}: {kind} {location}"]
    resolved = _Resolved(profile, registry)
    for key in options.PROFILE_KEYS:
        out += _LINES.get(key.path, _generic_lines)(key, profile, resolved)
    return out


class _Resolved:
    """The profile's registry templates filled, as the run fills them (hosts, env)."""

    def __init__(self, profile: Profile, registry: Registry | None) -> None:
        notes: list[str] = []
        self.registry = registry
        self.env = profiles.resolve_env(profile.env, registry, source=profile.source, notes=notes)
        self.hosts = profiles.resolve_hosts(
            list(profile.allow_hosts), registry, source=profile.source, notes=notes
        )


Lines = Callable[[Key, Profile, _Resolved], list[str]]


def _generic_lines(key: Key, profile: Profile, _: _Resolved) -> list[str]:
    value = getattr(profile, key.attr)
    name = key.path.rpartition(".")[2] if key.top in ("filesystem", "limits") else key.path
    if key.shape == "list":
        return [f"  {name}: {_shown(e)}" for e in value]
    if value is None or value == "" or value is False:
        return []
    return [f"  {name}: {_shown(value)}"]


def _shown(value: object) -> str:
    if isinstance(value, PathEntry):
        return value.path + ("  (optional)" if value.optional else "")
    if isinstance(value, CopyEntry):
        return f"{value.src} -> {value.dst}" + ("  (optional)" if value.optional else "")
    return str(value)


def _net_lines(key: Key, profile: Profile, _: _Resolved) -> list[str]:
    return [f"  net: {profile.net or 'public (the default)'}"]


def _host_lines(key: Key, profile: Profile, r: _Resolved) -> list[str]:
    out = []
    for entry in profile.allow_hosts:
        notes: list[str] = []
        hosts = profiles.resolve_hosts([entry], r.registry, source=profile.source, notes=notes)
        template = entry[1:-1] if entry.startswith("{") and entry.endswith("}") else None
        origin = f"  ({ORIGIN.get(template, template)})" if template else ""
        shown = hosts[0] if hosts else "none configured: dropped"
        out.append(f"  allow_host: {shown}{'  from ' + entry if template else ''}{origin}")
    return out


def _ports_lines(key: Key, profile: Profile, _: _Resolved) -> list[str]:
    return [
        f"  ports: {m}  ({m.host} on this machine leads to port {m.port} inside)"
        for m in profile.ports
    ]


def _env_lines(key: Key, profile: Profile, r: _Resolved) -> list[str]:
    return [
        f"  env {name}: {r.env[name]}"
        if name in r.env
        else f"  env {name}: not set (none configured)"
        for name in profile.env
    ]


def _passed_lines(key: Key, profile: Profile, _: _Resolved) -> list[str]:
    what = "passed from your environment" + (" as a secret" if key.path == "env_secrets" else "")
    out = []
    for entry in getattr(profile, key.attr):
        name, _at, hosts = entry.partition("@")  # env_secrets NAME@HOST: bound
        bound = f", a placeholder inside; its value sent to {hosts} alone" if hosts else ""
        out.append(f"  env {name}: {what}{bound}")
    return out


def _limit_lines(key: Key, profile: Profile, _: _Resolved) -> list[str]:
    value = getattr(profile, key.attr)
    if value is None:
        return []
    if key.attr in ("memory", "review_limit"):
        shown = values.format_size(value)
    else:
        shown = values.format_duration(value) if key.attr == "timeout" else str(value)
    return [f"  {key.path.removeprefix('limits.')}: {shown}"]


def _secrets_lines(key: Key, profile: Profile, _: _Resolved) -> list[str]:
    return [f"  secrets: {g}  (covered empty in every writable tree)" for g in profile.secrets]


# the keys whose lines say more than their value
_LINES: dict[str, Lines] = {
    "description": lambda k, p, r: [f"  description: {p.description}"] if p.description else [],
    "net": _net_lines,
    "allow_hosts": _host_lines,
    "allow_ports": lambda k, p, r: (
        [f"  allow_port: {', '.join(map(str, p.allow_ports))}"] if p.allow_ports else []
    ),
    "ports": _ports_lines,
    "env": _env_lines,
    "env_pass": _passed_lines,
    "env_secrets": _passed_lines,
    "filesystem.secrets": _secrets_lines,
    **{k.path: _limit_lines for k in options.PROFILE_KEYS if k.top == "limits"},
}


def show_doc(
    profile: Profile, registry: Registry | None, kind: str, location: str
) -> dict[str, object]:
    """`profile show --json`: what show_lines says, as one object: every key of the
    table by its attribute's name (templates resolved; a host template that names
    nothing is left out of allow_hosts)."""
    resolved = _Resolved(profile, registry)
    doc: dict[str, object] = {"name": profile.name, "kind": kind, "location": location}
    for key in options.PROFILE_KEYS:
        doc[key.attr] = _json(getattr(profile, key.attr))
    doc["description"] = profile.description or None
    doc["allow_hosts"] = resolved.hosts
    doc["env"] = {name: resolved.env.get(name) for name in profile.env}
    return doc


def _json(value: object) -> object:
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, PathEntry):
        return {"path": value.path, "optional": value.optional}
    if isinstance(value, CopyEntry):
        return {"src": value.src, "dst": value.dst, "optional": value.optional}
    if isinstance(value, PortMapping):
        return str(value)
    return value
