"""docs/design.md, steps 2–4 on the real kernel, as the unprivileged test user.

This file is also the script that user runs (``python -I test_netns.py ROOT``): it
maps its uid to itself (step 1), builds the gateway netns (step 2) and the payload
netns (step 3), receives the listeners over a socketpair the way boxyd would
(step 4), then, from the payload netns, plays the sandbox and the relay at once:
the listener fds keep working there because a socket belongs to the netns it was
created in. It prints one JSON report; the tests below assert on it.

No packet leaves the two namespaces: the gateway netns has lo and gw0 and no
route anywhere else (asserted too). The "public" addresses are never reached.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import socket
import struct
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from tests.conftest import User

# A socket address: (host, port), or (host, port, flowinfo, scope_id) for IPv6.
Address = tuple[str, int] | tuple[str, int, int, int]

ROOT = Path(__file__).resolve().parents[2]

DENY_V4 = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
]
# NAT64 and 6to4 images of 192.168/16 stand for what the ranges module may emit.
DENY_V6 = [
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::c0a8:0/112",
    "2002:c0a8::/32",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
]
EXCEPT_V4 = ["192.168.77.0/24"]
EXCEPT_V6 = ["fd77::/64"]
TCP_PORTS = [80, 443]

PUBLIC4, PUBLIC6 = "11.22.33.44", "2a00:1450:4001::1"
# Allowlist: only these have a binding (the bound sets' static elements here); a SYN
# to any other address is reset before TPROXY answers it.
BOUND = [PUBLIC4, PUBLIC6, "192.168.77.5", "fd77::5"]
UNBOUND = ["11.22.33.45:443", "[2a00:1450:4001::2]:443", "192.168.77.6:80"]
IP_ORIGDSTADDR, IPV6_ORIGDSTADDR = 20, 74
IP_PKTINFO, IPV6_PKTINFO = 8, 50
IP_TRANSPARENT, IPV6_TRANSPARENT = 19, 75
CLONE_NEWNET = 0x40000000
WAIT = 1.0  # seconds for anything that should arrive; refusals are expected well within
NOTHING = 0.3  # seconds to wait for something that must not arrive


# ---------------------------------------------------------------- the script (child) ---


def _outcome(fn: Any) -> str:
    try:
        fn()
    except TimeoutError:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e))
    return "ok"


def _fmt(addr: Address) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _orig_dst(ancdata: list[tuple[int, int, bytes]]) -> str | None:
    for level, kind, data in ancdata:
        if (level, kind) == (socket.IPPROTO_IP, IP_ORIGDSTADDR):
            (port,) = struct.unpack("!H", data[2:4])
            return f"{socket.inet_ntop(socket.AF_INET, data[4:8])}:{port}"
        if (level, kind) == (socket.IPPROTO_IPV6, IPV6_ORIGDSTADDR):
            (port,) = struct.unpack("!H", data[2:4])
            return f"[{socket.inet_ntop(socket.AF_INET6, data[8:24])}]:{port}"
    return None


def _refusals_reported(sock: socket.socket) -> list[list[str | int]]:
    from boxyd.net import nflog

    sock.setblocking(False)
    out: list[list[str | int]] = []
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return out
        out += [[r.proto, r.addr, r.port] for r in nflog.parse(data)]


def _refusals_counted(sock: socket.socket) -> int:
    """The ruleset's own count of its refusals, read as boxyd reads it."""
    from boxyd.net import nftcounter
    from boxyd.net.ruleset import REFUSED_COUNTER, TABLE

    sock.setblocking(True)
    return nftcounter.Counter(sock, TABLE, REFUSED_COUNTER).read()


