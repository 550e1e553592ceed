#!/usr/bin/env python3
"""The network gateway against no gateway, in one run, inside a test internet of its own.

Builds the topology of tests/harness/topology.py under its own prefix (``boxyb``,
state in /run/boxyb: never the ``boxyt`` one the tests use), starts a small HTTP
source in the fake internet (sendfile from memory, so the server is not what is
measured), and runs one client script twice, side by side, as the unprivileged
test user in the topology's host netns: once directly, once inside
``boxyctl run --net public``. Phases alternate between the two, so drift hits both:

- bulk: one download of ``--size-mib`` MiB, timing only the transfer (Gbit/s);
  with boxyd's CPU seconds (utime + stime from /proc) per GB moved;
- conns: ``--conns`` sequential short HTTP requests by address (connections/s), in
  ``--chunks`` parts, direct and boxy alternating (as the latency runs are),
  with boxyd's CPU per connection. boxy caps a session's accept rate (500/s, burst
  1000: boxyd/net/gateway.py Limits), so past ~1000 connections the cap shows as
  failed connections rather than the gateway's speed;
- latency: ``--samples`` times (DNS lookup + connect + request + first byte) by
  name, back to back and then paced (as sporadic connections are, and under boxy's
  per-session DNS rate limit): medians per step, the 90th percentile, and what boxy
  adds at the median.

Targets (issue 3): bulk >= 3 Gbit/s and >= half of direct; < 1 ms added per new
connection at the median; issue 18's follow, as figures (bench/table.py): bulk >= 0.9x
direct, new connections/s >= 0.6x direct, <= 0.2 ms added per new connection back to
back, <= 0.2 ms of boxyd's CPU per connection. ``--json`` prints them as a JSON list
on stdout (the prose goes to stderr). Run as root: ``.venv/bin/python bench/net.py``.
Nothing here leaves the machine: every address is inside the bench's own netns.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pwd
import re
import select
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.table import Figure, at_least, emit  # noqa: E402
from boxyd.net.dnsproxy import BURST as DNS_BURST  # noqa: E402
from boxyd.net.dnsproxy import RATE as DNS_RATE  # noqa: E402
from tests.harness import topology as topo_mod  # noqa: E402
from tests.harness.fakenet import plan  # noqa: E402

BIN = Path(sys.executable).parent
PREFIX = "boxyb"
STATE = Path("/run/boxyb")
PORT = 8000  # on the "big" server's address; the fake web servers hold 80/443/8080/8443
PYTHON = "/usr/bin/python3"  # the same interpreter inside the sandbox and outside
PHASE_TIMEOUT = 60.0
PACE = 1.2 / DNS_RATE  # seconds between paced latency samples: under boxy's DNS rate limit
STARTUP_RUNS = 10
# issue 18's absolute targets per new connection (the ratios are in Report.figures)
ADDED_MS = 0.2  # added at the median, back to back
CPU_MS = 0.2  # of boxyd's CPU

# The source, run as root in the fake-internet netns. GET /bytes?n=N answers N bytes
# by sendfile() from a memfd (no copy through Python); anything else answers "ok".
SERVER = r"""
import os, socket, sys, threading
addr, port = sys.argv[1], int(sys.argv[2])
BLOCK = 16 << 20
mfd = os.memfd_create("bench")
os.write(mfd, os.urandom(1 << 20) * (BLOCK >> 20))

def serve(c):
    with c:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            d = c.recv(4096)
            if not d:
                return
            head += d
        path = head.split(b" ", 2)[1]
        if path.startswith(b"/bytes?n="):
            n = int(path[9:])
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n)
            while n:
                sent = os.sendfile(c.fileno(), mfd, 0, min(n, BLOCK))
                n -= sent
        else:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        c.shutdown(socket.SHUT_WR)
        while c.recv(4096):
            pass

