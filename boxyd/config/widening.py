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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from boxy import options
from boxyd.config.profileschema import Profile

# unset in a profile means boxy's defaults (the option table's)
from boxyd.config.runspec import DEFAULT_NET, PathEntry

# What an approval commits to: every key whose rule could widen the sandbox (a "never"
# key cannot; a "kept" key only adds covers, and the base's are put back).
_UNCOMMITTED = {k.path for k in options.PROFILE_KEYS if k.widen in ("never", "kept")}


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
    view = {k: v for k, v in doc.items() if k not in _UNCOMMITTED}
    for top in ("filesystem", "limits"):
        section = view.get(top)
        if isinstance(section, dict):
            view[top] = {k: v for k, v in section.items() if f"{top}.{k}" not in _UNCOMMITTED}
    return view


def hold_back(base: Profile, candidate: Profile, *, own_cache: str) -> tuple[Profile, list[Held]]:
    """CANDIDATE with everything wider than BASE replaced by BASE's setting, key by key
    in the table's order as each key's WIDEN rule says; the keys held back."""
    out = dataclasses.replace(candidate)
    held: list[Held] = []
    for key in options.PROFILE_KEYS:
        RULES[key.widen](_Judged(key, base, out, held, own_cache))
    return out, held


@dataclass(frozen=True)
class _Judged:
    """One key being judged: OUT (the candidate, changed in place) against BASE."""

    key: options.Key
    base: Profile
    out: Profile
    held: list[Held]
    own_cache: str

    @property
    def mine(self) -> Any:
        return getattr(self.out, self.key.attr)

    @property
    def theirs(self) -> Any:
        return getattr(self.base, self.key.attr)

    def restore(self, *entries: str) -> None:
        setattr(self.out, self.key.attr, self.theirs)
        self.held.append(Held(self.key.path, entries))

    def entries(self, covered: Callable[[Any], bool], show: Callable[[Any], str] = str) -> None:
        """Drop from OUT's list what BASE does not already grant (COVERED says)."""
        keep: list[Any] = []
        dropped: list[Any] = []
        for entry in self.mine:
            (keep if covered(entry) else dropped).append(entry)
        if dropped:
            setattr(self.out, self.key.attr, keep)
            self.held.append(Held(self.key.path, tuple(show(e) for e in dropped)))

    def net(self, profile: Profile) -> str:
        return profile.net or DEFAULT_NET


# how much each choice lets out, for the keys whose rule is "rank" (unset: the default)
RANKS = {
    "net": {"none": 0, "allowlist": 1, "public": 2},
    "seccomp": {"strict": 0, "compat": 1},
}


def _rank(j: _Judged) -> None:
    ranks, unset = RANKS[j.key.path], options.default(str(j.key.field))
    mine = j.mine if j.mine is not None else unset
    if ranks[mine] > ranks[j.theirs if j.theirs is not None else unset]:
        j.restore(mine)


def _switch(j: _Judged) -> None:
    if j.mine and not j.theirs:
        j.restore()


def _tailnet(j: _Judged) -> None:
    """tailscale: wider only where the run has a network to reach the tailnet with."""
    if j.net(j.out) != "none":
        _switch(j)


def _at_most(j: _Judged) -> None:
    # unset means the option's default: boxy's (memory, pids), or none at all (cpus, timeout)
    unset = options.default(str(j.key.field))
    unset = float("inf") if unset is None else unset
    if (unset if j.mine is None else j.mine) > (unset if j.theirs is None else j.theirs):
        j.restore()


def _granted(j: _Judged) -> None:
    allowed = {str(e) for e in j.theirs}
    j.entries(lambda e: str(e) in allowed)


def _allowlisted(j: _Judged) -> None:
    """Hosts and ports bound the egress only where both runs are in allowlist mode."""
    if j.net(j.out) == "allowlist" and j.net(j.base) == "allowlist":
        _granted(j)


def _ranges(j: _Judged) -> None:
    if j.net(j.out) != "none":
        nets = [ipaddress.ip_network(c) for c in j.theirs]
        j.entries(lambda c: c in j.theirs or any(_within(c, n) for n in nets))


def _paths(*kinds: str) -> Callable[[_Judged], None]:
    """Paths exposed: no wider than what BASE exposes as KINDS (ro, rw, mkdir, reveal),
    or this project's own package cache (boxy's directory, not the host's)."""

    def rule(j: _Judged) -> None:
        granted = {e.path for k in kinds for e in getattr(j.base, k)}
        cache = j.own_cache.rstrip("/") + "/"
        j.entries(
            lambda e: e.path in granted or (kinds != ("reveal",) and _mine(e.path, cache)),
            show=lambda e: e.path,
        )

    return rule


def _mine(path: str, cache_dir: str) -> bool:
    return path == cache_dir[:-1] or path.startswith(cache_dir)


def _copies(*kinds: str) -> Callable[[_Judged], None]:
    """Copies in: one BASE makes as one of KINDS (a writable copy covers a read-only one)."""

    def rule(j: _Judged) -> None:
        allowed = {(c.src, c.dst) for k in kinds for c in getattr(j.base, k)}
        j.entries(lambda e: (e.src, e.dst) in allowed, show=lambda e: e.src)

    return rule


def _kept(j: _Judged) -> None:
    """More protect entries or secrets patterns cover more; BASE's stay (dropping one
    would uncover files)."""

    def ident(e: Any) -> str:
        return e.path if isinstance(e, PathEntry) else str(e)

    kept = {ident(e) for e in j.mine}
    gone = [e for e in j.theirs if ident(e) not in kept]
    if gone:
        setattr(j.out, j.key.attr, j.mine + gone)
        j.held.append(Held(j.key.path, tuple(ident(e) for e in gone)))


# the table's WIDEN column: each key's rule
RULES: dict[str, Callable[[_Judged], None]] = {
    "never": lambda j: None,
    "rank": _rank,
    "switch": _switch,
    "tailnet": _tailnet,
    "at_most": _at_most,
    "granted": _granted,
    "allowlisted": _allowlisted,
    "ranges": _ranges,
    "readable": _paths("ro", "rw", "mkdir"),
    "writable": _paths("rw", "mkdir"),
    "revealed": _paths("reveal"),
    "copies": _copies("copy"),
    "copies_ro": _copies("copy", "copy_ro"),
    "kept": _kept,
}


def _within(cidr: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    inner = ipaddress.ip_network(cidr)
    return inner.version == net.version and inner.subnet_of(net)  # type: ignore[arg-type]
