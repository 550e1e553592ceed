"""The test internet itself (tests/harness/topology.py), with no boxy involved.

Everything here runs inside namespaces the harness builds (under its own prefix,
so a topology other tests share is left alone): probes go from the host netns to
the fake internet and never from the machine's own netns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import User
from tests.harness import topology
from tests.harness.fakenet import plan, web

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the test internet is built as root (CI runs `make test` as root)"
)

PREFIX = "boxyt-self"
STATE = Path("/run/boxyt-self")
PY = sys.executable


@pytest.fixture(scope="module")
def topo() -> Iterator[topology.Topology]:
    # up() fails on its own if the servers are not ready (READY_TIMEOUT); how long it
    # takes is in the suite's --durations (the fixture's setup), not a bound here
    t = topology.up(STATE, PREFIX)
    yield t
    topology.down(PREFIX, STATE)


def in_host(
    t: topology.Topology, argv: list[str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(t.exec_in_host(argv), capture_output=True, text=True, timeout=timeout)


def py_in_host(t: topology.Topology, code: str) -> dict[str, Any]:
    """Run CODE (which prints one JSON object) with this venv's Python in the host netns."""
    r = in_host(t, [PY, "-c", code])
    assert r.returncode == 0, r.stderr
    return cast(dict[str, Any], json.loads(r.stdout))


def curl(t: topology.Topology, *args: str) -> subprocess.CompletedProcess[str]:
    return in_host(t, ["curl", "-sS", "--max-time", "20", *args])


# --- the topology ---------------------------------------------------------------------


def test_up_is_isolated(topo: topology.Topology) -> None:
    for ns in (topo.host_ns, topo.net_ns):
        topology.assert_isolated(ns)
    assert topo.leaks() == 0