s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port))
s.listen(1024)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# The client, stdlib only (it runs in the sandbox too). One command per stdin line,
# one JSON answer per line, so the bench can read boxyd's CPU between phases.
CLIENT = r"""
import json, socket, statistics, sys, time
name, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

def request(s, path):
    s.sendall(b"GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path.encode(), name.encode()))

def drain(s):
    while s.recv(65536):
        pass

def bulk(n):
    buf = memoryview(bytearray(1 << 20))
    s = socket.create_connection((addr, port))
    request(s, f"/bytes?n={n}")
    t0 = time.perf_counter()
    head = b""
    while b"\r\n\r\n" not in head:
        k = s.recv_into(buf)
        if not k:
            break
        head += bytes(buf[:k])
    got = len(head) - head.index(b"\r\n\r\n") - 4 if b"\r\n\r\n" in head else 0
    while got < n:
        k = s.recv_into(buf)
        if not k:
            break
        got += k
    dt = time.perf_counter() - t0
    s.close()
    return {"bytes": got, "seconds": dt}

def conns(n):
    ok = errors = 0
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            with socket.create_connection((addr, port), timeout=5) as s:
                request(s, "/")
                ok += s.recv(64).startswith(b"HTTP/1.1 200")
                drain(s)
        except OSError:
            errors += 1
    return {"n": n, "ok": ok, "errors": errors, "seconds": time.perf_counter() - t0}

def latency(n, pace):
    # Each sample: (total, DNS, connect, request to first byte) in ms. Paced, to stay
    # under boxy's per-session DNS rate limit (over it, queries are REFUSED).
    samples, errors = [], {}
    for _ in range(n):
        time.sleep(pace)
        t0 = time.perf_counter()
        try:
            ai = socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)[0]
            t1 = time.perf_counter()
            with socket.socket(ai[0], ai[1]) as s:
                s.settimeout(5)
                s.connect(ai[4])
                t2 = time.perf_counter()
                request(s, "/")
                first = s.recv(1)
                t3 = time.perf_counter()
                drain(s)
            if not first:
                raise ConnectionResetError("closed before the first byte")
            samples.append(((t3 - t0) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000, (t3 - t2) * 1000))
        except OSError as e:
            key = type(e).__name__ + (f" {e.errno}" if e.errno else "")
            errors[key] = errors.get(key, 0) + 1
    def med(i):
        return statistics.median(x[i] for x in samples) if samples else None
    total = sorted(x[0] for x in samples)
    return {"n": n, "errors": sum(errors.values()), "error_kinds": errors,
            "median_ms": med(0), "dns_ms": med(1), "connect_ms": med(2), "first_byte_ms": med(3),
            "p90_ms": total[int(len(total) * 0.9)] if total else None, "samples": samples}

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "latency":
        n, pace = arg.split(",")
        out = latency(int(n), float(pace))
    else:
        out = {"bulk": bulk, "conns": conns}[cmd](int(arg))
    print(json.dumps(out), flush=True)
"""


class BenchError(RuntimeError):
    pass


