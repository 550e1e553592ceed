"""What of a project's profile would widen the sandbox, and holding exactly that back.

A `.boxy.yaml` sits in the work directory, which the payload can write. Until a
person approves it (`boxyctl trust`), the run takes from it only what is no wider
than the run would be without it: BASE is that run's profile (the -p profile, or the
default), CANDIDATE is the profile the file asks for with its keys layered on top.
Every key in which CANDIDATE is wider takes BASE's value instead (for lists: the
entries BASE lacks are dropped), and each is named in the one line the run says.

Wider means: a wider network mode (none < allowlist < public); a host, port or
range allowed that BASE does not allow; tailscale; a port published that BASE does
not publish; a host path exposed or copied
in, or a credential revealed, that BASE does not expose; a BASE protect entry
gone; an environment variable passed from the host (env_pass, env_secrets);
seccomp compat; a limit raised (or lifted); a terminal; an unfiltered terminal
(tty_raw); a BASE filesystem.secrets pattern gone. Never wider: description,
env (values set inside the sandbox only), filesystem.tmpfs (empty directories on the
sandbox's own tmpfs), more protect entries, more filesystem.secrets patterns (more
covered), a lower limit, this project's own
package cache (boxy's directory for this work directory, not the host's).

Pure: no I/O. Profiles here are as loaded (host templates still unresolved: a
template is compared as written, which is what it will resolve to in both).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from boxyd.config.profileschema import Profile

# unset in a profile means boxy's defaults (the option table's)
from boxyd.config.runspec import DEFAULT_MEMORY, DEFAULT_NET, DEFAULT_PIDS, CopyEntry, PathEntry

NET_RANK = {"none": 0, "allowlist": 1, "public": 2}

# Top-level keys (and filesystem.* keys) of a .boxy.yaml that cannot widen anything:
# an approval does not commit to them, so editing them needs no new approval.
NEVER_WIDENS = ("description", "env")
NEVER_WIDENS_FS = ("tmpfs", "protect", "secrets")  # secrets: more is covered, never less


@dataclass(frozen=True)
class Held:
    """One key held back, with the entries of it that were (for a list)."""

    key: str
    entries: tuple[str, ...] = ()

    def __str__(self) -> str:
        if not self.entries:
            return self.key
        shown = ", ".join(self.entries[:3]) + (", …" if len(self.entries) > 3 else "")
        return f"{self.key} ({shown})"


def approval_view(doc: dict[str, Any]) -> dict[str, Any]:
    """The part of a parsed .boxy.yaml an approval commits to: every key that could
    widen the sandbox, as written."""
    view = {k: v for k, v in doc.items() if k not in NEVER_WIDENS}
    fs = view.get("filesystem")
    if isinstance(fs, dict):
        view["filesystem"] = {k: v for k, v in fs.items() if k not in NEVER_WIDENS_FS}
    return view


def hold_back(base: Profile, candidate: Profile, *, own_cache: str) -> tuple[Profile, list[Held]]:
    """CANDIDATE with everything wider than BASE replaced by BASE's setting; the keys
    that were held back, in a stable order."""
    out = dataclasses.replace(candidate)
    held: list[Held] = []
    _network(base, out, held)
    _filesystem(base, out, held, own_cache)
    for key in ("env_pass", "env_secrets"):
        _entries(out, key, getattr(base, key), held)
    if out.seccomp == "compat" and base.seccomp != "compat":
        out.seccomp = base.seccomp
        held.append(Held("seccomp"))
    _limits(base, out, held)
    if out.tty and not base.tty:
        out.tty = base.tty
        held.append(Held("tty"))
    if out.tty_raw and not base.tty_raw:  # the payload's output could act on the terminal
        out.tty_raw = base.tty_raw
        held.append(Held("tty_raw"))
    return out, held


def _entries(
    out: Profile,
    key: str,
    allowed: Iterable[Any],
    held: list[Held],
    *,
    label: str | None = None,
    covered: Callable[[Any], bool] | None = None,
    show: Callable[[Any], str] = str,
) -> None:
    """Drop from OUT.KEY what ALLOWED (or COVERED) does not already grant."""
    allowed = list(allowed)
    keep: list[Any] = []
    dropped: list[Any] = []
    for entry in getattr(out, key):
        ok = entry in allowed or (covered is not None and covered(entry))
        (keep if ok else dropped).append(entry)
    if dropped:
        setattr(out, key, keep)
        held.append(Held(label or key, tuple(show(e) for e in dropped)))


def _network(base: Profile, out: Profile, held: list[Held]) -> None:
    base_net, net = base.net or DEFAULT_NET, out.net or DEFAULT_NET
    if NET_RANK[net] > NET_RANK[base_net]:
        out.net = base.net
        held.append(Held("net", (net,)))
        net = base_net
    if net == "allowlist" and base_net == "allowlist":  # both lists bound the egress
        _entries(out, "allow_hosts", base.allow_hosts, held)
        _entries(out, "allow_ports", base.allow_ports, held)
    if net != "none":
        nets = [ipaddress.ip_network(c) for c in base.allow_cidrs]
        _entries(
            out,
            "allow_cidrs",
            base.allow_cidrs,
            held,
            label="allow_cidr",
            covered=lambda c: any(_within(c, n) for n in nets),
        )
        if out.tailscale and not base.tailscale:
            out.tailscale = base.tailscale
            held.append(Held("tailscale"))
    # a published port is reachable by every process of this machine (at least)
    _entries(out, "ports", base.ports, held)


def _within(cidr: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    inner = ipaddress.ip_network(cidr)
    return inner.version == net.version and inner.subnet_of(net)  # type: ignore[arg-type]


def _filesystem(base: Profile, out: Profile, held: list[Held], own_cache: str) -> None:
    def paths(*kinds: str) -> set[str]:
        return {e.path for k in kinds for e in getattr(base, k)}

    def mine(path: str) -> bool:
        return path == own_cache or path.startswith(own_cache.rstrip("/") + "/")

    def within(granted: set[str]) -> Callable[[PathEntry], bool]:
        # this project's own package cache is never wider
        return lambda e: e.path in granted or mine(e.path)

    def copied(allowed: set[tuple[str, str]]) -> Callable[[CopyEntry], bool]:
        return lambda e: (e.src, e.dst) in allowed

    readable, writable, revealed = paths("ro", "rw", "mkdir"), paths("rw", "mkdir"), paths("reveal")
    for key, granted in (("ro", readable), ("rw", writable), ("mkdir", writable)):
        _entries(
            out, key, (), held, label="filesystem." + key, show=lambda e: e.path,
            covered=within(granted),
        )  # fmt: skip
    _entries(
        out,
        "reveal",
        (),
        held,
        label="filesystem.reveal",
        show=lambda e: e.path,
        covered=lambda e: e.path in revealed,
    )
    copies = {(c.src, c.dst) for c in base.copy}
    copies_ro = copies | {(c.src, c.dst) for c in base.copy_ro}  # a writable copy covers one
    for key, allowed in (("copy", copies), ("copy_ro", copies_ro)):
        _entries(
            out, key, (), held, label="filesystem." + key, show=lambda e: e.src,
            covered=copied(allowed),
        )  # fmt: skip
    _kept(base, out, held)


def _kept(base: Profile, out: Profile, held: list[Held]) -> None:
    """BASE's protect entries and secrets patterns stay: dropping one uncovers files."""
    kept = {e.path for e in out.protect}
    gone = [e for e in base.protect if e.path not in kept]
    if gone:
        out.protect = out.protect + gone
        held.append(Held("filesystem.protect", tuple(e.path for e in gone)))
    lost = [g for g in base.secrets if g not in out.secrets]  # a pattern dropped uncovers files
    if lost:
        out.secrets = out.secrets + lost
        held.append(Held("filesystem.secrets", tuple(lost)))


def _limits(base: Profile, out: Profile, held: list[Held]) -> None:
    # memory and pids unset mean boxy's defaults; cpus and timeout unset mean none
    for key, unset in (
        ("memory", DEFAULT_MEMORY),
        ("pids", DEFAULT_PIDS),
        ("cpus", float("inf")),
        ("timeout", float("inf")),
    ):
        mine, theirs = getattr(out, key), getattr(base, key)
        if (unset if mine is None else mine) > (unset if theirs is None else theirs):
            setattr(out, key, theirs)
            held.append(Held(f"limits.{key}"))
