"""build_spec's network step: the mode, the hosts, ports and address ranges allowed,
tailscale. Flags add to the profile's lists and override its mode; --allow-host
without --net means allowlist.

Pure but for REGISTRY, the resolver of the profile's host templates (it asks the
tools' configuration, in a tool sandbox).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from boxy import options, values
from boxy.errors import UsageError
from boxy.request import RunOptions
from boxy.values import PortMapping
from boxyd.config import profiles, profileschema, projectregistries
from boxyd.config.pathutil import dedupe
from boxyd.config.profiles import Registry
from boxyd.config.profileschema import Profile
from boxyd.config.projectregistries import ProjectRegistry
from boxyd.config.runspec import DEFAULT_NET

# the templates through which a profile reaches each tool's registry
_FAMILIES = (("npm", "{npm_registry}"), ("pip", "{pip_index}"))


ASK_TIMEOUT = 60.0  # seconds a question (--ask) waits for its answer, unless told


@dataclass
class Network:
    """RunSpec's network fields (same names)."""

    net: str
    allow_hosts: list[str]
    allow_ports: list[int]
    allow_cidrs: list[str]
    tailscale: bool
    ask: bool
    ask_timeout: float
    ask_notify: bool
    publish: list[PortMapping]


@dataclass(frozen=True)
class ProjectHosts:
    """What the project's .npmrc and pip.conf name, and whether they are approved."""

    registries: Sequence[ProjectRegistry] = ()
    trusted: bool = False


def decide(
    o: RunOptions,
    prof: Profile,
    registry: Registry | None,
    project: ProjectHosts,
    *,
    notes: list[str],
    held: list[str],
) -> Network:
    """The network of a run with flags O and profile PROF. A project's registry host
    the profile reaches is added when approved, else named in HELD."""
    if o.net is not None and o.net not in profileschema.NETS:
        raise UsageError("Run: options.net: expected public, allowlist or none")
    flag_hosts = [str(h) for h in o.allow_host]  # parsed once, as RunOptions came off the wire
    net = mode(o.net, flag_hosts, prof)
    hosts = profile_hosts(net, prof, registry, flag_hosts, notes)
    if net == "allowlist":
        hosts += project_hosts(project, prof.allow_hosts, hosts, held)
    for port in o.allow_port:
        if not 1 <= port <= 65535:
            raise UsageError(f"--allow-port: {port!r} is not a port number (1–65535)")
    flag_cidrs = [n for c in o.allow_cidr for n in values.parse_cidrs(c)]
    cidrs, tailscale = ranges(net, prof, flag_cidrs, o.tailscale, notes)
    options.check_combinations(o, net=net)  # the client's checks, with the profile's net
    notify = o.ask_notify or bool(prof.ask_notify)  # it asks too
    return Network(
        net=net,
        allow_hosts=dedupe(hosts + flag_hosts),
        allow_ports=dedupe(prof.allow_ports + list(o.allow_port)),
        allow_cidrs=cidrs,
        tailscale=tailscale,
        ask=net == "allowlist" and (o.ask or bool(prof.ask) or notify),
        ask_timeout=o.ask_timeout or prof.ask_timeout or ASK_TIMEOUT,
        ask_notify=net == "allowlist" and notify,
        publish=published(prof.ports, o.publish),
    )


def published(profile: list[PortMapping], flags: list[PortMapping]) -> list[PortMapping]:
    """The profile's ports, then --publish's, without repeats; one host address and
    port relayed to two of the sandbox's ports is refused (the flags name it). Every
    mode: --net none too (inbound only: boxyd dials the sandbox's loopback)."""
    out: list[PortMapping] = []
    for m in [*profile, *flags]:
        if m in out:
            continue
        clash = next((x for x in out if (x.addr, x.host_port) == (m.addr, m.host_port)), None)
        if clash is not None:
            raise UsageError(f"--publish: {m.host} is published twice (as {clash} and as {m})")
        out.append(m)
    return out


def mode(net_flag: str | None, flag_hosts: list[str], prof: Profile) -> str:
    """--net, else allowlist when hosts are named, else the profile's, else the default.
    (--allow-host with --net public or none: options.check_combinations refuses it.)"""
    if flag_hosts and not net_flag and prof.net == "none":
        raise UsageError(
            f"--allow-host: the profile {prof.name} has no network (net: none); "
            "give --net allowlist as well to open one"
        )
    return net_flag or ("allowlist" if flag_hosts else None) or prof.net or DEFAULT_NET


def profile_hosts(
    net: str,
    prof: Profile,
    registry: Registry | None,
    flag_hosts: list[str],
    notes: list[str],
) -> list[str]:
    """The profile's allow_hosts, templates filled by REGISTRY; none unless allowlist.
    An allowlist the profile meant to fill but could not is refused, never empty."""
    if net != "allowlist":
        if prof.allow_hosts:
            notes.append(f"profile {prof.source}: allow_hosts not used with --net {net}")
        return []
    hosts = profiles.resolve_hosts(prof.allow_hosts, registry, source=prof.source, notes=notes)
    if prof.allow_hosts and not hosts and not flag_hosts:  # never a silent empty allowlist
        raise UsageError(
            f"profile {prof.name}: no host to allow: {', '.join(prof.allow_hosts)} "
            "could not be read from the tool's configuration (is the tool "
            "installed, and on your PATH?); name the host with --allow-host HOST"
        )
    return hosts


def project_hosts(
    project: ProjectHosts, allow_hosts: list[str], hosts: list[str], held: list[str]
) -> list[str]:
    """Hosts the project's .npmrc or pip.conf names, for a profile that reaches that
    tool's registry (ALLOW_HOSTS as written): added when approved, else those not
    already in HOSTS named in HELD."""
    families = {f for f, t in _FAMILIES if t in allow_hosts}
    named = [r for r in project.registries if r.family in families and r.host]
    if project.trusted:
        return projectregistries.extra_hosts(named, families)
    for r in named:
        if r.host not in hosts:
            held.append(f"{r.key} {r.host} of {r.source}")
    return []


def ranges(
    net: str, prof: Profile, flag_cidrs: list[str], flag_tailscale: bool, notes: list[str]
) -> tuple[list[str], bool]:
    """(allow_cidrs, tailscale): the flags' and the profile's, but for --net none,
    where the profile's have nothing to apply to (said)."""
    if net == "none":
        for key, given in (("allow_cidr", prof.allow_cidrs), ("tailscale", prof.tailscale)):
            if given:
                notes.append(f"profile {prof.source}: {key} not used with --net none")
        return flag_cidrs, flag_tailscale
    return dedupe(prof.allow_cidrs + flag_cidrs), flag_tailscale or bool(prof.tailscale)
