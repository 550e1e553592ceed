"""--ask on the session's terminal (issue 34 §2), in the test internet: a name the
allowlist does not hold pauses the payload's lookup and asks the user; `s` allows it
for the session (the lookup then resolves), `d` refuses it; a run with no terminal to
answer on never waits. The user is played by the PTY driver, the payload is Python's
own resolver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import NetBoxy, User
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
        send=key, send_after="[d]eny", wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip
    assert "in the sandbox looks up www.boxy.test, which is not on its allowlist" in r.tty, r
    assert outcome in r.tty, r.tty
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
