"""Per-session DNS bindings: lifetime (TTL floor/cap, grace), flow holds, the bound."""

from __future__ import annotations

import ipaddress

import pytest

from boxyd.net.bindings import (
    EXPIRY_GRACE,
    TTL_CAP,
    TTL_FLOOR,
    Address,
    Bindings,
    canonical_ip,
    canonical_name,
    clamp_ttl,
)


class Clock:
    """A settable clock; the table only ever calls it."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock) -> Bindings:
    return Bindings(clock)


def test_clamp_ttl() -> None:
    assert clamp_ttl(0) == TTL_FLOOR
    assert clamp_ttl(TTL_FLOOR + 1) == TTL_FLOOR + 1
    assert clamp_ttl(10**9) == TTL_CAP
    assert clamp_ttl(5, floor=10, cap=20) == 10


def test_canonical_ip_and_name() -> None:
    assert canonical_ip("::ffff:93.184.216.34") == ipaddress.IPv4Address("93.184.216.34")
    assert canonical_ip("2001:DB8:0::1") == ipaddress.IPv6Address("2001:db8::1")
    assert canonical_ip("fe80::1%eth0") == ipaddress.IPv6Address("fe80::1")
    with pytest.raises(ValueError):
        canonical_ip("not-an-address")
    assert canonical_name("WWW.Example.COM.") == "www.example.com"
    assert canonical_name(".") == ""


def test_bound_name_lives_for_floor_plus_grace(table: Bindings, clock: Clock) -> None:
    assert table.bind("93.184.216.34", "WWW.Example.com.", 1)
    assert table.names("93.184.216.34") == {"www.example.com"}
    clock.t += TTL_FLOOR + EXPIRY_GRACE - 0.01
    assert table.names("93.184.216.34") == {"www.example.com"}
    clock.t += 0.02
    assert table.names("93.184.216.34") == frozenset()


def test_long_ttl_kept_and_capped(table: Bindings, clock: Clock) -> None:
    table.bind("93.184.216.34", "a.test", 300)
    table.bind("93.184.216.35", "b.test", 10**9)
    clock.t += 299
    assert table.names("93.184.216.34") == {"a.test"}
    clock.t += 1 + EXPIRY_GRACE
    assert table.names("93.184.216.34") == frozenset()
    clock.t += TTL_CAP - 300
    assert table.names("93.184.216.35") == frozenset()


def test_addresses_are_normalised(table: Bindings) -> None:
    table.bind("::ffff:93.184.216.34", "a.test", 60)
    table.bind(ipaddress.IPv6Address("2001:db8::1"), "b.test", 60)
    assert table.names(ipaddress.IPv4Address("93.184.216.34")) == {"a.test"}
    assert table.names("2001:0DB8:0:0::1") == {"b.test"}
    assert table.names("93.184.216.35") == frozenset()


def test_several_names_per_address_and_rebinding_never_shortens(
    table: Bindings, clock: Clock
) -> None:
    table.bind("93.184.216.34", "a.test", 600)
    table.bind("93.184.216.34", "b.test", 60)
    table.bind("93.184.216.34", "a.test", 60)  # a shorter re-answer keeps the longer life
    assert len(table) == 2
    clock.t += 120
    assert table.names("93.184.216.34") == {"a.test"}


def test_hold_keeps_binding_past_its_ttl_until_last_release(table: Bindings, clock: Clock) -> None:
    table.bind("93.184.216.34", "a.test", 60)
    assert table.hold("93.184.216.34") == {"a.test"}
    assert table.hold("::ffff:93.184.216.34") == {"a.test"}  # second flow, same address
    clock.t += 10_000
    assert table.expire() == 0
    assert table.names("93.184.216.34") == {"a.test"}
    table.release("93.184.216.34")
    assert table.names("93.184.216.34") == {"a.test"}
    table.release("93.184.216.34")
    assert table.names("93.184.216.34") == frozenset()
    assert len(table) == 0  # swept on the last release


def test_hold_does_not_resurrect_expired_names(table: Bindings, clock: Clock) -> None:
    table.bind("93.184.216.34", "old.test", 60)
    clock.t += 100
    table.bind("93.184.216.34", "new.test", 60)
    with table.held("93.184.216.34") as names:
        assert names == {"new.test"}
        assert table.names("93.184.216.34") == {"new.test"}
    assert table.hold("93.184.216.35") == frozenset()  # no binding: the caller refuses
    table.release("93.184.216.35")


def test_release_without_hold_is_an_error(table: Bindings) -> None:
    table.bind("93.184.216.34", "a.test", 60)
    with pytest.raises(ValueError, match="without a matching hold"):
        table.release("93.184.216.34")


def test_expire_sweeps_only_expired_unheld(table: Bindings, clock: Clock) -> None:
    table.bind("93.184.216.34", "a.test", 60)
    table.bind("93.184.216.35", "b.test", 60)
    table.bind("93.184.216.36", "c.test", 3600)
    table.hold("93.184.216.35")
    clock.t += 100
    assert table.expire() == 1
    assert len(table) == 2
    assert table.names("93.184.216.35") == {"b.test"}


def test_full_table_refuses_new_bindings(clock: Clock) -> None:
    table = Bindings(clock, max_entries=3)
    for i in range(3):
        assert table.bind(f"93.184.216.{i}", "a.test", 60)
    assert not table.bind("93.184.216.9", "a.test", 60)
    assert table.refused == 1
    assert table.names("93.184.216.9") == frozenset()
    # Refreshing an existing pair needs no room.
    assert table.bind("93.184.216.0", "a.test", 600)
    assert len(table) == 3


def test_full_table_evicts_expired_first(clock: Clock) -> None:
    table = Bindings(clock, max_entries=2)
    table.bind("93.184.216.1", "a.test", 60)
    table.bind("93.184.216.2", "b.test", 600)
    assert not table.bind("93.184.216.3", "c.test", 60)
    clock.t += 100
    assert table.bind("93.184.216.3", "c.test", 60)
    assert table.names("93.184.216.1") == frozenset()
    assert table.names("93.184.216.2") == {"b.test"}
    assert table.names("93.184.216.3") == {"c.test"}


def test_entry_released_while_live_is_evictable_later(clock: Clock) -> None:
    """A pair that was held during a sweep still expires once released (the sweep
    skipped it, so the release must put it back in the bookkeeping)."""
    table = Bindings(clock, max_entries=3)
    table.bind("93.184.216.1", "held.test", 600)
    table.bind("93.184.216.2", "short.test", 60)
    table.bind("93.184.216.3", "long.test", 3600)
    table.hold("93.184.216.1")
    clock.t += 100
    assert table.bind("93.184.216.4", "long2.test", 3600)  # full: sweeps short.test
    table.release("93.184.216.1")  # still live at release
    clock.t += 600
    assert table.bind("93.184.216.5", "new.test", 60)  # evicts held.test, now expired
    assert table.names("93.184.216.1") == frozenset()
    assert table.refused == 0


def test_flood_is_bounded(clock: Clock) -> None:
    table = Bindings(clock, max_entries=1000)
    accepted = sum(
        table.bind(ipaddress.IPv4Address(0x5DB80000 + i), "a.test", 60) for i in range(5000)
    )
    assert accepted == 1000
    assert len(table) == 1000
    assert table.refused == 4000


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        Bindings(ttl_floor=100, ttl_cap=10)
    with pytest.raises(ValueError):
        Bindings(max_entries=0)


# --- published into the gateway's set of bound addresses (allowlist mode) ----------


class Published:
    """A publish() that records its calls and answers as told."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[str, float]] = []

    def __call__(self, addr: Address, seconds: float) -> bool:
        self.calls.append((str(addr), seconds))
        return self.ok


