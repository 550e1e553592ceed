"""refusals: the end-of-run line about what the network refused (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from boxy.values import plural
from boxyd.net import refusals
from boxyd.net.netlog import NetLog
from boxyd.net.refusals import Tally


def test_nothing_refused_says_nothing() -> None:
    t = Tally()
    t.add({"layer": "net.dns", "verdict": "allow", "name": "a.example"})
    t.add({"layer": "net.tcp", "verdict": "close", "proto": "tcp"})
    assert t.lines() == []


def test_counts_and_the_cidr_that_would_open_a_removed_answer() -> None:
    t = Tally()
    for _ in range(2):
        t.add({"layer": "net.ip", "verdict": "deny", "proto": "tcp", "addr": "10.0.0.1"})
    t.add({"layer": "net.ip", "verdict": "deny", "proto": "tcp", "count": 5})  # rate-limited
    t.add({"layer": "net.sni", "verdict": "deny", "proto": "tcp", "addr": "11.0.0.1"})
    t.add({"layer": "net.port", "verdict": "deny", "proto": "udp", "addr": "11.0.0.1"})
    t.add({"layer": "net.dns", "verdict": "deny", "name": "Evil.example.", "reason": "not listed"})
    t.add({"layer": "net.dns", "verdict": "deny", "name": "evil.example"})
    t.add(
        {
            "layer": "net.dns",
            "verdict": "deny",
            "name": "registry.example",
            "denied": [["10.9.8.7", "private (RFC 1918)"]],
        }
    )
    assert t.lines() == [
        "4 connections refused, 5 connections reset over the rate limits, 1 name not allowed, "
        "1 DNS answer in a refused range removed "
        "(-v or --audit-log for details)",
        "registry.example answered with 10.9.8.7 (private (RFC 1918)), which boxy refuses; "
        "if that is really where it lives: --allow-cidr 10.9.8.7",
        "evil.example: not on the allowlist; --allow-host evil.example allows it "
        "(a running session: boxyctl allow ID evil.example)",
    ]


def test_a_connection_refused_for_want_of_a_binding_is_a_connection() -> None:
    # Layer net.dns, yet a connection: it used to be taken for a DNS query and left out
    # of the count while the table showed it (2 refused said, 3 in the table).
    t = Tally()
    t.add(
        {
            "layer": "net.dns",
            "verdict": "deny",
            "proto": "tcp",
            "addr": "11.0.0.60",
            "port": 80,
            "reason": "no DNS binding for this address (hard-coded IP?)",
        }
    )
    t.add({"layer": "net.dns", "verdict": "deny", "proto": "udp", "addr": "11.0.0.60", "port": 9})
    assert t.lines() == ["2 connections refused (-v or --audit-log for details)"]
    assert t.names == set()


def test_each_removal_counts_as_the_table_counts_it() -> None:
    t = Tally()
    for _ in range(2):  # the same name asked twice: two answers removed, one hint
        t.add(
            {
                "layer": "net.dns",
                "verdict": "deny",
                "name": "m.example",
                "denied": [["169.254.169.254", "link-local / cloud metadata"]],
            }
        )
    assert (
        t.lines()[0] == "2 DNS answers in a refused range removed (-v or --audit-log for details)"
    )
    assert len(t.lines()) == 2 and "--allow-cidr 169.254.169.254" in t.lines()[1]


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 connections"), (1, "1 connection"), (2, "2 connections"), (11, "11 connections")],
)
def test_plural(n: int, text: str) -> None:
    assert plural(n, "connection") == text
    assert plural(n, "denial", "denials given") == (
        f"{n} denial" if n == 1 else f"{n} denials given"
    )


def test_one_of_each_is_singular() -> None:
    t = Tally()
    t.add({"layer": "net.ip", "verdict": "deny", "proto": "tcp", "addr": "10.0.2.2"})
    t.add({"layer": "net.ip", "verdict": "deny", "proto": "tcp", "count": 1})
    t.add({"layer": "net.dns", "verdict": "deny", "name": "x.example"})
    t.add(
        {"layer": "net.dns", "verdict": "deny", "name": "m.example", "denied": [["10.1.1.1", "p"]]}
    )
    assert t.lines()[0] == (
        "1 connection refused, 1 connection reset over the rate limits, "
        "1 name not allowed, 1 DNS answer in a refused range removed "
        "(-v or --audit-log for details)"
    )


EVENTS: list[dict[str, Any]] = [
    {"layer": "net.ip", "verdict": "deny", "proto": "tcp", "addr": "169.254.169.254", "port": 80},
    {"layer": "net.ip", "verdict": "deny", "proto": "tcp", "addr": "169.254.169.254", "port": 80},
    {"layer": "net.ip", "verdict": "deny", "proto": "udp", "addr": "224.0.0.251", "port": 5353},
    {"layer": "net.dns", "verdict": "deny", "proto": "tcp", "addr": "11.0.0.60", "port": 80},
    {
        "layer": "net.sni",
        "verdict": "deny",
        "proto": "tcp",
        "addr": "11.0.0.1",
        "port": 443,
        "host": "www.example",
    },
    {
        "layer": "net.sni",
        "verdict": "allow",
        "proto": "tcp",
        "addr": "11.0.0.1",
        "port": 443,
        "host": "www.example",
    },
    {"layer": "net.dns", "verdict": "deny", "name": "m.example", "denied": [["10.1.1.1", "p"]]},
    {
        "layer": "net.dns",
        "verdict": "deny",
        "name": "m.example",
        "denied": [["10.1.1.1", "p"], ["fd00:1::1", "u"]],
    },
    {"layer": "net.dns", "verdict": "deny", "name": "nope.example"},
    {"layer": "net.ip", "verdict": "deny", "proto": "icmp", "addr": "10.0.2.2"},  # a ping: no row
]


@pytest.mark.parametrize("n", range(len(EVENTS) + 1))
def test_the_summary_agrees_with_the_destinations_table(n: int) -> None:
    # Fed as boxyd feeds both (Gateway._decide, Gateway._dns_event, Network._event).
    from boxyd.daemon.network import _refused_lookup

    log, t = NetLog(), Tally()
    for ev in EVENTS[:n]:
        if ev.get("proto") in ("tcp", "udp"):
            log.conn(0, ev["proto"], ev["verdict"], ev["addr"], ev["port"], ev.get("host"))
        elif ev.get("denied"):
            log.removed(ev["name"], len(ev["denied"]))
        elif _refused_lookup(ev):
            log.refused_name(ev["name"])
        t.add(ev)
    assert t.connections == sum(d.denied for d in log.summary()) == log.totals().denials
    assert len(t.names | set(t.removed)) == log.totals().names_denied


def test_a_v_run_is_not_told_to_use_v() -> None:
    t = Tally()
    t.add({"layer": "net.ip", "verdict": "deny", "proto": "tcp", "addr": "10.0.0.1"})
    assert t.lines(verbose=True) == ["1 connection refused (each one said above)"]
    assert t.lines() == ["1 connection refused (-v or --audit-log for details)"]


def test_a_name_not_allowed_is_counted_as_a_name_not_a_destination() -> None:
    """The summary line's '1 name not allowed' is the net log's name denied; no row in
    the destinations table (no connection was made to it: issue 33 §1, `show` said
    '45 connections, 45 denied' where the 45 were names)."""
    from boxyd.daemon.network import _refused_lookup

    events: list[dict[str, Any]] = [
        {"layer": "net.dns", "verdict": "deny", "name": "Evil.example.", "reason": "not listed"},
        {"layer": "net.dns", "verdict": "deny", "name": "r.example", "denied": [["10.0.0.9", "x"]]},
        {"layer": "net.dns", "verdict": "deny", "proto": "tcp", "addr": "11.0.0.6", "name": "a"},
    ]
    t, log = Tally(), NetLog()
    for ev in events:
        t.add(ev)
        if _refused_lookup(ev):
            log.refused_name(str(ev["name"]))
    assert log.summary() == []
    assert log.to_json()["names_denied"] == {"evil.example": 1}
    assert t.names == {"evil.example"}
    totals = log.totals()
    assert (totals.connections, totals.denials, totals.names_denied) == (0, 0, 1)


def test_the_allowlists_names_that_resolve_only_into_refused_ranges_are_said() -> None:
    from boxyd.daemon.network import _plain_names, refused_names
    from boxyd.net.policy import NetPolicy

    policy = NetPolicy.from_spec("allowlist", ["reg.example", "*.cdn.example", "11.0.0.7"])
    assert _plain_names(policy) == ["reg.example"]
    events: list[
        dict[str, Any]
    ] = [  # the proxy's events: A removed whole; a second name keeps one address
        {"name": "reg.example", "addrs": [], "denied": [["10.9.8.7", "private (RFC 1918)"]]},
        {"name": "reg.example", "addrs": [], "qtype": "AAAA"},
        {"name": "ok.example", "addrs": ["11.0.0.1"], "denied": [["10.0.0.1", "private"]]},
    ]
    assert refused_names(events) == [
        "reg.example resolves to 10.9.8.7 (private (RFC 1918)), which boxy refuses, so the "
        "run cannot reach it; if that is really where it lives: --allow-cidr 10.9.8.7"
    ]


def test_rows_are_each_kind_once_most_frequent_first() -> None:
    t = Tally()
    deny = {"verdict": "deny", "layer": "net.ip", "proto": "tcp", "port": 443}
    for _ in range(3):
        t.add({**deny, "addr": "169.254.169.254", "reason": "link-local (cloud metadata)"})
    t.add({**deny, "addr": "10.0.0.1", "reason": "private-use", "sni": "intranet.test"})
    t.add({"verdict": "deny", "layer": "net.dns", "name": "evil.test", "reason": "not allowed"})
    t.add({"verdict": "allow", "layer": "net.ip", "proto": "tcp", "addr": "1.1.1.1", "port": 1})
    t.add({"verdict": "deny", "layer": "net.rate", "proto": "tcp", "count": 40, "reason": "rate"})
    assert [(r.layer, r.addr, r.port, r.host, r.count) for r in t.rows()] == [
        ("net.rate", None, None, None, 40),
        ("net.ip", "169.254.169.254", 443, None, 3),
        ("net.ip", "10.0.0.1", 443, "intranet.test", 1),
        ("net.dns", None, None, "evil.test", 1),
    ]
    assert t.rows()[3].proto == "dns"


def test_rows_are_bounded_and_the_rest_counted() -> None:
    t = Tally()
    for port in range(1, refusals.MAX_ROWS + 101):  # a port scan
        t.add({"verdict": "deny", "layer": "net.port", "proto": "tcp", "addr": "192.0.2.1",
               "port": port, "reason": "port not allowed"})  # fmt: skip
    rows = t.rows()
    assert len(rows) == refusals.MAX_ROWS + 1 and rows[-1].count == 100
    assert "more kinds of refusal" in rows[-1].reason
    assert sum(r.count for r in rows) == refusals.MAX_ROWS + 100 == t.connections


def test_refusals_past_the_report_rate_are_said_with_their_count() -> None:
    t = Tally()
    t.add({"layer": "net.ip", "verdict": "deny", "proto": "tcp", "addr": "10.0.0.1", "port": 80})
    assert t.lines(unreported=704_990) == [
        "1 connection refused, 704990 more connections refused past the report rate "
        "(counted, not named) (-v or --audit-log for details)"
    ]
    assert Tally().lines(unreported=1) == [
        "1 more connection refused past the report rate (counted, not named) "
        "(-v or --audit-log for details)"
    ]


def test_each_name_not_allowed_is_said_with_the_flag_that_allows_it() -> None:
    """What an agent reads at the end of a hook's run (issue 34 §3): the name and the
    flag, not only '2 names not allowed'."""
    t = Tally()
    for name in ("Api.Example.", "c2.example", "api.example"):
        t.add({"layer": "net.dns", "verdict": "deny", "name": name, "reason": "not listed"})
    assert t.lines() == [
        "2 names not allowed (-v or --audit-log for details)",
        "api.example: not on the allowlist; --allow-host api.example allows it "
        "(a running session: boxyctl allow ID api.example)",
        "c2.example: not on the allowlist; --allow-host c2.example allows it "
        "(a running session: boxyctl allow ID c2.example)",
    ]


def test_past_twenty_names_the_rest_are_counted_and_past_the_bound_not_kept() -> None:
    from boxyd.net import refusals

    t = Tally()
    for i in range(refusals.MAX_NAMES + 5):
        t.add({"layer": "net.dns", "verdict": "deny", "name": f"n{i:05}.example"})
    lines = t.lines()
    assert lines[0].startswith(f"at least {refusals.MAX_NAMES} names not allowed"), lines[0]
    assert len(lines) == 1 + refusals.MAX_NAMED + 1, len(lines)
    assert lines[-1] == f"and {refusals.MAX_NAMES - refusals.MAX_NAMED} more names not allowed"
    assert len(t.names) == refusals.MAX_NAMES and t.names_past == 5


def test_a_cut_by_the_secret_swap_says_why_and_a_placeholder_sent_says_where() -> None:
    """--secret NAME@HOST: a connection the swap cut (another Host, h2 …) is said with
    the swap's reason, not as a placeholder sent; a placeholder in a first record or a
    DNS name is said as sent there."""
    t = Tally()
    cut = {"layer": "net.secret", "verdict": "deny", "proto": "tcp", "addr": "11.0.0.10",
           "host": "www.example", "sni": "www.example"}  # fmt: skip
    for _ in range(2):
        t.add({**cut, "reason": refusals.SWAP_CUT + "a request not for its connection's host"})
    t.add({**cut, "reason": refusals.SWAP_CUT + "not an HTTP/1.1 request line"})
    t.add({**cut, "host": "other.example", "reason": "a secret's placeholder (TOKEN)"})
    t.add({"layer": "net.secret", "verdict": "deny", "name": "x.example", "reason": "TOKEN"})
    assert t.lines(verbose=True) == [
        "4 connections refused (each one said above)",
        "a connection to www.example was cut by the secret swap: a request not for its "
        "connection's host (2 times)",
        "a connection to www.example was cut by the secret swap: not an HTTP/1.1 request line",
        "a secret's placeholder was sent to other.example: refused",
        "a secret's placeholder was sent to a DNS lookup: refused",
    ]
