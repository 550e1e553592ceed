"""Refusals are visible without -v: after a run with network that refused something,
one line says how much, and a name whose answers boxy removed (they pointed into a
refused range) is named with the --allow-cidr that would open it. Quiet otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import User
from tests.escape.netutil import run_probes, write_script
from tests.harness.fakenet import plan
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

PROBE = r"""
import socket
for host in ("rebind-lan.boxy.test", "not-listed.boxy.test"):
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
        print("TRIED", host, "resolved")
    except socket.gaierror as e:
        print("TRIED", host, "refused", e.errno)
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("LAN", 443)); print("TRIED lan connected")
except OSError as e:
    print("TRIED lan refused", e.errno)
""".replace("LAN", plan.LAN_HOST)


def test_refusals_said_without_verbose(net: Topology, user: User, workdir: Path) -> None:
    run = run_probes(
        net,
        user,
        workdir,
        "--net",
        "allowlist",
        "--allow-host",
        "rebind-lan.boxy.test",
        "--allow-host",
        "www.boxy.test",
        cmd=["python3", "-c", PROBE],
    )
    assert run.proc.returncode == 0, run.describe()
    lines = run.stderr.splitlines()
    summary = [ln for ln in lines if "(-v or --audit-log for details)" in ln]
    assert summary == [
        "boxyctl: 1 connection refused, 1 name not allowed, 1 DNS answer in a "
        "refused range removed (-v or --audit-log for details)"
    ], run.stderr
    hint = [ln for ln in lines if ln.startswith("boxyctl: rebind-lan.boxy.test answered with")]
    assert hint and f"--allow-cidr {plan.LAN_HOST}" in hint[0], run.stderr
    # the name refused, with the flag that would allow it (issue 34 §3)
    assert (
        "boxyctl: not-listed.boxy.test: not on the allowlist; --allow-host "
        "not-listed.boxy.test allows it (a running session: boxyctl allow ID "
        "not-listed.boxy.test)"
    ) in lines, run.stderr
    assert not any(" deny " in ln for ln in lines), "the denials themselves are -v's"


def test_a_quiet_run_is_quiet(net: Topology, user: User, workdir: Path) -> None:
    run = run_probes(
        net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test", cmd=["true"]
    )
    assert run.proc.returncode == 0 and run.stderr == "", run.describe()


# Each refused destination is named by its range — link-local / cloud metadata,
# multicast, broadcast — and only the gateway's own two addresses are "the gateway";
# the summary line counts what the table counts, in the right number.
NAMED = r"""
import json, socket
report("meta tcp", tcp("169.254.169.254", 80))
report("meta udp", udp("169.254.169.254", 80))
report("meta6 tcp", tcp("META6", 80))
report("mdns", udp("224.0.0.251", 5353))
report("ssdp", udp("239.255.255.250", 1900))
report("mdns6", udp("ff02::fb", 5353, scope="eth0"))
report("gateway", tcp("10.0.2.2", 80))
report("gateway6", tcp("fd00::2", 80))
report("no binding", tcp("OTHER", 80))
""".replace("META6", plan.METADATA_V6).replace("OTHER", plan.SERVER_BY_NAME["other"].v4 or "")

EXPECTED = {  # what -v and the audit log say of each destination
    "169.254.169.254": "link-local / cloud metadata",
    f"[{plan.METADATA_V6}]": "unique local (ULA)",
    "224.0.0.251": "multicast",
    "239.255.255.250": "multicast",
    "[ff02::fb]": "multicast",
    "10.0.2.2": "the gateway itself is not a destination",
    "[fd00::2]": "the gateway itself is not a destination",
    cast(str, plan.SERVER_BY_NAME["other"].v4): "no DNS binding for this address (hard-coded IP?)",
}


def _table_denied(stderr: str) -> int:
    lines = stderr.splitlines()
    head = next(i for i, ln in enumerate(lines) if "DESTINATION" in ln and "DENIED" in ln)
    total = 0
    for ln in lines[head + 1 :]:
        cells = ln.split()
        if len(cells) != 6 or not cells[2].isdigit():
            break
        total += int(cells[2])
    return total


def test_refusals_are_named_by_their_range_and_counted_as_the_table(
    net: Topology, user: User, workdir: Path
) -> None:
    script = write_script(workdir, user, "named.py", NAMED)
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
        cmd=["python3", script],
    )
    assert run.proc.returncode == 0, run.describe()
    assert "ESCAPED" not in run.stdout
    for probe, got in run.probes.items():
        # No ICMP error is ever sent about a multicast datagram (RFC 1122): those time out.
        quiet = ("timeout",) if probe in ("mdns", "ssdp", "mdns6") else ()
        assert got["outcome"] in ("refused", "unreachable", "denied", *quiet), (probe, got)
    verbose = [ln for ln in run.stderr.splitlines() if " deny " in ln]
    for dest, reason in EXPECTED.items():
        assert any(f"://{dest}:" in ln and ln.endswith(f": {reason}") for ln in verbose), (
            dest,
            reason,
            run.stderr,
        )
    gateway = [ln for ln in verbose if "the gateway itself" in ln]
    assert {ln.split("://")[1].rsplit(":", 2)[0] for ln in gateway} == {"10.0.2.2", "[fd00::2]"}, (
        gateway
    )
    audit = [json.loads(ln) for ln in (workdir / "audit.jsonl").read_text().splitlines()]
    denials = {(r.get("addr"), r.get("reason")) for r in audit if r.get("verdict") == "deny"}
    for dest, reason in EXPECTED.items():
        assert (dest.strip("[]"), reason) in denials, (dest, denials)
    assert not any(
        r.get("reason") == "the gateway itself is not a destination"
        and r.get("addr") not in ("10.0.2.2", "fd00::2")
        for r in audit
    ), audit
    # a -v run saw each refusal as it happened: it is not told to use -v
    summary = [ln for ln in run.stderr.splitlines() if ln.endswith("(each one said above)")]
    assert len(summary) == 1, run.stderr
    refused = int(summary[0].removeprefix("boxyctl: ").split(" connection")[0])
    assert refused == _table_denied(run.stderr) == len(run.probes), run.stderr
    assert f"{refused} connections refused" in summary[0]
    assert net.recorder_hits("metadata") == 0


EDNS_PROBE = r"""
import socket, struct
def name(n):
    return b"".join(bytes([len(p)]) + p.encode() for p in n.split(".")) + b"\0"