def test_every_bind_is_published_first_for_the_address_whole_lifetime() -> None:
    clock = [100.0]
    pub = Published()
    b = Bindings(lambda: clock[0], publish=pub, grace=5.0)
    assert b.bind("11.0.0.10", "www.example", 300)
    assert b.bind("11.0.0.10", "alias.example", 60)  # shorter: the element keeps the longest
    assert b.bind("::ffff:11.0.0.10", "www.example", 600)
    assert pub.calls == [("11.0.0.10", 305.0), ("11.0.0.10", 305.0), ("11.0.0.10", 605.0)]


def test_a_bind_the_gateway_did_not_take_is_refused_and_counted() -> None:
    pub = Published(ok=False)
    b = Bindings(publish=pub)
    assert not b.bind("11.0.0.10", "www.example", 300)
    assert b.names("11.0.0.10") == frozenset() and b.unpublished == 1 and len(b) == 0
    pub.ok = True
    assert b.bind("11.0.0.10", "www.example", 300) and b.names("11.0.0.10") == {"www.example"}


def test_a_bind_refused_for_a_full_table_is_not_published() -> None:
    pub = Published()
    b = Bindings(publish=pub, max_entries=1)
    assert b.bind("11.0.0.10", "a.example", 300)
    assert not b.bind("11.0.0.11", "b.example", 300)
    assert [a for a, _ in pub.calls] == ["11.0.0.10"] and b.refused == 1


def test_held_addresses() -> None:
    b = Bindings()
    b.bind("11.0.0.10", "a.example", 300)
    assert b.held_addresses() == []
    with b.held("11.0.0.10"):
        assert [str(a) for a in b.held_addresses()] == ["11.0.0.10"]
    assert b.held_addresses() == []
