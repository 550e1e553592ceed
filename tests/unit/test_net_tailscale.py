"""--tailscale's pure parts: MagicDNS status, qualified names, the search domain."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import dns.message
import pytest

from boxyd.net import tailscale
from boxyd.net.bindings import Address
from boxyd.net.dnsproxy import DnsSession, route_for
from boxyd.plan.mountplan import etc_files
from boxyd.plan.ops import File


def runner(rc: int, out: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(argv: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        assert argv[:2] == ["tailscale", "status"]
        return subprocess.CompletedProcess(argv, rc, out, "")

    return run


@pytest.mark.parametrize(
    ("rc", "out", "suffix"),
    [
        (
            0,
            json.dumps({"BackendState": "Running", "MagicDNSSuffix": "Tail0a1b2.ts.net."}),
            "tail0a1b2.ts.net",
        ),
        (0, json.dumps({"BackendState": "Stopped", "MagicDNSSuffix": "tail0a1b2.ts.net"}), None),
        (0, json.dumps({"BackendState": "Running", "MagicDNSSuffix": ""}), None),
        (0, "not json", None),
        (1, "", None),
    ],
)
def test_magicdns_suffix(rc: int, out: str, suffix: str | None) -> None:
    assert tailscale.magicdns_suffix(run=runner(rc, out)) == suffix


def test_missing_binary_is_not_running() -> None:
    def run(argv: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    assert tailscale.magicdns_suffix(run=run) is None


def test_bare_names_also_allow_their_tailnet_name() -> None:
    assert tailscale.qualify_hosts(
        ["nas:22", "db.example.com", "*.wild.test", "printer"], "t.ts.net"
    ) == [
        "nas:22",
        "db.example.com",
        "*.wild.test",
        "printer",
        "nas.t.ts.net:22",
        "printer.t.ts.net",
    ]


def test_search_domain() -> None:
    """--tailscale: the sandbox's resolv.conf searches the tailnet (its MagicDNS short
    names); without a network, no resolver at all."""
    (resolv,) = [
        op
        for op in etc_files(0, 0, "u", "/h", "public", "t.ts.net")
        if op.dst == "/etc/resolv.conf"
    ]
    assert isinstance(resolv, File)
    assert resolv.content == "nameserver 10.0.2.2\noptions edns0 trust-ad\nsearch t.ts.net\n"
    (none,) = [
        op for op in etc_files(0, 0, "u", "/h", "none", "t.ts.net") if op.dst == "/etc/resolv.conf"
    ]
    assert isinstance(none, File) and "search" not in none.content


def test_dns_routes_pick_the_suffix_only() -> None:
    class Allow:
        def name_allowed(self, name: str) -> bool:
            return True

        def name_denied(self, name: str) -> bool:
            return False

        def address_denied(self, ip: Address) -> str | None:
            return None

    session = DnsSession(policy=Allow(), routes=(("t.ts.net", (tailscale.MAGICDNS,)),))
    assert route_for(session, dns.message.make_query("nas.t.ts.net", "A")) == (tailscale.MAGICDNS,)
    assert route_for(session, dns.message.make_query("t.ts.net", "A")) == (tailscale.MAGICDNS,)
    assert route_for(session, dns.message.make_query("xt.ts.net", "A")) is None
    assert route_for(session, dns.message.make_query("www.example.com", "A")) is None