class Sandbox:
    """The probes, run from the payload netns against the listeners boxyd would hold."""

    def __init__(
        self, listeners: dict[str, socket.socket], eth0: int, gateway_ns: int, payload_ns: int
    ) -> None:
        self.ls = listeners
        self.eth0 = eth0
        self.netns = {"gateway": gateway_ns, "payload": payload_ns}
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _setns(self, which: str) -> None:
        if self.libc.setns(self.netns[which], CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {which}")

    def flow_socket(self, orig: Address) -> socket.socket:
        """A UDP reply for a port the listener is not bound to must come from a socket
        bound to the original destination, made in the gateway netns."""
        self._setns("gateway")
        try:
            v6 = ":" in orig[0]
            s = socket.socket(_family(orig[0]), socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(
                *(
                    (socket.IPPROTO_IPV6, IPV6_TRANSPARENT)
                    if v6
                    else (socket.IPPROTO_IP, IP_TRANSPARENT)
                ),
                1,
            )
            s.bind(orig)
            return s
        finally:
            self._setns("payload")

    def tcp(self, host: str, port: int, listener: str | None = None) -> dict[str, Any]:
        addr: Address = (host, port, 0, self.eth0) if host.startswith("fe80") else (host, port)
        c = socket.socket(_family(host), socket.SOCK_STREAM)
        c.settimeout(WAIT)
        start = time.perf_counter()
        outcome = _outcome(lambda: c.connect(addr))
        out: dict[str, Any] = {"outcome": outcome, "ms": (time.perf_counter() - start) * 1000}
        if outcome == "ok" and listener:
            srv = self.ls[listener]
            srv.settimeout(WAIT)
            try:
                a, _ = srv.accept()
            except TimeoutError:
                out["accepted"] = None
            else:
                with a:
                    out["accepted"] = _fmt(a.getsockname())
                    c.sendall(b"up")
                    got_up = a.recv(16)
                    a.sendall(b"down")
                    out["data"] = [got_up.decode(), c.recv(16).decode()]
        c.close()
        return out

    def udp(self, host: str, port: int, size: int = 5, reply: bool = True) -> dict[str, Any]:
        """Send one datagram on a connected socket; report which listener got it, with
        what original destination, and whether a reply from that destination reached
        the sender: sent by the listener with IP_PKTINFO when it is bound to the
        original port (DNS on 53), else by a per-flow socket bound to it."""
        c = socket.socket(_family(host), socket.SOCK_DGRAM)
        c.connect((host, port))
        out: dict[str, Any] = {"send": _outcome(lambda: c.send(b"q" * size))}
        udp = {n: s for n, s in self.ls.items() if s.type == socket.SOCK_DGRAM}
        ready = select.select(list(udp.values()), [], [], WAIT if reply else NOTHING)[0]
        out["got"] = None
        for name, s in udp.items():
            if s in ready:
                data, anc, _, src = s.recvmsg(65536, 256)
                out.update(got=name, size=len(data), orig=_orig_dst(anc), src=_fmt(src))
                if reply and out["orig"] and s.getsockname()[1] == port:
                    # DNS: the listener answers, from the address asked (IP_PKTINFO).
                    s.sendmsg([b"answer"], [self._pktinfo(host)], 0, src)
                    out["reply_from"] = "listener"
                elif reply and out["orig"]:
                    with self.flow_socket((host, port)) as f:
                        f.sendto(b"answer", src)
                    out["reply_from"] = "flow socket"
        c.settimeout(WAIT if reply and out["got"] else NOTHING)
        out["recv"] = _outcome(lambda: out.__setitem__("reply", c.recv(64).decode()))
        c.close()
        return out

    @staticmethod
    def _pktinfo(orig: str) -> tuple[int, int, bytes]:
        if ":" in orig:
            return (
                socket.IPPROTO_IPV6,
                IPV6_PKTINFO,
                socket.inet_pton(socket.AF_INET6, orig) + struct.pack("=i", 0),
            )
        return (
            socket.IPPROTO_IP,
            IP_PKTINFO,
            struct.pack("=i4s4s", 0, socket.inet_aton(orig), bytes(4)),
        )

    def ping(self, host: str) -> dict[str, Any]:
        v6 = ":" in host
        proto = socket.IPPROTO_ICMPV6 if v6 else socket.IPPROTO_ICMP
        out: dict[str, Any] = {}
        try:
            p = socket.socket(_family(host), socket.SOCK_DGRAM, proto)
        except OSError as e:
            return {"socket": errno.errorcode.get(e.errno or 0, str(e))}
        with p:
            p.connect((host, 0))
            p.send(struct.pack("!BBHHH", 128 if v6 else 8, 0, 0, 0, 1) + b"boxy")
            p.settimeout(WAIT)
            out["recv"] = _outcome(lambda: out.__setitem__("reply", p.recv(64).hex()))
        return out

    def queued(self) -> dict[str, int]:
        """Whatever still waits on a listener was never meant to get through."""
        left: dict[str, int] = {}
        for name, s in self.ls.items():
            if name == "nflog":  # holds the refusals' reports, by design: counted apart
                continue
            s.setblocking(False)
            n = 0
            while True:
                try:
                    if s.type == socket.SOCK_STREAM:
                        s.accept()[0].close()
                    else:
                        s.recv(65536)
                except BlockingIOError:
                    break
                n += 1
            if n:
                left[name] = n
        return left


def _in_fork(fn: Any) -> dict[str, Any]:
    """Run fn in a child (a step changes the namespaces of whoever calls it); report the
    error it raised and the fds it left open."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            before = set(os.listdir("/proc/self/fd"))
            try:
                fn()
                out: dict[str, object] = {"error": None}
            except Exception as e:
                out = {"error": f"{type(e).__name__}: {e}"}
            out["leaked"] = sorted(set(os.listdir("/proc/self/fd")) - before)
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return cast(dict[str, Any], json.loads(data))


def _ahead(netns: Any, loaded: str, planned: str) -> None:
    """A spare's network made ahead with LOADED (boxyd/stage2/__main__.py,
    prepare_network), then the plan's ruleset PLANNED applied to it."""
    gw = netns.enter_gateway_netns(loaded)
    netns.enter_payload_netns(gw, keep_gateway=True)
    netns.apply_ruleset(gw, planned)


def _gateway_view(ipr: Any) -> dict[str, Any]:
    links = {m["index"]: m.get_attr("IFLA_IFNAME") for m in ipr.link("dump")}
    routes = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for r in ipr.route("dump", family=family, table=254):  # main
            routes.append(f"{r.get_attr('RTA_DST') or 'default'}/{r['dst_len']}")
    ll = [
        a.get_attr("IFA_ADDRESS")
        for a in ipr.addr("dump", family=socket.AF_INET6)
        if a.get_attr("IFA_ADDRESS", "").startswith("fe80")
    ]
    return {"links": sorted(links.values()), "main_routes": routes, "link_local": ll}


def child(root: str) -> dict[str, Any]:
    sys.path.insert(0, root)
    start = time.perf_counter()
    from pyroute2 import IPRoute

    report: dict[str, Any] = {"pyroute2_import_ms": (time.perf_counter() - start) * 1000}

    from boxy.errors import SetupError
    from boxyd.net import ruleset
    from boxyd.stage2 import namespaces, netns, nft, protocol

    rules_json = ruleset.gateway_ruleset(
        mode="allowlist",
        deny_v4=DENY_V4,
        deny_v6=DENY_V6,
        except_v4=EXCEPT_V4,
        except_v6=EXCEPT_V6,
        tcp_ports=TCP_PORTS,
        bound=BOUND,
    )
    rules = json.dumps(rules_json)  # as the plan carries it (boxyd/plan/ops.py, Outer)
    report["errors"] = {"no_userns": _in_fork(lambda: netns.enter_gateway_netns(rules))}
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    bogus = {
        "rule": {
            "family": "inet",
            "table": "boxy",
            "chain": "input",
            "comment": "bogus",
            "expr": [
                {"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": "@nosuchset"}},
                {"accept": None},
            ],
        }
    }
    bad = json.dumps({"nftables": [*rules_json["nftables"], bogus]})
    report["errors"]["bad_ruleset"] = _in_fork(lambda: netns.enter_gateway_netns(bad))
    other = json.dumps(
        ruleset.gateway_ruleset(
            mode="public", deny_v4=DENY_V4, deny_v6=DENY_V6, except_v4=[], except_v6=[]
        )
    )
    report["errors"]["ahead_same"] = _in_fork(lambda: _ahead(netns, rules, rules))
    report["errors"]["ahead_other"] = _in_fork(lambda: _ahead(netns, rules, other))
    t0 = time.perf_counter()
    gw = netns.enter_gateway_netns(rules)
    t1 = time.perf_counter()
    report["step2_ms"] = (t1 - t0) * 1000
    with (
        open("/proc/sys/net/ipv4/ip_forward") as f4,
        open("/proc/sys/net/ipv6/conf/all/forwarding") as f6,
    ):
        report["forwarding"] = [f4.read().strip(), f6.read().strip()]
    # A batch whose second command fails must leave nothing behind (one transaction).
    half = {
        "nftables": [
            {"table": {"family": "inet", "name": "half"}},
            {
                "rule": {
                    "family": "inet",
                    "table": "boxy",
                    "chain": "input",
                    "comment": "x",
                    "expr": [
                        {
                            "match": {
                                "op": "==",
                                "left": {"meta": {"key": "mark"}},
                                "right": "@nosuchset",
                            }
                        },
                        {"accept": None},
                    ],
                }
            },
        ]
    }
    report["nft"] = {}
    for name, batch in (
        ("bad", half),
        ("delete_half", {"nftables": [{"delete": {"table": {"family": "inet", "name": "half"}}}]}),
    ):
        try:
            nft.apply(batch)
            report["nft"][name] = "loaded"
        except SetupError as e:
            report["nft"][name] = str(e)
    probe = IPRoute(groups=0)  # the test's own window into the gateway netns
    gateway_ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    t2 = time.perf_counter()
    netns.enter_payload_netns(gw)
    report["step3_ms"] = (time.perf_counter() - t2) * 1000
    report["released"] = [gw.rtnl is None, gw.netns_fd]
    report["gateway"] = _gateway_view(probe)
    here = IPRoute(groups=0)  # the payload netns's
    report["mtu"] = {
        "gw0": probe.link("get", ifname="gw0")[0].get_attr("IFLA_MTU"),
        "eth0": here.link("get", ifname="eth0")[0].get_attr("IFLA_MTU"),
    }
    here.close()
    probe.close()

    # Step 4, received as boxyd does; from here on only the received fds are used.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    netns.send_listeners(ours, gw)
    msg, fds = protocol.receive(theirs)
    got = protocol.decode_report(msg, len(fds))
    assert isinstance(got, protocol.Listeners)
    names = list(got.names)
    report["step4"] = {
        "names": names,
        "fds": len(fds),
        "closed": [s.fileno() for s in gw.listeners().values()],
    }
    listeners = {n: socket.socket(fileno=fd) for n, fd in zip(names, fds, strict=True)}
    payload_ns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    sb = Sandbox(listeners, socket.if_nametoindex("eth0"), gateway_ns, payload_ns)

    report["tcp"] = {
        "public4": sb.tcp(PUBLIC4, 443, "tcp4"),
        "public6": sb.tcp(PUBLIC6, 443, "tcp6"),
        "excepted4": sb.tcp("192.168.77.5", 80, "tcp4"),
        "excepted6": sb.tcp("fd77::5", 80, "tcp6"),
        "dns4": sb.tcp("8.8.8.8", 53, "dns_tcp4"),
        "dns6": sb.tcp("2001:4860:4860::8888", 53, "dns_tcp6"),
        "dns_gateway": sb.tcp("10.0.2.2", 53, "dns_tcp4"),
    }
    refused = [
        "192.168.1.10:80",
        "169.254.169.254:80",
        "10.1.2.3:443",
        "100.64.0.1:443",
        "172.16.0.1:443",
        "[fd12::1]:80",
        "[64:ff9b::c0a8:10a]:80",
        "[2002:c0a8:10a::1]:80",
        "[::ffff:192.168.1.10]:80",
        f"{PUBLIC4}:22",
        "10.0.2.2:15001",
        "10.0.2.2:80",
        "10.0.2.2:15002",
        "[fd00::2]:15001",
        "[fd00::2]:443",
        *UNBOUND,
    ]
    refused += [f"[{ll}]:15001" for ll in report["gateway"]["link_local"]]
    report["refused"] = {}
    for target in refused:
        host, _, port = target.rpartition(":")
        report["refused"][target] = sb.tcp(host.strip("[]"), int(port))

    report["udp"] = {
        "dns4": sb.udp("8.8.8.8", 53),
        "dns_gateway": sb.udp("10.0.2.2", 53),
        "dns_lan": sb.udp("192.168.1.1", 53),
        "dns6": sb.udp("2001:4860:4860::8888", 53),
        "dns6_gateway": sb.udp("fd00::2", 53),
        "relay4": sb.udp(PUBLIC4, 9999),
        "relay6": sb.udp(PUBLIC6, 9999),
        "quic4": sb.udp(PUBLIC4, 443, reply=False),
        "quic6": sb.udp(PUBLIC6, 443, reply=False),
        "denied4": sb.udp("192.168.1.10", 9999, reply=False),
        "denied6": sb.udp("fd12::1", 9999, reply=False),
        "gateway_port": sb.udp("10.0.2.2", 15002, reply=False),
        "fragmented_dns4": sb.udp("8.8.8.8", 53, size=3000),
        "fragmented_dns6": sb.udp("2001:4860:4860::8888", 53, size=3000),
        "fragmented_relay4": sb.udp(PUBLIC4, 9999, size=3000),
        "fragmented_quic4": sb.udp(PUBLIC4, 443, size=3000, reply=False),
        "fragmented_denied4": sb.udp("192.168.1.10", 9999, size=3000, reply=False),
    }

    report["ping"] = {"socket": sb.ping(PUBLIC4)}  # as the payload finds it
    # ping_group_range is "1 0" in a new netns; open it to reach the ICMP rules themselves.
    with open("/proc/sys/net/ipv4/ping_group_range", "w") as f:
        f.write(f"{os.getgid()} {os.getgid()}")
    for host in (PUBLIC4, "10.0.2.2", PUBLIC6, "fd00::2"):
        report["ping"][host] = sb.ping(host)
    report["queued"] = sb.queued()
    report["refusals_reported"] = _refusals_reported(sb.ls["nflog"])
    report["refusals_counted"] = _refusals_counted(sb.ls["nftset"])
    return report


