"""--secret NAME: the value from boxyctl's environment reaches the payload's environment
and nowhere else — not an argv, boxyd's log, the audit log, the net log, a session
record or an error message. Every one of them is read back after a run with network."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.conftest import NetBoxy
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

SECRET = "boxy-secret-3f1c9a7e-not-for-logs"
PROBE = (
    "import hashlib, os, urllib.request\n"
    "v = os.environ.get('BOXY_TEST_TOKEN', '')\n"
    "print('HASH', hashlib.sha256(v.encode()).hexdigest())\n"
    "urllib.request.urlopen('http://www.boxy.test/', timeout=5).read()\n"
)


def _everything_under(path: Path) -> bytes:
    out = b""
    for f in path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            out += f.read_bytes()
    return out


def test_a_secret_reaches_the_payload_and_nothing_else(netboxy: NetBoxy, net: Topology) -> None:
    seen: list[bytes] = []
    ps = subprocess.Popen(
        ["sh", "-c", "for i in $(seq 40); do ps -eo args; sleep 0.1; done"], stdout=subprocess.PIPE
    )  # every argv on the machine, during the run
    try:
        r = netboxy.run(
            "--net",
            "allowlist",
            "--allow-host",
            "www.boxy.test",
            "--secret",
            "BOXY_TEST_TOKEN",
            "--audit-log",
            "audit.jsonl",
            "--net-log",
            "net.json",
            "-v",
            cmd=["python3", "-c", PROBE],
            extra_env={"BOXY_TEST_TOKEN": SECRET},
        )
    finally:
        ps.kill()
        seen.append(ps.communicate()[0])
    assert r.returncode == 0, r.stderr
    assert f"HASH {hashlib.sha256(SECRET.encode()).hexdigest()}".encode() in r.stdout  # delivered
    env = netboxy.env()
    places = {
        "client output": r.stdout + r.stderr,
        "audit log": (netboxy.workdir / "audit.jsonl").read_bytes(),
        "net log": (netboxy.workdir / "net.json").read_bytes(),
        "state (records, quarantine, boxyd's log)": _everything_under(Path(env["XDG_STATE_HOME"])),
        "argv of every process": b"".join(seen),
    }
    assert places["audit log"] and places["net log"]  # really written
    leaked = [where for where, data in places.items() if SECRET.encode() in data]
    assert not leaked, f"ESCAPED: the secret is in {leaked}"


def test_a_profile_passes_secrets_by_name_and_makes_its_tmpfs(
    netboxy: NetBoxy, net: Topology
) -> None:
    """env_secrets: boxyctl learns the names from boxyd (SecretsNeeded) and sends the
    values from its own environment; filesystem.tmpfs: an empty writable directory."""
    profile = netboxy.workdir / "secretive.yaml"
    profile.write_text(
        "net: allowlist\nallow_hosts: [www.boxy.test]\nenv_secrets: [BOXY_TEST_TOKEN]\n"
        "filesystem: {tmpfs: [/opt/scratch]}\n"
    )
    netboxy.user.chown(profile)
    probe = PROBE + (
        "print('TMPFS', os.listdir('/opt/scratch'))\n"
        "open('/opt/scratch/x', 'w').write('w')\nprint('WROTE', os.listdir('/opt/scratch'))\n"
    )
    r = netboxy.run(
        "-p",
        str(profile),
        "--audit-log",
        "audit.jsonl",
        "-v",
        cmd=["python3", "-c", probe],
        extra_env={"BOXY_TEST_TOKEN": SECRET},
    )
    assert r.returncode == 0, r.stderr
    assert f"HASH {hashlib.sha256(SECRET.encode()).hexdigest()}".encode() in r.stdout
    assert b"TMPFS []" in r.stdout and b"WROTE ['x']" in r.stdout
    env = netboxy.env()
    places = {
        "client output": r.stdout + r.stderr,
        "audit log": (netboxy.workdir / "audit.jsonl").read_bytes(),
        "state": _everything_under(Path(env["XDG_STATE_HOME"])),
    }
    leaked = [where for where, data in places.items() if SECRET.encode() in data]
    assert not leaked, f"ESCAPED: the secret is in {leaked}"
    missing = netboxy.run("-p", str(profile), cmd=["true"])  # not in boxyctl's environment
    assert missing.returncode == 2
    assert b"env_secrets BOXY_TEST_TOKEN: not set in your environment" in missing.stderr
