"""A TCP connect() Landlock's port rules refuse is named like the gateway's refusals
(issue 34): no packet ever leaves, so PID 1 hears of every connect() (where the run
asked: -v, --audit-log, --net-log), a reader in the payload's own Landlock domain
copies its address, and boxyd records a denied connection with the port and the flag.
Only the test internet is dialled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import User
from tests.escape.netutil import run_probes
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

PROBE = r"""
import errno, socket
addr = socket.getaddrinfo("www.boxy.test", 443, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
print("ADDR", addr, flush=True)
s = socket.socket(); s.settimeout(5)
try:
    s.connect((addr, 8081)); print("TRIED 8081 connected")
except OSError as e:
    print("TRIED 8081", errno.errorcode.get(e.errno, e.errno))
s = socket.socket(); s.settimeout(5)
try:
    s.connect((addr, 443)); print("TRIED 443 connected")
except OSError as e:
    print("TRIED 443", errno.errorcode.get(e.errno, e.errno))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((addr, 8082))  # UDP: Landlock's rules are TCP's; the ruleset refuses this
print("DONE", flush=True)
"""


def test_a_port_landlock_refuses_is_named(net: Topology, user: User, workdir: Path) -> None:
    run = run_probes(
        net,
        user,
        workdir,
        "--net",
        "allowlist",
        "--allow-host",
        "www.boxy.test",
        "-v",
        "--audit-log",
        "audit.jsonl",
        cmd=["python3", "-c", PROBE],
    )
    out = run.proc.stdout.decode(errors="replace")
    assert "DONE" in out and "TRIED 8081 EACCES" in out, run.describe()
    assert "TRIED 443 connected" in out, run.describe()  # let through: Landlock decided
    addr = next(x.split()[1] for x in out.splitlines() if x.startswith("ADDR "))
    records = [json.loads(x) for x in (workdir / "audit.jsonl").read_text().splitlines()]
    landlock = [r for r in records if r.get("layer") == "net.landlock"]
    assert [(r["addr"], r["port"], r["verdict"]) for r in landlock] == [(addr, 8081, "deny")]
    [rec] = landlock
    assert rec["host"] == "www.boxy.test" and "python3" in rec["by"], rec
    assert "--allow-host www.boxy.test:8081 allows it" in rec["reason"], rec
    said = [ln for ln in run.stderr.splitlines() if "net.landlock deny" in ln]
    assert said == [
        f"boxyctl: net.landlock deny tcp://{addr}:8081 (www.boxy.test): {rec['reason']}"
    ], run.stderr
    # the table's row: the end of the run counts it with the gateway's refusals
    assert "connection refused" in run.stderr or "connections refused" in run.stderr, run.stderr


def test_without_asking_a_refused_port_is_landlocks_eacces_alone(
    net: Topology, user: User, workdir: Path
) -> None:
    # no -v, no --audit-log, no --net-log: the refusal is Landlock's EACCES, as before,
    # and no record of it (each connect() would otherwise wait on PID 1)
    run = run_probes(
        net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test",
        cmd=["python3", "-c", PROBE],
    )  # fmt: skip
    out = run.proc.stdout.decode(errors="replace")
    assert "TRIED 8081 EACCES" in out and "DONE" in out, run.describe()
    assert "8081" not in run.stderr, run.stderr


STOPS_ITS_READER = r"""
import os, signal, socket, time
readers = [
    int(p) for p in os.listdir("/proc")
    if p.isdigit() and int(p) not in (1, os.getpid())
    and open(f"/proc/{p}/comm").read().strip() == "boxy-init"
]
print("READERS", len(readers), flush=True)
for p in readers:
    os.kill(p, signal.SIGSTOP)  # its own domain: it may; PID 1 waits once, then not
addr = socket.getaddrinfo("www.boxy.test", 443, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
t0 = time.monotonic()
for port in (443, 443, 443, 8081, 8081):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((addr, port)); print("TRIED", port, "connected")
    except OSError as e:
        print("TRIED", port, e.errno)
    s.close()
print("SECONDS", round(time.monotonic() - t0, 2), flush=True)
"""


def test_a_payload_that_stops_its_reader_only_goes_unnamed(
    net: Topology, user: User, workdir: Path
) -> None:
    run = run_probes(
        net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test", "-v",
        cmd=["python3", "-c", STOPS_ITS_READER],
    )  # fmt: skip
    out = run.proc.stdout.decode(errors="replace")
    assert "READERS 1" in out, run.describe()
    assert out.count("TRIED 443 connected") == 3 and out.count("TRIED 8081 13") == 2, out
    seconds = float(next(x.split()[1] for x in out.splitlines() if x.startswith("SECONDS")))
    assert seconds < 1.0, out  # one wait of READER_WAIT (0.25 s), not one per connect()
    assert "net.landlock" not in run.stderr, run.stderr  # unnamed: the reader said nothing