# ---------------------------------------------------------------------- the tests ---


@pytest.fixture(scope="module")
def report(user: User) -> dict[str, Any]:
    proc = user.run(
        [sys.executable, "-I", str(Path(__file__).resolve()), str(ROOT)], timeout=120, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    rep = cast(dict[str, Any], json.loads(proc.stdout.decode().splitlines()[-1]))
    print(
        f"\npyroute2 import {rep['pyroute2_import_ms']:.0f} ms, step 2 {rep['step2_ms']:.1f} ms,"
        f" step 3 {rep['step3_ms']:.1f} ms"
    )
    return rep


def test_the_veth_has_loopbacks_mtu_on_both_ends(report: dict[str, Any]) -> None:
    from boxyd.stage2.netns import VETH_MTU

    assert report["mtu"] == {"gw0": VETH_MTU, "eth0": VETH_MTU}


def test_forwarding_is_off_in_the_gateway(report: dict[str, Any]) -> None:
    assert report["forwarding"] == ["0", "0"]


def test_a_bad_ruleset_is_refused_whole_with_libnftables_words(report: dict[str, Any]) -> None:
    bad, delete = report["nft"]["bad"], report["nft"]["delete_half"]
    assert bad.startswith("gateway netns: nftables: the ruleset was not loaded: "), bad
    assert bad.endswith("(at command 2 of 2, rule 'x' in chain input)"), bad
    # The table of the failed batch's first command was never created.
    assert delete.startswith("gateway netns: nftables: "), delete
    assert "No such file or directory" in delete


def test_a_ruleset_loaded_ahead_serves_only_a_plan_with_that_very_ruleset(
    report: dict[str, Any],
) -> None:
    """A spare that loaded the last run's ruleset ahead: the same plan's is not loaded
    again; another plan's is refused, never loaded over it (it would merge into the
    sets loaded ahead: an --allow-cidr of the run before would be let through)."""
    assert report["errors"]["ahead_same"]["error"] is None, report["errors"]["ahead_same"]
    assert report["errors"]["ahead_other"]["error"] == (
        "SetupError: gateway netns: the ruleset loaded ahead is not the plan's"
    ), report["errors"]["ahead_other"]


def test_step2_without_a_user_namespace_says_so(report: dict[str, Any]) -> None:
    r = report["errors"]["no_userns"]
    assert r["error"] == (
        "SetupError: gateway netns: unshare(CLONE_NEWNET): Operation not permitted (errno 1)"
    )


def test_step2_with_a_bad_ruleset_stops_clearly_and_leaks_nothing(report: dict[str, Any]) -> None:
    r = report["errors"]["bad_ruleset"]
    assert r["error"].startswith(
        "SetupError: gateway netns: nftables: the ruleset was not loaded: "
    ), r
    assert r["error"].endswith("rule 'bogus' in chain input)"), r
    assert r["leaked"] == [], r  # netns fd, netlink socket: closed on the way out


def test_gateway_netns_is_an_island(report: dict[str, Any]) -> None:
    gw = report["gateway"]
    assert gw["links"] == ["gw0", "lo"]
    assert all(r != "default/0" for r in gw["main_routes"]), gw["main_routes"]
    assert len(gw["link_local"]) == 1, gw  # gw0's, dialled below


def test_step3_releases_the_gateway_netns(report: dict[str, Any]) -> None:
    assert report["released"] == [True, -1]


def test_step4_sends_every_listener_and_keeps_none(report: dict[str, Any]) -> None:
    s4 = report["step4"]
    assert s4["names"] == [
        "tcp4",
        "tcp6",
        "udp4",
        "udp6",
        "dns_udp4",
        "dns_udp6",
        "dns_tcp4",
        "dns_tcp6",
        "udp_reply4",
        "udp_reply6",
        "icmp4",
        "icmp6",
        "nflog",
        "nftset",
    ]
    assert s4["fds"] == 14
    assert s4["closed"] == [-1] * 14


@pytest.mark.parametrize(
    "case,orig",
    [
        ("public4", f"{PUBLIC4}:443"),
        ("public6", f"[{PUBLIC6}]:443"),
        ("excepted4", "192.168.77.5:80"),
        ("excepted6", "[fd77::5]:80"),
        ("dns4", "8.8.8.8:53"),
        ("dns6", "[2001:4860:4860::8888]:53"),
        ("dns_gateway", "10.0.2.2:53"),
    ],
)
def test_tcp_reaches_its_listener_with_the_original_destination(
    report: dict[str, Any], case: str, orig: str
) -> None:
    r = report["tcp"][case]
    assert r["outcome"] == "ok", r
    assert r["accepted"] == orig
    assert r["data"] == ["up", "down"]


@pytest.mark.parametrize(
    "target",
    [
        "192.168.1.10:80",
        "169.254.169.254:80",
        "10.1.2.3:443",
        "100.64.0.1:443",
        "172.16.0.1:443",
        "[fd12::1]:80",
        "[64:ff9b::c0a8:10a]:80",
        "[2002:c0a8:10a::1]:80",
        "[::ffff:192.168.1.10]:80",
        f"{PUBLIC4}:22",
        "10.0.2.2:15001",
        "10.0.2.2:80",
        "10.0.2.2:15002",
        "[fd00::2]:15001",
        "[fd00::2]:443",
        "link-local",
        *UNBOUND,
    ],
)
def test_static_denials_reset_at_syn_time(report: dict[str, Any], target: str) -> None:
    if target == "link-local":
        target = f"[{report['gateway']['link_local'][0]}]:15001"
    r = report["refused"][target]
    assert r["outcome"] == "ECONNREFUSED", r
    assert r["ms"] < 500, r  # a reset, not a timeout


def test_nothing_refused_was_accepted_or_received(report: dict[str, Any]) -> None:
    assert report["queued"] == {}


def test_refusals_are_reported_over_nflog(report: dict[str, Any]) -> None:
    got = {tuple(r) for r in report["refusals_reported"]}
    assert ("tcp", "192.168.1.10", 80) in got, got
    assert ("tcp", "169.254.169.254", 80) in got, got


def test_the_ruleset_counts_each_refusal_and_boxyd_can_read_the_count(
    report: dict[str, Any],
) -> None:
    """Under NFLOG's rate every refusal is reported, so the counter (what a flood's
    count rests on, boxyd.net.nftcounter) holds exactly as many."""
    reported = [r for r in report["refusals_reported"] if r[0] in ("tcp", "udp")]
    assert len(reported) > 20, report["refusals_reported"]
    assert report["refusals_counted"] == len(reported)


@pytest.mark.parametrize(
    "case,listener,orig",
    [
        ("dns4", "dns_udp4", "8.8.8.8:53"),
        ("dns_gateway", "dns_udp4", "10.0.2.2:53"),
        ("dns_lan", "dns_udp4", "192.168.1.1:53"),
        ("dns6", "dns_udp6", "[2001:4860:4860::8888]:53"),
        ("dns6_gateway", "dns_udp6", "[fd00::2]:53"),
        ("relay4", "udp4", f"{PUBLIC4}:9999"),
        ("relay6", "udp6", f"[{PUBLIC6}]:9999"),
        ("fragmented_dns4", "dns_udp4", "8.8.8.8:53"),
        ("fragmented_dns6", "dns_udp6", "[2001:4860:4860::8888]:53"),
        ("fragmented_relay4", "udp4", f"{PUBLIC4}:9999"),
    ],
)
def test_udp_reaches_its_listener_and_replies_come_from_the_destination(
    report: dict[str, Any], case: str, listener: str, orig: str
) -> None:
    r = report["udp"][case]
    assert (r["got"], r["orig"]) == (listener, orig), r
    assert r["size"] == (3000 if case.startswith("fragmented") else 5)
    assert r.get("reply") == "answer", r
    assert r["reply_from"] == ("listener" if "dns" in case else "flow socket")


@pytest.mark.parametrize(
    "case,error",
    [
        ("quic4", "ECONNREFUSED"),
        ("quic6", "ECONNREFUSED"),  # port unreachable: QUIC falls back
        ("denied4", "EHOSTUNREACH"),
        ("denied6", "EACCES"),  # admin-prohibited
        ("gateway_port", "EHOSTUNREACH"),
        ("fragmented_quic4", "ECONNREFUSED"),
        ("fragmented_denied4", "EHOSTUNREACH"),
    ],
)
def test_refused_udp_gets_an_icmp_error_and_reaches_nothing(
    report: dict[str, Any], case: str, error: str
) -> None:
    r = report["udp"][case]
    assert r["got"] is None, r
    assert r["recv"] == error, r


def test_ping_sockets_are_closed_to_the_payload(report: dict[str, Any]) -> None:
    assert report["ping"]["socket"] == {"socket": "EACCES"}


@pytest.mark.parametrize("host", [PUBLIC4, "10.0.2.2", PUBLIC6, "fd00::2"])
def test_no_echo_reply_ever_returns(report: dict[str, Any], host: str) -> None:
    r = report["ping"][host]
    assert "reply" not in r, r
    assert r["recv"] in ("EHOSTUNREACH", "EACCES"), r  # refused at once, not a timeout


if __name__ == "__main__":
    print(json.dumps(child(sys.argv[1])))
    sys.stdout.flush()
    os._exit(0)  # the namespaces go with the process; skip interpreter shutdown