def test_machine_netns_untouched(topo: topology.Topology) -> None:
    links = json.loads(
        subprocess.run(
            ["ip", "-j", "link", "show"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert not [ln["ifname"] for ln in links if ln["ifname"].startswith("bxt-")]
    routes = subprocess.run(
        ["ip", "route", "show", "table", "all"], capture_output=True, text=True, check=True
    ).stdout
    routes += subprocess.run(
        ["ip", "-6", "route", "show", "table", "all"], capture_output=True, text=True, check=True
    ).stdout
    assert plan.ROUTER_V4 not in routes and plan.ROUTER_V6 not in routes


def test_isolation_check_catches_a_stray_interface(topo: topology.Topology) -> None:
    subprocess.run(
        [
            "ip",
            "-n",
            topo.host_ns,
            "link",
            "add",
            "bxt-stray",
            "type",
            "veth",
            "peer",
            "name",
            "bxt-stray2",
        ],
        check=True,
    )
    try:
        with pytest.raises(topology.IsolationError, match="bxt-stray"):
            topology.assert_isolated(topo.host_ns)
    finally:
        subprocess.run(["ip", "-n", topo.host_ns, "link", "del", "bxt-stray"], check=True)
    topology.assert_isolated(topo.host_ns)


def test_isolation_check_catches_a_missing_guard(topo: topology.Topology) -> None:
    subprocess.run(
        topo.exec_in_host(["nft", "delete", "table", "inet", topology.TABLE]), check=True
    )
    try:
        with pytest.raises(topology.IsolationError, match="nftables guard"):
            topology.assert_isolated(topo.host_ns)
    finally:
        topology._load_nft(topo.host_ns, topology.host_ruleset())
    topology.assert_isolated(topo.host_ns)


def test_unprivileged_user_in_host_netns(topo: topology.Topology, user: User) -> None:
    r = in_host(topo, ["runuser", "-u", user.name, "--", "unshare", "-Urn", "true"])
    assert r.returncode == 0, r.stderr
    r = in_host(topo, ["runuser", "-u", user.name, "--", "readlink", "/proc/self/ns/net"])
    assert r.stdout.strip() == f"net:[{os.stat(f'/run/netns/{topo.host_ns}').st_ino}]"
    r = in_host(topo, ["runuser", "-u", user.name, "--", "ip", "route"])
    assert f"default via {plan.ROUTER_V4} dev {plan.HOST_IF}" in r.stdout
    env = topo.user_env(user.uid, user.gid)  # a daemon of its own, inside the topology
    for key in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
        st = os.stat(env[key])
        assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o700)
    assert env["BOXY_UPSTREAM_DNS"] == topo.dns_v4


# --- DNS ------------------------------------------------------------------------------


def test_resolv_conf_names_the_fake_dns(topo: topology.Topology) -> None:
    topo.reset_records()
    v4 = in_host(topo, ["getent", "ahostsv4", "www.boxy.test"])
    v6 = in_host(topo, ["getent", "ahostsv6", "www.boxy.test"])
    assert v4.stdout.split()[0] == plan.SERVER_BY_NAME["www"].v4, v4.stderr
    assert v6.stdout.split()[0] == plan.SERVER_BY_NAME["www"].v6, v6.stderr
    seen = {(q["qname"], q["qtype"], q["server"]) for q in topo.dns_queries()}
    assert {("www.boxy.test.", "A", "auth"), ("www.boxy.test.", "AAAA", "auth")} <= seen


_DNS_PROBE = """
import json, dns.message, dns.query, dns.flags, dns.rcode, dns.rdatatype
S, S6 = %r, %r
def q(name, t, tcp=False, srv=S):
    m = dns.message.make_query(name, t, use_edns=0)
    return (dns.query.tcp if tcp else dns.query.udp)(m, srv, timeout=3)
def rrs(r, t):
    return [rd.to_text() for rrset in r.answer if rrset.rdtype == dns.rdatatype.from_text(t)
            for rd in rrset]
out = {}
r = q("cname.boxy.test", "A"); out["cname"] = [len(r.answer), rrs(r, "A")]
r = q("loop.boxy.test", "A"); out["loop"] = [len(rrs(r, "CNAME")), rrs(r, "A")]
r = q("txt.boxy.test", "TXT"); out["txt_udp_tc"] = bool(r.flags & dns.flags.TC)
r = q("txt.boxy.test", "TXT", tcp=True)
out["txt_tcp"] = [bool(r.flags & dns.flags.TC), len(r.to_wire())]
out["https"] = rrs(q("svc.boxy.test", "HTTPS"), "HTTPS")
out["evil"] = rrs(q("x1234.evil.test", "A"), "A")
r = q("short.boxy.test", "A"); out["short_ttl"] = r.answer[0].ttl
out["cdn"] = [rrs(q("cdn-a.boxy.test", "A"), "A"), rrs(q("cdn-b.boxy.test", "A"), "A")]
out["mixed"] = sorted(rrs(q("rebind-mixed.boxy.test", "A"), "A"))
out["aaaaonly"] = [rrs(q("aaaaonly.boxy.test", "A"), "A"), rrs(q("aaaaonly.boxy.test", "AAAA"), "AAAA")]
out["nx"] = dns.rcode.to_text(q("nope.boxy.test", "A").rcode())
out["refused"] = dns.rcode.to_text(q("example.com", "A").rcode())
out["v6_tcp"] = rrs(q("www.boxy.test", "AAAA", tcp=True, srv=S6), "AAAA")
print(json.dumps(out))
"""


def test_dns_cases(topo: topology.Topology) -> None:
    out = py_in_host(topo, _DNS_PROBE % (topo.dns_v4, topo.dns_v6))
    www = plan.SERVER_BY_NAME["www"]
    assert www.v4 is not None
    assert out["cname"] == [3, [www.v4]]  # two CNAMEs, then www's address
    assert out["loop"] == [2, []]  # the loop is answered, and ends
    assert out["txt_udp_tc"] is True
    assert out["txt_tcp"][0] is False and out["txt_tcp"][1] > 4000
    (https,) = out["https"]
    assert "ech=" in https and 'ipv4hint="11.0.0.81"' in https and "ipv6hint=" in https
    assert out["evil"] == [plan.SERVER_BY_NAME["evil"].v4]
    assert out["short_ttl"] == plan.SHORT_TTL
    assert out["cdn"][0] == out["cdn"][1] == [plan.SERVER_BY_NAME["cdn"].v4]
    assert out["mixed"] == sorted([www.v4, plan.LAN_HOST])
    assert out["aaaaonly"] == [[], [plan.SERVER_BY_NAME["aaaaonly"].v6]]
    assert out["nx"] == "NXDOMAIN"
    assert out["refused"] == "REFUSED"
    assert out["v6_tcp"] == [www.v6]
    assert any(q["qname"] == "x1234.evil.test." for q in topo.dns_queries())


# --- HTTP, TLS, UDP, banner -------------------------------------------------------------


@pytest.mark.parametrize("family", ["-4", "-6"])
def test_http_and_https(topo: topology.Topology, family: str) -> None:
    www = plan.SERVER_BY_NAME["www"]
    addr = www.v4 if family == "-4" else www.v6
    r = curl(topo, family, "http://www.boxy.test/hello")
    body = json.loads(r.stdout)
    assert (body["server"], body["addr"], body["port"], body["tls"]) == ("www", addr, 80, False)
    r = curl(topo, family, "--cacert", str(topo.ca), "https://www.boxy.test:8443/")
    body = json.loads(r.stdout)
    assert (body["addr"], body["port"], body["tls"], body["sni"]) == (
        addr,
        8443,
        True,
        "www.boxy.test",
    )
    # Without the test CA the certificate is not trusted: it really is ours.
    assert curl(topo, family, "https://www.boxy.test/").returncode == 60


def test_sni_picks_the_certificate_on_the_shared_address(topo: topology.Topology) -> None:
    for name in ("cdn-a", "cdn-b"):
        r = curl(topo, "--cacert", str(topo.ca), f"https://{name}.boxy.test/")
        assert r.returncode == 0, r.stderr  # verified: the certificate names exactly this host
        body = json.loads(r.stdout)
        assert (body["server"], body["sni"]) == ("cdn", f"{name}.boxy.test")
    # A forged SNI: cdn-a's name, cdn-b's Host header, same address.
    r = curl(
        topo, "--cacert", str(topo.ca), "-H", "Host: cdn-b.boxy.test", "https://cdn-a.boxy.test/"
    )
    body = json.loads(r.stdout)
    assert (body["sni"], body["host"]) == ("cdn-a.boxy.test", "cdn-b.boxy.test")


def test_redirect_across_names(topo: topology.Topology) -> None:
    r = curl(
        topo,
        "-L",
        "--cacert",
        str(topo.ca),
        "-w",
        "\n%{url_effective}",
        "https://redirect.boxy.test/x?y=1",
    )
    body, url = r.stdout.rsplit("\n", 1)
    assert url == "https://www.boxy.test/x?y=1"
    assert json.loads(body)["server"] == "www"
    r = curl(
        topo,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{redirect_url}",
        "http://www.boxy.test/redirect?to=other.boxy.test",
    )
    assert r.stdout == "302 http://other.boxy.test/"


def test_big_download_integrity(topo: topology.Topology) -> None:
    expected = web.BIG.sha256(plan.BIG_SIZE)
    r = in_host(
        topo,
        [
            "bash",
            "-c",
            "curl -sS --max-time 60 http://big.boxy.test/big | tee >(wc -c >&2) | sha256sum",
        ],
    )
    got, _ = r.stdout.split()
    assert got == expected
    assert int(r.stderr.split()[-1]) == plan.BIG_SIZE
    assert curl(topo, "http://big.boxy.test/big.sha256").stdout.strip() == expected


def test_slow_drips(topo: topology.Topology) -> None:
    t0 = time.monotonic()
    r = curl(topo, "http://www.boxy.test/slow?secs=0.5")
    assert r.stdout == "....."
    assert time.monotonic() - t0 >= 0.4


_UDP_BANNER_PROBE = """
import json, socket
out = {}
for addr in %r:
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    for port in (9999, 443):
        u = socket.socket(fam, socket.SOCK_DGRAM); u.settimeout(3)
        u.sendto(b"echo-%%d" %% port, (addr, port))
        data, src = u.recvfrom(100)
        out[f"udp {addr} {port}"] = [data.decode(), src[0], src[1]]
    c = socket.create_connection((addr, %d), 3)
    out[f"banner {addr}"] = c.recv(100).decode()  # before we send anything
    c.sendall(b"hello\\n"); out[f"echo {addr}"] = c.recv(100).decode()
print(json.dumps(out))
"""


def test_udp_echo_and_server_first_banner(topo: topology.Topology) -> None:
    udp = plan.SERVER_BY_NAME["udp"]
    out = py_in_host(topo, _UDP_BANNER_PROBE % (list(udp.addrs), plan.BANNER_PORT))
    for addr in udp.addrs:
        for port in (9999, 443):
            assert out[f"udp {addr} {port}"] == [f"echo-{port}", addr, port]
        assert out[f"banner {addr}"] == "SSH-2.0-boxyt_udp\r\n"
        assert out[f"echo {addr}"] == "hello\n"


def test_nobody_there_is_refused_at_once(topo: topology.Topology) -> None:
    topo.reset_records()
    out = py_in_host(
        topo,
        """
import json, socket
out = {}
for addr in ("11.0.0.99", "2a0b:4000::99", "10.1.2.3"):
    try:
        socket.create_connection((addr, 80), 5); out[addr] = "connected"
    except OSError as e:
        out[addr] = e.errno
print(json.dumps(out))
""",
    )
    for addr, err in out.items():
        assert err == 111, addr  # ECONNREFUSED: answered (a drop would time out, no errno)
    assert topo.range_hits("10.0.0.0/8") > 0


def test_ipv6_default_route_can_be_taken_away(topo: topology.Topology) -> None:
    topo.set_ipv6_default_route(False)
    try:
        r = curl(topo, "-6", "http://www.boxy.test/")
        assert r.returncode == 7  # couldn't connect: no route
    finally:
        topo.set_ipv6_default_route(True)
    assert json.loads(curl(topo, "-6", "http://www.boxy.test/").stdout)["family"] == 6


# --- recorders ---------------------------------------------------------------------------


def test_recorders_count_a_probe_from_the_host(topo: topology.Topology) -> None:
    topo.reset_records()
    assert topo.recorder_hits("lan") == 0
    out = py_in_host(
        topo,
        """
import json, socket
import dns.message, dns.query
c = socket.create_connection(("192.168.1.10", 22), 3); c.sendall(b"probe"); c.close()
r = dns.query.udp(dns.message.make_query("probe.boxy.test", "A"), "192.168.1.1", timeout=3)
h = socket.create_connection(("127.0.0.1", 8080), 3); h.close()
i = socket.create_connection(("192.168.77.2", 22), 3); i.close()
print(json.dumps({"lan_dns": [rd.to_text() for rrs in r.answer for rd in rrs]}))
""",
    )
    assert out["lan_dns"] == [plan.SENTINEL_V4]  # the LAN resolver answered: it was reached
    assert topo.recorder_hits("lan") > 0
    assert topo.recorder_hits("lan_resolver") > 0
    assert topo.range_hits("192.168.0.0/16") > 0
    assert topo.recorder_hits("host_loopback") > 0
    assert topo.recorder_hits("host_ifaddr") > 0
    assert topo.recorder_hits("metadata") == 0  # not probed, not counted
    deadline = time.monotonic() + 30  # the recorder logs first bytes after they arrive
    while time.monotonic() < deadline and not any(
        e["kind"] == "tcp-data" for e in topo.recorder_events("lan")
    ):
        time.sleep(0.02)
    kinds = {(e["kind"], e["port"]) for e in topo.recorder_events("lan")}
    assert {("tcp", 22), ("tcp-data", 22)} <= kinds
    assert [q["server"] for q in topo.dns_queries() if q["qname"] == "probe.boxy.test."] == [
        "lan_resolver"
    ]


# --- lifecycle (last: they rebuild and remove the module's topology) ------------------------


def test_up_again_replaces_a_crashed_run(topo: topology.Topology) -> None:
    pid = int((STATE / "ready-net").read_text())
    os.kill(pid, 9)  # a crashed run: servers gone, namespaces left
    again = topology.up(STATE, PREFIX)
    assert int((STATE / "ready-net").read_text()) != pid
    assert json.loads(curl(again, "http://www.boxy.test/").stdout)["server"] == "www"


def test_down_leaves_nothing_behind(topo: topology.Topology) -> None:
    pids = [int((STATE / f"ready-{role}").read_text()) for role in ("net", "host")]
    topology.down(PREFIX, STATE)
    for ns in topology.namespaces(PREFIX):
        assert not (topology.NETNS_DIR / ns).exists()
        assert not (topology.ETC_NETNS / ns).exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    assert not list(STATE.glob("ready-*"))
    topology.down(PREFIX, STATE)  # idempotent
