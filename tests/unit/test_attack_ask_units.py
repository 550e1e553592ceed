"""Attacks on --ask, unit level (issue 34 §2): the payload getting a wider policy than
the user knowingly gave, or the user's answer applied to something else. Each test
fails (says ESCAPED) only when the attack got through.

The terminal: a real PTY pair plays the client's terminal (tests/unit/test_pty.py's
fixture), another the sandbox's. The payload writes to the sandbox's slave."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
import time
import tty
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import dns.message
import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from boxy.errors import UsageError
from boxyd.api.dbus import BUS_NAME, SESSION_INTERFACE, DbusService, session_path
from boxyd.api.notify import NOTIFICATIONS_PATH
from boxyd.config import projectconfig, trust
from boxyd.daemon.asking import Answer, Asking, TerminalQuestions
from boxyd.daemon.manager import Manager
from boxyd.daemon.pty import ASK_GRACE, QUESTION_RESET, PtyRelay
from boxyd.net.dnsproxy import AskUser, DnsProxy, DnsSession
from boxyd.net.policy import NetPolicy
from tests.unit.test_asking import Terminal, asker
from tests.unit.test_core import FakeLauncher, request, started
from tests.unit.test_dbus import BusDaemon, Decided, NotificationServer
from tests.unit.test_pty import attach_pair, read_until

QUESTION = "boxy: the sandbox looks up c2.example; [s]ession [d]eny "
KEYS = {"s": "session", "d": "deny"}
SPOOF = b"\r\x1b[2K\x1b[1A\x1b[2Kboxy: the sandbox looks up registry.example SPOOFED "


def read_for(fd: int, seconds: float) -> bytes:
    """What FD gives within SECONDS."""
    out = bytearray()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            out += os.read(fd, 65536)
    return bytes(out)


@pytest.fixture
def term() -> Iterator[tuple[int, int]]:
    """The client's terminal: (its master, played by the test; its slave)."""
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


@contextlib.contextmanager
def relay_on(term: tuple[int, int]) -> Iterator[tuple[PtyRelay, int, int]]:
    """A relay with a client that can answer: (relay, the client terminal's master,
    the payload's slave)."""
    ctl_master, ctl_slave = term
    fd = os.dup(ctl_slave)
    relay = PtyRelay(fd, fd)
    slave = attach_pair(relay)
    relay.connect(os.dup(ctl_slave), os.dup(ctl_slave), replay=False)
    tty.setraw(ctl_slave)
    try:
        yield relay, ctl_master, slave
    finally:
        relay.close()
        os.close(slave)


# --- the terminal: what the user reads, and which key answers ------------------------


async def test_the_payload_cannot_redraw_an_open_question(term: tuple[int, int]) -> None:
    with relay_on(term) as (relay, ctl, slave):
        relay.ask(QUESTION, KEYS)
        await asyncio.to_thread(read_until, ctl, b"[d]eny ")
        os.write(slave, SPOOF)  # the payload, while the question is open
        meanwhile = await asyncio.to_thread(read_for, ctl, 0.5)
        assert b"SPOOFED" not in meanwhile, f"ESCAPED: redrawn while open: {meanwhile!r}"
        relay.end_question("(refused)")
        after = await asyncio.to_thread(read_until, ctl, b"SPOOFED ")
        assert after.index(b"(refused)") < after.index(b"SPOOFED"), after  # then shown


async def test_output_written_before_a_question_is_shown_before_it(
    term: tuple[int, int],
) -> None:
    with relay_on(term) as (relay, ctl, slave):
        for _ in range(20):
            os.write(slave, SPOOF)
            relay.ask(QUESTION, KEYS)  # the lookup right behind the write
            said = await asyncio.to_thread(read_until, ctl, b"[d]eny ")
            tail = said[said.rindex(QUESTION_RESET) :]
            assert b"SPOOFED" not in tail, f"ESCAPED: the payload's bytes after it: {tail!r}"
            relay.end_question("")
            await asyncio.to_thread(read_for, ctl, 0.05)


async def test_the_question_is_written_from_a_reset_state(term: tuple[int, int]) -> None:
    with relay_on(term) as (relay, ctl, slave):
        os.write(slave, b"\x1b[8m\x1b(0\x1b[?7l\x1b[4h\x1b#6")  # concealed, graphics, cut
        await asyncio.to_thread(read_until, ctl, b"\x1b#6")
        relay.ask(QUESTION, KEYS)
        said = await asyncio.to_thread(read_until, ctl, b"[d]eny ")
        assert said.endswith(QUESTION_RESET + QUESTION.encode()), f"ESCAPED: {said!r}"
        relay.end_question("")


