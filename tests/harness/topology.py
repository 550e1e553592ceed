"""The test internet: two network namespaces, built as root, that nothing leaves.

    <prefix>-host   where boxyd under test runs (as the unprivileged test user):
                    lo, and veth bxt-up 192.168.77.2/24, fd77::2/64, default
                    routes v4+v6 via the fake internet; recorders on its
                    loopback (127.0.0.1, ::1, 127.0.0.53) and on its own address.
    <prefix>-net    the fake internet: veth bxt-dn 192.168.77.1, fd77::1 and
                    every server and recorder address on lo; no other route.
                    Runs the authoritative DNS server, HTTP/HTTPS/banner/UDP
                    servers and the recorders (fakenet/plan.py has the table).

nftables in <prefix>-net counts every packet from the host by destination (one
counter per recorder host, per special-purpose range, for public servers and in
total), and refuses at once (TCP reset, ICMP port unreachable) a packet for an
address nobody holds, so a probe fails fast instead of hanging. Both netns drop
anything leaving by an interface that is not lo or the topology veth, and forward
nothing. `ip netns exec <prefix>-host ...` sees /etc/netns/<prefix>-host/resolv.conf,
which names the fake DNS server.

    python -m tests.harness.topology up|down|status|check [--state DIR] [--prefix P]

`up` removes whatever an earlier run left, builds everything, writes
STATE/topology.json and ends with assert_isolated() on both namespaces. In code:
up() -> Topology, down(), assert_isolated(netns), and the Topology methods tests
use (exec_in_host, user_env, recorder_hits, range_hits, dns_queries, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tests.harness.fakenet import plan
from tests.harness.fakenet.ca import make_pki
from tests.harness.fakenet.dns import parse_query_log
from tests.harness.fakenet.events import read_events
from tests.harness.fakenet.serve import QUERY_LOG, RECORDER_LOG, SERVER_LOG

DEFAULT_PREFIX = "boxyt"
DEFAULT_STATE = Path("/run/boxyt")
REPO = Path(__file__).resolve().parents[2]
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
TABLE = "boxyt"  # the nftables table (family inet) in both namespaces
READY_TIMEOUT = 20.0
LINK_NETS = (
    ipaddress.ip_network(f"{plan.ROUTER_V4}/{plan.LINK_V4_LEN}", strict=False),
    ipaddress.ip_network(f"{plan.ROUTER_V6}/{plan.LINK_V6_LEN}", strict=False),
)

# Link-layer chatter of the host kernel itself (neighbour discovery, MLD): not an escape.
_ICMPV6_LINK = (
    "nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, "
    "nd-redirect, mld-listener-query, mld-listener-report, mld-listener-done, "
    "mld2-listener-report"
)


class TopologyError(RuntimeError):
    pass


class IsolationError(AssertionError):
    pass


def namespaces(prefix: str = DEFAULT_PREFIX) -> tuple[str, str]:
    """(host netns, fake-internet netns) for PREFIX."""
    return f"{prefix}-host", f"{prefix}-net"


def _run(argv: list[str], input: str | None = None) -> str:
    p = subprocess.run(argv, input=input, capture_output=True, text=True)
    if p.returncode != 0:
        raise TopologyError(f"{' '.join(argv[:6])} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def _in_ns(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def _exists(ns: str) -> bool:
    return (NETNS_DIR / ns).exists()


# --- building ----------------------------------------------------------------------


def _net_addrs() -> list[str]:
    """Every address that must be local in the fake internet (on its lo)."""
    addrs = [plan.RESOLVER_V4, plan.RESOLVER_V6]
    addrs += [a for s in plan.SERVERS for a in s.addrs]
    addrs += [
        a
        for r in plan.RECORDERS
        if r.where == "net"
        for a in r.addrs
        if a not in (plan.ROUTER_V4, plan.ROUTER_V6)
    ]
    return addrs


def _host_lo_addrs() -> list[str]:
    # 127.0.0.1 and ::1 come with lo; anything else in 127/8 is local anyway, but
    # adding it makes `ip addr` show what the recorders listen on.
    return [
        a
        for r in plan.RECORDERS
        if r.where == "host"
        for a in r.addrs
        if a.startswith("127.") and a != "127.0.0.1"
    ]


def _addr_line(addr: str, dev: str, plen: int | None = None) -> str:
    v6 = ":" in addr
    plen = plen if plen is not None else (128 if v6 else 32)
    return f"address add {addr}/{plen} dev {dev}" + (" nodad" if v6 else "")


def _build_links(host: str, net: str) -> None:
    _run(["ip", "-batch", "-"], input=f"netns add {host}\nnetns add {net}\n")
    _run(
        [
            "ip",
            "-n",
            host,
            "link",
            "add",
            plan.HOST_IF,
            "type",
            "veth",
            "peer",
            "name",
            plan.NET_IF,
            "netns",
            net,
        ]
    )
    net_lines = [
        "link set lo up",
        f"link set {plan.NET_IF} up",
        _addr_line(plan.ROUTER_V4, plan.NET_IF, plan.LINK_V4_LEN),
        _addr_line(plan.ROUTER_V6, plan.NET_IF, plan.LINK_V6_LEN),
    ]
    net_lines += [_addr_line(a, "lo") for a in _net_addrs()]
    _run(["ip", "-n", net, "-batch", "-"], input="\n".join(net_lines) + "\n")
    host_lines = [
        "link set lo up",
        f"link set {plan.HOST_IF} up",
        _addr_line(plan.HOST_V4, plan.HOST_IF, plan.LINK_V4_LEN),
        _addr_line(plan.HOST_V6, plan.HOST_IF, plan.LINK_V6_LEN),
        *[_addr_line(a, "lo") for a in _host_lo_addrs()],
        f"route add 0.0.0.0/0 via {plan.ROUTER_V4} dev {plan.HOST_IF}",
        f"route add ::/0 via {plan.ROUTER_V6} dev {plan.HOST_IF}",
    ]
    _run(["ip", "-n", host, "-batch", "-"], input="\n".join(host_lines) + "\n")


def _daddr(addrs: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """[("ip", "{a, b}"), ("ip6", "{c}")] for the families present."""
    out: list[tuple[str, str]] = []
    families: tuple[tuple[str, Callable[[str], bool]], ...] = (
        ("ip", lambda a: ":" not in a),
        ("ip6", lambda a: ":" in a),
    )
    for fam, pick in families:
        sel = [a for a in addrs if pick(a)]
        if sel:
            out.append((fam, "{ " + ", ".join(sel) + " }"))
    return out


def _guard(out_if: str) -> list[str]:
    """Chains both namespaces share: forward nothing, send only via lo and the veth."""
    return [
        "  counter leak { }",
        '  chain guard_fwd { type filter hook forward priority 0; policy drop; counter name "leak"; }',
        "  chain guard_out { type filter hook output priority 0; policy accept;",
        f'    oifname != {{ "lo", "{out_if}" }} counter name "leak" drop',
        "  }",
    ]


def net_ruleset() -> str:
    counters = ["total", "public"] + [r.counter for r in plan.RECORDERS if r.where == "net"]
    counters += [plan.range_counter(c) for c in plan.RANGES]
    rules = [
        f'iifname != "{plan.NET_IF}" return',
        f"icmpv6 type {{ {_ICMPV6_LINK} }} return",
        'counter name "total"',
    ]
    for fam, net in _daddr(list(plan.PUBLIC_NETS)):
        rules.append(f'{fam} daddr {net} counter name "public"')
    for rec in plan.RECORDERS:
        if rec.where == "net":
            rules += [
                f'{fam} daddr {s} counter name "{rec.counter}"' for fam, s in _daddr(rec.addrs)
            ]
    for cidr in plan.RANGES:
        fam = "ip6" if ":" in cidr else "ip"
        rules.append(f'{fam} daddr {cidr} counter name "{plan.range_counter(cidr)}"')
    # Nobody holds the address: refuse at once (forwarding is off, so the kernel would
    # drop it silently and a probe would hang until its timeout).
    rules += [
        "fib daddr type != { local, broadcast, multicast } meta l4proto tcp reject with tcp reset",
        "fib daddr type != { local, broadcast, multicast } reject with icmpx port-unreachable",
    ]
    return (
        "\n".join(
            [
                f"table inet {TABLE} {{",
                *[f"  counter {c} {{ }}" for c in counters],
                "  chain count_pre { type filter hook prerouting priority -300; policy accept;",
                *[f"    {r}" for r in rules],
                "  }",
                *_guard(plan.NET_IF),
                "}",
            ]
        )
        + "\n"
    )


def host_ruleset() -> str:
    recs = [r for r in plan.RECORDERS if r.where == "host"]
    rules = []
    for rec in recs:
        for proto, ports in (("tcp", rec.tcp), ("udp", rec.udp)):
            if not ports:
                continue
            pset = "{ " + ", ".join(map(str, ports)) + " }"
            rules += [
                f'iifname "lo" {fam} daddr {s} {proto} dport {pset} counter name "{rec.counter}"'
                for fam, s in _daddr(rec.addrs)
            ]
    return (
        "\n".join(
            [
                f"table inet {TABLE} {{",
                *[f"  counter {r.counter} {{ }}" for r in recs],
                "  chain count_in { type filter hook input priority -300; policy accept;",
                *[f"    {r}" for r in rules],
                "  }",
                *_guard(plan.HOST_IF),
                "}",
            ]
        )
        + "\n"
    )


def _load_nft(ns: str, ruleset: str) -> None:
    _run(
        _in_ns(ns, ["nft", "-f", "-"]),
        input=f"table inet {TABLE}\nflush table inet {TABLE}\n"
        f"delete table inet {TABLE}\n" + ruleset,
    )


def _write_resolv(ns: str) -> None:
    d = ETC_NETNS / ns
    d.mkdir(parents=True, exist_ok=True)
    (d / "resolv.conf").write_text(
        f"# boxy test internet ({ns}); removed by topology down\n"
        f"nameserver {plan.RESOLVER_V4}\nnameserver {plan.RESOLVER_V6}\n"
        "options timeout:1 attempts:2\n"
    )
    (d / "resolv.conf").chmod(0o644)


def _start_server(ns: str, role: str, state: Path) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "PYTHONPATH": str(REPO),
        "LANG": "C.UTF-8",
    }
    with open(state / f"serve-{role}.log", "wb") as log:
        return subprocess.Popen(
            _in_ns(
                ns,
                [
                    sys.executable,
                    "-m",
                    "tests.harness.fakenet.serve",
                    "--role",
                    role,
                    "--state",
                    str(state),
                ],
            ),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )


def _wait_ready(procs: dict[str, subprocess.Popen[bytes]], state: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    pending = dict(procs)
    while pending:
        for role, p in list(pending.items()):
            if (state / f"ready-{role}").exists():
                del pending[role]
            elif p.poll() is not None:
                tail = (state / f"serve-{role}.log").read_text(errors="replace")[-3000:]
                raise TopologyError(f"the {role} servers exited ({p.returncode}):\n{tail}")
        if pending and time.monotonic() > deadline:
            raise TopologyError(
                f"servers not ready after {READY_TIMEOUT:.0f} s: {sorted(pending)}"
                f" (see {state}/serve-*.log)"
            )
        if pending:
            time.sleep(0.01)


def _names_table() -> dict[str, dict[str, list[str] | int]]:
    out: dict[str, dict[str, list[str] | int]] = {}
    for owner, recs in plan.RECORDS.items():
        name = plan.ZONE[:-1] if owner == "@" else plan.fqdn(owner)
        entry: dict[str, list[str] | int] = {}
        for rdtype, ttl, text in recs:
            cast(list[str], entry.setdefault(rdtype, [])).append(text)
            entry["ttl"] = ttl
        out[name] = entry
    return out


def _describe(prefix: str, state: Path) -> dict[str, Any]:
    host, net = namespaces(prefix)
    return {
        "prefix": prefix,
        "namespaces": {"host": host, "net": net},
        "interfaces": {"host": plan.HOST_IF, "net": plan.NET_IF},
        "link": {
            "host_v4": plan.HOST_V4,
            "host_v6": plan.HOST_V6,
            "router_v4": plan.ROUTER_V4,
            "router_v6": plan.ROUTER_V6,
        },
        "dns": {
            "v4": plan.RESOLVER_V4,
            "v6": plan.RESOLVER_V6,
            "zone": plan.ZONE[:-1],
            "evil_zone": plan.EVIL_ZONE[:-1],
        },
        "ca": str(state / "ca.pem"),
        "names": _names_table(),
        "servers": {
            s.name: {
                "v4": s.v4,
                "v6": s.v6,
                "http": list(plan.HTTP_PORTS),
                "https": list(plan.HTTPS_PORTS),
                "banner": plan.BANNER_PORT,
                "udp_echo": list(plan.UDP_ECHO_PORTS),
            }
            for s in plan.SERVERS
        },
        "recorders": {
            r.name: {
                "where": r.where,
                "addrs": list(r.addrs),
                "tcp": list(r.tcp),
                "udp": list(r.udp),
                "dns": r.dns,
                "counter": r.counter,
            }
            for r in plan.RECORDERS
        },
        "ranges": {c: plan.range_counter(c) for c in plan.RANGES},
        "big": {"path": "/big", "size": plan.BIG_SIZE, "sha256_path": "/big.sha256"},
        "files": {
            "dns_queries": str(state / QUERY_LOG),
            "servers": str(state / SERVER_LOG),
            "recorders": str(state / RECORDER_LOG),
        },
    }


def up(state_dir: str | Path = DEFAULT_STATE, prefix: str = DEFAULT_PREFIX) -> Topology:
    """Build the topology (after removing any leftover of PREFIX) and return it."""
    if os.geteuid() != 0:
        raise TopologyError("the test internet is built as root (ip netns, nftables)")
    state = Path(state_dir).resolve()
    host, net = namespaces(prefix)
    down(prefix, state)
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # the test user reads ca.pem from here
    for f in (QUERY_LOG, SERVER_LOG, RECORDER_LOG):
        (state / f).unlink(missing_ok=True)
    try:
        make_pki(state, plan.CERTS, plan.CERT_IPS)
        for key in state.glob("*.key"):
            key.chmod(0o600)
        _build_links(host, net)
        _load_nft(net, net_ruleset())
        _load_nft(host, host_ruleset())
        _write_resolv(host)
        _write_resolv(net)
        procs = {
            "net": _start_server(net, "net", state),
            "host": _start_server(host, "host", state),
        }
        _wait_ready(procs, state)
        topo = Topology(state, _describe(prefix, state))
        (state / "topology.json").write_text(json.dumps(topo.info, indent=1) + "\n")
        topo.assert_isolated()
    except BaseException:
        down(prefix, state)
        raise
    return topo


# --- tearing down ------------------------------------------------------------------


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap our own children (the servers) so they vanish
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _kill_all_in(ns: str) -> None:
    """End every process whose netns is NS (our servers, a boxyd a test left behind)."""
    pids = [int(p) for p in _run(["ip", "netns", "pids", ns]).split()]
    for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        pids = [p for p in pids if _alive(p)]
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.01)
            pids = [p for p in pids if _alive(p)]
        if not pids:
            return
    raise TopologyError(f"processes in netns {ns} would not die: {pids}")


def down(prefix: str = DEFAULT_PREFIX, state_dir: str | Path | None = None) -> None:
    """Kill everything in the topology's namespaces and delete them (idempotent)."""
    for ns in namespaces(prefix):
        if _exists(ns):
            _kill_all_in(ns)
            _run(["ip", "netns", "del", ns])
        shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)
    with contextlib.suppress(OSError):
        ETC_NETNS.rmdir()  # only if we emptied it
    if state_dir is not None:
        for f in Path(state_dir).glob("ready-*"):
            f.unlink(missing_ok=True)


