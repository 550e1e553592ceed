"""Pure pieces of boxyd/net/gateway.py: the parsed destination of an accepted flow
must be the same key as the stdlib's address in every table it is looked up in."""

from __future__ import annotations

import ipaddress

import pytest

from boxyd.net.bindings import Bindings
from boxyd.net.gateway import _ip
from boxyd.net.policy import NetPolicy


@pytest.mark.parametrize("addr", ["11.22.33.44", "2a00:1450:4001::1", "fe80::1%2", "127.0.0.1"])
def test_the_cached_address_is_the_stdlib_address(addr: str) -> None:
    ours, std = _ip(addr), ipaddress.ip_address(addr)
    assert ours == std and std == ours
    assert hash(ours) == hash(std)
    assert str(ours) == str(std) and ours.version == std.version
    assert {std: 1}[ours] == 1 and {ours: 1}[std] == 1
    assert _ip(addr) is ours, "parsed once"


def test_bindings_and_policy_see_the_cached_address_as_the_stdlib_one() -> None:
    b = Bindings()
    assert b.bind(ipaddress.ip_address("11.22.33.44"), "www.example", 300)
    assert b.names(_ip("11.22.33.44")) == frozenset({"www.example"})
    policy = NetPolicy.from_spec("public")
    assert policy.address(_ip("127.0.0.1")).allow is False
    assert policy.address(_ip("11.22.33.44")).allow is True
