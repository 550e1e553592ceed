"""refusals: the end-of-run line about what the network refused (pure)."""

from __future__ import annotations

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
    t.add({"layer": "net.sni", "verdict": "deny", "proto": "tcp"})
    t.add({"layer": "net.port", "verdict": "deny", "proto": "udp"})
    t.add({"layer": "net.dns", "verdict": "deny", "name": "Evil.example.", "reason": "not listed"})
    t.add({"layer": "net.dns", "verdict": "deny", "name": "evil.example"})
    t.add({"layer": "net.dns", "verdict": "deny", "name": "registry.example",
           "denied": [["10.9.8.7", "private (RFC 1918)"]]})
    assert t.lines() == [
        "9 connections refused, 1 name not allowed, 1 DNS answer in a refused range removed "
        "(-v or --audit-log for details)",
        "registry.example answered with 10.9.8.7 (private (RFC 1918)), which boxy refuses; "
        "if that is really where it lives: --allow-cidr 10.9.8.7",
    ]