async def test_keys_typed_before_the_question_could_be_read_are_no_answer(
    term: tuple[int, int],
) -> None:
    """The payload sees each key the user types for it, and can open a question mid-word
    ("npm in|stall": the next `s` would allow for the session)."""
    with relay_on(term) as (relay, ctl, slave):
        answer = relay.ask(QUESTION, KEYS)
        await asyncio.to_thread(read_until, ctl, b"[d]eny ")
        for key in b"stall lodash":  # typing on, as fast as a person types
            os.write(ctl, bytes([key]))
            await asyncio.sleep(0.1)
        assert not answer.done(), "ESCAPED: a key typed ahead answered the question"
        assert await asyncio.to_thread(read_for, slave, 0.2) == b""  # nor the payload's
        await asyncio.sleep(ASK_GRACE + 0.2)  # the user stops, reads, answers
        os.write(ctl, b"d")
        assert await asyncio.wait_for(answer, 5) == "deny"
        relay.end_question("")


async def test_a_client_that_takes_over_during_a_question_is_shown_it(
    term: tuple[int, int],
) -> None:
    """`boxyctl attach` from another terminal while a question is open: the keys the
    user types there must not answer a question that terminal never showed."""
    with relay_on(term) as (relay, _, _slave):
        answer = relay.ask(QUESTION, KEYS)
        other_master, other_slave = os.openpty()
        try:
            tty.setraw(other_slave)
            relay.connect(os.dup(other_slave), os.dup(other_slave), replay=True)
            shown = await asyncio.to_thread(read_for, other_master, 0.5)
            if QUESTION.encode() not in shown:
                os.write(other_master, b"ls -s")
                await asyncio.sleep(0.2)
                assert not answer.done(), "ESCAPED: answered from a terminal never shown it"
            assert QUESTION.encode() in shown, shown
        finally:
            relay.end_question("")
            os.close(other_master)
            os.close(other_slave)


async def test_a_question_the_run_gives_up_ends_and_lets_the_output_go(
    term: tuple[int, int],
) -> None:
    """The run ends (its DNS task cancelled) with a question open: the question ends
    with it, so neither its key nor the held output waits on for its timeout."""
    with relay_on(term) as (relay, ctl, slave):
        decided: list[str] = []

        async def decide(host: str, answer: Answer, via: str) -> None:
            decided.append(host)

        asking = Asking(60, lambda: [TerminalQuestions(lambda: relay)], decide)
        task = asyncio.ensure_future(asking.ask("c2.example"))
        await asyncio.to_thread(read_until, ctl, b"[d]eny ")
        os.write(slave, b"after ")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        said = await asyncio.to_thread(read_until, ctl, b"after ", 5)
        assert said.endswith(b"after "), f"ESCAPED: still open: {said!r}"
        assert relay.can_ask() and not decided


# --- what an answer may allow -------------------------------------------------------


@pytest.mark.parametrize("host", ["11.0.0.10", "93.184.216.34", "1.2.3.4"])
async def test_a_lookup_of_an_address_is_never_asked(host: str) -> None:
    """Allowed, "1.2.3.4" would be a literal host: the address reachable hard-coded,
    by any name, when the question only named a lookup."""
    t = Terminal()
    allowed = await asker(t).ask(host)
    assert not t.asked and not allowed, f"ESCAPED: asked about {host}, which allows an address"
    # (what an answer would have done: the address its own binding, for the run)
    assert NetPolicy.from_spec("allowlist", ["a.example"]).widened([host]).literal_addresses() == [
        host
    ]


def test_a_name_boxyctl_deny_refused_is_not_asked_about_again() -> None:
    async def ask(name: str, port: int | None, flow: object) -> bool:
        return True  # a user who would answer yes, if asked

    policy = NetPolicy.from_spec("allowlist", ["a.example"]).narrowed(["c2.example"])
    session = DnsSession(policy=policy, ask=ask)
    wire = dns.message.make_query("c2.example", "A").to_wire()
    got = DnsProxy([("127.0.0.1", 53)], ipv6=False).answer_now(wire, tcp=False, session=session)
    assert not isinstance(got, AskUser), "ESCAPED: a name denied for the session asked again"


# --- `for this project`: exactly the old approval plus the host --------------------

