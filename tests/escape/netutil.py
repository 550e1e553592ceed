"""Helpers for the network escape tests: probe scripts run inside a sandbox in the test
internet (tests/harness/topology.py), one JSON line per probe, and a snapshot of what
the test internet saw while they ran.

Sandbox side — ``PRELUDE`` (stdlib only, prepended by ``write_script``) gives a probe
script these functions, each returning a dict with ``outcome``, ``errno`` and ``ms``:

    tcp(addr, port, timeout=1.0, send=HTTP_GET, scope="")  connect, send, read
        outcome: refused | denied | unreachable | timeout | error    (connect failed)
                 reset | closed | silent | answered                  (after connect)
    udp(addr, port, payload=b"boxy-probe", timeout=1.0, scope="")   connected socket
        outcome: reply (+ echo_ok) | refused | unreachable | denied | timeout | error
    dns(server, qname, qtype="A", tcp=False, timeout=1.5)
        outcome: answer | nxdomain | rcode:NAME, with rcode, addrs, texts (or a socket
        outcome as above)
    report(probe, result_or_outcome, escaped=False, **fields)
        prints {"probe": ..., "outcome": ..., "errno": ..., ...} and, when ESCAPED is
        true, a line "ESCAPED <probe> ..." — the only way that word is printed.

``errno`` is a name ("ECONNREFUSED") or null; ``ms`` the milliseconds until the
outcome was known. Host side: ``probe_workdir`` (a work directory for a module-scoped
fixture), ``install_ca``, ``write_script``, ``run_probes`` (assert isolation, reset the
records, run, snapshot) → ``NetRun``, ``parse_probes``, and ``stop_daemon``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import BIN, NetBoxy, User
from tests.harness.topology import Topology

PRELUDE = r'''
import errno, json, os, random, select, socket, struct, subprocess, sys, time

HTTP_GET = b"GET / HTTP/1.0\r\nHost: probe\r\nUser-Agent: boxy-probe\r\n\r\n"

def ename(e):
    n = getattr(e, "errno", None)
    return errno.errorcode.get(n, str(n)) if n is not None else type(e).__name__

_SOCK_OUTCOME = {"ECONNREFUSED": "refused", "EACCES": "denied", "EPERM": "denied",
                 "ENETUNREACH": "unreachable", "EHOSTUNREACH": "unreachable",
                 "EADDRNOTAVAIL": "unreachable", "ETIMEDOUT": "timeout",
                 "ECONNRESET": "reset", "EPIPE": "reset"}

def _fail(e, t0):
    name = ename(e)
    out = "timeout" if isinstance(e, (socket.timeout, TimeoutError)) else \
        _SOCK_OUTCOME.get(name, "error")
    return {"outcome": out, "errno": None if out == "timeout" else name, "ms": _ms(t0)}

def _ms(t0):
    return round((time.monotonic() - t0) * 1000, 1)

def _target(addr, port, scope=""):
    if ":" in addr:
        info = socket.getaddrinfo(f"{addr}%{scope}" if scope else addr, port,
                                  socket.AF_INET6, 0, 0, socket.AI_NUMERICHOST)
        return socket.AF_INET6, info[0][4]
    return socket.AF_INET, (addr, port)

def _open(addr, port, kind, timeout, scope="", t0=0.0):
    """(socket with TIMEOUT, sockaddr), or (None, the failure record)."""
    try:
        fam, sa = _target(addr, port, scope)
        s = socket.socket(fam, kind)
    except OSError as e:
        return None, _fail(e, t0)
    s.settimeout(timeout)
    return s, sa

def _connect(addr, port, timeout, scope="", t0=0.0):
    """(connected TCP socket, None), or (None, the failure record)."""
    s, sa = _open(addr, port, socket.SOCK_STREAM, timeout, scope, t0)
    if s is None:
        return None, sa
    try:
        s.connect(sa)
    except OSError as e:
        s.close()
        return None, _fail(e, t0)
    return s, None

def tcp(addr, port, timeout=1.0, send=HTTP_GET, scope=""):
    """Connect; then (unless SEND is None) send SEND and wait for the first bytes."""
    t0 = time.monotonic()
    s, failure = _connect(addr, port, timeout, scope, t0)
    if s is None:
        return failure
    connect_ms = _ms(t0)
    if send is None:
        s.close()
        return {"outcome": "connected", "errno": None, "ms": connect_ms}
    try:
        if send:
            s.sendall(send)
        data = s.recv(4096)
    except OSError as e:
        s.close()
        r = _fail(e, t0)
        if r["outcome"] == "timeout":
            r["outcome"] = "silent"
        r["connect_ms"] = connect_ms
        return r
    # The rest of a reply that came in more than one segment (headers, then the body),
    # without waiting out a server that keeps the connection open.
    s.settimeout(0.2)
    try:
        while data and len(data) < 8192:
            more = s.recv(4096)
            if not more:
                break
            data += more
    except OSError:
        pass
    finally:
        s.close()
    out = "answered" if data else "closed"
    return {"outcome": out, "errno": None, "ms": _ms(t0), "connect_ms": connect_ms,
            "data": data[:1000].decode("latin-1")}

def udp(addr, port, payload=b"boxy-probe", timeout=1.0, scope=""):
    """A connected UDP socket: send PAYLOAD, wait for one datagram or an ICMP error."""
    t0 = time.monotonic()
    s, sa = _open(addr, port, socket.SOCK_DGRAM, timeout, scope, t0)
    if s is None:
        return sa
    try:
        s.connect(sa)
        s.send(payload)
        data = s.recv(65535)
    except OSError as e:
        return _fail(e, t0)
    finally:
        s.close()
    return {"outcome": "reply", "errno": None, "ms": _ms(t0), "size": len(data),
            "echo_ok": data == payload}

_TYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "TXT": 16, "AAAA": 28, "ANY": 255}
_RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}

def _qwire(qname, qtype):
    qid = random.randrange(1 << 16)
    labels = b"".join(bytes([len(x)]) + x.encode() for x in qname.rstrip(".").split(".") if x)
    return qid, struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + \
        struct.pack("!HH", _TYPES[qtype], 1)

def _skip_name(msg, i):
    while True:
        n = msg[i]
        if n == 0:
            return i + 1
        if n & 0xC0 == 0xC0:
            return i + 2
        i += 1 + n

def _parse(msg, qid):
    rid, flags, qd, an = struct.unpack("!HHHH", msg[:8])
    if rid != qid:
        raise ValueError(f"answer id {rid} != query id {qid}")
    i = 12
    for _ in range(qd):
        i = _skip_name(msg, i) + 4
    addrs, texts = [], []
    for _ in range(an):
        i = _skip_name(msg, i)
        rtype, _cls, _ttl, rdlen = struct.unpack("!HHIH", msg[i:i + 10])
        rd = msg[i + 10:i + 10 + rdlen]
        i += 10 + rdlen
        if rtype == 1:
            addrs.append(socket.inet_ntop(socket.AF_INET, rd))
        elif rtype == 28:
            addrs.append(socket.inet_ntop(socket.AF_INET6, rd))
        elif rtype == 16:
            j = 0
            while j < len(rd):
                texts.append(rd[j + 1:j + 1 + rd[j]].decode("latin-1"))
                j += 1 + rd[j]
    return _RCODES.get(flags & 0xF, str(flags & 0xF)), addrs, texts

def dns(server, qname, qtype="A", tcp=False, timeout=1.5):
    """One query to SERVER:53 (any address: boxy intercepts port 53 to all of them)."""
    t0 = time.monotonic()
    qid, wire = _qwire(qname, qtype)
    try:
        fam, sa = _target(server, 53)
        s = socket.socket(fam, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
    except OSError as e:
        return _fail(e, t0)
    s.settimeout(timeout)
    try:
        s.connect(sa)
        if tcp:
            s.sendall(struct.pack("!H", len(wire)) + wire)
            head = b""
            while len(head) < 2:
                chunk = s.recv(2 - len(head))
                if not chunk:
                    return {"outcome": "closed", "errno": None, "ms": _ms(t0)}
                head += chunk
            size = struct.unpack("!H", head)[0]
            msg = b""
            while len(msg) < size:
                chunk = s.recv(size - len(msg))
                if not chunk:
                    return {"outcome": "closed", "errno": None, "ms": _ms(t0)}
                msg += chunk
        else:
            s.send(wire)
            msg = s.recv(65535)
        rcode, addrs, texts = _parse(msg, qid)
    except OSError as e:
        return _fail(e, t0)
    except (ValueError, IndexError, struct.error) as e:
        return {"outcome": "malformed", "errno": None, "ms": _ms(t0), "detail": str(e)}
    finally:
        s.close()
    out = {"NOERROR": "answer", "NXDOMAIN": "nxdomain"}.get(rcode, f"rcode:{rcode}")
    return {"outcome": out, "errno": None, "ms": _ms(t0), "rcode": rcode, "addrs": addrs,
            "texts": texts[:4]}

def report(probe, result, escaped=False, **fields):
    """One JSON line for PROBE; RESULT is a dict from tcp/udp/dns or an outcome string."""
    rec = {"probe": probe}
    rec.update(result if isinstance(result, dict) else {"outcome": result, "errno": None})
    rec.update(fields)
    print(json.dumps(rec, sort_keys=True), flush=True)
    if escaped:
        print(f"ESCAPED {probe} {rec.get('outcome')}", flush=True)
    return rec
'''


def write_script(workdir: Path, user: User, name: str, body: str) -> str:
    """PRELUDE + BODY as WORKDIR/NAME, owned by the test user; returns NAME (the sandbox
    runs in the work directory, so `python3 NAME` finds it)."""
    path = workdir / name
    path.write_text(PRELUDE + "\n" + body + "\n")
    user.chown(path)
    return name


def install_ca(topology: Topology, workdir: Path, user: User, name: str = "ca.pem") -> str:
    """Copy the test CA into WORKDIR for `curl --cacert`, `cafile=`, NODE_EXTRA_CA_CERTS."""
    dst = workdir / name
    shutil.copyfile(topology.ca, dst)
    user.chown(dst)
    return name


def mode_flags(mode: str, hosts: Iterable[str]) -> list[str]:
    """``--net public``, or allowlist mode allowing HOSTS."""
    if mode == "public":
        return ["--net", "public"]
    return ["--net", "allowlist", *(f"--allow-host={h}" for h in hosts)]


@contextlib.contextmanager
def probe_workdir(user: User, label: str) -> Iterator[Path]:
    """A work directory owned by the test user, for a module-scoped fixture (the
    conftest `workdir` fixture is function-scoped); removed afterwards."""
    base = user.home / "boxy-tests"
    base.mkdir(exist_ok=True)
    if os.getuid() == 0:
        os.chown(base, user.uid, user.gid)
    d = base / f"{label[:40]}-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    user.chown(d)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def parse_probes(stdout: bytes | str) -> dict[str, dict[str, Any]]:
    """probe name -> its JSON record. Other lines are ignored; a name reported twice is
    an error in the probe script."""
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "probe" in rec:
            if rec["probe"] in out:
                raise AssertionError(f"probe {rec['probe']!r} reported twice")
            out[rec["probe"]] = rec
    return out


@dataclass
class NetRun:
    """One sandbox run and what the test internet recorded while it ran (a snapshot
    taken the moment it ended, so later tests' resets cannot change it)."""

    proc: subprocess.CompletedProcess[bytes]
    seconds: float
    probes: dict[str, dict[str, Any]]
    net_counters: dict[str, int]
    host_counters: dict[str, int]
    dns_queries: list[dict[str, Any]]
    server_events: list[dict[str, Any]]
    recorder_events: list[dict[str, Any]]
    info: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def stdout(self) -> str:
        return self.proc.stdout.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.proc.stderr.decode(errors="replace")

    def escaped(self) -> list[str]:
        """Every line of output that says ESCAPED (stdout and stderr)."""
        return [ln for ln in (self.stdout + "\n" + self.stderr).splitlines() if "ESCAPED" in ln]

    def recorder_hits(self, name: str) -> int:
        rec = self.info["recorders"][name]
        counters = self.net_counters if rec["where"] == "net" else self.host_counters
        return counters[rec["counter"]]

    def range_hits(self, cidr: str) -> int:
        return self.net_counters[self.info["ranges"][cidr]]

    def describe(self, probe: str | None = None) -> str:
        """For assertion messages: the probe's record (or all), exit status, stderr."""
        head = (
            json.dumps(self.probes.get(probe), sort_keys=True)
            if probe
            else "\n".join(json.dumps(r, sort_keys=True) for r in self.probes.values())
        )
        return (
            f"{head}\n--- exit {self.proc.returncode} after {self.seconds:.1f} s"
            f"\n--- stderr\n{self.stderr[-2000:]}"
        )


def run_probes(
    topology: Topology, user: User, workdir: Path, *flags: str, cmd: list[str], timeout: float = 90
) -> NetRun:
    """`boxyctl run FLAGS -- CMD` as the test user in the topology, after asserting it
    is isolated and zeroing its records; returns the run with the records it left."""
    topology.assert_isolated()
    topology.reset_records()
    box = NetBoxy(user, workdir, topology)
    t0 = time.monotonic()
    proc = box.run(*flags, cmd=cmd, timeout=timeout)
    seconds = time.monotonic() - t0
    return NetRun(
        proc=proc,
        seconds=seconds,
        probes=parse_probes(proc.stdout),
        net_counters=topology.counters("net"),
        host_counters=topology.counters("host"),
        dns_queries=topology.dns_queries(),
        server_events=topology.server_events(),
        recorder_events=topology.recorder_events(),
        info=topology.info,
    )


def stop_daemon(topology: Topology, user: User) -> subprocess.CompletedProcess[bytes]:
    """`boxyctl daemon stop` for the test user's boxyd in the topology (the next run
    starts a fresh one): for a test that changed the host netns under it."""
    argv = [str(BIN / "boxyctl"), "daemon", "stop"]
    env = topology.user_env(user.uid, user.gid)
    return subprocess.run(
        topology.exec_in_host(user.cmd(argv, env)), capture_output=True, timeout=30
    )
