"""--ask on the session's terminal (issue 34 §2), in the test internet: a name the
allowlist does not hold pauses the payload's lookup and asks the user; `s` allows it
for the session (the lookup then resolves), `d` refuses it; a run with no terminal to
answer on never waits. The user is played by the PTY driver, the payload is Python's
own resolver."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from boxyd.daemon.pty import ASK_GRACE
from tests.conftest import BIN, NetBoxy, User
from tests.escape.netutil import install_ca
from tests.escape.test_terminal import run_on_pty
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox

LOOKUP = (
    "import socket\n"
    "try:\n"
    "    print('RESOLVED', socket.getaddrinfo('www.boxy.test', 443, socket.AF_INET)[0][4][0])\n"
    "except socket.gaierror as e:\n"
    "    print('REFUSED', e.errno)\n"
)
# the user reads the question before answering (pty.ASK_GRACE: keys typed sooner are dropped)
ANSWER_DELAY = ASK_GRACE + 0.3
FLAGS = ["--net", "allowlist", "--allow-host", "other.boxy.test", "--ask", "--ask-timeout", "20s"]


def _in_topology(net: Topology, user: User, workdir: Path):  # type: ignore[no-untyped-def]
    env = NetBoxy(user, workdir, net).env()
    return lambda argv: net.exec_in_host(user.cmd(argv, env))


@pytest.mark.parametrize("key,outcome", [(b"s", "RESOLVED 11."), (b"d", "REFUSED")])
def test_the_user_answers_on_the_terminal(
    net: Topology, user: User, workdir: Path, key: bytes, outcome: str
) -> None:
    net.assert_isolated()
    install_ca(net, workdir, user)
    r = run_on_pty(
        user, workdir, FLAGS, ["python3", "-c", LOOKUP],
        send=key, send_after="[d]eny", send_delay=ANSWER_DELAY,
        wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip
    assert "in the sandbox looks up www.boxy.test, which is not on its allowlist" in r.tty, r
    assert outcome in r.tty, r.tty
    # what the answer did, named under the question
    did = "allowed for this session" if key == b"s" else "refused for this session"
    assert f"www.boxy.test: {did}" in r.tty, r.tty
    assert ("ESCAPED" not in r.tty) and r.returncode == 0, r


def test_a_run_with_no_terminal_to_answer_never_waits(
    net: Topology, user: User, workdir: Path
) -> None:
    """An hour to answer, and nobody to: refused at once (the driver's own 60 s bound
    would fail the test had it waited)."""
    net.assert_isolated()
    flags = [*FLAGS[:-1], "1h"]
    r = run_on_pty(
        user, workdir, flags, ["python3", "-c", LOOKUP], stdin="pipe", stdout="pipe",
        stderr="pipe", wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip
    assert "REFUSED" in r.stdout and "looks up" not in r.stdout + r.stderr, r


def test_once_allows_this_lookup_then_the_name_is_asked_about_again(
    net: Topology, user: User, workdir: Path
) -> None:
    """`o`: resolved now; past the window (network.ONCE_WINDOW) the name is asked about
    again, and with nobody answering that time it is refused."""
    net.assert_isolated()
    twice = f"{LOOKUP}import time\ntime.sleep(11)\n{LOOKUP}"
    flags = [*FLAGS[:-1], "4s"]
    r = run_on_pty(
        user, workdir, flags, ["python3", "-c", twice],
        send=b"o", send_after="[d]eny", send_delay=ANSWER_DELAY,
        wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip
    assert r.tty.count("looks up www.boxy.test") == 2, r.tty
    assert "RESOLVED 11." in r.tty and "(no answer in 4s: www.boxy.test refused)" in r.tty
    assert r.tty.index("RESOLVED") < r.tty.rindex("REFUSED"), r.tty


def test_for_this_project_writes_boxy_yaml_approved_and_a_later_run_reaches_it(
    net: Topology, user: User, workdir: Path
) -> None:
    net.assert_isolated()
    r = run_on_pty(
        user, workdir, FLAGS, ["python3", "-c", LOOKUP],
        send=b"p", send_after="[d]eny", send_delay=ANSWER_DELAY,
        wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip
    assert "RESOLVED 11." in r.tty and f"added to {workdir}/.boxy.yaml and approved" in r.tty
    assert (workdir / ".boxy.yaml").read_text() == 'allow_hosts:\n  - "www.boxy.test"\n'
    # a run that neither asks nor names it: the approved project allows it
    again = NetBoxy(user, workdir, net).run("--net", "allowlist", cmd=["python3", "-c", LOOKUP])
    assert b"RESOLVED 11." in again.stdout, again


def test_for_this_project_never_approves_what_the_payload_wrote(
    net: Topology, user: User, workdir: Path
) -> None:
    """The payload writes its own .boxy.yaml, then looks up: `p` allows the name for
    the session only, and neither writes nor approves the payload's file."""
    net.assert_isolated()
    planted = "allow_hosts:\n  - c2.boxy.test\n"
    plant = f"open('.boxy.yaml', 'w').write({planted!r})\n{LOOKUP}"
    r = run_on_pty(
        user, workdir, FLAGS, ["python3", "-c", plant],
        send=b"p", send_after="[d]eny", send_delay=ANSWER_DELAY,
        wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip
    assert "RESOLVED 11." in r.tty, r.tty
    assert "allowed for this session only" in r.tty and "not approved as it is now" in r.tty
    assert (workdir / ".boxy.yaml").read_text() == planted
    env = NetBoxy(user, workdir, net).env()
    trusted = subprocess.run(
        net.exec_in_host(user.cmd([str(BIN / "boxyctl"), "trust", "--list"], env)),
        capture_output=True, cwd=workdir, timeout=60, check=True,
    )  # fmt: skip
    assert str(workdir).encode() not in trusted.stdout, trusted
