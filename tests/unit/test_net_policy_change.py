"""A running session's policy changed (`boxyctl allow` / `deny`, issue 34 §1): what
widens, what stays fixed since the start, what a denial wins over (pure)."""

from __future__ import annotations

import pytest

from boxy.errors import UsageError
from boxyd.net.policy import NetPolicy

PUB = "93.184.216.34"


def allowlist(*hosts: str, ports: tuple[int, ...] = (), cidrs: tuple[str, ...] = ()) -> NetPolicy:
    return NetPolicy.from_spec("allowlist", hosts, ports, cidrs, False)


def test_allow_widens_names_dns_and_connections() -> None:
    before = allowlist("registry.example")
    after = before.widened(["api.example"])
    assert not before.dns("api.example").allow and after.dns("api.example").allow
    assert after.tcp_connect(PUB, 443, ["api.example"]).allow
    assert after.dns("registry.example").allow  # what was allowed stays
    assert not before.dns("api.example").allow  # a new policy; the old one is unchanged


def test_allow_a_wildcard_and_an_address() -> None:
    after = allowlist("registry.example").widened(["*.cdn.example", "93.184.216.7"])
    assert after.dns("a.cdn.example").allow and not after.dns("cdn.example").allow
    assert after.tcp_connect("93.184.216.7", 443, []).allow
    assert "93.184.216.7" in after.literal_addresses()


@pytest.mark.parametrize(
    "host,words",
    [
        ("registry.example:8443", "TCP port 8443"),
        ("registry.example:22,443", "TCP port 22"),
        ("dns.example:5353/udp", "UDP port 5353"),
    ],
)
def test_a_port_the_kernel_fixed_at_the_start_is_refused(host: str, words: str) -> None:
    before = allowlist("registry.example")
    with pytest.raises(UsageError) as e:
        before.widened([host])
    msg = str(e.value)
    assert msg.startswith(f"allow: {words}: the session's "), msg
    assert f"a new run with --allow-host {host} allows it" in msg, msg


def test_a_port_already_in_the_sets_widens() -> None:
    before = allowlist("registry.example", "git.example:22")
    after = before.widened(["nas.example:22", "other.example"])
    assert after.tcp_connect(PUB, 22, ["nas.example"]).allow
    assert after.landlock_ports() == before.landlock_ports()


@pytest.mark.parametrize("addr", ["192.168.4.7", "169.254.169.254", "10.0.0.1:22", "[fd00::7]"])
def test_a_range_objection_is_never_lifted(addr: str) -> None:
    with pytest.raises(UsageError) as e:
        allowlist("registry.example").widened([addr])
    assert "only a new run with --allow-cidr" in str(e.value), e.value


def test_an_address_in_a_range_the_run_opened_widens() -> None:
    after = allowlist("registry.example", cidrs=("192.168.4.0/24",)).widened(["192.168.4.7"])
    assert after.tcp_connect("192.168.4.7", 443, []).allow


def test_public_mode_has_nothing_to_allow_or_deny() -> None:
    public = NetPolicy.from_spec("public", [], [], [], False)
    with pytest.raises(UsageError, match="every public host is allowed"):
        public.widened(["a.example"])
    with pytest.raises(UsageError, match="needs --net allowlist"):
        public.narrowed(["a.example"])


def test_deny_removes_a_name_and_wins_over_a_wildcard() -> None:
    before = allowlist("registry.example", "*.example.com")
    after = before.narrowed(["registry.example", "evil.example.com"])
    assert not after.dns("registry.example").allow
    assert not after.dns("EVIL.example.com.").allow
    assert after.dns("good.example.com").allow
    assert after.refuses("evil.example.com") and after.refuses("registry.example:443")
    assert not after.refuses("good.example.com")


def test_deny_a_wildcard_refuses_every_name_below_it() -> None:
    after = allowlist("*.example.com", "api.example.com").narrowed(["*.example.com"])
    assert not after.dns("a.example.com").allow
    assert not after.dns("api.example.com").allow  # below the denied wildcard


def test_deny_an_address_ends_its_literal_binding() -> None:
    after = allowlist("93.184.216.7").narrowed(["93.184.216.7"])
    assert not after.tcp_connect("93.184.216.7", 443, []).allow
    assert after.literal_addresses() == [] and after.refuses("93.184.216.7")


def test_allow_after_deny_lifts_the_denial() -> None:
    denied = allowlist("registry.example").narrowed(["api.example"])
    assert not denied.widened(["api.example"]).refuses("api.example")


@pytest.mark.parametrize("host", ["a.example:443", "a.example:53/udp"])
def test_deny_takes_no_port(host: str) -> None:
    with pytest.raises(UsageError, match="on every port"):
        allowlist("a.example").narrowed([host])


@pytest.mark.parametrize("bad", ["http://a.example", "a..example", "a.example:0", ""])
def test_bad_hosts_are_refused_in_one_line(bad: str) -> None:
    for change in (NetPolicy.widened, NetPolicy.narrowed):
        with pytest.raises(UsageError):
            change(allowlist("registry.example"), [bad])


def test_an_allow_a_denied_wildcard_would_still_refuse_says_so() -> None:
    """Found attacking issue 34: `allow a.example.com` after `deny '*.example.com'` said
    it allowed the name, which stayed refused (the wildcard's denial wins)."""
    denied = allowlist("registry.example").narrowed(["*.example.com"])
    with pytest.raises(UsageError) as e:
        denied.widened(["a.example.com"])
    assert str(e.value) == (
        "allow: a.example.com is under the denied *.example.com, which wins; "
        "`boxyctl allow ID '*.example.com'` lifts that denial"
    )
    lifted = denied.widened(["*.example.com"])
    assert lifted.dns("a.example.com").allow


def test_forgetting_a_name_allowed_once_asks_again_and_refuses_nothing() -> None:
    """--ask's `once` ends: the name is no longer allowed, and not denied either."""
    base = NetPolicy.from_spec("allowlist", ["keep.example"])
    once = base.widened(["api.example"])
    after = once.forgetting(["api.example"])
    assert after.exact.keys() == base.exact.keys() and after.refused_names == frozenset()
    assert after.widened(["api.example"]).exact.keys() == once.exact.keys()


def test_askable_is_a_name_the_allowlist_holds_no_rule_for() -> None:
    """--ask asks about a connection's SNI or Host only when the allowlist holds no
    rule for it: never one allowed, one `deny` refused, an address, or in public mode."""
    p = allowlist("cdn-a.example", "*.ok.example").narrowed(["bad.example", "*.worse.example"])
    assert p.askable("CDN-B.example.") == "cdn-b.example"
    assert p.askable("cdn-b.example:8443", "host") == "cdn-b.example"
    assert p.askable("[::1]:80", "host") is None and p.askable("11.0.0.20") is None
    for refused in ("cdn-a.example", "x.ok.example", "bad.example", "y.worse.example", ""):
        assert p.askable(refused) is None, refused
    assert p.widened(["cdn-b.example"]).askable("cdn-b.example") is None
    assert NetPolicy.from_spec("public", [], [], [], False).askable("cdn-b.example") is None
