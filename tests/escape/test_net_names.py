"""Name-level network escapes, and what must keep working (issue 3, docs/design.md, "Network").

Every case runs real sandboxes through `boxyctl` as the test user inside the test
internet (tests/harness/topology.py). A probe script prints one JSON line per attempt
and `ESCAPED ...` only when an attack got through; each test asserts that nothing
escaped *and* the positive evidence: the refusal the design promises (a reset after
the first record, a refusal at SYN time), the far end never accepting the flow, the
recorders at zero, the upstream DNS server having been asked (so an empty answer is
boxy's filtering, not a name that never resolved).

One sandbox run serves many assertions (module-scoped fixtures; each run asserts the
topology is isolated first and snapshots what it recorded the moment it ends).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from boxyd.net.gateway import Limits
from tests.conftest import BIN, NetBoxy, User
from tests.escape.netutil import (
    NetRun,
    install_ca,
    mode_flags,
    parse_probes,
    probe_workdir,
    run_probes,
    write_script,
)
from tests.harness.fakenet import plan
from tests.harness.topology import Topology
from tests.unit import tlsbuild

pytestmark = pytest.mark.sandbox

WWW = plan.SERVER_BY_NAME["www"]
CDN = plan.SERVER_BY_NAME["cdn"]
OTHER = plan.SERVER_BY_NAME["other"]
PUBLIC = tuple(ipaddress.ip_network(n) for n in plan.PUBLIC_NETS)

# Appended to netutil.PRELUDE in every script here: TLS probes (SNI chosen freely,
# certificate checks only where a test wants the real thing), a DNS client that also
# shows the TC bit and HTTPS records, and ClientHello re-framing.
NETLIB = r'''
import collections, contextlib, hashlib, ipaddress, ssl, threading

CA = "ca.pem"
RESOLVER = "10.0.2.2"  # /etc/resolv.conf in the sandbox names the gateway
PUBLIC_NETS = [ipaddress.ip_network(n) for n in ("11.0.0.0/8", "2a0b:4000::/32")]

def public(addr):
    ip = ipaddress.ip_address(addr)
    return any(ip.version == n.version and ip in n for n in PUBLIC_NETS)

def client_ctx(verify):
    if verify:
        return ssl.create_default_context(cafile=CA)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx

def boxy_alert(data):
    """The 7 bytes boxy's gateway answers a refused ClientHello with: a fatal TLS
    access_denied alert (boxyd/net/denial.py), never a far end's."""
    return len(data) == 7 and data[:2] in (b"\x15\x03",) and data[3:] == b"\x00\x02\x02\x31"

