"""`boxyctl profile list` and `profile show NAME`: what a profile does, resolved — its
templates expanded, the registry hosts derived from the tools' configuration (and
where each came from), `extends` merged — in plain lines. Only profiles are shown: a
path that is not a valid profile is refused like any other invalid profile."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from boxy import values
from boxy.errors import ProfileError
from boxyd.config import profiles
from boxyd.config.profiles import Registry
from boxyd.config.profileschema import Profile

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
    return ProfileView(
        show_doc(prof, registry, kind, location), show_lines(prof, registry, kind, location)
    )


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
    """The resolved profile, one setting per line."""
    notes: list[str] = []
    out = [f"profile {profile.name}: {kind} {location}"]
    if profile.description:
        out.append(f"  description: {profile.description}")
    out.append(f"  net: {profile.net or 'public (the default)'}")
    for entry in profile.allow_hosts:
        hosts = profiles.resolve_hosts([entry], registry, source=profile.source, notes=notes)
        template = entry[1:-1] if entry.startswith("{") and entry.endswith("}") else None
        origin = f"  ({ORIGIN.get(template, template)})" if template else ""
        shown = hosts[0] if hosts else "none configured: dropped"
        out.append(f"  allow_host: {shown}{'  from ' + entry if template else ''}{origin}")
    if profile.allow_ports:
        out.append(f"  allow_port: {', '.join(map(str, profile.allow_ports))}")
    for m in profile.ports:
        out.append(f"  ports: {m}  ({m.host} on this machine leads to port {m.port} inside)")
    for kind_name in ("ro", "rw", "mkdir", "protect", "reveal"):
        for e in getattr(profile, kind_name):
            out.append(f"  {kind_name}: {e.path}{'  (optional)' if e.optional else ''}")
    for glob in profile.secrets:
        out.append(f"  secrets: {glob}  (covered empty in every writable tree)")
    for kind_name in ("copy", "copy_ro"):
        for c in getattr(profile, kind_name):
            out.append(f"  {kind_name}: {c.src} -> {c.dst}{'  (optional)' if c.optional else ''}")
    env = profiles.resolve_env(profile.env, registry, source=profile.source, notes=notes)
    for name in profile.env:
        out.append(
            f"  env {name}: {env[name]}"
            if name in env
            else f"  env {name}: not set (none configured)"
        )
    for name in profile.env_pass:
        out.append(f"  env {name}: passed from your environment")
    limits: Mapping[str, object] = {
        "memory": values.format_size(profile.memory) if profile.memory else None,
        "pids": profile.pids,
        "cpus": profile.cpus,
        "timeout": values.format_duration(profile.timeout) if profile.timeout else None,
        "seccomp": profile.seccomp,
    }
    out += [f"  {k}: {v}" for k, v in limits.items() if v is not None]
    return out


def show_doc(
    profile: Profile, registry: Registry | None, kind: str, location: str
) -> dict[str, object]:
    """`profile show --json`: what show_lines says, as one object (templates resolved;
    a host template that names nothing is left out of allow_hosts)."""
    notes: list[str] = []
    env = profiles.resolve_env(profile.env, registry, source=profile.source, notes=notes)
    doc: dict[str, object] = {
        "name": profile.name,
        "kind": kind,
        "location": location,
        "description": profile.description or None,
        "net": profile.net or None,
        "allow_hosts": profiles.resolve_hosts(
            list(profile.allow_hosts), registry, source=profile.source, notes=notes
        ),
        "allow_ports": list(profile.allow_ports),
        "ports": [str(m) for m in profile.ports],
        "secrets": list(profile.secrets),
        "env": {name: env.get(name) for name in profile.env},
        "env_pass": list(profile.env_pass),
        "memory": profile.memory,
        "pids": profile.pids,
        "cpus": profile.cpus,
        "timeout": profile.timeout,
        "seccomp": profile.seccomp,
    }
    for k in ("ro", "rw", "mkdir", "protect", "reveal"):
        doc[k] = [{"path": e.path, "optional": e.optional} for e in getattr(profile, k)]
    for k in ("copy", "copy_ro"):
        doc[k] = [{"src": c.src, "dst": c.dst, "optional": c.optional} for c in getattr(profile, k)]
    return doc