@dataclass
class Peer:
    """A running client (direct or sandboxed): one command in, one JSON line out."""

    label: str
    proc: subprocess.Popen

    def read(self, timeout: float = PHASE_TIMEOUT) -> dict:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise BenchError(
                f"{self.label}: no answer (exit {self.proc.returncode}): "
                f"{err.decode(errors='replace').strip()[-2000:]}"
            )
        return json.loads(line)

    def ask(self, cmd: str, arg: int | str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{cmd} {arg}\n".encode())
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Env:
    """The test user and the bench topology: commands as that user in its host netns."""

    def __init__(self, topo: topo_mod.Topology, user: str) -> None:
        self.topo = topo
        self.pw = pwd.getpwnam(user)
        self.env = {
            "HOME": self.pw.pw_dir,
            "USER": user,
            "LOGNAME": user,
            "LANG": "C.UTF-8",
            "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
            **topo.user_env(self.pw.pw_uid, self.pw.pw_gid),
        }

    def argv(self, argv: list[str]) -> list[str]:
        env = [f"{k}={v}" for k, v in self.env.items()]
        return self.topo.exec_in_host(
            ["runuser", "-u", self.pw.pw_name, "--", "env", "-i", *env, *argv]
        )

    def spawn(self, label: str, argv: list[str], cwd: Path) -> Peer:
        proc = subprocess.Popen(
            self.argv(argv),
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        peer = Peer(label, proc)
        if not peer.read().get("ready"):
            raise BenchError(f"{label}: did not start")
        return peer

    def boxyd_pid(self) -> int:
        out = subprocess.run(
            self.argv([str(BIN / "boxyctl"), "daemon", "status"]),
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        m = re.search(r"pid (\d+)", out)
        if not m:
            raise BenchError(f"boxyctl daemon status: no pid in {out.strip()!r}")
        return int(m.group(1))


def cpu_seconds(pid: int) -> float:
    """utime + stime of PID (every thread), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(topo: topo_mod.Topology, addr: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        topo.exec_in_net([sys.executable, "-c", SERVER, addr, str(PORT)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready or proc.stdout.readline().strip() != b"ready":
        proc.kill()
        raise BenchError(f"bench server: {proc.communicate()[1].decode(errors='replace')}")
    return proc


@contextlib.contextmanager
def internet(
    user: str, keep: bool, prefix: str, state: Path, client: str
) -> Iterator[tuple[Env, Path]]:
    """A test internet of the bench's own (PREFIX, its state in STATE) with the source
    on big's address, and a work directory of USER's holding CLIENT as client.py; all
    gone afterwards (the topology kept with KEEP)."""
    topo = topo_mod.up(state, prefix)
    server = None
    work: Path | None = None
    try:
        env = Env(topo, user)
        addr = plan.SERVER_BY_NAME["big"].v4
        assert addr is not None
        server = start_server(topo, addr)
        work = Path(env.pw.pw_dir) / f"boxy-bench-{uuid.uuid4().hex[:8]}"
        work.mkdir()
        (work / "client.py").write_text(client)
        for p in (work, work / "client.py"):
            os.chown(p, env.pw.pw_uid, env.pw.pw_gid)
        yield env, work
    finally:
        if server is not None:
            server.kill()
            server.wait()
        if not keep:
            topo_mod.down(prefix, state)
            shutil.rmtree(state, ignore_errors=True)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _chunks(total: int, k: int) -> list[int]:
    """TOTAL split into at most K near-equal positive parts."""
    k = max(1, min(k, total))
    return [total // k + (i < total % k) for i in range(k)]


def _pooled_conns(parts: list[dict]) -> dict:
    return {key: sum(p[key] for p in parts) for key in ("n", "ok", "errors", "seconds")}


def _pooled_latency(parts: list[dict]) -> dict:
    """The client's latency summary, over the samples of every part."""
    samples = [x for p in parts for x in p["samples"]]
    kinds: dict[str, int] = {}
    for p in parts:
        for k, v in p["error_kinds"].items():
            kinds[k] = kinds.get(k, 0) + v

    def med(i: int) -> float | None:
        return statistics.median(x[i] for x in samples) if samples else None

    total = sorted(x[0] for x in samples)
    return {
        "n": sum(p["n"] for p in parts),
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "median_ms": med(0),
        "dns_ms": med(1),
        "connect_ms": med(2),
        "first_byte_ms": med(3),
        "p90_ms": total[int(len(total) * 0.9)] if total else None,
    }


def gbps(r: dict) -> float:
    return r["bytes"] * 8 / r["seconds"] / 1e9


def run(args: argparse.Namespace) -> int:
    size = args.size_mib << 20
    name = plan.fqdn("big")
    addr = plan.SERVER_BY_NAME["big"].v4
    assert addr is not None
    direct = boxed = None
    with internet(args.user, args.keep, PREFIX, STATE, CLIENT) as (env, work):
        try:
            client = [PYTHON, "-I", "client.py", name, addr, str(PORT)]
            direct = env.spawn("direct", client, work)
            t0 = time.perf_counter()
            boxed = env.spawn(
                "boxy", [str(BIN / "boxyctl"), "run", "--net", "public", "--", *client], work
            )
            start = time.perf_counter() - t0
            pid = env.boxyd_pid()

            bulk: dict[str, list[dict]] = {"direct": [], "boxy": []}
            cpu_per_gb: list[float] = []
            for _ in range(args.repeat):
                bulk["direct"].append(direct.ask("bulk", size))
                c0 = cpu_seconds(pid)
                r = boxed.ask("bulk", size)
                cpu_per_gb.append((cpu_seconds(pid) - c0) / (r["bytes"] / 1e9))
                bulk["boxy"].append(r)
            for label, runs in bulk.items():
                for r in runs:
                    if r["bytes"] != size:
                        raise BenchError(
                            f"{label}: bulk transfer incomplete ({r['bytes']} of {size})"
                        )
            # In chunks, alternating, so that a machine busy with something else for a
            # while slows both sides rather than one (a ratio is only as good as that).
            parts: dict[str, list[dict]] = {"direct": [], "boxy": []}
            conn_cpu = 0.0
            for n in _chunks(args.conns, args.chunks):
                parts["direct"].append(direct.ask("conns", n))
                c0 = cpu_seconds(pid)
                parts["boxy"].append(boxed.ask("conns", n))
                conn_cpu += cpu_seconds(pid) - c0
            conns = {k: _pooled_conns(v) for k, v in parts.items()}
            conn_cpu_ms = conn_cpu / args.conns * 1000
            # Back to back (within boxy's DNS burst allowance), then paced like sporadic
            # connections (under its sustained DNS rate): an idle path pays wake-ups too.
            lats = {}
            for label, pace in (("back to back", 0.0), (f"{PACE * 1000:.0f} ms apart", PACE)):
                runs: dict[str, list[dict]] = {"direct": [], "boxy": []}
                for n in _chunks(args.samples, args.chunks):
                    for side, peer in (("direct", direct), ("boxy", boxed)):
                        runs[side].append(peer.ask("latency", f"{n},{pace}"))
                lats[label] = {k: _pooled_latency(v) for k, v in runs.items()}
            # Start-up of a whole run per mode, in the same topology (ip netns exec and
            # runuser included): what the network steps add to `--net none`.
            startup: dict[str, float] = {}
            for mode, extra in (
                ("none", []),
                ("public", []),
                ("allowlist", ["--allow-host", name]),
            ):
                argv = env.argv([str(BIN / "boxyctl"), "run", "--net", mode, *extra, "--", "true"])
                times = []
                for _ in range(STARTUP_RUNS):
                    t = time.perf_counter()
                    subprocess.run(argv, cwd=work, capture_output=True, check=True, timeout=60)
                    times.append((time.perf_counter() - t) * 1000)
                startup[mode] = statistics.median(times)
            direct.close()
            boxed.close()
        finally:
            for peer in (direct, boxed):
                if peer is not None and peer.proc.poll() is None:
                    peer.proc.kill()

    g = {k: statistics.median(gbps(r) for r in v) for k, v in bulk.items()}
    cps = {k: v["ok"] / v["seconds"] for k, v in conns.items()}
    added = {
        label: lat["boxy"]["median_ms"] - lat["direct"]["median_ms"] for label, lat in lats.items()
    }
    out = sys.stderr if args.json else sys.stdout
    report = Report(args, name, start, g, cpu_per_gb, cps, conns, conn_cpu_ms, lats, added, startup)
    report.prose(out)
    emit(report.figures(), args.json)
    return 0


@dataclass
class Report:
    """What one run measured: the prose table, and the figures for bench/all.py."""

    args: argparse.Namespace
    name: str
    start: float
    g: dict[str, float]
    cpu_per_gb: list[float]
    cps: dict[str, float]
    conns: dict[str, dict]
    conn_cpu_ms: float
    lats: dict[str, dict[str, dict]]
    added: dict[str, float]
    startup: dict[str, float]

    def figures(self) -> list[Figure]:
        """Issue 18's gateway targets: ratios against the direct path of this run,
        and what a new connection costs in time (back to back) and in boxyd's CPU."""
        g, cps = self.g, self.cps
        added = self.added["back to back"]
        return [
            Figure("net", "bulk", g["boxy"], "Gbit/s", *at_least(g["boxy"] / g["direct"], 0.9)),
            Figure(
                "net",
                "new connections/s",
                cps["boxy"],
                "/s",
                *at_least(cps["boxy"] / cps["direct"], 0.6),
            ),
            Figure(
                "net",
                "added per connection",
                added,
                "ms",
                None,
                f"≤ {ADDED_MS:g} ms",
                added <= ADDED_MS,
            ),
            Figure(
                "net",
                "boxyd CPU per connection",
                self.conn_cpu_ms,
                "ms",
                None,
                f"≤ {CPU_MS:g} ms",
                self.conn_cpu_ms <= CPU_MS,
            ),
        ]

    def prose(self, out: TextIO) -> None:
        args, g, cps, conns, lats = self.args, self.g, self.cps, self.conns, self.lats
        bulk_ok = g["boxy"] >= 3 and g["boxy"] >= g["direct"] / 2
        p = functools.partial(print, file=out)
        p(
            f"boxy network bench: {os.cpu_count()} CPUs, topology {PREFIX}, server "
            f"{self.name}:{PORT}; sandbox ready in {self.start:.2f} s"
        )
        p(f"{'':34}{'direct':>10}{'boxy':>10}{'boxy/dir':>10}   target")
        p(
            f"{f'bulk Gbit/s ({args.size_mib} MiB, median of {args.repeat})':34}"
            f"{g['direct']:10.2f}{g['boxy']:10.2f}{g['boxy'] / g['direct']:10.2f}   "
            f">= 3 and >= 0.5x: {'met' if bulk_ok else 'MISSED'}"
        )
        p(f"{'  boxyd CPU s/GB (median)':34}{'':10}{statistics.median(self.cpu_per_gb):10.3f}")
        p(
            f"{f'conns/s ({args.conns} sequential)':34}{cps['direct']:10.0f}{cps['boxy']:10.0f}"
            f"{cps['boxy'] / cps['direct']:10.2f}"
        )
        p(
            f"{'  failed connections':34}{conns['direct']['errors']:10d}"
            f"{conns['boxy']['errors']:10d}"
        )
        p(f"{'  boxyd CPU ms/connection':34}{'':10}{self.conn_cpu_ms:10.3f}")
        for label, lat in lats.items():
            self._latency(p, label, lat)
        startup = self.startup
        p(
            f"{f'start-up ms, median of {STARTUP_RUNS}':34}"
            + "".join(f"  {mode} {ms:.1f}" for mode, ms in startup.items())
            + f"   (network adds {startup['public'] - startup['none']:.1f} ms)"
        )

    def _latency(self, p: Callable[..., None], label: str, lat: dict[str, dict]) -> None:
        a = self.added[label]
        p(
            f"{f'new conn ms ({label}), median':34}{lat['direct']['median_ms']:10.3f}"
            f"{lat['boxy']['median_ms']:10.3f}{'':10}   < 1 ms added: {a:.3f} ms "
            f"{'met' if a < 1 else 'MISSED'}"
        )
        for key, what in (
            ("dns_ms", "DNS lookup"),
            ("connect_ms", "connect"),
            ("first_byte_ms", "request to first byte"),
        ):
            p(f"{f'  {what}, median ms':34}{lat['direct'][key]:10.3f}{lat['boxy'][key]:10.3f}")
        p(f"{'  p90 ms':34}{lat['direct']['p90_ms']:10.3f}{lat['boxy']['p90_ms']:10.3f}")
        p(
            f"{'  failed lookups/connections':34}{lat['direct']['errors']:10d}"
            f"{lat['boxy']['errors']:10d}"
            + "".join(f"   {k}: {v['error_kinds']}" for k, v in lat.items() if v["error_kinds"])
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="bytes per bulk transfer")
    ap.add_argument("--repeat", type=int, default=3, help="bulk transfers per side")
    ap.add_argument("--conns", type=int, default=1000, help="sequential short connections")
    ap.add_argument(
        "--samples",
        type=int,
        default=DNS_BURST * 3 // 4,
        help="timed new connections by name, per latency run (back to back: "
        f"keep under boxy's DNS burst of {DNS_BURST})",
    )
    ap.add_argument(
        "--chunks",
        type=int,
        default=5,
        help="connection and latency runs split into this many parts, direct and boxy alternating",
    )
    return main_as_root(ap, run, "bench/net.py")


def main_as_root(
    ap: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int], script: str
) -> int:
    """The end of a bench's main that builds a test internet of its own (SCRIPT): the
    flags every such bench takes, root required, its errors said in one line."""
    ap.add_argument("--user", default=os.environ.get("BOXY_TEST_USER", "boxytest"))
    ap.add_argument("--keep", action="store_true", help="leave the topology up afterwards")
    ap.add_argument(
        "--json", action="store_true", help="the figures as JSON on stdout (prose to stderr)"
    )
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit(f"{script} builds network namespaces: run it as root")
    try:
        return run(args)
    except (BenchError, topo_mod.TopologyError) as e:
        sys.exit(f"{script}: {e}")


if __name__ == "__main__":
    sys.exit(main())
