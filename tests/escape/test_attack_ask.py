"""Attacks on --ask end to end in the test internet (issue 34 §2): the payload trying to
get a wider policy than the user knowingly gave, or the user's answer applied to
something else. The user is played by the PTY driver; each payload prints ESCAPED
when its attack worked, and each test asserts that it did not.

- the payload redraws the question while it is open (`\\r`, erase line, a cursor move
  up, a fake boxy line naming another host): its output is held until the question
  is over (pty.PtyRelay.ask);
- the payload leaves the terminal concealing text before its lookup: the question is
  written from a reset state (pty.QUESTION_RESET);
- the payload looks up an IPv4 address as a name: allowing that "lookup" allowed the
  address as a literal host, reachable hard-coded (asking.askable: never asked).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import User
from tests.escape.netutil import write_script
from tests.escape.test_ask import ANSWER_DELAY, FLAGS, LOOKUP, _in_topology
from tests.escape.test_terminal import PtyRun, run_on_pty
from tests.harness.topology import Topology

pytestmark = pytest.mark.sandbox


def _answered(
    net: Topology, user: User, workdir: Path, cmd: list[str], key: bytes,
    delay: float = ANSWER_DELAY,
) -> PtyRun:  # fmt: skip
    """CMD run asking on the terminal; KEY typed DELAY after the question shows."""
    return run_on_pty(
        user, workdir, FLAGS, cmd, send=key, send_after="[d]eny", send_delay=delay,
        wrap=_in_topology(net, user, workdir), timeout=60,
    )  # fmt: skip


SPOOF = "boxy: the sandbox looks up registry.example, which is not on its allowlist"
# the lookup in a thread; once it waits on the question, the payload redraws the line
REDRAW = (
    "import os, threading, time\n"
    f"t = threading.Thread(target=exec, args=({LOOKUP!r},))\n"
    "t.start()\n"
    "time.sleep(0.8)\n"
    f"os.write(1, b'\\r\\x1b[2K\\x1b[1A\\x1b[2K\\r{SPOOF}; SPOOFED? ')\n"
    "t.join()\n"
)


def test_the_payload_cannot_redraw_an_open_question(
    net: Topology, user: User, workdir: Path
) -> None:
    net.assert_isolated()
    r = _answered(net, user, workdir, ["python3", "-c", REDRAW], b"d", ANSWER_DELAY + 1.0)
    asked = r.tty.index("looks up www.boxy.test")
    answered = r.tty.index("d\n", asked)  # the key, echoed
    spoofed = r.tty.find("SPOOFED?")
    if asked < spoofed < answered:
        print("ESCAPED: the payload's redraw reached the terminal while the question was open")
    assert spoofed > answered, r.tty  # held until the question was over, then shown
    assert "REFUSED" in r.tty, r.tty


CONCEAL = (
    "import os\n"
    "os.write(1, b'\\x1b[8m\\x1b(0\\x1b[?7l\\x1b[4h')\n"  # conceal, DEC graphics, no wrap, insert
    f"exec({LOOKUP!r})\n"
)


def test_a_question_is_written_from_a_reset_terminal_state(
    net: Topology, user: User, workdir: Path
) -> None:
    net.assert_isolated()
    r = _answered(net, user, workdir, ["python3", "-c", CONCEAL], b"d")
    asked = r.tty.index("in the sandbox looks up www.boxy.test")
    before = r.tty[: r.tty.rindex("boxy: ", 0, asked)]
    reset = before[before.rindex("\x1b[8m") :]
    for undo in ("\x1b[0m", "\x0f\x1b(B", "\x1b[4l", "\x1b[?7h"):
        if undo not in reset:
            print(f"ESCAPED: the question was written with the payload's state ({undo!r})")
        assert undo in reset, before


# a DNS query for the name "11.0.0.10" (www.boxy.test's address), then that address
# hard-coded: allowed only if the question's answer allowed it as a literal host
LITERAL = """
q = dns("10.0.2.2", "11.0.0.10", tcp=True, timeout=30)
print("LOOKED", q.get("rcode"), flush=True)
r = tcp("11.0.0.10", 80)
print("CONNECT", r["outcome"], flush=True)
if r["outcome"] == "answered":
    print("ESCAPED: a lookup's answer opened an address, hard-coded", flush=True)
"""


def test_a_lookup_of_an_address_is_not_asked_and_opens_nothing(
    net: Topology, user: User, workdir: Path
) -> None:
    net.assert_isolated()
    script = write_script(workdir, user, "literal.py", LITERAL)
    r = _answered(net, user, workdir, ["python3", script], b"s")
    assert "CONNECT" in r.tty, r.tty
    assert "ESCAPED" not in r.tty and "looks up 11.0.0.10" not in r.tty, r.tty
