"""--ask answered on the bus (issue 34 §2), end to end in the test internet: a run with
no terminal, a session bus the topology's boxyd joined as D-Bus activation makes it
join, and a desktop tool written with dbus-python that said it answers
(Manager1.AnswerQuestions). The payload's lookup waits for the tool's `session`, then
resolves; the question named the host and the program that asked (its pid as the
host sees it)."""

from __future__ import annotations

import select
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, NetBoxy, User
from tests.escape.test_ask import FLAGS, LOOKUP
from tests.harness.topology import Topology
from tests.unit.test_dbus import ANSWERING_TOOL

pytestmark = pytest.mark.sandbox


def _line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else b""


@pytest.fixture
def bus(net: Topology, user: User, workdir: Path) -> Iterator[str]:
    """A session bus of the user's, joined by the topology's boxyd (the activation
    path: a second boxyd started by the bus hands it to the running one)."""
    env = NetBoxy(user, workdir, net).env()
    where = Path(env["XDG_RUNTIME_DIR"]) / "test-bus"
    daemon = subprocess.Popen(
        net.exec_in_host(user.cmd(
            ["dbus-daemon", "--session", "--nofork", "--print-address=1",
             f"--address=unix:path={where}"], env,
        )),
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        address = _line(daemon, 10).decode().strip()
        assert address.startswith("unix:"), address
        for argv, extra in (
            ([str(BIN / "boxyctl"), "ps"], {}),  # the topology's boxyd, up
            ([str(BIN / "boxyd")], {"DBUS_STARTER_ADDRESS": address}),  # joins the bus
        ):
            argv = net.exec_in_host(user.cmd(argv, {**env, **extra}))
            subprocess.run(argv, capture_output=True, timeout=60, check=True)
        yield address
    finally:
        daemon.kill()
        daemon.wait()


def test_a_desktop_tool_answers_the_question_of_a_run_without_a_terminal(
    net: Topology, user: User, workdir: Path, bus: str
) -> None:
    net.assert_isolated()
    env = NetBoxy(user, workdir, net).env()
    tool = subprocess.Popen(
        net.exec_in_host(user.cmd(["/usr/bin/python3", "-c", ANSWERING_TOOL, bus], env)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert _line(tool, 20) == b"READY True\n"
        r = NetBoxy(user, workdir, net).run(*FLAGS, cmd=["python3", "-c", LOOKUP], timeout=60)
        out, err = tool.communicate(timeout=30)
    finally:
        if tool.poll() is None:
            tool.kill()
    assert b"RESOLVED 11." in r.stdout, r
    lines = out.decode().splitlines()
    assert lines[0].startswith("ASKED 1 www.boxy.test 0 "), (lines, err)
    pid, argv0 = lines[0].split()[4:6]  # the program that looked it up, as the host sees it
    assert int(pid) > 1 and argv0 == "python3", lines
    assert lines[1:] == ["ANSWERED www.boxy.test", "ENDED 1 session"], (lines, err)
    assert lines[0].split()[-1].startswith("/dev/boxy/session/"), lines