def tls_fail(e, t0, stage):
    base = {"errno": None, "ms": _ms(t0), "stage": stage, "detail": str(e)[:160]}
    if isinstance(e, ssl.SSLError) and "ALERT_ACCESS_DENIED" in str(e):
        return {"outcome": "boxy-refused", **base}  # boxy's alert, after the ClientHello
    if isinstance(e, ssl.SSLCertVerificationError):
        return {"outcome": "cert-error", **base}  # the far end answered
    if isinstance(e, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return {"outcome": "closed", **base}
    if isinstance(e, ssl.SSLError):
        return {"outcome": "tls-error", **base}
    r = _fail(e, t0)
    r["stage"] = stage
    return r

def http_result(data, t0, **extra):
    head, _, body = data.partition(b"\r\n\r\n")
    status = None
    if head.startswith(b"HTTP/"):
        with contextlib.suppress(ValueError, IndexError):
            status = int(head.split(b" ", 2)[1])
    js = None
    with contextlib.suppress(ValueError):
        js = json.loads(body)
    refused = status == 403 and b"\r\nX-Boxy: refused" in head  # boxy's own 403
    outcome = "boxy-refused" if refused else "answered" if data else "closed"
    r = {"outcome": outcome, "errno": None, "ms": _ms(t0),
         "status": status, "body_len": len(body), **extra}
    if refused:
        r["said"] = body.decode(errors="replace")
    if isinstance(js, dict):
        r.update({"server": js.get("server"), "sni": js.get("sni"), "host": js.get("host"),
                  "family": js.get("family"), "port": js.get("port"), "path": js.get("path")})
    return r

def request(host, path="/"):
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()

def https(addr, port, sni, host=None, path="/", verify=False, timeout=3.0):
    """Connect, TLS with SNI (None: no SNI), GET PATH; the whole response."""
    t0 = time.monotonic()
    s, failure = _connect(addr, port, timeout, "", t0)
    if s is None:
        failure["stage"] = "connect"
        return failure
    try:
        t = client_ctx(verify).wrap_socket(s, server_hostname=sni)
    except OSError as e:
        s.close()
        return tls_fail(e, t0, "handshake")
    data = b""
    try:
        t.sendall(request(host or sni or addr, path))
        while chunk := t.recv(65536):
            data += chunk
    except OSError as e:
        if not data:
            t.close()
            return {**tls_fail(e, t0, "http"), "handshake": True}
    t.close()
    return http_result(data, t0, stage="http", handshake=True)

def plain(addr, port, host, path="/", timeout=3.0):
    """Plain HTTP with this Host header; the whole response."""
    t0 = time.monotonic()
    try:
        fam, sa = _target(addr, port)
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(sa)
    except OSError as e:
        r = _fail(e, t0)
        r["stage"] = "connect"
        return r
    data = b""
    try:
        s.sendall(request(host, path))
        while chunk := s.recv(65536):
            data += chunk
    except OSError as e:
        if not data:
            s.close()
            r = _fail(e, t0)
            r["stage"] = "http"
            return r
    s.close()
    return http_result(data, t0, stage="http")

QTYPES = {"A": 1, "CNAME": 5, "TXT": 16, "AAAA": 28, "HTTPS": 65}

def _name(msg, i):
    labels, jumped, end = [], False, None
    for _ in range(128):
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 == 0xC0:
            if not jumped:
                end = i + 2
            i, jumped = ((n & 0x3F) << 8) | msg[i + 1], True
            continue
        labels.append(msg[i + 1:i + 1 + n].decode("latin-1"))
        i += 1 + n
    return ".".join(labels), (end if jumped else i)

def _svcb(rd):
    prio = struct.unpack("!H", rd[:2])[0]
    target, i = _name(rd, 2)
    out = {"priority": prio, "target": target, "keys": [], "ipv4hint": [], "ipv6hint": []}
    while i + 4 <= len(rd):
        key, ln = struct.unpack("!HH", rd[i:i + 4])
        val = rd[i + 4:i + 4 + ln]
        i += 4 + ln
        out["keys"].append(key)
        if key == 4:
            out["ipv4hint"] += [socket.inet_ntop(socket.AF_INET, val[j:j + 4])
                                for j in range(0, len(val), 4)]
        elif key == 6:
            out["ipv6hint"] += [socket.inet_ntop(socket.AF_INET6, val[j:j + 16])
                                for j in range(0, len(val), 16)]
    return out

def dnsq(qname, qtype, tcp=False, server=RESOLVER, timeout=2.0):
    """One query, no EDNS (so 512 bytes over UDP). answers: [[type, value]]."""
    t0 = time.monotonic()
    qid = random.randrange(1 << 16)
    labels = b"".join(bytes([len(x)]) + x.encode() for x in qname.split("."))
    wire = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + \
        struct.pack("!HH", QTYPES[qtype], 1)
    try:
        fam, sa = _target(server, 53)
        s = socket.socket(fam, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
        s.settimeout(timeout)
        s.connect(sa)
        if tcp:
            s.sendall(struct.pack("!H", len(wire)) + wire)
            buf = b""
            while len(buf) < 2 or len(buf) < 2 + struct.unpack("!H", buf[:2])[0]:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionResetError(errno.ECONNRESET, "closed mid-answer")
                buf += chunk
            msg = buf[2:]
        else:
            s.send(wire)
            msg = s.recv(65535)
        s.close()
    except OSError as e:
        return _fail(e, t0)
    rid, flags, qd, an = struct.unpack("!HHHH", msg[:8])
    i = 12
    for _ in range(qd):
        i = _name(msg, i)[1] + 4
    answers = []
    for _ in range(an):
        i = _name(msg, i)[1]
        rtype, _cls, ttl, rdlen = struct.unpack("!HHIH", msg[i:i + 10])
        rd, i = msg[i + 10:i + 10 + rdlen], i + 10 + rdlen
        if rtype == 1:
            answers.append([rtype, socket.inet_ntop(socket.AF_INET, rd)])
        elif rtype == 28:
            answers.append([rtype, socket.inet_ntop(socket.AF_INET6, rd)])
        elif rtype == 5:
            answers.append([rtype, _name(msg, i - rdlen)[0]])
        elif rtype == 16:
            texts, j = [], 0
            while j < len(rd):
                texts.append(rd[j + 1:j + 1 + rd[j]].decode("latin-1"))
                j += 1 + rd[j]
            answers.append([rtype, texts])
        elif rtype == 65:
            answers.append([rtype, _svcb(rd)])
    rcode = {0: "NOERROR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED"}.get(flags & 0xF,
                                                                           str(flags & 0xF))
    return {"outcome": "answer" if rid == qid else "bad-id", "errno": None, "ms": _ms(t0),
            "rcode": rcode, "tc": bool(flags & 0x0200), "answers": answers}

def addrs_of(r):
    return [v for t, v in r.get("answers", []) if t in (1, 28)]

def resolve(name, family=0):
    try:
        return sorted({ai[4][0] for ai in socket.getaddrinfo(name, 443, family,
                                                             socket.SOCK_STREAM)})
    except socket.gaierror:
        return []

def client_hello(name, verify=True):
    """The ClientHello OpenSSL sends for NAME, and the TLS object to finish it with."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_ctx(verify).wrap_bio(incoming, outgoing, server_hostname=name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read(), tls, incoming, outgoing

def reframe(records, size):
    """The handshake bytes of RECORDS re-framed into TLS records of SIZE bytes."""
    hs, i, version = b"", 0, records[1:3]
    while i + 5 <= len(records):
        ln = int.from_bytes(records[i + 3:i + 5], "big")
        assert records[i] == 22, "not a handshake record"
        hs += records[i + 5:i + 5 + ln]
        i += 5 + ln
    return b"".join(bytes([22]) + version + len(hs[j:j + size]).to_bytes(2, "big")
                    + hs[j:j + size] for j in range(0, len(hs), size)), hs

def trickle(sock, data, seg, pause=0.002):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for j in range(0, len(data), seg):
        sock.sendall(data[j:j + seg])
        time.sleep(pause)
'''


# --- host side -------------------------------------------------------------------------


def script(workdir: Path, user: User, name: str, body: str) -> str:
    return write_script(workdir, user, name, NETLIB + "\n" + body)


def assert_clean(run: NetRun) -> None:
    """Nothing escaped, and the payload ran to its end."""
    assert not run.escaped(), run.describe()
    assert "DONE" in run.stdout, f"the probe script did not finish\n{run.describe()}"


def probe(run: NetRun, name: str) -> dict[str, Any]:
    rec = run.probes.get(name)
    assert rec is not None, f"probe {name!r} never ran\n{run.describe()}"
    return rec


def is_public(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return any(ip.version == n.version and ip in n for n in PUBLIC)


def audit_records(path: Path) -> list[dict[str, Any]]:
    assert path.exists(), f"--audit-log {path} was not written"
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))  # every line must be JSON
    return out


def upstream_asked(run: NetRun, qname: str, qtype: str | None = None) -> bool:
    return any(
        q["qname"].rstrip(".").lower() == qname
        and q["server"] == "auth"
        and (qtype is None or q["qtype"] in (qtype, "TYPE65" if qtype == "HTTPS" else ""))
        for q in run.dns_queries
    )


def events(run: NetRun, server: str, **match: object) -> list[dict[str, Any]]:
    return [
        e
        for e in run.server_events
        if e.get("server") == server and all(e.get(k) == v for k, v in match.items())
    ]


@dataclass
class Live:
    """A `boxyctl run` started in the background, its output lines time-stamped."""

    proc: subprocess.Popen[bytes]
    out: list[tuple[float, str]] = field(default_factory=list)
    err: list[tuple[float, str]] = field(default_factory=list)
    ended: float = 0.0
    _threads: list[threading.Thread] = field(default_factory=list)

    def _pump(self, stream: Any, into: list[tuple[float, str]]) -> None:
        for raw in iter(stream.readline, b""):
            into.append((time.time(), raw.decode(errors="replace").rstrip("\n")))

    def start(self) -> Live:
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            t = threading.Thread(target=self._pump, args=(stream, into), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_line(self, text: str, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.out):
                if text in line:
                    return t
            if self.proc.poll() is not None and not any(t.is_alive() for t in self._threads):
                return None
            time.sleep(0.02)
        return None

    def finish(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # only the process this test started
            rc = self.proc.wait(timeout=10)
        self.ended = time.time()
        for t in self._threads:
            t.join(timeout=5)
        return rc

    @property
    def stdout(self) -> str:
        return "\n".join(line for _, line in self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(line for _, line in self.err)


def start_run(topology: Topology, user: User, workdir: Path, *flags: str, cmd: list[str]) -> Live:
    box = NetBoxy(user, workdir, topology)
    argv = [str(BIN / "boxyctl"), "run", *flags, "--", *cmd]
    proc = subprocess.Popen(
        topology.exec_in_host(user.cmd(argv, box.env())),
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return Live(proc).start()


@contextlib.contextmanager
def probe_dir(topology: Topology, user: User, label: str) -> Iterator[Path]:
    with probe_workdir(user, label) as d:
        install_ca(topology, d, user)
        yield d


# --- DNS rebinding -----------------------------------------------------------------------

REBIND = (
    "rebind-lan",
    "rebind-lo",
    "rebind-meta",
    "rebind-mixed",
    "rebind-cgnat",
    "rebind-ula",
    "rebind-nat64",
    "rebind-6to4",
    "rebind-teredo",
    "rebind-mapped",
    "rebind-cname",
    "svc-rebind",
)
# Where the rebinding answers point: each dialled directly must fail at once.
REBIND_TARGETS = (
    plan.LAN_HOST,
    "127.0.0.1",
    "::1",
    plan.METADATA_V4,
    plan.METADATA_V6,
    plan.CGNAT_HOST,
    plan.ULA_HOST,
    plan.NAT64_LAN,
    plan.SIXTOFOUR_LAN,
    plan.TEREDO_LAN,
    plan.MAPPED_LAN,
)
REBIND_RECORDERS = (
    "lan",
    "metadata",
    "cgnat",
    "ula",
    "nat64",
    "sixtofour",
    "teredo",
    "host_loopback",
    "host_resolver",
    "host_ifaddr",
    "router",
)

REBIND_BODY = r"""
NAMES = %(names)r
TARGETS = %(targets)r
for n in NAMES:
    fq = n + ".boxy.test"
    for qt in ("A", "AAAA"):
        r = dnsq(fq, qt)
        bad = [a for a in addrs_of(r) if not public(a)]
        report(f"dns-{n}-{qt}", r, escaped=bool(bad), addrs=addrs_of(r))
    got = resolve(fq)
    bad = [a for a in got if not public(a)]
    report(f"gai-{n}", "addrs" if got else "noaddr", escaped=bool(bad), addrs=got)
    for a in bad:  # only reached if a private answer came through
        r = tcp(a, 80)
        report(f"gai-connect-{n}-{a}", r, escaped=r["outcome"] == "answered")
r = dnsq("svc-rebind.boxy.test", "HTTPS")
hints = [h for t, v in r.get("answers", []) if t == 65 for h in v["ipv4hint"] + v["ipv6hint"]]
report("svc-rebind-https", r, escaped=any(not public(h) for h in hints), hints=hints)
for a in TARGETS:
    r = tcp(a, 80)
    report(f"direct-{a}", r, escaped=r["outcome"] == "answered")
for a in resolve("rebind-mixed.boxy.test"):
    r = https(a, 443, "rebind-mixed.boxy.test", verify=True)
    report(f"mixed-{a}", r)
print("DONE", flush=True)
"""


@pytest.fixture(scope="module", params=["allowlist", "public"])
def rebind_run(request: pytest.FixtureRequest, topology: Topology, user: User) -> Iterator[NetRun]:
    mode = request.param
    flags = mode_flags(mode, (f"{n}.boxy.test" for n in REBIND))
    with probe_dir(topology, user, f"rebind-{mode}") as wd:
        name = script(
            wd,
            user,
            "rebind.py",
            REBIND_BODY % {"names": list(REBIND), "targets": list(REBIND_TARGETS)},
        )
        yield run_probes(topology, user, wd, *flags, cmd=["python3", name])


@pytest.mark.parametrize("name", REBIND)
def test_rebinding_answers_are_removed(rebind_run: NetRun, name: str) -> None:
    """An allowed name answering into a denied range: the private answers are gone
    from what boxy's resolver returns (raw queries and getaddrinfo), though the
    upstream was asked (boxy filtered them; the name did resolve)."""
    assert_clean(rebind_run)
    fq = plan.fqdn(name)
    for qt in ("A", "AAAA"):
        rec = probe(rebind_run, f"dns-{name}-{qt}")
        assert rec["outcome"] == "answer", rebind_run.describe(f"dns-{name}-{qt}")
        addrs = [a for t, a in rec["answers"] if t in (1, 28)]
        assert all(is_public(a) for a in addrs), rebind_run.describe(f"dns-{name}-{qt}")
    gai = probe(rebind_run, f"gai-{name}")
    assert all(is_public(a) for a in gai["addrs"]), rebind_run.describe(f"gai-{name}")
    assert upstream_asked(rebind_run, fq), (
        f"the fake DNS server was never asked for {fq}: {rebind_run.dns_queries}"
    )


def test_rebinding_mixed_keeps_public_answers(rebind_run: NetRun) -> None:
    """rebind-mixed answers www's addresses and private ones: only the private ones
    go, and the public address still works end to end (v4 and v6)."""
    assert_clean(rebind_run)
    a = probe(rebind_run, "dns-rebind-mixed-A")
    aaaa = probe(rebind_run, "dns-rebind-mixed-AAAA")
    assert [v for t, v in a["answers"] if t == 1] == [WWW.v4], rebind_run.describe()
    assert [v for t, v in aaaa["answers"] if t == 28] == [WWW.v6], rebind_run.describe()
    assert sorted(probe(rebind_run, "gai-rebind-mixed")["addrs"]) == sorted(WWW.addrs)
    for addr in WWW.addrs:
        rec = probe(rebind_run, f"mixed-{addr}")
        assert rec["outcome"] == "answered" and rec["status"] == 200, rebind_run.describe()
        assert rec["server"] == "www" and rec["sni"] == "rebind-mixed.boxy.test", rec


def test_rebinding_svcb_hints_are_not_private(rebind_run: NetRun) -> None:
    """svc-rebind's HTTPS record carries ipv4hint/ipv6hint pointing at the LAN and a
    ULA: they are stripped (or the record dropped), never handed to the sandbox."""
    assert_clean(rebind_run)
    rec = probe(rebind_run, "svc-rebind-https")
    assert rec["outcome"] == "answer", rebind_run.describe("svc-rebind-https")
    assert all(is_public(h) for h in rec["hints"]), rebind_run.describe("svc-rebind-https")
    assert upstream_asked(rebind_run, "svc-rebind.boxy.test", "HTTPS"), rebind_run.dns_queries


@pytest.mark.parametrize("addr", REBIND_TARGETS)
def test_rebinding_targets_refused(rebind_run: NetRun, addr: str) -> None:
    """Dialling what the rebinding answers pointed at fails at once: refused at SYN
    time (or the sandbox's own empty loopback), or — for an encoding only boxyd
    decodes, such as Teredo — reset right after the gateway's handshake."""
    assert_clean(rebind_run)
    rec = probe(rebind_run, f"direct-{addr}")
    assert rec["outcome"] in ("refused", "reset"), rebind_run.describe(f"direct-{addr}")
    assert rec["ms"] < 500, rebind_run.describe(f"direct-{addr}")


def test_rebinding_recorders_silent(rebind_run: NetRun) -> None:
    """Nothing reached any rebinding target or any special-purpose range."""
    assert_clean(rebind_run)
    hits = {r: rebind_run.recorder_hits(r) for r in REBIND_RECORDERS}
    assert not any(hits.values()), f"recorders reached: {hits}\n{rebind_run.describe()}"
    ranges = {c: rebind_run.range_hits(c) for c in plan.RANGES}
    assert not any(ranges.values()), f"ranges reached: { {c: n for c, n in ranges.items() if n} }"
    assert rebind_run.recorder_events == [], rebind_run.recorder_events


# --- forged SNI and Host on a shared address -----------------------------------------------

SNI_BODY = r"""
# Before anything allowed is resolved: cdn-b (not allowed) and other are refused names.
report("resolve-cdn-b", dnsq("cdn-b.boxy.test", "A"))
report("resolve-other", dnsq("other.boxy.test", "A"))
report("gai-cdn-b", "addrs" if resolve("cdn-b.boxy.test") else "noaddr")

def attack(label, r):
    # A completed handshake, a certificate or an alert: the far end answered.
    report(label, r, escaped=r.get("handshake", False)
           or r["outcome"] in ("answered", "cert-error", "tls-error"))

# The shared address with no binding yet (only cdn-b was asked for, and refused).
attack("unbound-sni-cdn-a", https(CDN4, 443, "cdn-a.boxy.test"))
# An allowed name sent to a disallowed host's address (no binding at all).
attack("other-sni-www", https(OTHER4, 443, "www.boxy.test"))
attack("other-host-www", plain(OTHER4, 80, "www.boxy.test"))
report("gai-cdn-a", "addrs", addrs=resolve("cdn-a.boxy.test"))
report("gai-www", "addrs", addrs=resolve("www.boxy.test"))
attack("cdn-sni-cdn-b", https(CDN4, 443, "cdn-b.boxy.test"))
attack("cdn-sni-cdn-b-v6", https(CDN6, 443, "cdn-b.boxy.test"))
attack("cdn-host-cdn-b", plain(CDN4, 80, "cdn-b.boxy.test"))
attack("cdn-host-cdn-b-v6", plain(CDN6, 80, "cdn-b.boxy.test"))
attack("cdn-sni-www", https(CDN4, 443, "www.boxy.test"))
attack("cdn-host-www", plain(CDN4, 80, "www.boxy.test"))
attack("cdn-no-sni", https(CDN4, 443, None, host="cdn-a.boxy.test"))
attack("www-sni-cdn-a", https(WWW4, 443, "cdn-a.boxy.test"))
attack("www-host-cdn-a", plain(WWW4, 80, "cdn-a.boxy.test"))
attack("other-sni-www-after", https(OTHER4, 443, "www.boxy.test"))
# What must keep working on the same addresses.
report("ok-cdn-sni-cdn-a", https(CDN4, 443, "cdn-a.boxy.test", verify=True))
report("ok-cdn-host-cdn-a", plain(CDN4, 80, "cdn-a.boxy.test"))
report("ok-www-sni-www", https(WWW4, 443, "www.boxy.test", verify=True))
print("DONE", flush=True)
"""
SNI_ATTACKS = (
    "unbound-sni-cdn-a",
    "other-sni-www",
    "other-host-www",
    "cdn-sni-cdn-b",
    "cdn-sni-cdn-b-v6",
    "cdn-host-cdn-b",
    "cdn-host-cdn-b-v6",
    "cdn-sni-www",
    "cdn-host-www",
    "cdn-no-sni",
    "www-sni-cdn-a",
    "www-host-cdn-a",
    "other-sni-www-after",
)
UNBOUND_ATTACKS = ("unbound-sni-cdn-a", "other-sni-www", "other-host-www", "other-sni-www-after")


@dataclass
class AuditedRun:
    run: NetRun
    audit: list[dict[str, Any]]


@pytest.fixture(scope="module")
def sni_run(topology: Topology, user: User) -> Iterator[AuditedRun]:
    with probe_dir(topology, user, "forged-sni") as wd:
        consts = f"CDN4, CDN6, WWW4, OTHER4 = {CDN.v4!r}, {CDN.v6!r}, {WWW.v4!r}, {OTHER.v4!r}\n"
        name = script(wd, user, "sni.py", consts + SNI_BODY)
        audit = wd / "audit.jsonl"
        run = run_probes(
            topology,
            user,
            wd,
            "--net",
            "allowlist",
            "--allow-host",
            "cdn-a.boxy.test",
            "--allow-host",
            "www.boxy.test",
            "--audit-log",
            str(audit),
            cmd=["python3", name],
        )
        yield AuditedRun(run, audit_records(audit))


def test_forged_sni_names_refused(sni_run: AuditedRun) -> None:
    run = sni_run.run
    assert_clean(run)
    assert probe(run, "resolve-cdn-b")["rcode"] in ("NXDOMAIN", "REFUSED"), run.describe()
    assert probe(run, "gai-cdn-b")["outcome"] == "noaddr"
    assert not upstream_asked(run, "cdn-b.boxy.test"), "a refused name was sent upstream"


@pytest.mark.parametrize("attack", SNI_ATTACKS)
def test_forged_sni_reset(sni_run: AuditedRun, attack: str) -> None:
    """A name on the wire that is not bound to the destination address (a forged SNI
    or Host on a shared CDN address, an allowed name sent to another host's address,
    no SNI at all): the gateway reads the first record and refuses the flow, in words
    the client reads (TLS access_denied, HTTP 403), never dialling. An address
    with no binding at all (the shared one before its allowed name was resolved,
    another host's) is refused at the SYN: no handshake, no first record."""
    run = sni_run.run
    assert_clean(run)
    rec = probe(run, attack)
    # refused by name after the first record: told so in words (a TLS access_denied
    # alert, an HTTP 403: issue 34 §3); a first record that is neither, reset
    expected = "refused" if attack in UNBOUND_ATTACKS else "boxy-refused"
    assert rec["outcome"] == expected, run.describe(attack)


def test_forged_sni_never_dialled(sni_run: AuditedRun) -> None:
    """The far ends saw exactly the allowed flows: one TLS and one HTTP connection to
    the CDN address (cdn-a), one to www, none to other; no request named cdn-b."""
    run = sni_run.run
    assert_clean(run)
    for name in ("ok-cdn-sni-cdn-a", "ok-www-sni-www"):
        rec = probe(run, name)
        assert rec["outcome"] == "answered" and rec["status"] == 200, run.describe(name)
    assert probe(run, "ok-cdn-sni-cdn-a")["sni"] == "cdn-a.boxy.test"
    assert probe(run, "ok-cdn-host-cdn-a")["outcome"] == "answered", run.describe()
    assert len(events(run, "cdn", kind="accept")) == 2, events(run, "cdn")
    assert len(events(run, "www", kind="accept")) == 1, events(run, "www")
    assert events(run, "other") == [], events(run, "other")
    forged = [e for e in run.server_events if "cdn-b.boxy.test" in (e.get("sni"), e.get("host"))]
    assert forged == [], forged


def test_forged_sni_audited(sni_run: AuditedRun) -> None:
    """Each name-level refusal is in the audit log under net.sni, with a reason."""
    run = sni_run.run
    assert_clean(run)
    denials = [
        r
        for r in sni_run.audit
        if r.get("verdict") == "deny"
        and r.get("layer") == "net.sni"
        and r.get("sni") == "cdn-b.boxy.test"
    ]
    assert len(denials) >= 4, json.dumps(sni_run.audit, indent=0)[-4000:]
    assert all(r.get("reason") for r in denials), denials
    unbound = [r for r in sni_run.audit if r.get("verdict") == "deny" and r.get("addr") == OTHER.v4]
    assert len(unbound) == 3, json.dumps(sni_run.audit, indent=0)[-4000:]


# --- ports ------------------------------------------------------------------------------------

PORTS_BODY = r"""
WWW4 = %(www)r
CASES = %(cases)r  # case -> what must happen ("ok" or a refusal)
resolve("www.boxy.test")

def must_fail(case):
    return CASES[case] != "ok"

def banner(case, addr, port, send_first=None, wait=1.5):
    t0 = time.monotonic()
    try:
        s = socket.create_connection((addr, port), timeout=wait)
    except OSError as e:
        r = _fail(e, t0)
        r["stage"] = "connect"
        return report(case, r, banner="")
    data, echo = b"", b""
    try:
        if send_first:
            s.sendall(send_first)
        data = s.recv(4096)
        if data and not send_first:
            s.sendall(b"ping boxy\r\n")
            while b"ping boxy" not in echo:
                chunk = s.recv(4096)
                if not chunk:
                    break
                echo += chunk
        r = {"outcome": "answered" if data else "closed", "errno": None, "ms": _ms(t0)}
    except OSError as e:
        r = _fail(e, t0)
        if r["outcome"] == "timeout":
            r["outcome"] = "silent"
    s.close()
    return report(case, r, escaped=must_fail(case) and bool(data),
                  banner=data.decode(errors="replace"), echo=echo.decode(errors="replace"))

for case in CASES:
    kind, port = case.split("-")
    port = int(port)
    if kind == "tls":
        r = https(WWW4, port, "www.boxy.test")
        report(case, r, escaped=must_fail(case) and (r.get("handshake", False)
               or r["outcome"] in ("answered", "cert-error", "tls-error")))
    elif kind == "http":
        r = plain(WWW4, port, "www.boxy.test")
        report(case, r, escaped=must_fail(case) and r["outcome"] == "answered")
    elif kind == "banner":
        banner(case, WWW4, port)
    elif kind == "clientfirst":
        banner(case, WWW4, port, send_first=b"SSH-2.0-boxy_probe\r\n")
print("DONE", flush=True)
"""

# flags, cases to run, and what must happen to each (the rest are denials).
PORT_RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    "global": (
        ["--allow-host", "www.boxy.test"],
        {
            "tls-443": "ok",
            "http-80": "ok",
            "tls-8443": "refused",
            "http-8080": "refused",
            "banner-2222": "refused",
        },
    ),
    "explicit-8443": (
        ["--allow-host", "www.boxy.test:8443"],
        {"tls-8443": "ok", "tls-443": "refused"},
    ),
    "explicit-2222": (
        ["--allow-host", "www.boxy.test:2222"],
        {"banner-2222": "ok", "tls-443": "refused"},
    ),
    # The port is open globally, but only a host named with :2222 takes bytes that are
    # neither TLS nor HTTP: the binding alone must not let a server-first flow through.
    # (--allow-port replaces the default list, hence 443 again.)
    "global-2222": (
        ["--allow-host", "www.boxy.test", "--allow-port", "443", "--allow-port", "2222"],
        {"banner-2222": "no-banner", "clientfirst-2222": "reset", "tls-443": "ok"},
    ),
}


@pytest.fixture(scope="module")
def port_runs(topology: Topology, user: User) -> Iterator[dict[str, NetRun]]:
    out: dict[str, NetRun] = {}
    with probe_dir(topology, user, "ports") as wd:
        for label, (flags, cases) in PORT_RUNS.items():
            name = script(
                wd, user, f"ports-{label}.py", PORTS_BODY % {"www": WWW.v4, "cases": cases}
            )
            out[label] = run_probes(
                topology, user, wd, "--net", "allowlist", *flags, cmd=["python3", name]
            )
        yield out


@pytest.mark.parametrize(
    "label,case", [(label, case) for label, (_, cases) in PORT_RUNS.items() for case in cases]
)
def test_ports(port_runs: dict[str, NetRun], label: str, case: str) -> None:
    """A port not allowed to a host is refused (at SYN time or by Landlock), an
    explicitly allowed one works, a server-first protocol works on an explicitly
    allowed port (banner before the client says anything), and not otherwise."""
    run = port_runs[label]
    assert_clean(run)
    rec = probe(run, case)
    want = PORT_RUNS[label][1][case]
    if want == "ok":
        assert rec["outcome"] == "answered", run.describe(case)
        if case.startswith("banner"):
            assert rec["banner"].startswith("SSH-2.0-boxyt_www"), run.describe(case)
            assert "ping boxy" in rec["echo"], run.describe(case)
        else:
            assert rec["status"] == 200 and rec["server"] == "www", run.describe(case)
            assert rec["port"] == int(case.split("-")[1]), run.describe(case)
    elif want == "refused":
        assert rec["outcome"] in ("refused", "denied"), run.describe(case)
        assert rec.get("stage", "connect") == "connect", run.describe(case)
        port = int(case.split("-")[1])
        assert [e for e in run.server_events if e.get("port") == port] == [], run.server_events
    elif want == "no-banner":
        assert rec["banner"] == "" and rec["outcome"] in ("silent", "reset"), run.describe(case)
    else:
        assert rec["outcome"] == want, run.describe(case)


def test_ports_opaque_never_dialled(port_runs: dict[str, NetRun]) -> None:
    """With :2222 only in the global list, the banner server never saw a connection;
    with www.boxy.test:2222 it did (the positive control)."""
    assert events(port_runs["global-2222"], "www", kind="banner") == []
    assert len(events(port_runs["explicit-2222"], "www", kind="banner")) == 1


# --- fair share: clients that never finish their first record ---------------------------------

FAIR_BODY = r"""
WWW4 = %(www)r
resolve("www.boxy.test")
stalled = [socket.create_connection((WWW4, 443), timeout=5) for _ in range(%(pending)d)]
time.sleep(0.2)  # every one of them accepted and waiting
t0 = time.monotonic()
one_more = socket.create_connection((WWW4, 443), timeout=5)
stalled[0].settimeout(5)
try:
    outcome = "data" if stalled[0].recv(1) else "closed"
except ConnectionResetError:
    outcome = "reset"
except OSError as e:
    outcome = ename(e)
report("oldest", outcome, ms=_ms(t0))
stalled[1].settimeout(0.5)
try:
    outcome = "data" if stalled[1].recv(1) else "closed"
except socket.timeout:
    outcome = "waiting"
except OSError as e:
    outcome = ename(e)
report("second-oldest", outcome)
get = b"GET / HTTP/1.1\r\nHost: www.boxy.test\r\nConnection: close\r\n\r\n"
report("real", tcp(WWW4, 80, timeout=5, send=get))
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def fair_run(topology: Topology, user: User) -> Iterator[NetRun]:
    with probe_dir(topology, user, "fair") as wd:
        body = FAIR_BODY % {"www": WWW.v4, "pending": Limits().pending}
        name = script(wd, user, "fair.py", body)
        yield run_probes(
            topology, user, wd, "-v", "--net", "allowlist", "--allow-host", "www.boxy.test",
            cmd=["python3", name],
        )  # fmt: skip


def test_stalled_first_records_cannot_keep_a_sessions_connections_out(fair_run: NetRun) -> None:
    """A session's cap on connections still waiting for their first record: one
    more makes the oldest waiter go (reset at once, not after the 10 s timeout), the
    next oldest keeps waiting, and a real request gets through."""
    assert_clean(fair_run)
    oldest = probe(fair_run, "oldest")
    assert oldest["outcome"] == "reset", fair_run.describe("oldest")
    assert oldest["ms"] < 3000, fair_run.describe("oldest")
    assert probe(fair_run, "second-oldest")["outcome"] == "waiting", fair_run.describe()
    real = probe(fair_run, "real")
    assert real["outcome"] == "answered" and " 200 " in real["data"], fair_run.describe("real")
    assert "the oldest of too many connections waiting for their first record" in (
        fair_run.stderr
    ), fair_run.stderr


# --- an upstream that refuses -----------------------------------------------------------------

UPSTREAM_BODY = r"""
get = b"GET / HTTP/1.1\r\nHost: www.boxy.test\r\nConnection: close\r\n\r\n"
report("closed-port", tcp(%(www)r, 9, timeout=5, send=get))
report("open-port", tcp(%(www)r, 80, timeout=5, send=get))
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def upstream_run(topology: Topology, user: User) -> Iterator[tuple[NetRun, dict[str, Any]]]:
    with probe_dir(topology, user, "upstream") as wd:
        name = script(wd, user, "upstream.py", UPSTREAM_BODY % {"www": WWW.v4})
        netlog = wd / "net.json"
        run = run_probes(
            topology, user, wd, "--net", "public", "--net-log", str(netlog), cmd=["python3", name]
        )
        yield run, json.loads(netlog.read_text())


def test_an_upstream_that_refuses_resets_the_client_and_is_logged(
    upstream_run: tuple[NetRun, dict[str, Any]],
) -> None:
    """The gateway's dial is refused (nothing listens on www's port 9): the sandbox's
    connection, already accepted, is reset at once, as by the real peer, and the
    net log says why; the open port of the same host is relayed as usual."""
    run, doc = upstream_run
    assert_clean(run)
    assert probe(run, "closed-port")["outcome"] == "reset", run.describe("closed-port")
    assert probe(run, "open-port")["outcome"] == "answered", run.describe("open-port")
    conns = [dict(zip(doc["conn_fields"], row, strict=True)) for row in doc["conns"]]
    errors = [c for c in conns if c["verdict"] == "error"]
    assert [c["port"] for c in errors] == [9], conns
    assert doc["strings"][errors[0]["reason"]] == "upstream: Connection refused", doc
    assert [c["port"] for c in conns if c["verdict"] == "allow"] == [80], conns


# --- the ClientHello on the wire: split, ECH ----------------------------------------------------

WIRE_BODY = r"""
WWW4 = %(www)r
resolve("www.boxy.test")

def split_https(label, addr, name, rec_size, seg, verify):
    t0 = time.monotonic()
    hello, tls, incoming, outgoing = client_hello(name, verify)
    wire, hs = reframe(hello, rec_size)
    try:
        s = socket.create_connection((addr, 443), timeout=5)
    except OSError as e:
        return report(label, _fail(e, t0), stage="connect")
    data, handshaken = b"", False
    try:
        trickle(s, wire, seg)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                raise ssl.SSLEOFError("closed during the handshake")
            incoming.write(chunk)
            try:
                tls.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            if pending := outgoing.read():
                s.sendall(pending)
            if done:
                handshaken = True
                break
        tls.write(request(name))
        s.sendall(outgoing.read())
        while True:
            try:
                data += tls.read(65536)
                continue
            except ssl.SSLWantReadError:
                pass
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            chunk = s.recv(65536)
            if not chunk:
                break
            incoming.write(chunk)
    except OSError as e:
        r = tls_fail(e, t0, "handshake" if not data else "http")
        return report(label, r, escaped=ESCAPE.get(label, False)
                      and (handshaken or r["outcome"] in ("cert-error", "tls-error")),
                      handshake=handshaken, hello_len=len(hs), wire_len=len(wire))
    finally:
        s.close()
    r = http_result(data, t0, handshake=True, hello_len=len(hs), wire_len=len(wire))
    return report(label, r, escaped=ESCAPE.get(label, False))

def raw_hello(label, addr, path):
    with open(path, "rb") as f:
        hello = f.read()
    t0 = time.monotonic()
    try:
        s = socket.create_connection((addr, 443), timeout=3)
        trickle(s, hello, 64)
        data = s.recv(4096)
        outcome = "boxy-refused" if boxy_alert(data) else "answered" if data else "closed"
        r = {"outcome": outcome, "errno": None, "ms": _ms(t0), "first": data[:1].hex()}
    except OSError as e:
        r = _fail(e, t0)
        if r["outcome"] == "timeout":
            r["outcome"] = "silent"
    return report(label, r, escaped=ESCAPE.get(label, False) and r["outcome"] == "answered")

ESCAPE = {"split-other-16": True, "split-other-3": True, "ech-www": True}
split_https("split-www-16", WWW4, "www.boxy.test", 16, 7, True)
split_https("split-www-3", WWW4, "www.boxy.test", 3, 11, True)
split_https("split-other-16", WWW4, "other.boxy.test", 16, 7, False)
split_https("split-other-3", WWW4, "other.boxy.test", 3, 11, False)
raw_hello("ech-www", WWW4, "hello-ech.bin")
raw_hello("noech-www", WWW4, "hello-plain.bin")
print("DONE", flush=True)
"""


@pytest.fixture(scope="module")
def wire_run(topology: Topology, user: User) -> Iterator[AuditedRun]:
    with probe_dir(topology, user, "tls-wire") as wd:
        # A synthetic ClientHello naming an allowed host, with and without an
        # encrypted_client_hello extension: the only difference between the two.
        sni = tlsbuild.server_name(b"www.boxy.test")
        for fname, exts in (("hello-ech.bin", (sni, tlsbuild.ech())), ("hello-plain.bin", (sni,))):
            (wd / fname).write_bytes(tlsbuild.record(tlsbuild.client_hello(*exts)))
            user.chown(wd / fname)
        name = script(wd, user, "wire.py", WIRE_BODY % {"www": WWW.v4})
        audit = wd / "audit.jsonl"
        run = run_probes(
            topology,
            user,
            wd,
            "--net",
            "allowlist",
            "--allow-host",
            "www.boxy.test",
            "--audit-log",
            str(audit),
            cmd=["python3", name],
        )
        yield AuditedRun(run, audit_records(audit))


@pytest.mark.parametrize("label", ["split-www-16", "split-www-3"])
def test_split_client_hello_allowed_host_works(wire_run: AuditedRun, label: str) -> None:
    """A real ClientHello re-framed into 16- or 3-byte TLS records and sent in 7- or
    11-byte TCP segments: the name is still read, and the handshake completes end to
    end (the server accepts the fragmented record layer)."""
    run = wire_run.run
    assert_clean(run)
    rec = probe(run, label)
    assert rec["outcome"] == "answered" and rec["status"] == 200, run.describe(label)
    assert rec["server"] == "www" and rec["sni"] == "www.boxy.test", run.describe(label)


@pytest.mark.parametrize("label", ["split-other-16", "split-other-3"])
def test_split_client_hello_disallowed_host_reset(wire_run: AuditedRun, label: str) -> None:
    run = wire_run.run
    assert_clean(run)
    rec = probe(run, label)
    assert rec["outcome"] == "boxy-refused", run.describe(label)
    assert [e for e in run.server_events if e.get("sni") == "other.boxy.test"] == []
    denied = [
        r
        for r in wire_run.audit
        if r.get("verdict") == "deny"
        and r.get("sni") == "other.boxy.test"
        and r.get("layer") == "net.sni"
    ]
    assert len(denied) == 2, wire_run.audit


def test_ech_refused(wire_run: AuditedRun) -> None:
    """A ClientHello with encrypted_client_hello to an allowed host is reset, while the
    same hello without the extension reaches the server (it answers something)."""
    run = wire_run.run
    assert_clean(run)
    assert probe(run, "ech-www")["outcome"] == "boxy-refused", run.describe("ech-www")
    assert probe(run, "noech-www")["outcome"] == "answered", run.describe("noech-www")
    ech = [
        r for r in wire_run.audit if r.get("verdict") == "deny" and "ECH" in str(r.get("reason"))
    ]
    assert len(ech) == 1 and ech[0].get("layer") == "net.sni", wire_run.audit
    # Only the plain synthetic hello reached www beyond the two split handshakes.
    assert len(events(run, "www", kind="accept")) == 3, events(run, "www")


# --- a client that never finishes its ClientHello ------------------------------------------------

STALL_BODY = r"""
WWW4 = resolve("www.boxy.test", socket.AF_INET)[0]
hello = client_hello("www.boxy.test")[0]
N = %(n)d
stalled, errors = [], collections.Counter()
t_start = time.monotonic()
for i in range(N):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((WWW4, 443))
        s.sendall(hello[:10])
    except OSError as e:
        errors[ename(e)] += 1
        s.close()
        continue
    stalled.append((s, time.monotonic()))
report("stall-open", "opened", n=len(stalled), errors=dict(errors),
       ms=_ms(t_start))
time.sleep(0.5)
report("during", https(WWW4, 443, "www.boxy.test", verify=True, timeout=5))
poller = select.poll()
by_fd = {}
for s, t in stalled:
    poller.register(s.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    by_fd[s.fileno()] = (s, t)
kinds, waited = collections.Counter(), []
deadline = t_start + 16
while by_fd and time.monotonic() < deadline:
    for fd, _ev in poller.poll(200):
        s, t = by_fd.pop(fd)
        poller.unregister(fd)
        try:
            d = s.recv(100)
            kinds["eof" if not d else "data"] += 1
        except OSError as e:
            kinds[ename(e)] += 1
        waited.append(time.monotonic() - t)
        s.close()
report("stall-end", "ended", kinds=dict(kinds), left=len(by_fd),
       max_s=round(max(waited, default=0), 2), min_s=round(min(waited, default=0), 2),
       escaped=kinds.get("data", 0) > 0)
report("after", https(WWW4, 443, "www.boxy.test", verify=True, timeout=5))
print("DONE", flush=True)
"""
STALLED = 300


@pytest.fixture(scope="module")
def stall_run(topology: Topology, user: User) -> Iterator[NetRun]:
    with probe_dir(topology, user, "stall") as wd:
        name = script(wd, user, "stall.py", STALL_BODY % {"n": STALLED})
        yield run_probes(
            topology,
            user,
            wd,
            "--net",
            "allowlist",
            "--allow-host",
            "www.boxy.test",
            cmd=["python3", name],
            timeout=60,
        )


def test_stalled_client_hello_reset(stall_run: NetRun) -> None:
    """Clients that send 10 bytes of a ClientHello and stop: every one is reset (not
    left open, never relayed) within 15 s."""
    assert_clean(stall_run)
    opened = probe(stall_run, "stall-open")
    assert opened["n"] == STALLED, stall_run.describe("stall-open")
    end = probe(stall_run, "stall-end")
    assert end["left"] == 0 and end["kinds"] == {"ECONNRESET": STALLED}, stall_run.describe(
        "stall-end"
    )
    assert end["max_s"] < 15, stall_run.describe("stall-end")
    # Only the normal requests were dialled upstream, never a stalled flow.
    normal = sum(probe(stall_run, p)["outcome"] == "answered" for p in ("during", "after"))
    assert len(events(stall_run, "www", kind="accept")) == normal, events(stall_run, "www")


def test_stalled_clients_do_not_block_a_normal_request(stall_run: NetRun) -> None:
    """While 300 stalled ClientHellos are pending, a normal request in the same session
    still goes through: a stalled flow does not hold a slot a real one needs."""
    assert_clean(stall_run)
    rec = probe(stall_run, "during")
    assert rec["outcome"] == "answered" and rec["status"] == 200, stall_run.describe("during")


def test_stalled_clients_release_their_slots(stall_run: NetRun) -> None:
    assert_clean(stall_run)
    rec = probe(stall_run, "after")
    assert rec["outcome"] == "answered" and rec["status"] == 200, stall_run.describe("after")


# --- a connection flood in one session; a second session and the API keep working ---------------

FLOOD_BODY = r"""
WWW4 = resolve("www.boxy.test", socket.AF_INET)[0]
TARGETS = [(%(denied)r, 443), (WWW4, 443)]  # no binding (boxyd denies); allowed but silent
MIN, RATE, MAX_S, MAX_OPEN = %(min)d, %(rate)d, %(max_s)d, 4000
held, errors, attempts = collections.deque(), collections.Counter(), 0
linger = struct.pack("ii", 1, 0)
t0 = time.time()
report("flood-start", "started", t=t0)
while True:
    now = time.time()
    if now - t0 > MAX_S or (attempts >= MIN and os.path.exists("flood.stop")):
        break
    if attempts >= RATE * (now - t0):
        time.sleep(0.001)
        continue
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    err = s.connect_ex(TARGETS[attempts %% 2])
    errors[errno.errorcode.get(err, str(err))] += 1
    attempts += 1
    if attempts == RATE // 10:  # a tenth of a second in at full rate
        report("flood-going", "flooding", t=time.time())
    held.append(s)
    while len(held) > MAX_OPEN:
        held.popleft().close()
t1 = time.time()
for s in held:
    s.close()
report("flood-end", "ended", t=t1, attempts=attempts, errors=dict(errors),
       stopped=os.path.exists("flood.stop"))
print("DONE", flush=True)
"""

CALM_BODY = r"""
WWW4 = resolve("www.boxy.test", socket.AF_INET)[0]
for i in range(%(n)d):
    t = time.time()
    report(f"req-{i}", https(WWW4, 443, "www.boxy.test", verify=True, timeout=10), t=t)
print("DONE", flush=True)
"""
FLOOD_MIN = 10_000
CALM_REQUESTS = 20


@dataclass
class FloodResult:
    flood: Live
    flood_rc: int
    calm: subprocess.CompletedProcess[bytes]
    calm_probes: dict[str, dict[str, Any]]
    status_t: tuple[float, float]  # (asked, answered), time.time() as the sandbox's
    status: subprocess.CompletedProcess[bytes]
    describe: str
    netlog: dict[str, Any]  # the flood's --net-log


@pytest.fixture(scope="module")
def flood_run(topology: Topology, user: User) -> Iterator[FloodResult]:
    with probe_dir(topology, user, "flood") as wd:
        topology.assert_isolated()
        topology.reset_records()
        fname = script(
            wd,
            user,
            "flood.py",
            # max_s: a cap for a test that went wrong; the stop file ends it
            FLOOD_BODY % {"denied": OTHER.v4, "min": FLOOD_MIN, "rate": 20_000, "max_s": 120},
        )
        cname = script(wd, user, "calm.py", CALM_BODY % {"n": CALM_REQUESTS})
        flags = ("--net", "allowlist", "--allow-host", "www.boxy.test")
        netlog = ("--net-log", str(wd / "flood-net.json"))
        flood = start_run(topology, user, wd, *flags, *netlog, cmd=["python3", fname])
        try:
            going = flood.wait_line('"flood-going"', 30)
            assert going is not None, f"the flood never started\n{flood.stdout}\n{flood.stderr}"
            box = NetBoxy(user, wd, topology)
            status_argv = topology.exec_in_host(
                user.cmd([str(BIN / "boxyctl"), "daemon", "status"], box.env())
            )
            asked = time.time()
            status = subprocess.run(status_argv, capture_output=True, timeout=30)
            status_t = (asked, time.time())
            calm = box.run(*flags, cmd=["python3", cname], timeout=120)
        finally:
            (wd / "flood.stop").touch()
            rc = flood.finish(timeout=60)
        yield FloodResult(
            flood,
            rc,
            calm,
            parse_probes(calm.stdout),
            status_t,
            status,
            f"--- flood exit {rc}\n{flood.stdout[-3000:]}\n{flood.stderr[-3000:]}"
            f"\n--- second session exit {calm.returncode}\n"
            f"{calm.stdout.decode(errors='replace')[-3000:]}"
            f"\n{calm.stderr.decode(errors='replace')[-3000:]}",
            json.loads((wd / "flood-net.json").read_text()),
        )


def test_flood_really_flooded(flood_run: FloodResult) -> None:
    probes = parse_probes(flood_run.flood.stdout)
    end = probes.get("flood-end")
    assert flood_run.flood_rc == 0 and end is not None, flood_run.describe
    assert end["attempts"] >= FLOOD_MIN, flood_run.describe
    assert "ESCAPED" not in flood_run.flood.stdout + flood_run.flood.stderr


def test_flood_counted_exactly(flood_run: FloodResult) -> None:
    """Every refused SYN counts, past NFLOG's 1,000 reports a second (issue 33 §1:
    711,989 attempts were once recorded as 6,999). Half the flood's attempts go to
    an address with no binding, each refused at the SYN by the ruleset, once."""
    end = parse_probes(flood_run.flood.stdout)["flood-end"]
    doc = flood_run.netlog
    named = sum(row[2] for row in doc["summary"])
    denied = named + doc["unnamed"]
    assert doc["exact"] is True, doc["exact"]
    assert doc["unnamed"] > 0, "the flood stayed under the report rate: it tests nothing"
    # no fewer than the unbound half; no more than were made (the other half's are
    # the resets at the accept rate, each counted once)
    assert (end["attempts"] + 1) // 2 <= denied <= end["attempts"], (denied, flood_run.describe)
    assert "more connections refused past the report rate (counted, not named)" in (
        flood_run.flood.stderr
    ), flood_run.describe


def _during_the_flood(r: FloodResult, start: float, end: float) -> bool:
    """START..END (time.time(), the sandbox's clock as the host's) lies inside the
    flood at full rate, and the flood ran until the test stopped it (not its cap)."""
    fl = parse_probes(r.flood.stdout)
    return (
        fl["flood-going"]["t"] <= start
        and end <= fl["flood-end"]["t"]
        and fl["flood-end"]["stopped"] is True
    )


def test_flood_second_session_keeps_working(flood_run: FloodResult) -> None:
    """20 HTTPS requests from a second session, made while the first one floods, are
    all answered within their own 10 s timeout, each from start to end during the
    flood. (How fast they are under a flood is a figure, not a bound in a test.)"""
    r = flood_run
    assert r.calm.returncode == 0, r.describe
    reqs = [r.calm_probes.get(f"req-{i}") for i in range(CALM_REQUESTS)]
    assert all(q and q["outcome"] == "answered" and q["status"] == 200 for q in reqs), r.describe
    during = [_during_the_flood(r, q["t"], q["t"] + q["ms"] / 1000) for q in reqs if q]
    assert all(during), f"requests outside the flood: {during}\n{r.describe}"


def test_flood_api_answers(flood_run: FloodResult) -> None:
    """`boxyctl daemon status` is answered while the flood still runs: a daemon the
    flood starved would answer only after it ended (or after status's 30 s)."""
    r = flood_run
    assert r.status.returncode == 0, r.status
    assert b"running" in r.status.stdout, r.status.stdout
    assert _during_the_flood(r, *r.status_t), (r.status_t, r.describe)


# --- must keep working -----------------------------------------------------------------------

WORK_BODY = r"""
import hashlib, subprocess
MODE = %(mode)r
OTHER4, OTHER6 = %(other4)r, %(other6)r

def curl(*args, timeout=60):
    p = subprocess.run(["curl", "-sS", "--cacert", CA, "-m", str(timeout), *args],
                       capture_output=True)
    return p

def curl_json(label, *args, escaped_if_ok=False, **extra):
    p = curl(*args)
    try:
        js = json.loads(p.stdout)
    except ValueError:
        js = None
    if p.returncode == 0 and isinstance(js, dict):
        return report(label, "ok", escaped=escaped_if_ok, server=js.get("server"),
                      family=js.get("family"), tls=js.get("tls"), path=js.get("path"),
                      sni=js.get("sni"), host=js.get("host"), **extra)
    return report(label, "failed", rc=p.returncode, err=p.stderr.decode()[-300:], **extra)

# A long-lived connection, in the background while everything else runs.
slow = {}
def slow_get():
    t = time.monotonic()
    slow.update(https(resolve("www.boxy.test", socket.AF_INET)[0], 443, "www.boxy.test",
                      path="/slow?secs=5", verify=True, timeout=15))
    slow["elapsed"] = time.monotonic() - t
slow_thread = threading.Thread(target=slow_get)
slow_thread.start()

curl_json("https-v4", "-4", "https://www.boxy.test/")
curl_json("https-v6", "-6", "https://www.boxy.test/")
curl_json("http-v4", "-4", "http://www.boxy.test/")
curl_json("http-v6", "-6", "http://www.boxy.test/")
curl_json("redirect-https", "-L", "https://redirect.boxy.test/moved")
curl_json("redirect-http", "-L", "http://redirect.boxy.test/moved")
curl_json("wildcard", "https://foo.wild.boxy.test/")
curl_json("wildcard-deep", "http://a.b.wild.boxy.test/")  # the certificate covers one label

# 64 MiB, hashed as it streams, against the server's own digest.
p = subprocess.Popen(["curl", "-sS", "--cacert", CA, "-m", "120", "https://big.boxy.test/big"],
                     stdout=subprocess.PIPE)
h, n = hashlib.sha256(), 0
while chunk := p.stdout.read(1 << 20):
    h.update(chunk)
    n += len(chunk)
rc = p.wait()
want = curl("https://big.boxy.test/big.sha256").stdout.decode().strip()
report("big", "ok" if rc == 0 and h.hexdigest() == want and want else "failed", rc=rc,
       size=n, sha_ok=h.hexdigest() == want)

# 50 connections open at once (all handshakes done before any request is sent).
barrier = threading.Barrier(50, timeout=30)
results = []
def one(i):
    t0 = time.monotonic()
    try:
        s = socket.create_connection(("www.boxy.test", 443), timeout=20)
        t = client_ctx(True).wrap_socket(s, server_hostname="www.boxy.test")
        barrier.wait()
        t.sendall(request("www.boxy.test", f"/p{i}"))
        data = b""
        while chunk := t.recv(65536):
            data += chunk
        t.close()
        results.append(http_result(data, t0))
    except Exception as e:
        results.append({"outcome": type(e).__name__, "detail": str(e)[:100]})
threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
for t in threads:
    t.start()
for t in threads:
    t.join()
good = sum(1 for r in results if r.get("status") == 200 and r.get("server") == "www")
report("parallel-50", "ok" if good == 50 else "failed", good=good,
       bad=[r for r in results if r.get("status") != 200][:5])

# DNS over TCP: raw queries, glibc forced onto TCP, and a TXT answer too big for UDP.
r = dnsq("www.boxy.test", "A", tcp=True)
report("dns-tcp", "ok" if addrs_of(r) == [%(www4)r] else "failed", **{"r": r})
env = dict(os.environ, RES_OPTIONS="use-vc")
g = subprocess.run(["getent", "ahostsv4", "www.boxy.test"], capture_output=True, env=env)
report("dns-tcp-getent", "ok" if %(www4)r in g.stdout.decode() else "failed",
       out=g.stdout.decode()[:200], rc=g.returncode)
u = dnsq("txt.boxy.test", "TXT")
t = dnsq("txt.boxy.test", "TXT", tcp=True)
texts = [s for typ, v in t.get("answers", []) if typ == 16 for s in v]
report("dns-txt-truncated", "ok" if u.get("tc") else "failed", udp_tc=u.get("tc"),
       udp_rcode=u.get("rcode"))
report("dns-txt-tcp", "ok" if len(texts) == %(txt_n)d and all(len(x) == %(txt_len)d
                                                            for x in texts) else "failed",
       n=len(texts), tc=t.get("tc"), rcode=t.get("rcode"))

# By IP literal: public mode reaches public-looking addresses; allowlist must not.
curl_json("by-ip-v4", f"https://{OTHER4}/", escaped_if_ok=MODE == "allowlist")
curl_json("by-ip-v6", "-g", f"http://[{OTHER6}]/", escaped_if_ok=MODE == "allowlist")

slow_thread.join()
ok = slow.get("status") == 200 and slow.get("body_len") == 50 and slow["elapsed"] >= 4.5
report("slow", "ok" if ok else "failed", slow={k: slow.get(k) for k in (
    "outcome", "status", "body_len", "elapsed", "errno", "detail")})
print("DONE", flush=True)
"""

WORK_HOSTS = (
    "www.boxy.test",
    "redirect.boxy.test",
    "big.boxy.test",
    "txt.boxy.test",
    "*.wild.boxy.test",
)
# probe -> (server it must land on, extra fields that must match)
WORK_JSON: dict[str, tuple[str, dict[str, Any]]] = {
    "https-v4": ("www", {"family": 4, "tls": True}),
    "https-v6": ("www", {"family": 6, "tls": True}),
    "http-v4": ("www", {"family": 4, "tls": False}),
    "http-v6": ("www", {"family": 6, "tls": False}),
    "redirect-https": ("www", {"path": "/moved", "tls": True}),
    "redirect-http": ("www", {"path": "/moved", "tls": False}),
    "wildcard": ("wild", {"sni": "foo.wild.boxy.test"}),
    "wildcard-deep": ("wild", {"host": "a.b.wild.boxy.test", "tls": False}),
}
WORK_OTHER = (
    "big",
    "parallel-50",
    "dns-tcp",
    "dns-tcp-getent",
    "dns-txt-truncated",
    "dns-txt-tcp",
    "slow",
)


@pytest.fixture(scope="module", params=["allowlist", "public"])
def work_run(request: pytest.FixtureRequest, topology: Topology, user: User) -> Iterator[NetRun]:
    mode = request.param
    flags = mode_flags(mode, WORK_HOSTS)
    with probe_dir(topology, user, f"work-{mode}") as wd:
        body = WORK_BODY % {
            "mode": mode,
            "other4": OTHER.v4,
            "other6": OTHER.v6,
            "www4": WWW.v4,
            "txt_n": plan.TXT_STRINGS,
            "txt_len": plan.TXT_STRING_LEN,
        }
        name = script(wd, user, "work.py", body)
        run = run_probes(topology, user, wd, *flags, cmd=["python3", name], timeout=120)
        run.info = {**run.info, "mode": mode}
        yield run


@pytest.mark.parametrize("label", list(WORK_JSON))
def test_keeps_working_http(work_run: NetRun, label: str) -> None:
    """HTTP and HTTPS to an allowed name over v4 and v6, redirects across allowed
    names, a wildcard allow (with curl, as a real client would)."""
    assert_clean(work_run)
    rec = probe(work_run, label)
    server, extra = WORK_JSON[label]
    assert rec["outcome"] == "ok", work_run.describe(label)
    assert rec["server"] == server, work_run.describe(label)
    for k, v in extra.items():
        assert rec[k] == v, work_run.describe(label)


@pytest.mark.parametrize("label", WORK_OTHER)
def test_keeps_working(work_run: NetRun, label: str) -> None:
    """A 64 MiB download (sha256 checked), 50 connections at once, a 5 s connection,
    DNS over TCP (raw, glibc with use-vc, a TXT answer that truncates over UDP)."""
    assert_clean(work_run)
    rec = probe(work_run, label)
    assert rec["outcome"] == "ok", work_run.describe(label)
    if label == "big":
        assert rec["size"] == plan.BIG_SIZE and rec["sha_ok"], rec


def test_keeps_working_by_ip(work_run: NetRun) -> None:
    """Public mode reaches public-looking addresses by IP literal (v4 TLS, v6 HTTP);
    allowlist mode refuses them (no binding)."""
    assert_clean(work_run)
    v4, v6 = probe(work_run, "by-ip-v4"), probe(work_run, "by-ip-v6")
    if work_run.info["mode"] == "public":
        assert v4["outcome"] == "ok" and v4["server"] == "other", work_run.describe("by-ip-v4")
        assert v6["outcome"] == "ok" and v6["server"] == "other", work_run.describe("by-ip-v6")
        assert v6["family"] == 6
    else:
        assert v4["outcome"] == v6["outcome"] == "failed", work_run.describe()
        assert events(work_run, "other") == [], events(work_run, "other")


# --- output: --net-log, --audit-log, the destinations table, -v -----------------------------------

FORMAT_SCRIPT = r"""
set -u
curl -4 -sS --cacert ca.pem -o /dev/null https://www.boxy.test/ && echo ALLOWED-1
curl -4 -sS -o /dev/null http://www.boxy.test/ && echo ALLOWED-2
python3 -c '
import socket
try:
    s = socket.create_connection(("%(other)s", 443), timeout=3)
    s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
    print("ESCAPED" if s.recv(100) else "CLOSED")
except OSError as e:
    print("DENIED-3", e.__class__.__name__)
'
getent hosts other.boxy.test || echo NAME-REFUSED
echo MARK
sleep 3
echo DONE
"""


@dataclass
class FormatRun:
    live: Live
    rc: int
    netlog: dict[str, Any]
    audit: list[dict[str, Any]]
    mark: float | None
    report: dict[str, Any]  # --report's JSON
    show: str  # `boxyctl show ID` afterwards


@pytest.fixture(scope="module")
def format_run(topology: Topology, user: User) -> Iterator[FormatRun]:
    with probe_dir(topology, user, "formats") as wd:
        topology.assert_isolated()
        topology.reset_records()
        sh = wd / "formats.sh"
        sh.write_text(FORMAT_SCRIPT % {"other": OTHER.v4})
        user.chown(sh)
        netlog, audit, report = wd / "net.json", wd / "audit.jsonl", wd / "report.json"
        live = start_run(
            topology,
            user,
            wd,
            "--net",
            "allowlist",
            "--allow-host",
            "www.boxy.test",
            "-v",
            "--net-log",
            str(netlog),
            "--audit-log",
            str(audit),
            "--report",
            str(report),
            cmd=["sh", "formats.sh"],
        )
        mark = live.wait_line("MARK", 30)
        rc = live.finish(timeout=60)
        assert netlog.exists(), f"--net-log was not written\n{live.stdout}\n{live.stderr}"
        doc = json.loads(netlog.read_text())
        got = json.loads(report.read_text())
        show = [str(BIN / "boxyctl"), "show", str(got.get("id"))]
        shown = subprocess.run(
            topology.exec_in_host(user.cmd(show, NetBoxy(user, wd, topology).env())),
            capture_output=True,
            timeout=30,
        )
        yield FormatRun(live, rc, doc, audit_records(audit), mark, got, shown.stdout.decode())


def _strings(doc: dict[str, Any], i: int) -> str | None:
    return None if i == -1 else doc["strings"][i]


def test_net_log_format(format_run: FormatRun) -> None:
    """--net-log: version 1, the exact field list, interned strings, fixed-shape rows;
    2 allowed connections to www (443, 80) with bytes both ways, 1 denied (11.0.0.60,
    no binding), the resolution, and a summary that adds up."""
    r = format_run
    assert r.rc == 0 and "ESCAPED" not in r.live.stdout, r.live.stdout + r.live.stderr
    assert "ALLOWED-1" in r.live.stdout and "ALLOWED-2" in r.live.stdout, r.live.stdout
    assert "DENIED-3" in r.live.stdout and "NAME-REFUSED" in r.live.stdout, (
        r.live.stdout + r.live.stderr
    )
    doc = r.netlog
    assert doc["version"] == 1
    assert doc["conn_fields"] == [
        "t_ms",
        "proto",
        "verdict",
        "addr",
        "port",
        "host",
        "sni",
        "reason",
        "up",
        "down",
    ]
    strings = doc["strings"]
    assert all(isinstance(s, str) for s in strings) and len(set(strings)) == len(strings)
    rows = doc["conns"]
    for row in rows:
        assert len(row) == 10, row
        assert isinstance(row[0], int) and row[1] in ("tcp", "udp"), row
        for i in (3, 5, 6, 7):
            assert isinstance(row[i], int) and -1 <= row[i] < len(strings), row
    conns = [dict(zip(doc["conn_fields"], row, strict=True)) for row in rows]
    allowed = [c for c in conns if c["verdict"] == "allow"]
    denied = [c for c in conns if c["verdict"] == "deny"]
    assert len(conns) == 3 and len(allowed) == 2 and len(denied) == 1, json.dumps(doc)
    assert sorted(c["port"] for c in allowed) == [80, 443]
    for c in allowed:
        assert _strings(doc, c["addr"]) == WWW.v4 and _strings(doc, c["host"]) == "www.boxy.test"
        assert _strings(doc, c["sni"]) == "www.boxy.test" and c["up"] > 0 and c["down"] > 0, c
    d = denied[0]
    assert _strings(doc, d["addr"]) == OTHER.v4 and d["port"] == 443 and d["host"] == -1, d
    assert _strings(doc, d["reason"]), d
    assert WWW.v4 in doc["resolutions"].get("www.boxy.test", []), doc["resolutions"]
    summary = {row[0]: row for row in doc["summary"]}
    assert summary["www.boxy.test"][1:4] == [2, 0, 1], summary
    assert summary[OTHER.v4][1:4] == [1, 1, 1], summary
    sent = sum(c["up"] for c in allowed)
    assert summary["www.boxy.test"][4] == sent, (summary, allowed)
    assert "other.boxy.test" not in summary and doc["names_denied"]["other.boxy.test"] >= 1, doc
    assert (doc["unnamed"], doc["exact"]) == (0, True), doc


def test_audit_log_layers(format_run: FormatRun) -> None:
    """--audit-log: one JSON object per line; the DNS decisions (allowed www, refused
    other) under net.dns, each relayed connection's name check under net.sni, the
    unbound address's refusal with its reason."""
    audit = format_run.audit
    assert audit and all("layer" in r and "t" in r for r in audit), audit
    dns_allow = [
        r
        for r in audit
        if r["layer"] == "net.dns"
        and r.get("verdict") == "allow"
        and r.get("name") == "www.boxy.test"
    ]
    dns_deny = [
        r
        for r in audit
        if r["layer"] == "net.dns"
        and r.get("verdict") == "deny"
        and r.get("name") == "other.boxy.test"
    ]
    sni_allow = [r for r in audit if r["layer"] == "net.sni" and r.get("verdict") == "allow"]
    unbound = [r for r in audit if r.get("verdict") == "deny" and r.get("addr") == OTHER.v4]
    assert dns_allow and dns_deny, audit
    assert sorted(cast(int, r.get("port")) for r in sni_allow) == [80, 443], sni_allow
    assert (
        len(unbound) == 1 and unbound[0]["layer"].startswith("net.") and unbound[0].get("reason")
    ), unbound


def test_destinations_table(format_run: FormatRun) -> None:
    err = format_run.live.stderr.splitlines()
    head = [i for i, line in enumerate(err) if line.startswith("boxyctl: network destinations")]
    assert head, format_run.live.stderr
    i = head[-1]
    # where connections went; the name DNS refused is a name denied, not a destination
    # (issue 33 §1: names and connections counted apart), said on its own line
    assert err[i] == "boxyctl: network destinations (2)", err[i]
    assert err[i + 1].split() == ["DESTINATION", "CONNS", "DENIED", "ADDRS", "SENT", "RECEIVED"]
    rows = {line.split()[0]: line.split() for line in err[i + 2 : i + 4]}
    assert OTHER.v4 is not None
    assert rows["www.boxy.test"][1:4] == ["2", "0", "1"], rows
    assert rows[OTHER.v4][1:4] == ["1", "1", "1"], rows
    assert "other.boxy.test" not in rows, rows
    assert any("1 name not allowed" in line for line in err), format_run.live.stderr
    # --report (and the library's Result) has the same rows as objects, in the same order
    got = format_run.report["destinations"]
    assert [d["name"] for d in got] == [line.split()[0] for line in err[i + 2 : i + 4]], got
    www = next(d for d in got if d["name"] == "www.boxy.test")
    assert (www["connections"], www["denied"], www["addresses"]) == (2, 0, 1), www
    assert www["bytes_up"] > 0 and www["bytes_down"] > 0, www


def test_show_counts_names_and_connections_apart(format_run: FormatRun) -> None:
    """`show` said '45 connections, 45 denied' where the 45 were names (issue 33 §1)."""
    (line,) = [ln for ln in format_run.show.splitlines() if ln.startswith("network ")]
    assert line.startswith("network   3 connections (1 denied), 1 name denied, up "), (
        format_run.show
    )
    assert line.endswith(", 2 destinations"), line


def test_report_refusals_are_typed_rows(format_run: FormatRun) -> None:
    """--report's refusals (the library's Result.refusals): each kind once with its
    count, the layer, address, port and name, and the -v lines apart as notices."""
    rows = format_run.report["refusals"]
    unbound = [r for r in rows if r["addr"] == OTHER.v4]
    assert len(unbound) == 1 and unbound[0]["port"] == 443 and unbound[0]["count"] == 1, rows
    assert unbound[0]["layer"].startswith("net.") and unbound[0]["reason"], unbound
    name = [r for r in rows if r["host"] == "other.boxy.test" and r["layer"] == "net.dns"]
    assert name and name[0]["addr"] is None and name[0]["proto"] == "dns", rows
    notices = format_run.report["notices"]  # the run had -v
    assert any(OTHER.v4 in n for n in notices), notices


def _denial_lines(r: FormatRun) -> list[tuple[float, str]]:
    return [
        (t, line)
        for t, line in r.live.err
        if " deny " in line and not line.startswith("boxyctl: network destinations")
    ]


def test_verbose_denials_as_they_happen(format_run: FormatRun) -> None:
    """-v: each denial is on stderr while the run is still going (the payload sleeps 3 s
    after its last attempt: the lines must come before that)."""
    r = format_run
    assert r.mark is not None, r.live.stdout
    lines = _denial_lines(r)
    assert len(lines) >= 2, r.live.stderr  # the unbound address, the refused name
    late = [(round(r.live.ended - t, 2), line) for t, line in lines if t > r.live.ended - 2]
    assert not late, f"denials printed only at the end (seconds before exit, line): {late}"


def test_verbose_denials_name_what(format_run: FormatRun) -> None:
    """Each -v line says what was refused: the address and port, or the name."""
    lines = [line for _, line in _denial_lines(format_run)]
    assert OTHER.v4 is not None
    assert any(OTHER.v4 in line and "443" in line for line in lines), lines
    assert any("other.boxy.test" in line for line in lines), lines


STATIC_BODY = r"""
for a, port in ((%(lan)r, 443), (%(meta)r, 80)):
    r = tcp(a, port)
    report(f"static-{a}", r, escaped=r["outcome"] == "answered")
print("DONE", flush=True)
"""


@dataclass
class StaticRun:
    run: NetRun
    netlog: dict[str, Any]
    audit: list[dict[str, Any]]


@pytest.fixture(scope="module")
def static_run(topology: Topology, user: User) -> Iterator[StaticRun]:
    with probe_dir(topology, user, "static-denials") as wd:
        name = script(
            wd, user, "static.py", STATIC_BODY % {"lan": plan.LAN_HOST, "meta": plan.METADATA_V4}
        )
        netlog, audit = wd / "net.json", wd / "audit.jsonl"
        run = run_probes(
            topology,
            user,
            wd,
            "--net",
            "allowlist",
            "--allow-host",
            "www.boxy.test",
            "-v",
            "--net-log",
            str(netlog),
            "--audit-log",
            str(audit),
            cmd=["python3", name],
        )
        assert netlog.exists(), run.describe()
        yield StaticRun(run, json.loads(netlog.read_text()), audit_records(audit))


@pytest.mark.parametrize("addr,port", [(plan.LAN_HOST, 443), (plan.METADATA_V4, 80)])
def test_static_denial_reported(static_run: StaticRun, addr: str, port: int) -> None:
    """A range denial happens at SYN time in the gateway netns, before boxyd sees the
    flow: it must still reach the audit log (net.ip, with a reason), the net log (a
    deny row) and -v — and the recorder never saw a packet."""
    run = static_run.run
    assert_clean(run)
    assert probe(run, f"static-{addr}")["outcome"] == "refused", run.describe()
    audit = [r for r in static_run.audit if r.get("addr") == addr]
    assert [(r.get("layer"), r.get("verdict"), r.get("port")) for r in audit] == [
        ("net.ip", "deny", port)
    ], static_run.audit
    assert audit[0].get("reason"), audit
    doc = static_run.netlog
    rows = [dict(zip(doc["conn_fields"], row, strict=True)) for row in doc["conns"]]
    mine = [c for c in rows if _strings(doc, c["addr"]) == addr]
    assert [(c["verdict"], c["port"]) for c in mine] == [("deny", port)], doc
    assert any(addr in line and " deny " in line for line in run.stderr.splitlines()), run.stderr
    assert run.recorder_hits("lan") == run.recorder_hits("metadata") == 0
