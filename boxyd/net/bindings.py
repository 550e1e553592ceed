"""One session's DNS bindings: which names each address was handed out for.

The DNS proxy records ``ip -> name`` for every address it returns, before the
answer leaves; the gateway then lets a flow to an address only when the address
has a live binding (and the SNI / Host names one of its names). Pure: no I/O,
the clock is injected.

Lifetime. A binding lives for the answer's TTL, raised to ``TTL_FLOOR`` and capped
at ``TTL_CAP`` (the DNS filter rewrites the answer's TTL with the same
:func:`clamp_ttl`, so the client never holds an address longer than its binding),
plus ``EXPIRY_GRACE`` for the time the answer spends in flight. While a flow uses
an address (:meth:`Bindings.hold` ... :meth:`Bindings.release`, reference
counted) none of its names expire, however long the flow lasts.

Bound. A hostile payload can make the proxy bind as many addresses as its query
rate allows, so the table holds at most ``max_entries`` (address, name) pairs.
When it is full, expired pairs are evicted first; if none are, the new binding is
*refused* (``bind`` returns False and ``refused`` counts it) rather than evicting a
live one, which could cut a legitimate flow's binding. The caller then fails the
DNS answer, so no client is handed an address it could not connect to.

Published. In allowlist mode the gateway's ruleset resets a SYN to an address that
is not in its set of bound addresses, so every bind is also *published* there
(``publish(addr, seconds)``, the address's whole remaining lifetime) before it is
recorded; a bind whose publication fails is refused like one over the bound, so
the client is never handed an address the gateway would refuse.

Addresses are ``ipaddress`` objects; an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``)
is the IPv4 address it carries, since that is the host a socket would reach.
Names are lower-case without the trailing dot.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

TTL_FLOOR = 60
TTL_CAP = 86400
# The answer is bound before it is sent, so a client that uses it until the last
# second of its TTL would otherwise race the binding's expiry by the transit time.
EXPIRY_GRACE = 5.0
MAX_ENTRIES = 65536


def clamp_ttl(ttl: int, floor: int = TTL_FLOOR, cap: int = TTL_CAP) -> int:
    """The TTL boxy hands out and binds for: TTL raised to FLOOR, capped at CAP."""
    return max(floor, min(int(ttl), cap))


def canonical_ip(ip: str | Address) -> Address:
    """IP as an address object; an IPv4-mapped IPv6 address becomes its IPv4 address.

    Raises ValueError for anything that is not an IP address."""
    addr = (
        ip
        if isinstance(ip, ipaddress.IPv4Address | ipaddress.IPv6Address)
        else ipaddress.ip_address(ip)
    )
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr.scope_id is not None:
            # A zone index names an interface of the sender, not the host.
            return ipaddress.IPv6Address(addr.packed)
    return addr


def canonical_name(name: str) -> str:
    """NAME lower-cased, without the trailing dot ("" for the root)."""
    return name.rstrip(".").lower() if name != "." else ""


class Bindings:
    """``ip -> {name: expiry}`` for one session, bounded, with flow holds."""

    def __init__(
        self,
        now: Callable[[], float] = time.monotonic,
        *,
        ttl_floor: int = TTL_FLOOR,
        ttl_cap: int = TTL_CAP,
        grace: float = EXPIRY_GRACE,
        max_entries: int = MAX_ENTRIES,
        publish: Callable[[Address, float], bool] | None = None,
    ) -> None:
        if ttl_floor < 0 or ttl_cap < ttl_floor:
            raise ValueError(f"TTL floor {ttl_floor} / cap {ttl_cap}: need 0 <= floor <= cap")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.now = now
        self.ttl_floor = ttl_floor
        self.ttl_cap = ttl_cap
        self.grace = grace
        self.max_entries = max_entries
        self.publish = publish
        self.refused = 0  # bindings refused because the table was full of live entries
        self.unpublished = 0  # bindings refused because the gateway's set took no element
        self._table: dict[Address, dict[str, float]] = {}
        self._holds: dict[Address, int] = {}
        self._count = 0
        # No unheld pair expires before this instant, so a full table need not be
        # scanned again until then (a flood of binds stays O(1) each).
        self._earliest = float("inf")

    def __len__(self) -> int:
        """Number of (address, name) pairs stored, including expired ones not yet swept."""
        return self._count

    def clamp(self, ttl: int) -> int:
        return clamp_ttl(ttl, self.ttl_floor, self.ttl_cap)

    def bind(self, ip: str | Address, name: str, ttl: int) -> bool:
        """Record IP as an answer for NAME for clamp(TTL) seconds (never shortens one).

        Returns False, and counts it in ``refused``, when the table is full of live
        bindings."""
        addr = canonical_ip(ip)
        name = canonical_name(name)
        expiry = self.now() + self.clamp(ttl) + self.grace
        names = self._table.get(addr)
        if names is not None and name in names:
            if not self._published(addr, names, expiry):
                return False
            names[name] = max(names[name], expiry)
            return True
        if self._count >= self.max_entries:
            self.expire()
            if self._count >= self.max_entries:
                self.refused += 1
                return False
            names = self._table.get(addr)
        if not self._published(addr, names, expiry):
            return False
        if names is None:
            names = self._table[addr] = {}
        names[name] = expiry
        self._count += 1
        self._earliest = min(self._earliest, expiry)
        return True

    def _published(self, addr: Address, names: dict[str, float] | None, expiry: float) -> bool:
        """Publish ADDR for the longest of its lifetimes; False (counted) on failure."""
        if self.publish is None:
            return True
        lifetime = max([expiry, *(names.values() if names else ())]) - self.now()
        if self.publish(addr, lifetime):
            return True
        self.unpublished += 1
        return False

    def names(self, ip: str | Address) -> frozenset[str]:
        """The names IP is bound to now (all of them while a flow holds IP)."""
        addr = canonical_ip(ip)
        names = self._table.get(addr)
        if not names:
            return frozenset()
        if self._holds.get(addr):
            return frozenset(names)
        now = self.now()
        return frozenset(n for n, expiry in names.items() if expiry > now)

    def held_addresses(self) -> list[Address]:
        """The addresses flows use now (their published elements need refreshing)."""
        return [addr for addr, n in self._holds.items() if n > 0]

    def hold(self, ip: str | Address) -> frozenset[str]:
        """A flow starts using IP: keep its live names alive until :meth:`release`.

        Returns those names (empty when IP has no live binding — the caller decides
        whether that refuses the flow). Every hold, even one returning nothing, must
        be paired with a release."""
        addr = canonical_ip(ip)
        if not self._holds.get(addr):
            # An expired name must not come back to life; names another flow is
            # already keeping alive stay (that is what the hold is for).
            self._purge(addr, self.now())
        self._holds[addr] = self._holds.get(addr, 0) + 1
        names = self._table.get(addr)
        return frozenset(names) if names else frozenset()

    def release(self, ip: str | Address) -> None:
        """The flow that held IP ended."""
        addr = canonical_ip(ip)
        count = self._holds.get(addr, 0)
        if count <= 0:
            raise ValueError(f"release({addr}) without a matching hold()")
        if count > 1:
            self._holds[addr] = count - 1
            return
        del self._holds[addr]
        self._purge(addr, self.now())
        names = self._table.get(addr)
        if names:
            # Its pairs were ignored by the last sweep's bookkeeping while held.
            self._earliest = min(self._earliest, min(names.values()))

    @contextmanager
    def held(self, ip: str | Address) -> Iterator[frozenset[str]]:
        """``with bindings.held(ip) as names:`` — hold for the duration of a flow."""
        names = self.hold(ip)
        try:
            yield names
        finally:
            self.release(ip)

    def expire(self) -> int:
        """Housekeeping: drop expired pairs of addresses no flow holds. Returns how many."""
        now = self.now()
        if now < self._earliest:
            return 0
        removed = 0
        earliest = float("inf")
        for addr in list(self._table):
            if self._holds.get(addr):
                continue
            removed += self._purge(addr, now)
            names = self._table.get(addr)
            if names:
                earliest = min(earliest, min(names.values()))
        self._earliest = earliest
        return removed

    def _purge(self, addr: Address, now: float) -> int:
        names = self._table.get(addr)
        if not names:
            return 0
        dead = [n for n, expiry in names.items() if expiry <= now]
        for n in dead:
            del names[n]
        if not names:
            del self._table[addr]
        self._count -= len(dead)
        return len(dead)