opt = b"\0" + struct.pack("!HHIH", 41, 1232, 0, 0)  # OPT: the client speaks EDNS
for host in ("not-listed.boxy.test", "www.boxy.test"):
    q = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 1) + name(host) + b"\0\1\0\1" + opt
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, ("10.0.2.2", 53))
    print("ANSWER", host, s.recv(4096).hex(), flush=True)
"""


def test_a_refused_name_is_answered_with_an_extended_dns_error_a_client_can_read(
    net: Topology, user: User, workdir: Path
) -> None:
    """RFC 8914 (issue 34 §3): the sandbox's own DNS client, speaking EDNS, is told in
    the answer that boxy refused the name and which flag allows it; an allowed name's
    answer carries no such error."""
    import dns.edns
    import dns.message
    import dns.rcode

    run = run_probes(
        net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test",
        cmd=["python3", "-c", EDNS_PROBE],
    )  # fmt: skip
    assert run.proc.returncode == 0, run.describe()
    got = {
        ln.split()[1]: dns.message.from_wire(bytes.fromhex(ln.split()[2]))
        for ln in run.stdout.splitlines()
        if ln.startswith("ANSWER ")
    }
    refused, allowed = got["not-listed.boxy.test"], got["www.boxy.test"]
    assert refused.rcode() == dns.rcode.NXDOMAIN, refused
    (ede,) = [o for o in refused.options if isinstance(o, dns.edns.EDEOption)]
    assert ede.code == dns.edns.EDECode.BLOCKED, ede
    assert ede.text is not None and ede.text.startswith("boxy: not-listed.boxy.test "), ede
    assert "--allow-host not-listed.boxy.test allows it" in ede.text, ede
    assert allowed.rcode() == dns.rcode.NOERROR and allowed.answer, allowed
    assert not [o for o in allowed.options if isinstance(o, dns.edns.EDEOption)], allowed


def test_curl_reads_why_a_name_on_the_wire_was_refused(
    net: Topology, user: User, workdir: Path
) -> None:
    """A real client, refused by name after its first record (issue 34 §3): curl over
    plain HTTP prints boxy's 403 body, naming the flag; over TLS it reports the
    access_denied alert instead of a bare reset. The far end is never dialled."""
    www = plan.SERVER_BY_NAME["www"].v4
    script = (
        f"curl -sS -m 10 --resolve evil.boxy.test:80:{www} http://evil.boxy.test/; "
        'echo "HTTP-EXIT $?"; '
        f"curl -sS -m 10 -k --resolve evil.boxy.test:443:{www} https://evil.boxy.test/ 2>&1; "
        'echo "TLS-EXIT $?"'
    )
    run = run_probes(
        net, user, workdir, "--net", "allowlist", "--allow-host", "www.boxy.test",
        cmd=["sh", "-c", f"getent ahostsv4 www.boxy.test >/dev/null; {script}"],
    )  # fmt: skip
    out = run.stdout
    assert "boxy refused this connection: Host names evil.boxy.test" in out, run.describe()
    assert "--allow-host evil.boxy.test allows it" in out, run.describe()
    assert "HTTP-EXIT 0" in out, run.describe()  # a response, read whole
    assert "access denied" in out.lower() and "TLS-EXIT 35" in out, run.describe()
    assert not [e for e in run.server_events if e.get("host") == "evil.boxy.test"], run.describe()