APPROVED = [
    "allow_hosts: [a.example]\n",
    "allow_hosts:\n  - a.example\nnet: allowlist\n",
    "allow_hosts:\n- a.example\n",
    "allow_hosts:\r\n  - a.example\r\n",
    "\ufeffallow_hosts:\n  - a.example\n",
    "allow_hosts: [a.example]\n---\nallow_hosts: [evil.example]\n",
    "{allow_hosts: [a.example], net: allowlist}\n",
    "base: &b [a.example]\nallow_hosts: *b\n",
    "<<: {allow_hosts: [evil.example]}\nallow_hosts: [a.example]\n",
    'allow_hosts: [a.example]\n"allow_hosts": [evil.example]\n',
    'description: "x\nallow_hosts: [evil.example]"\nallow_hosts: [a.example]\n',
    "description: |\n  allow_hosts:\n  - evil.example\nallow_hosts: [a.example]\n",
    "allow_hosts: [a.example,\n  b.example]\n",
    "? allow_hosts\n: [a.example]\n",
    "allow_hosts:\n\t- a.example\n",
    "allow_hosts: ~\n",
    "allow_hosts:\n  - a.example\n...\n",
    "allow_hosts:\n  - a.example\n# allow_hosts: [evil.example]\n  - b.example\n",
    "allow_hosts:\n  - a.example",
    "net: allowlist\n",
]


def _project(tmp_path: Path, text: str) -> tuple[str, str, str]:
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / ".boxy.yaml").write_bytes(text.encode())
    return str(work), str(home), str(home / ".config")


def _digests(config_home: str, workdir: str) -> set[str]:
    return {r["digest"] for r in projectconfig.approvals(config_home) if r["workdir"] == workdir}


@pytest.mark.parametrize("text", APPROVED)
def test_for_this_project_approves_exactly_the_old_approval_plus_the_host(
    tmp_path: Path, text: str
) -> None:
    work, home, cfg = _project(tmp_path, text)
    env: dict[str, str] = {}
    try:
        trust.approve(work, home, "u", env, cfg)
    except UsageError:  # not a file `trust` approves: nor is it edited and approved
        with pytest.raises(UsageError):
            trust.allow_in_project("c2.example", work, home, "u", env, cfg)
        assert not _digests(cfg, work) and Path(work, ".boxy.yaml").read_text() == text
        return
    before = projectconfig.read(work, projectconfig.run_env(home, "u", env))
    old = _digests(cfg, work)
    try:
        trust.allow_in_project("c2.example", work, home, "u", env, cfg)
    except UsageError:
        assert _digests(cfg, work) == old and Path(work, ".boxy.yaml").read_bytes() == before.config
        return
    after = projectconfig.read(work, projectconfig.run_env(home, "u", env))
    assert before.doc is not None and after.doc is not None
    want = {**before.doc, "allow_hosts": [*(before.doc.get("allow_hosts") or []), "c2.example"]}
    assert after.doc == want, f"ESCAPED: approved {after.doc} for {want}"
    assert _digests(cfg, work) == old | {after.digest}


def test_for_this_project_never_approves_a_registry_the_payload_named(tmp_path: Path) -> None:
    work, home, cfg = _project(tmp_path, "allow_hosts: [a.example]\n")
    trust.approve(work, home, "u", {}, cfg)
    Path(work, ".npmrc").write_text("registry=https://evil.example/\n")
    with pytest.raises(UsageError):
        trust.allow_in_project("c2.example", work, home, "u", {}, cfg)
    assert not any(
        "evil.example" in str(r.get("registries")) for r in projectconfig.approvals(cfg)
    ), "ESCAPED: the payload's registry approved with the host"


def _put_back(target: Path, text: str) -> None:
    side = target.with_name(".put-back")
    side.write_text(text)
    while True:
        try:
            os.replace(side, target)
            return
        except IsADirectoryError:
            with contextlib.suppress(OSError):
                target.rmdir()