# --- checking ----------------------------------------------------------------------


def _json(argv: list[str]) -> Any:
    out = _run(argv).strip()
    return json.loads(out) if out else []


def _sibling(netns: str) -> tuple[str, str]:
    base, _, role = netns.rpartition("-")
    if role not in ("host", "net") or not base:
        raise IsolationError(f"{netns} is not a topology namespace (<prefix>-host or -net)")
    host, net = namespaces(base)
    return (net, plan.NET_IF) if role == "host" else (host, plan.HOST_IF)


def _isolation_problems(netns: str) -> list[str]:
    if not _exists(netns):
        return [f"netns {netns} does not exist"]
    peer_ns, peer_if = _sibling(netns)
    my_if = plan.HOST_IF if peer_if == plan.NET_IF else plan.NET_IF
    allowed = {"lo", my_if}
    problems: list[str] = []
    mine = os.stat(NETNS_DIR / netns).st_ino
    for ref in ("/proc/self/ns/net", "/proc/1/ns/net"):
        try:
            same = os.stat(ref).st_ino == mine
        except OSError:  # /proc/1 may be out of reach in a container
            continue
        if same:
            problems.append(f"{netns} is the same netns as {ref}")
    ids = {
        e.get("nsid"): e.get("name") for e in _json(["ip", "-n", netns, "-j", "netns", "list-id"])
    }
    peer_links = (
        {ln["ifname"]: ln for ln in _json(["ip", "-n", peer_ns, "-j", "link", "show"])}
        if _exists(peer_ns)
        else {}
    )
    for link in _json(["ip", "-n", netns, "-j", "-d", "link", "show"]):
        name = link["ifname"]
        if name not in allowed:
            problems.append(f"{netns}: unexpected interface {name}")
            continue
        if name == "lo":
            continue
        kind = link.get("linkinfo", {}).get("info_kind")
        where = ids.get(link.get("link_netnsid"))
        peer = peer_links.get(peer_if)
        if (
            kind != "veth"
            or where != peer_ns
            or peer is None
            or peer.get("ifindex") != link.get("link_index")
        ):
            problems.append(
                f"{netns}: {name} is not a veth to {peer_if} in {peer_ns} "
                f"(kind {kind}, peer netns {where!r})"
            )
    for fam in ("-4", "-6"):
        for r in _json(["ip", "-n", netns, "-j", fam, "route", "show", "table", "all"]):
            if r.get("type") in ("blackhole", "unreachable", "prohibit"):
                continue
            dev, via = r.get("dev"), r.get("gateway")
            if dev not in allowed:
                problems.append(f"{netns}: route {r.get('dst')} leaves by {dev}")
            if via and not any(ipaddress.ip_address(via) in n for n in LINK_NETS):
                problems.append(f"{netns}: route {r.get('dst')} via {via}, outside the topology")
    try:
        chains = {
            c["chain"]["name"]: c["chain"]
            for c in _json(_in_ns(netns, ["nft", "-j", "list", "table", "inet", TABLE]))["nftables"]
            if "chain" in c
        }
        rules = _run(_in_ns(netns, ["nft", "list", "chain", "inet", TABLE, "guard_out"]))
    except TopologyError as e:
        return [*problems, f"{netns}: no nftables guard: {e}"]
    if chains.get("guard_fwd", {}).get("policy") != "drop":
        problems.append(f"{netns}: the forward chain does not drop")
    if f'oifname != {{ "lo", "{my_if}" }}' not in rules or " drop" not in rules:
        problems.append(f"{netns}: the output guard rule is missing")
    return problems


