"""--publish: a real server inside the sandbox, reached from the host's loopback
through boxyd's relay, and not from another address; a taken port refused before
the start. Every connection here is to loopback: the machine's own (--net none,
whose daemon is the machine's) or the test topology's host netns (--net public and
allowlist, whose daemon runs there)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import BIN, Boxy, NetBoxy, User

pytestmark = pytest.mark.sandbox

TOKEN = "served-from-inside-7f3a"

# What the host side runs: one HTTP GET, retried while the server inside starts
# (bounded: TRIES tries, 15 s); prints the body, or the last error and exits 1.
FETCH = r"""
import socket, sys, time
addr, port, tries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
family = socket.AF_INET6 if ":" in addr else socket.AF_INET
deadline, last = time.monotonic() + 15, None
for _ in range(tries):
    try:
        with socket.socket(family) as s:
            s.settimeout(5)
            s.connect((addr, port))
            s.sendall(b"GET /token.txt HTTP/1.0\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        if data:
            sys.stdout.write(data.decode(errors="replace"))
            sys.exit(0)
        last = "closed without an answer"
    except OSError as e:
        last = f"{type(e).__name__}: {e}"
    if time.monotonic() > deadline:
        break
    time.sleep(0.25)
print(last)
sys.exit(1)
"""


def err(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stderr.decode(errors="replace")


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return cast(int, s.getsockname()[1])


def ctl(boxy: Boxy, *args: str) -> subprocess.CompletedProcess[bytes]:
    if isinstance(boxy, NetBoxy):
        argv = boxy.topo.exec_in_host(boxy.user.cmd([str(BIN / "boxyctl"), *args], boxy.env()))
        return subprocess.run(argv, capture_output=True, timeout=60, cwd=boxy.workdir)
    return boxy.user.run([str(BIN / "boxyctl"), *args], timeout=60, cwd=boxy.workdir)


def fetch(boxy: Boxy, addr: str, port: int, tries: int = 60) -> subprocess.CompletedProcess[bytes]:
    """FETCH from the host side: where the daemon under test runs."""
    argv = [sys.executable, "-c", FETCH, addr, str(port), str(tries)]
    if isinstance(boxy, NetBoxy):
        argv = boxy.topo.exec_in_host(argv)
    return subprocess.run(argv, capture_output=True, timeout=60)


def refused(boxy: Boxy, addr: str, port: int) -> bool:
    """Whether a connection to ADDR:PORT on the host side is refused outright."""
    family = "socket.AF_INET6" if ":" in addr else "socket.AF_INET"
    code = (
        f"import socket\ns = socket.socket({family}); s.settimeout(5)\n"
        f"try:\n    s.connect(({addr!r}, {port}))\nexcept ConnectionRefusedError:\n"
        "    print('refused')\nelse:\n    print('connected')\n"
    )
    argv = [sys.executable, "-c", code]
    if isinstance(boxy, NetBoxy):
        argv = boxy.topo.exec_in_host(argv)
    return subprocess.run(argv, capture_output=True, timeout=30).stdout.strip() == b"refused"


def serve(boxy: Boxy, workdir: Path, *flags: str, bind: str = "127.0.0.1") -> str:
    """A detached sandbox running python's http.server on BIND:8000 inside, serving
    token.txt from the work directory; its session id (SAID: what it said first)."""
    (workdir / "token.txt").write_text(TOKEN)
    boxy.user.chown(workdir)
    r = ctl(
        boxy, "run", "-d", "-w", str(workdir), *flags, "--",
        "python3", "-m", "http.server", "8000", "--bind", bind, "--directory", str(workdir),
    )  # fmt: skip
    assert r.returncode == 0, err(r)
    sid = r.stdout.decode().strip()
    assert re.fullmatch(r"[0-9a-f]{8}", sid), r.stdout
    SAID[sid] = err(r)
    return sid


SAID: dict[str, str] = {}


def stop(boxy: Boxy, sid: str) -> None:
    ctl(boxy, "stop", sid)


def test_a_server_inside_is_reached_from_the_host_loopback_only(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    port = free_port()
    sid = serve(boxy, workdir, "--net", "none", "--publish", f"{port}:8000")
    try:
        said = f"--publish: 127.0.0.1:{port} leads to port 8000 inside; every process of this"
        assert said in SAID[sid], SAID[sid]
        got = fetch(boxy, "127.0.0.1", port)
        assert got.returncode == 0 and TOKEN in got.stdout.decode(), got.stdout
        assert refused(boxy, "127.0.0.2", port)  # bound to 127.0.0.1, not to all of lo
        shown = ctl(boxy, "show", sid).stdout.decode()
        assert f"port      127.0.0.1:{port} leads to 8000 inside" in shown, shown
        doc = json.loads(ctl(boxy, "show", "--json", sid).stdout)
        assert doc["ports"] == [f"127.0.0.1:{port}:8000"], doc
    finally:
        stop(boxy, sid)
    deadline = time.monotonic() + 10
    while not refused(boxy, "127.0.0.1", port):  # the session's end unbinds it
        assert time.monotonic() < deadline, "the published port outlived its session"
        time.sleep(0.2)


def test_an_address_spelled_out_is_the_only_one(boxy: Boxy, workdir: Path) -> None:
    port = free_port("127.0.0.3")
    sid = serve(boxy, workdir, "--net", "none", "--publish", f"127.0.0.3:{port}:8000")
    try:
        got = fetch(boxy, "127.0.0.3", port)
        assert got.returncode == 0 and TOKEN in got.stdout.decode(), got.stdout
        assert refused(boxy, "127.0.0.1", port)
    finally:
        stop(boxy, sid)


def test_a_server_on_the_sandbox_ipv6_loopback_is_reached(boxy: Boxy, workdir: Path) -> None:
    """`localhost` servers often bind ::1 only: the relay tries it after 127.0.0.1."""
    port = free_port()
    sid = serve(boxy, workdir, "--net", "none", "--publish", f"{port}:8000", bind="::1")
    try:
        got = fetch(boxy, "127.0.0.1", port)
        assert got.returncode == 0 and TOKEN in got.stdout.decode(), got.stdout
    finally:
        stop(boxy, sid)


def test_nothing_listening_inside_is_a_reset_not_a_hang(boxy: Boxy, workdir: Path) -> None:
    port = free_port()
    r = ctl(
        boxy, "run", "-d", "-w", str(workdir), "--net", "none",
        "--publish", f"{port}:8000", "--", "sleep", "60",
    )  # fmt: skip
    assert r.returncode == 0, err(r)
    sid = r.stdout.decode().strip()
    try:
        got = fetch(boxy, "127.0.0.1", port, tries=2)
        assert got.returncode == 1, got.stdout
        assert b"Reset" in got.stdout or b"closed without" in got.stdout, got.stdout
    finally:
        stop(boxy, sid)


def test_a_taken_host_port_is_refused_before_the_start(boxy: Boxy, workdir: Path) -> None:
    before = ctl(boxy, "ps", "-a", "-q").stdout
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        marker = workdir / "ran"
        r = boxy.run(
            "--net", "none", "--publish", f"{port}:8000",
            cmd=["sh", "-c", f"touch {marker}"],
        )  # fmt: skip
    assert r.returncode == 2, err(r)
    lines = err(r).strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port} is taken" in lines[0], lines
    assert not marker.exists()  # nothing started
    assert ctl(boxy, "ps", "-a", "-q").stdout == before  # and no session recorded


@pytest.mark.parametrize("flags", [["--net", "public"], ["--allow-host", "example.test"]])
def test_published_in_the_networked_modes(
    netboxy: NetBoxy, workdir: Path, flags: list[str]
) -> None:
    port = free_port()
    sid = serve(netboxy, workdir, *flags, "--publish", f"{port}:8000")
    try:
        got = fetch(netboxy, "127.0.0.1", port)
        assert got.returncode == 0 and TOKEN in got.stdout.decode(), got.stdout
        assert refused(netboxy, "127.0.0.2", port)
    finally:
        stop(netboxy, sid)


def test_a_profile_publishes_its_ports(boxy: Boxy, user: User, workdir: Path) -> None:
    port = free_port()
    profile = workdir / "dev.yaml"
    profile.write_text(f"extends: generic\nnet: none\nports: ['{port}:8000']\n")
    sid = serve(boxy, workdir, "-p", str(profile))
    try:
        got = fetch(boxy, "127.0.0.1", port)
        assert got.returncode == 0 and TOKEN in got.stdout.decode(), got.stdout
    finally:
        stop(boxy, sid)


def test_an_unapproved_project_cannot_publish(boxy: Boxy, user: User, workdir: Path) -> None:
    """A .boxy.yaml the payload could have written opens no port on the host."""
    port = free_port()
    (workdir / ".boxy.yaml").write_text(f"ports: ['{port}:8000']\n")
    user.chown(workdir)
    r = ctl(boxy, "run", "-d", "-w", str(workdir), "--net", "none", "--", "sleep", "60")
    assert r.returncode == 0, err(r)
    try:
        held = r"not approved, so held back: ports \(127\.0\.0\.1:\d+:8000\)"
        assert re.search(held, err(r)), err(r)
        assert refused(boxy, "127.0.0.1", port)  # bound before `run -d` returns, if at all
    finally:
        stop(boxy, r.stdout.decode().strip())


# Accepts on 8000 inside and holds every connection, writing how many it holds.
HOLD = r"""
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(1024)
s.settimeout(0.5)
held, end = [], time.time() + 60
while time.time() < end:
    try:
        c, _ = s.accept()
    except OSError:
        continue
    held.append(c)
    with open("held.tmp", "w") as f:
        f.write(str(len(held)))
    __import__("os").replace("held.tmp", "held")
"""


def test_ps_shows_what_a_session_publishes(boxy: Boxy) -> None:
    """`ps` left the published ports out (issue 33 §2): shown as docker's ps does."""
    port = free_port()
    r = ctl(boxy, "run", "-d", "--net", "none", "--publish", f"{port}:8000", "--", "sleep", "60")
    assert r.returncode == 0, err(r)
    sid = r.stdout.decode().strip()
    try:
        lines = ctl(boxy, "ps").stdout.decode().splitlines()
        assert lines[0].split()[5] == "PORTS", lines
        mine = [ln.split() for ln in lines if ln.startswith(sid)]
        assert mine and mine[0][5] == f"127.0.0.1:{port}->8000", lines
    finally:
        stop(boxy, sid)


def test_a_burst_past_the_connection_table_is_reset_and_said(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """§3 of issue #30: a session relays at most MAX_CONNECTIONS (256) at once; a burst
    of accepts once got 311 past it (counted by their tasks' state, not at the
    accept). Past the table a connection is reset, and the run's last lines say so."""
    port = free_port()
    r = ctl(boxy, "run", "-d", "--net", "none", "--publish", f"{port}:8000", "--",
            "python3", "-c", HOLD)  # fmt: skip
    assert r.returncode == 0, err(r)
    sid = r.stdout.decode().strip()
    held = workdir / "held"
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 20
        while not held.exists():  # the first connection waits for the server inside
            assert time.monotonic() < deadline, "the server inside never accepted"
            # nobody listening inside yet: the connection is reset, as it should be
            with contextlib.suppress(ConnectionResetError):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.2)
        for _ in range(300):  # the burst: loopback only, bounded
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except ConnectionResetError:  # past the table: reset at once (CI)
                continue
        deadline = time.monotonic() + 20
        last = -1
        while time.monotonic() < deadline:  # until the count settles
            time.sleep(1.0)
            now = int(held.read_text() or 0)
            if now == last:
                break
            last = now
        assert 200 <= last <= 256, f"the payload holds {last} connections"
    finally:
        for s in socks:
            s.close()
        stop(boxy, sid)
    deadline = time.monotonic() + 30
    while json.loads(ctl(boxy, "show", "--json", sid).stdout)["state"] in ("starting", "running"):
        assert time.monotonic() < deadline, "the session did not end"
        time.sleep(0.2)
    shown = ctl(boxy, "show", "--json", sid).stdout.decode()
    assert "connections reset at the accept: 256 were open at once" in shown, shown[-2000:]