def test_for_this_project_races_the_payload_swapping_the_file(tmp_path: Path) -> None:
    """While boxyd edits, the payload swaps .boxy.yaml for a symlink out of the tree,
    a FIFO, a directory, a hard link to another file of its own: nothing outside is
    written, and nothing is approved that boxy did not write."""
    work, home, cfg = _project(tmp_path, "allow_hosts: [a.example]\n")
    trust.approve(work, home, "u", {}, cfg)
    old = _digests(cfg, work)
    outside = tmp_path / "outside.yaml"
    outside.write_text("allow_hosts: [evil.example]\n")
    mine = Path(work, "mine.yaml")
    mine.write_text("allow_hosts: [evil.example]\n")
    stop = threading.Event()
    target = Path(work, ".boxy.yaml")
    forms: list[Callable[[Path], object]] = [
        lambda p: p.symlink_to(outside),
        lambda p: os.mkfifo(p),
        lambda p: p.mkdir(),
        lambda p: os.link(mine, p),
    ]

    def swap() -> None:
        i = 0
        while not stop.is_set():
            side = Path(work, f".swap{i}")
            with contextlib.suppress(OSError):
                forms[i % len(forms)](side)
                os.rename(side, target)  # (a directory over a file fails: it stays)
            i += 1

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    try:
        for _ in range(30):
            with contextlib.suppress(UsageError):
                trust.allow_in_project("c2.example", work, home, "u", {}, cfg)
            _put_back(target, "allow_hosts: [a.example]\n")  # each edit from the approved file
    finally:
        stop.set()
        t.join()
    assert outside.read_text() == "allow_hosts: [evil.example]\n", "ESCAPED: written outside"
    assert mine.read_text() == "allow_hosts: [evil.example]\n", "ESCAPED: through a hard link"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / ".boxy.yaml").write_text('allow_hosts: [a.example, "c2.example"]\n')
    boxy_wrote = projectconfig.read(str(scratch), {}).digest
    assert _digests(cfg, work) <= old | {boxy_wrote}, "ESCAPED: approved what boxy did not write"


# --- the bus: only the notification server speaks for its notifications, and an
# answer goes to the session it was given to ------------------------------------------


@pytest.fixture
async def on_bus(tmp_path: Path) -> AsyncIterator[tuple[Manager, BusDaemon]]:
    daemon = BusDaemon(tmp_path)
    manager = Manager(FakeLauncher(), grace=0.05, keep_finished=0)
    service = DbusService(manager, lambda pid, pidfd: None)
    try:
        await service.start(daemon.address)
        yield manager, daemon
    finally:
        service.close()
        daemon.kill()


async def test_a_forged_action_from_another_connection_answers_nothing(
    on_bus: tuple[Manager, BusDaemon],
) -> None:
    manager, daemon = on_bus
    server_bus = await MessageBus(bus_address=daemon.address).connect()
    server = NotificationServer()
    server_bus.export(NOTIFICATIONS_PATH, server)
    await server_bus.request_name("org.freedesktop.Notifications")
    forger_bus = await MessageBus(bus_address=daemon.address).connect()
    forger = NotificationServer()  # the same interface, from another connection
    forger_bus.export(NOTIFICATIONS_PATH, forger)
    s = await manager.start(request(), [])
    await started(s)
    s.spec.ask_notify = True
    decided = Decided()
    pending = asyncio.ensure_future(Asking(20, lambda: [s.questions], decided).ask("c2.example"))
    for _ in range(100):
        if server.shown:
            break
        await asyncio.sleep(0.02)
    nid = server.shown[0][0]
    forger.ActionInvoked(nid, "session")
    await asyncio.sleep(0.3)
    assert not pending.done(), f"ESCAPED: a forged ActionInvoked answered: {decided.answers}"
    server.NotificationClosed(nid, 2)  # the user dismisses it: a denial
    assert await asyncio.wait_for(pending, 5) is False
    forger_bus.disconnect()
    server_bus.disconnect()
    manager.stop(s.id, kill=True)
    await s.wait()


async def test_an_answer_on_one_session_answers_no_other_sessions_question(
    on_bus: tuple[Manager, BusDaemon],
) -> None:
    manager, daemon = on_bus
    mine, other = await manager.start(request(), []), await manager.start(request(), [])
    await started(mine)
    await started(other)
    await asyncio.sleep(0.1)  # the objects on the bus
    mine.questions.can = other.questions.can = lambda: True
    decided = Decided()
    pending = asyncio.ensure_future(Asking(20, lambda: [mine.questions], decided).ask("c2.example"))
    await asyncio.sleep(0.05)
    client = await MessageBus(bus_address=daemon.address).connect()
    reply = await client.call(
        Message(destination=BUS_NAME, path=session_path(other.id), interface=SESSION_INTERFACE,
                member="Answer", signature="us", body=[1, "session"])
    )  # fmt: skip
    assert reply.message_type == MessageType.ERROR, reply.body
    assert not pending.done(), "ESCAPED: another session's Answer answered this question"
    mine.questions.answer(1, "deny")
    assert await asyncio.wait_for(pending, 5) is False
    client.disconnect()
    for s in (mine, other):
        manager.stop(s.id, kill=True)
        await s.wait()
