"""--ask names who asked, and asks about a connection too (issue 34 §2), in the test
internet, with the PTY driver as the user:

- a lookup: the question names the program that looked the name up by the pid it
  sees itself by and its argv[0] (a script run as `/usr/bin/python3 who.py`, which
  prints its own pid first);
- a connection: a TLS client that sends the SNI of a host not allowed (cdn-b) to an
  address bound for an allowed one (cdn-a: both share the CDN's address) is held
  before its first byte leaves and asked about; allowed, its request is answered by
  the host it named; denied, it gets the refusal it gets today (the TLS
  `access_denied` alert)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import User
from tests.escape.netutil import install_ca
from tests.escape.test_ask import ANSWER_DELAY, _in_topology
from tests.escape.test_terminal import run_on_pty
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

LOOKUP = """\
import os, socket, sys
print("MYPID", os.getpid(), flush=True)
try:
    print("RESOLVED", socket.getaddrinfo("www.boxy.test", 443, socket.AF_INET)[0][4][0])
except socket.gaierror as e:
    print("REFUSED", e.errno)
"""

# cdn-a is allowed; the TLS connection to its (shared) address names cdn-b. While that
# one is held, another (cdn-a's own) is answered: the pause holds nothing shared.
CONNECT = """\
import os, socket, ssl, sys, threading, time
print("MYPID", os.getpid(), flush=True)
addr = socket.getaddrinfo("cdn-a.boxy.test", 443, socket.AF_INET)[0][4][0]
ctx = ssl.create_default_context(cafile="ca.pem")
def fetch(name, label):
    try:
        with socket.create_connection((addr, 443), timeout=40) as raw:
            with ctx.wrap_socket(raw, server_hostname=name) as tls:
                tls.sendall(b"GET / HTTP/1.0\\r\\nHost: " + name.encode() + b"\\r\\n\\r\\n")
                reply = b""
                while chunk := tls.recv(65536):
                    reply += chunk
                peer = dict(x[0] for x in tls.getpeercert()["subject"])["commonName"]
        first = reply.split(b"\\r\\n")[0].decode()
        said = f"{label} {first} from {peer}"
    except (ssl.SSLError, OSError) as e:
        said = f"DENIED {getattr(e, 'reason', None) or e}"
    # the terminal shows nothing of the payload's while a question is open: the other
    # fetch's outcome goes to a file, with when it came (this process's own clock)
    if label == "OTHER":
        open("other.txt", "w").write(f"{time.monotonic()} {said}\\n")
    else:
        print(said, flush=True)
        print("ANSWERED_AT", time.monotonic(), flush=True)
held = threading.Thread(target=fetch, args=("cdn-b.boxy.test", "REPLY"))
held.start()
time.sleep(1)  # the question is up by now
fetch("cdn-a.boxy.test", "OTHER")
held.join()
"""

ALLOWED = ["--net", "allowlist", "--allow-host", "cdn-a.boxy.test", "--allow-host"]
FLAGS = [*ALLOWED, "other.boxy.test", "--ask", "--ask-timeout", "30s"]


def _run(net: Topology, user: User, workdir: Path, script: str, key: bytes, after: str):  # type: ignore[no-untyped-def]
    net.assert_isolated()
    install_ca(net, workdir, user)
    (workdir / "who.py").write_text(script)
    user.chown(workdir / "who.py")
    return run_on_pty(
        user, workdir, FLAGS, ["/usr/bin/python3", "who.py"],
        send=key, send_after=after, send_delay=ANSWER_DELAY,
        wrap=_in_topology(net, user, workdir), timeout=90,
    )  # fmt: skip


def _own_pid(tty: str) -> int:
    found = re.search(r"^MYPID (\d+)$", tty, re.M)
    assert found, tty
    return int(found.group(1))


def test_a_lookup_asked_about_names_the_program_that_looked_it_up(
    net: Topology, user: User, workdir: Path
) -> None:
    r = _run(net, user, workdir, LOOKUP, b"d", "[d]eny")
    pid = _own_pid(r.tty)
    asked = re.search(r"boxy: pid (\d+) \((.*?), pid (\d+) on the host\) in the sandbox", r.tty)
    assert asked, r.tty
    assert int(asked.group(1)) == pid and asked.group(2) == "/usr/bin/python3", r.tty
    assert int(asked.group(3)) != pid  # the host's pid of it: another pid namespace
    assert "looks up www.boxy.test, which is not on its allowlist" in r.tty, r.tty
    assert "REFUSED" in r.tty and r.returncode == 0, r


@pytest.mark.parametrize("key", [b"s", b"d"])
def test_a_connection_whose_name_is_not_allowed_is_held_and_asked_about(
    net: Topology, user: User, workdir: Path, key: bytes
) -> None:
    r = _run(net, user, workdir, CONNECT, key, "[d]eny")
    pid = _own_pid(r.tty)
    assert f"boxy: pid {pid} (/usr/bin/python3, pid " in r.tty, r.tty
    assert "connects to cdn-b.boxy.test:443, which is not on its allowlist" in r.tty, r.tty
    other_at, other = (workdir / "other.txt").read_text().split(" ", 1)
    assert re.match(r"OTHER HTTP/1.. 200 .*from cdn-a.boxy.test$", other), other
    answered_at = re.search(r"^ANSWERED_AT (\S+)", r.tty, re.M)
    assert answered_at and float(other_at) < float(answered_at.group(1)), r.tty  # while held
    if key == b"s":  # allowed: answered by the host it named, through the gateway
        assert re.search(r"REPLY HTTP/1.. 200 .*from cdn-b.boxy.test$", r.tty, re.M), r.tty
    else:  # denied: the refusal it gets without --ask
        assert "DENIED" in r.tty and "ACCESS_DENIED" in r.tty.upper(), r.tty
    assert r.returncode == 0, r