def assert_isolated(netns: str) -> None:
    """Raise IsolationError unless NETNS (a topology namespace) has only lo and its veth
    to the other topology namespace, every route stays on them with gateways inside
    the topology link, and the nftables guard (no forwarding, output only via lo and
    the veth) is loaded. Call it before any network test."""
    problems = _isolation_problems(netns)
    if problems:
        raise IsolationError("the test topology is not isolated:\n  " + "\n  ".join(problems))


def status(prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ns in namespaces(prefix):
        if not _exists(ns):
            out[ns] = {"exists": False}
            continue
        pids = _run(["ip", "netns", "pids", ns]).split()
        out[ns] = {
            "exists": True,
            "pids": [int(p) for p in pids],
            "problems": _isolation_problems(ns),
        }
    return out


# --- the handle tests use ----------------------------------------------------------


@dataclass
class Topology:
    state_dir: Path
    info: dict[str, Any]

    @classmethod
    def load(cls, state_dir: str | Path = DEFAULT_STATE) -> Topology:
        state = Path(state_dir)
        try:
            info = json.loads((state / "topology.json").read_text())
        except FileNotFoundError:
            raise TopologyError(
                f"no topology in {state}: run `python -m tests.harness.topology up` (as root) first"
            ) from None
        return cls(state, info)

    @property
    def host_ns(self) -> str:
        return cast(str, self.info["namespaces"]["host"])

    @property
    def net_ns(self) -> str:
        return cast(str, self.info["namespaces"]["net"])

    @property
    def ca(self) -> Path:
        return Path(self.info["ca"])

    @property
    def dns_v4(self) -> str:
        return cast(str, self.info["dns"]["v4"])

    @property
    def dns_v6(self) -> str:
        return cast(str, self.info["dns"]["v6"])

    def server(self, name: str) -> dict[str, Any]:
        """A public server's entry: v4, v6, http/https/udp_echo ports, banner port."""
        return cast(dict[str, Any], self.info["servers"][name])

    def recorder(self, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], self.info["recorders"][name])

    def exec_in_host(self, argv: list[str]) -> list[str]:
        """ARGV run in the host netns (where boxyd runs), with the fake resolv.conf."""
        return _in_ns(self.host_ns, argv)

    def exec_in_net(self, argv: list[str]) -> list[str]:
        return _in_ns(self.net_ns, argv)

    def user_env(self, uid: int, gid: int) -> dict[str, str]:
        """Environment for `boxyctl` run as UID in the host netns. Runtime and state
        directories of its own, so boxyctl starts (and talks to) a boxyd inside the
        topology, never one left running in the machine's netns (the socket path is not
        per-netns), and its log is apart; the fake DNS server as that daemon's upstream."""
        base = self.state_dir / f"user-{uid}"
        for d in (base, base / "run", base / "state"):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chown(d, uid, gid)
        return {
            "XDG_RUNTIME_DIR": str(base / "run"),
            "XDG_STATE_HOME": str(base / "state"),
            "BOXY_UPSTREAM_DNS": self.dns_v4,
            # --secret NAME@HOST: boxyd's TLS to the host trusts the test internet's CA
            "BOXY_UPSTREAM_CA": str(self.ca),
        }

    def assert_isolated(self) -> None:
        problems = _isolation_problems(self.host_ns) + _isolation_problems(self.net_ns)
        if problems:
            raise IsolationError("the test topology is not isolated:\n  " + "\n  ".join(problems))

    # Records.

    def counters(self, where: str = "net") -> dict[str, int]:
        """Packet counts of every nftables counter in the 'net' or 'host' netns."""
        ns = self.net_ns if where == "net" else self.host_ns
        data = _json(_in_ns(ns, ["nft", "-j", "list", "counters", "table", "inet", TABLE]))
        return {
            c["counter"]["name"]: c["counter"]["packets"]
            for c in data["nftables"]
            if "counter" in c
        }

    def recorder_hits(self, name: str) -> int:
        """Packets that reached recorder NAME (any protocol, any port)."""
        rec = self.recorder(name)
        return self.counters(rec["where"])[rec["counter"]]

    def range_hits(self, cidr: str) -> int:
        """Packets from the host into special-purpose range CIDR (one of plan.RANGES)."""
        return self.counters("net")[self.info["ranges"][cidr]]

    def leaks(self) -> int:
        """Packets the guards dropped for trying to leave the topology (should stay 0)."""
        return self.counters("net")["leak"] + self.counters("host")["leak"]

    def recorder_events(self, name: str | None = None) -> list[dict[str, Any]]:
        """Connections/datagrams the recorder listeners logged (all, or NAME's)."""
        ev = read_events(self.state_dir / RECORDER_LOG)
        return [e for e in ev if name is None or e.get("recorder") == name]

    def server_events(self, server: str | None = None) -> list[dict[str, Any]]:
        """What the public servers logged: accept, http, tls-error, banner, udp."""
        ev = read_events(self.state_dir / SERVER_LOG)
        return [e for e in ev if server is None or e.get("server") == server]

    def dns_queries(self) -> list[dict[str, Any]]:
        """Every DNS query any server received: t, transport, qname (with the final
        dot), qtype, peer, server ("auth", or a recorder's name)."""
        try:
            return parse_query_log((self.state_dir / QUERY_LOG).read_text(errors="replace"))
        except FileNotFoundError:
            return []

    def reset_records(self) -> None:
        """Zero every counter and empty the logs (between tests)."""
        for ns in (self.net_ns, self.host_ns):
            _run(_in_ns(ns, ["nft", "reset", "counters", "table", "inet", TABLE]))
        for f in (QUERY_LOG, SERVER_LOG, RECORDER_LOG):
            with open(self.state_dir / f, "w"):
                pass

    def set_ipv6_default_route(self, on: bool) -> None:
        """Give or take the host netns's IPv6 default route (boxy drops AAAA without one)."""
        verb = "replace" if on else "del"
        argv = ["ip", "-n", self.host_ns, "-6", "route", verb, "default"]
        if on:
            argv += ["via", plan.ROUTER_V6, "dev", plan.HOST_IF]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0 and on:
            raise TopologyError(f"cannot restore the IPv6 default route: {p.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.harness.topology",
        description="Build or remove the boxy test internet.",
    )
    ap.add_argument("action", choices=("up", "down", "status", "check"))
    ap.add_argument("--state", type=Path, default=DEFAULT_STATE)
    ap.add_argument("--prefix", default=DEFAULT_PREFIX)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if args.action == "up":
        topo = up(args.state, args.prefix)
        print(
            f"up in {time.monotonic() - t0:.2f} s: {topo.host_ns} / {topo.net_ns}, "
            f"state {topo.state_dir}"
        )
    elif args.action == "down":
        down(args.prefix, args.state)
        print(f"down in {time.monotonic() - t0:.2f} s")
    elif args.action == "status":
        print(json.dumps(status(args.prefix), indent=1))
    else:
        for ns in namespaces(args.prefix):
            assert_isolated(ns)
        print("isolated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
