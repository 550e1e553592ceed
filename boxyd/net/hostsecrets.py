"""A session's secrets bound to hosts (`--secret NAME@HOST`): for each, the value (in
boxyd only), the placeholder the payload holds instead, and the hosts the value may
be sent to. What the gateway and the DNS proxy ask of them. Pure."""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from boxyd.net import placeholder

# what a value put in a header may hold: a token's characters, never a line break
_HEADER_SAFE = frozenset(string.printable) - frozenset("\r\n\x0b\x0c")


@dataclass(frozen=True)
class HostSecret:
    name: str
    value: str = field(repr=False)
    placeholder: str
    hosts: frozenset[str]


def make(name: str, value: str, hosts: Iterable[str], taken: frozenset[str]) -> HostSecret:
    """NAME's placeholder, fresh. Raises ValueError (placeholder.TooShort) with a
    message that holds no value."""
    if not set(value) <= _HEADER_SAFE:
        raise ValueError("the value holds a character a request header cannot carry")
    ph = placeholder.make(value, taken=taken)
    return HostSecret(name, value, ph, frozenset(h.lower().rstrip(".") for h in hosts))


class HostSecrets:
    """The session's secrets bound to hosts (none: no instance at all)."""

    def __init__(self, items: Sequence[HostSecret]) -> None:
        self.items = tuple(items)
        self.hosts = frozenset(h for s in items for h in s.hosts)
        self._bytes = [(s.placeholder.encode(), s.name) for s in items]
        self._lower = [(s.placeholder.lower().encode(), s.name) for s in items]

    def __repr__(self) -> str:
        return f"HostSecrets({[s.name for s in self.items]!r})"

    def for_host(self, host: str) -> dict[str, str]:
        """placeholder → value of the secrets HOST may be sent."""
        host = host.lower().rstrip(".")
        return {s.placeholder: s.value for s in self.items if host in s.hosts}

    def foreign(self, host: str) -> frozenset[str]:
        """The placeholders of the secrets HOST may not be sent."""
        host = host.lower().rstrip(".")
        return frozenset(s.placeholder for s in self.items if host not in s.hosts)

    @property
    def longest(self) -> int:
        """The longest placeholder's length in bytes (what a scan keeps between reads)."""
        return max((len(ph) for ph, _ in self._bytes), default=1)

    def found(self, data: bytes) -> str | None:
        """The name of a secret whose placeholder DATA holds, as sent (a first record,
        an SNI), or None."""
        for ph, name in self._bytes:
            if ph in data:
                return name
        return None

    def found_folded(self, text: bytes) -> str | None:
        """The same in a name compared without case (a DNS query's name)."""
        low = text.lower()
        for ph, name in self._lower:
            if ph in low:
                return name
        return None
