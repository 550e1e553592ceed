"""`--allow-cidr` lifts the range objection, and only that (the review's §5): in
allowlist mode an address inside an opened prefix still needs a binding to an allowed
name, exactly like a public one; a device reached by its literal address is named as
itself (`--allow-host 192.168.1.10:22`). In public mode the prefix is simply open.
Verdicts from the test internet's recorders: did anything reach the LAN/ULA host."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import User
from tests.escape.netutil import NetRun, run_probes
from tests.harness.fakenet import plan
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

ADDRS = {"v4": plan.LAN_HOST, "v6": plan.ULA_HOST}
RECORDER = {"v4": "lan", "v6": "ula"}
PREFIX = {"v4": "192.168.1.0/24", "v6": "fd12::/64"}

# TLS without SNI to :443, and server-first style bytes to :443 and :22. Prints one
# line per attempt; a reply from the far side is what an escape would look like.
PROBE = r"""
import socket, sys
addr = sys.argv[1]
hello = bytes.fromhex("160301002f0100002b0303") + bytes(32) + bytes.fromhex("000002002f0100")
for label, port, data in (("tls-no-sni", 443, hello), ("opaque-443", 443, b"SSH-2.0-probe\r\n"),
                          ("opaque-22", 22, b"SSH-2.0-probe\r\n")):
    s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((addr, port))
        s.sendall(data)
        reply = s.recv(64)
        print("TRIED", label, "reply" if reply else "closed", flush=True)
    except OSError as e:
        print("TRIED", label, "refused", e.errno, flush=True)
    finally:
        s.close()
"""


def _run(net: Topology, user: User, workdir: Path, fam: str, *flags: str) -> NetRun:
    return run_probes(
        net,
        user,
        workdir,
        *flags,
        "--allow-port",
        "443",
        "--allow-port",
        "22",
        cmd=["python3", "-c", PROBE, ADDRS[fam]],
    )


@pytest.mark.parametrize("fam", ["v4", "v6"])
def test_allowlist_prefix_is_no_binding(net: Topology, user: User, workdir: Path, fam: str) -> None:
    run = _run(
        net,
        user,
        workdir,
        fam,
        "--net",
        "allowlist",
        "--allow-host",
        "www.boxy.test",
        "--allow-cidr",
        PREFIX[fam],
    )
    assert run.proc.returncode == 0, run.describe()
    assert run.stdout.count("TRIED") == 3, run.describe()
    hits = run.recorder_hits(RECORDER[fam])
    assert hits == 0, (
        f"ESCAPED: {hits} packets reached {ADDRS[fam]} with no binding\n{run.describe()}"
    )
    # The three refusals are counted (they once were not: layer net.dns, yet connections).
    assert "boxyctl: 3 connections refused" in run.stderr, run.describe()


@pytest.mark.parametrize("fam", ["v4", "v6"])
def test_allowlist_literal_host_reaches_that_address_only(
    net: Topology, user: User, workdir: Path, fam: str
) -> None:
    """The kept-working case: the device named by its address, on its port."""
    addr = ADDRS[fam]
    literal = f"[{addr}]:22" if fam == "v6" else f"{addr}:22"
    run = _run(
        net,
        user,
        workdir,
        fam,
        "--net",
        "allowlist",
        "--allow-host",
        literal,
        "--allow-cidr",
        PREFIX[fam],
    )
    assert run.proc.returncode == 0, run.describe()
    assert run.recorder_hits(RECORDER[fam]) > 0, (
        f"the named device was not reached\n{run.describe()}"
    )
    reached = {e["port"] for e in run.recorder_events if e.get("recorder") == RECORDER[fam]}
    assert reached == {22}, f"reached {reached}: only :22 was allowed\n{run.describe()}"


@pytest.mark.parametrize("fam", ["v4", "v6"])
def test_public_prefix_is_open(net: Topology, user: User, workdir: Path, fam: str) -> None:
    run = run_probes(
        net,
        user,
        workdir,
        "--net",
        "public",
        "--allow-cidr",
        PREFIX[fam],
        cmd=["python3", "-c", PROBE, ADDRS[fam]],
    )
    assert run.proc.returncode == 0, run.describe()
    reached = {e["port"] for e in run.recorder_events if e.get("recorder") == RECORDER[fam]}
    assert reached == {22, 443}, run.describe()


def test_a_literal_in_a_denied_range_needs_the_prefix_opened(
    net: Topology, user: User, workdir: Path
) -> None:
    run = run_probes(
        net,
        user,
        workdir,
        "--net",
        "allowlist",
        "--allow-host",
        f"{plan.LAN_HOST}:22",
        cmd=["true"],
    )
    assert run.proc.returncode == 2, run.describe()
    assert f"open it with --allow-cidr {plan.LAN_HOST} as well" in run.stderr, run.describe()
