"""The D-Bus adapter on a real bus (a private dbus-daemon) over the real core with the
fake launcher of test_core: introspection with named signal arguments, the
ObjectManager, Run's build check in the core, a flood that grows nothing, the loss
of the bus, and joining a bus later (main.Bus, which JoinBus calls)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import types
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dbus_fast")
from dbus_fast import Message, MessageType  # noqa: E402
from dbus_fast.aio import MessageBus  # noqa: E402
from dbus_fast.service import ServiceInterface, method  # noqa: E402
from dbus_fast.service import signal as dbus_signal  # noqa: E402

from boxy.errors import UsageError  # noqa: E402
from boxyd.api.dbus import BUS_NAME, MANAGER_PATH, DbusService, session_path  # noqa: E402
from boxyd.daemon.asking import Answer, Asking, Who  # noqa: E402
from boxyd.daemon.events import BOUND  # noqa: E402
from boxyd.daemon.manager import Manager  # noqa: E402
from boxyd.daemon.scopes import Scopes  # noqa: E402
from boxyd.daemon.serve import Bus  # noqa: E402
from tests.unit.test_core import FakeLauncher, request, started  # noqa: E402

# dbus-daemon is one of make setup's packages (dbus-user-session): never skipped


class BusDaemon:
    """A private session bus: dbus-daemon on a socket in a temporary directory."""

    def __init__(self, where: Path) -> None:
        self.proc = subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--print-address=1",
             f"--address=unix:path={where}/bus"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.address = self.proc.stdout.readline().strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


OnBus = tuple[Manager, DbusService, MessageBus]


@pytest.fixture
def bus_daemon(tmp_path: Path) -> Iterator[BusDaemon]:
    d = BusDaemon(tmp_path)
    yield d
    d.kill()


@pytest.fixture
async def on_bus(bus_daemon: BusDaemon) -> AsyncIterator[OnBus]:
    manager = Manager(FakeLauncher(), grace=0.05, keep_finished=0)
    service = DbusService(manager, lambda pid, pidfd: None)
    await service.start(bus_daemon.address)
    client = await MessageBus(bus_address=bus_daemon.address, negotiate_unix_fd=True).connect()
    yield manager, service, client
    client.disconnect()
    service.close()


async def call(client: MessageBus, path: str, interface: str, member: str,
               signature: str = "", body: list[Any] | None = None, **kw: Any) -> Message:  # fmt: skip
    return await client.call(
        Message(destination=BUS_NAME, path=path, interface=interface, member=member,
                signature=signature, body=body or [], **kw)
    )  # fmt: skip


def signals(client: MessageBus, member: str) -> list[Message]:
    got: list[Message] = []

    def handler(msg: Message) -> None:
        if msg.message_type == MessageType.SIGNAL and msg.member == member:
            got.append(msg)

    client.add_message_handler(handler)
    return got


async def add_match(client: MessageBus, rule: str) -> None:
    await client.call(
        Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus", member="AddMatch", signature="s", body=[rule])
    )  # fmt: skip


async def introspect(client: MessageBus, path: str) -> ET.Element:
    reply = await call(client, path, "org.freedesktop.DBus.Introspectable", "Introspect")
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    return ET.fromstring(reply.body[0])


async def test_every_argument_is_named_in_the_introspection(on_bus: OnBus) -> None:
    """Issue 32 §5: results showed as arg_0 in clients; signals' arguments too."""
    manager, _, client = on_bus
    s = await manager.start(request(), [])
    await started(s)
    for path in (MANAGER_PATH, session_path(s.id)):
        node = await introspect(client, path)
        ours = [i for i in node.iter("interface") if i.get("name", "").startswith("dev.boxy.")]
        assert ours, path
        args = [a for i in ours for a in i.iter("arg")]
        assert args and all(a.get("name") for a in args), ET.tostring(ours[0]).decode()
    node = await introspect(client, MANAGER_PATH)
    run = node.find("interface/method[@name='Run']")
    assert run is not None
    assert [a.get("name") for a in run.iter("arg") if a.get("direction") == "out"] == ["id", "path"]
    new = node.find("interface/signal[@name='SessionNew']")
    assert new is not None and [a.get("name") for a in new.iter("arg")] == ["id", "path"]


OBJECT_MANAGER = "org.freedesktop.DBus.ObjectManager"


async def test_the_object_manager_is_advertised_and_answers_at_dev_boxy_only(on_bus: OnBus) -> None:
    """Issue 32 §5: introspecting /dev/boxy showed no ObjectManager though it answered
    there; /dev/boxy/Manager and every session advertised an empty one."""
    manager, _, client = on_bus
    s = await manager.start(request(), [])
    await started(s)
    names = {
        path: {i.get("name") for i in (await introspect(client, path)).iter("interface")}
        for path in ("/dev/boxy", MANAGER_PATH, session_path(s.id))
    }
    assert OBJECT_MANAGER in names["/dev/boxy"], names
    assert {n for n in names["/dev/boxy"] if n and n.startswith("dev.boxy.")} == set()
    assert OBJECT_MANAGER not in names[MANAGER_PATH] | names[session_path(s.id)], names
    assert "dev.boxy.Manager1" in names[MANAGER_PATH]
    for path in (MANAGER_PATH, session_path(s.id), "/"):
        reply = await call(client, path, OBJECT_MANAGER, "GetManagedObjects")
        assert reply.message_type == MessageType.ERROR, (path, reply.body)
        assert reply.error_name == "org.freedesktop.DBus.Error.UnknownMethod"
    reply = await call(client, "/dev/boxy", OBJECT_MANAGER, "GetManagedObjects")
    assert reply.message_type == MessageType.METHOD_RETURN
    assert set(reply.body[0]) == {MANAGER_PATH, session_path(s.id)}


async def test_the_object_manager_adds_and_removes_sessions(on_bus: OnBus) -> None:
    manager, _, client = on_bus
    await add_match(
        client, "type='signal',path='/dev/boxy',interface='org.freedesktop.DBus.ObjectManager'"
    )
    added, removed = signals(client, "InterfacesAdded"), signals(client, "InterfacesRemoved")
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.2)
    objects = (
        await call(client, "/dev/boxy", "org.freedesktop.DBus.ObjectManager", "GetManagedObjects")
    ).body[0]
    assert session_path(s.id) in objects and MANAGER_PATH in objects
    assert objects[session_path(s.id)]["dev.boxy.Session1"]["State"].value == "running"
    ours = [m for m in added if m.path == "/dev/boxy"]
    assert [m.body[0] for m in ours] == [session_path(s.id)]
    assert ours[0].body[1]["dev.boxy.Session1"]["Profile"].value == "generic"
    manager.stop(s.id, kill=True)
    await s.wait()
    for _ in range(50):  # keep_finished=0: forgotten at once, and removed from the bus
        if [m for m in removed if m.path == "/dev/boxy"]:
            break
        await asyncio.sleep(0.05)
    assert [m.body for m in removed if m.path == "/dev/boxy"] == [
        [session_path(s.id), ["dev.boxy.Session1"]]
    ]
    listed = (await call(client, MANAGER_PATH, "dev.boxy.Manager1", "List", "b", [True])).body[0]
    assert listed == []  # only what has an object on the bus


async def test_run_over_dbus_is_refused_for_another_build(on_bus: OnBus) -> None:
    import json

    manager, _, client = on_bus
    r, w = os.pipe()
    req = json.dumps({"argv": ["true"], "cwd": "/w", "build": "other"})
    reply = await call(client, MANAGER_PATH, "dev.boxy.Manager1", "Run", "shhh", [req, 0, 1, 2],
                       unix_fds=[w, w, w])  # fmt: skip
    os.close(w)
    assert (
        reply.message_type == MessageType.ERROR
        and reply.error_name == "dev.boxy.Error.BuildMismatch"
    )
    assert os.read(r, 1) == b""  # the daemon kept none of the fds
    os.close(r)
    assert manager.known() == []


async def test_a_flood_of_10000_events_grows_nothing(on_bus: OnBus) -> None:
    manager, service, client = on_bus
    await add_match(client, "type='signal',interface='dev.boxy.Session1',member='Event'")
    events = signals(client, "Event")
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)
    tasks = len(service._tasks)
    for i in range(10_000):  # at once: the follower cannot keep up
        s.record("net", verdict="deny", n=i)
    manager.stop(s.id, kill=True)
    await s.wait()
    for _ in range(100):
        if any(m.body[0] == "exited" for m in events):
            break
        await asyncio.sleep(0.05)
    kinds = [m.body[0] for m in events]
    lost = [m.body[1]["count"].value for m in events if m.body[0] == "lost"]
    assert "exited" in kinds and lost and sum(lost) >= 10_000 - BOUND
    assert len(events) <= BOUND + 16, len(events)  # the follower's queue, never more
    assert len(service._tasks) <= tasks + 1


async def test_the_loss_of_the_bus_is_no_traceback_and_a_later_bus_is_joined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # no user manager runs: no wait
    manager = Manager(FakeLauncher(), grace=0.05)
    launcher = types.SimpleNamespace(scopes=Scopes())
    bus = Bus(manager, launcher)  # type: ignore[arg-type]
    first = BusDaemon(tmp_path)
    (tmp_path / "2").mkdir()
    second = BusDaemon(tmp_path / "2")
    try:
        await bus.join(first.address)
        assert bus.service is not None
        # no user manager on this bus: asked for by name (never called), and not found
        assert launcher.scopes.bus is not None
        assert not await launcher.scopes._manager_on_bus()
        s = await manager.start(request(), [])
        await started(s)
        first.kill()
        for _ in range(100):
            if bus.service is None:
                break
            await asyncio.sleep(0.05)
        assert bus.service is None and launcher.scopes.bus is None
        s.notice("still running")  # the core goes on without a bus
        await bus.join(second.address)  # as JoinBus does when a client brings one
        client = await MessageBus(bus_address=second.address).connect()
        listed = (await call(client, MANAGER_PATH, "dev.boxy.Manager1", "List", "b", [False])).body[
            0
        ]
        assert [x[0] for x in listed] == [s.id]
        client.disconnect()
        manager.stop(s.id, kill=True)
        await s.wait()
    finally:
        bus.close()
        first.kill()
        second.kill()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize(
    "address", ["", "tcp:host=127.0.0.1,port=9", "unix:path=/x;tcp:host=h,port=1", "nonce-tcp:"]
)
async def test_join_bus_takes_only_unix_addresses(address: str) -> None:
    manager = Manager(FakeLauncher(), grace=0.05)
    launcher = types.SimpleNamespace(scopes=Scopes())
    bus = Bus(manager, launcher)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not a unix: D-Bus address"):
        await bus.join(address)
    assert bus.service is None


async def test_output_reads_a_sessions_log_in_pieces(
    on_bus: OnBus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output, as varlink's: the log from an offset, the next offset, ended, kept."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    manager, _, client = on_bus
    s = await manager.start(request(), [])
    await started(s)
    log = tmp_path / "state/boxy/sessions" / s.id / "output.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"hello from a detached session\n")
    iface = "dev.boxy.Manager1"
    reply = await call(client, MANAGER_PATH, iface, "Output", "st", [s.id[:4], 6])
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    assert reply.body == [b"from a detached session\n", 30, False, True]
    reply = await call(client, MANAGER_PATH, iface, "Output", "st", [s.id, 30])
    assert reply.body == [b"", 30, False, True]
    log.unlink()
    reply = await call(client, MANAGER_PATH, iface, "Output", "st", [s.id, 0])
    assert reply.body == [b"", 0, False, False]  # it kept none
    reply = await call(client, MANAGER_PATH, iface, "Output", "st", ["ffffffff", 0])
    assert reply.message_type == MessageType.ERROR and "ffffffff" in str(reply.body), reply.body


# -- who calls: a process inside a sandbox is refused (docs/design.md, "The front door")


def busctl(
    address: str, *args: str, via: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(via or []), "busctl", f"--address={address}", "call", BUS_NAME, MANAGER_PATH,
         "dev.boxy.Manager1", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


async def test_a_caller_inside_a_sandbox_is_refused_and_others_are_served(
    bus_daemon: BusDaemon,
) -> None:
    """The caller's process, as the bus knows it, is put to the same check as
    varlink's writers (daemon/insiders.py): a process in a registered user namespace
    (here: unshare's, standing for a sandbox's) hears a refusal; the others are
    served, the first call of each waiting for the answer about its process."""
    from boxyd.daemon.insiders import Insiders

    insiders = Insiders()
    manager = Manager(FakeLauncher(), grace=0.05, keep_finished=0)
    service = DbusService(manager, insiders.inside)
    await service.start(bus_daemon.address)
    inside = subprocess.Popen(["unshare", "-U", "-r", "sleep", "60"])
    try:
        own = os.stat("/proc/self/ns/user").st_ino
        for _ in range(500):
            if os.stat(f"/proc/{inside.pid}/ns/user").st_ino != own:
                break
            await asyncio.sleep(0.01)
        fd = os.open(f"/proc/{inside.pid}/ns/user", os.O_RDONLY)
        insiders.add(fd)
        os.close(fd)
        enter = ["nsenter", "-t", str(inside.pid), "-U", "--preserve-credentials"]
        outside, within = await asyncio.gather(
            asyncio.to_thread(busctl, bus_daemon.address, "List", "b", "false"),
            asyncio.to_thread(busctl, bus_daemon.address, "Stop", "sb", "x", "true", via=enter),
        )
        assert outside.returncode == 0, outside.stderr
        assert within.returncode != 0 and "inside a sandbox" in within.stderr, within
    finally:
        inside.kill()
        inside.wait()
        service.close()


async def test_doctor_answers_with_the_checks(on_bus: OnBus) -> None:
    """`boxyctl doctor`'s checks over D-Bus too: (name, ok, required, detail), the probe's."""
    _, _, client = on_bus
    reply = await call(client, MANAGER_PATH, "dev.boxy.Manager1", "Doctor")
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    assert reply.signature == "a(sbbs)"
    names = [c[0] for c in reply.body[0]]
    assert names[:2] == ["kernel", "writer-pidfd"] and "userns" in names
    assert all(isinstance(c[1], bool) and isinstance(c[2], bool) for c in reply.body[0])


async def test_profiles_and_profile_show_answer_with_the_document_and_lines(
    on_bus: OnBus, tmp_path: Path
) -> None:
    """`boxyctl profile list` and `profile show` over D-Bus: the JSON --json prints
    and the lines, from the core (the fake launcher loads the profile for real)."""
    _, _, client = on_bus
    reply = await call(client, MANAGER_PATH, "dev.boxy.Manager1", "Profiles")
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    listed = json.loads(reply.body[0])
    assert {"node", "generic"} <= {r["name"] for r in listed["profiles"]}
    assert any(line.startswith("node ") for line in reply.body[1])
    body = ["node", str(tmp_path), {}]
    reply = await call(client, MANAGER_PATH, "dev.boxy.Manager1", "ProfileShow", "ssa{ss}", body)
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    assert json.loads(reply.body[0])["name"] == "node"
    assert reply.body[1][0].startswith("profile node: preset")
    for bad in (["node", "relative/dir", {}],):
        reply = await call(client, MANAGER_PATH, "dev.boxy.Manager1", "ProfileShow", "ssa{ss}", bad)
        assert reply.error_name == "dev.boxy.Error.InvalidArgument", (bad, reply.body)


async def test_allow_and_deny_on_a_session_record_the_callers_process(
    on_bus: OnBus, bus_daemon: BusDaemon
) -> None:
    """Session1.Allow / Deny (issue 34 §1) reach the core with who asked: the pid is
    the one the bus gave for the calling connection (busctl's own, here)."""
    manager, _, client = on_bus
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)  # the object on the bus
    probe = subprocess.Popen(
        ["busctl", f"--address={bus_daemon.address}", "call", BUS_NAME, session_path(s.id),
         "dev.boxy.Session1", "Allow", "as", "1", "api.example"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, _ = await asyncio.to_thread(probe.communicate, None, 30)
    assert probe.returncode == 0, out
    assert out.startswith('s "allow api.example (uid ') and f"pid {probe.pid}, D-Bus)" in out, out
    reply = await call(
        client, session_path(s.id), "dev.boxy.Session1", "Deny", "as", [["a.example"]]
    )
    assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    assert reply.body[0].startswith("deny a.example (uid ") and ", D-Bus)" in reply.body[0]
    assert (await manager.info(s.id)).policy == [out[3:-2], reply.body[0]]
    manager.stop(s.id, kill=True)
    await s.wait()


# --- --ask's questions on the bus (issue 34 §2) ------------------------------------------

# The desktop tool's side, in dbus-python (the reference binding) with GLib's loop, as
# such a tool is written: it says it answers, answers the first question `session`,
# prints what it was asked and how the question ended.
ANSWERING_TOOL = r"""
import sys, dbus
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib
DBusGMainLoop(set_as_default=True)
bus = dbus.bus.BusConnection(sys.argv[1])
loop = GLib.MainLoop()
def asked(number, host, port, pid, argv0, choices, timeout, text, path=None):
    print("ASKED", int(number), host, int(port), int(pid), argv0, ",".join(choices), path, flush=True)
    session = dbus.Interface(bus.get_object("dev.boxy.Daemon", path), "dev.boxy.Session1")
    print("ANSWERED", session.Answer(number, "session"), flush=True)
def ended(number, answer, line, path=None):
    print("ENDED", int(number), answer, flush=True)
    loop.quit()
bus.add_signal_receiver(asked, "AskDenied", "dev.boxy.Session1", path_keyword="path")
bus.add_signal_receiver(ended, "AskEnded", "dev.boxy.Session1", path_keyword="path")
manager = dbus.Interface(bus.get_object("dev.boxy.Daemon", "/dev/boxy/Manager"), "dev.boxy.Manager1")
print("READY", bool(manager.AnswerQuestions(True)), flush=True)
GLib.timeout_add_seconds(20, loop.quit)
loop.run()
"""


class Decided:
    def __init__(self) -> None:
        self.answers: list[tuple[str, Answer, str]] = []

    async def __call__(self, host: str, answer: Answer, via: str) -> str | None:
        self.answers.append((host, answer, via))
        return None


async def test_a_desktop_tool_answers_a_question_no_terminal_could(
    on_bus: OnBus, bus_daemon: BusDaemon
) -> None:
    """AnswerQuestions, AskDenied, Answer and AskEnded through dbus-python: the answer
    decides the lookup, and the question named the host, port, pid and argv[0]."""
    manager, _, _ = on_bus
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)  # the object on the bus
    decided = Decided()
    asking = Asking(20, lambda: [s.questions], decided)
    assert await asking.ask("nobody.example") is False  # nobody answers yet: at once
    tool = await asyncio.create_subprocess_exec(
        "/usr/bin/python3", "-c", ANSWERING_TOOL, bus_daemon.address,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert tool.stdout is not None
    assert await asyncio.wait_for(tool.stdout.readline(), 20) == b"READY True\n"
    assert s.questions.can_answer()
    allowed = await asking.ask("api.example", 443, Who(4242, "node"))
    out, err = await asyncio.wait_for(tool.communicate(), 20)
    assert allowed is True and decided.answers == [("api.example", Answer.SESSION, "D-Bus")]
    assert out.decode().splitlines() == [
        f"ASKED 1 api.example 443 4242 node once,session,project,deny {session_path(s.id)}",
        "ANSWERED api.example",
        "ENDED 1 session",
    ], err
    # the tool has left the bus: nobody answers again, and nothing waits
    for _ in range(100):
        if not s.questions.can_answer():
            break
        await asyncio.sleep(0.05)
    assert await asyncio.wait_for(asking.ask("later.example"), 1) is False
    manager.stop(s.id, kill=True)
    await s.wait()


async def test_an_answer_to_no_open_question_or_not_offered_is_refused(on_bus: OnBus) -> None:
    manager, _, client = on_bus
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)
    reply = await call(
        client, session_path(s.id), "dev.boxy.Session1", "Answer", "us", [7, "session"]
    )
    assert reply.error_name == "dev.boxy.Error.InvalidArgument", reply.body
    assert "no question 7 is open" in reply.body[0]
    s.questions.can = lambda: True
    asking = Asking(5, lambda: [s.questions], Decided())
    pending = asyncio.ensure_future(asking.ask("api.example"))
    await asyncio.sleep(0.05)
    reply = await call(
        client, session_path(s.id), "dev.boxy.Session1", "Answer", "us", [1, "always"]
    )
    assert reply.error_name == "dev.boxy.Error.InvalidArgument" and "'always'" in reply.body[0]
    reply = await call(client, session_path(s.id), "dev.boxy.Session1", "Answer", "us", [1, "deny"])
    assert reply.body == ["api.example"] and await pending is False
    manager.stop(s.id, kill=True)
    await s.wait()


class NotificationServer(ServiceInterface):
    """A desktop's notification server as the Desktop Notifications Specification
    defines its calls, on the test's bus: it keeps what it was asked to show."""

    def __init__(self) -> None:
        super().__init__("org.freedesktop.Notifications")
        self.shown: list[tuple[int, str, list[str], int]] = []
        self.closed: list[int] = []

    @method()
    def Notify(
        self, app: "s", replaces: "u", icon: "s", summary: "s", body: "s", actions: "as",
        hints: "a{sv}", timeout: "i",
    ) -> "u":  # fmt: skip
        self.shown.append((len(self.shown) + 1, summary, actions, timeout))
        return len(self.shown)

    @method()
    def CloseNotification(self, id: "u") -> "":
        self.closed.append(id)

    @dbus_signal()
    def ActionInvoked(self, id: int, key: str) -> "us":
        return [id, key]

    @dbus_signal()
    def NotificationClosed(self, id: int, reason: int) -> "uu":
        return [id, reason]


@pytest.mark.parametrize("choice,allowed", [("once", True), (None, False)])
async def test_ask_notify_shows_the_choices_and_an_action_or_a_dismissal_answers(
    on_bus: OnBus, bus_daemon: BusDaemon, choice: str | None, allowed: bool
) -> None:
    """--ask-notify: the question is a notification whose actions are its choices;
    an action invoked is the answer, a dismissal (reason 2) a denial; it is closed
    once the question is over."""
    manager, _, _ = on_bus
    server_bus = await MessageBus(bus_address=bus_daemon.address).connect()
    server = NotificationServer()
    server_bus.export("/org/freedesktop/Notifications", server)
    await server_bus.request_name("org.freedesktop.Notifications")
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)
    assert not s.questions.can_answer()  # not asked for
    s.spec.ask_notify = True
    decided = Decided()
    asking = Asking(20, lambda: [s.questions], decided)
    pending = asyncio.ensure_future(asking.ask("api.example"))
    for _ in range(100):
        if server.shown:
            break
        await asyncio.sleep(0.02)
    nid, summary, actions, timeout = server.shown[0]
    assert summary == "boxy: allow api.example?" and timeout == 20000
    assert actions[::2] == ["once", "session", "project", "deny"]
    if choice is not None:
        server.ActionInvoked(nid, choice)
    else:
        server.NotificationClosed(nid, 2)
    assert await asyncio.wait_for(pending, 5) is allowed
    want = Answer(choice) if choice is not None else Answer.DENY
    assert decided.answers == [("api.example", want, "D-Bus")]
    for _ in range(100):
        if server.closed or choice is None:
            break
        await asyncio.sleep(0.02)
    assert server.closed == ([nid] if choice is not None else [])
    server_bus.disconnect()
    manager.stop(s.id, kill=True)
    await s.wait()


async def test_ask_notify_without_a_notification_server_refuses_at_once(on_bus: OnBus) -> None:
    manager, _, _ = on_bus
    s = await manager.start(request(), [])
    await started(s)
    await asyncio.sleep(0.1)
    s.spec.ask_notify = True
    asking = Asking(60, lambda: [s.questions], Decided())
    assert await asyncio.wait_for(asking.ask("api.example"), 5) is False
    manager.stop(s.id, kill=True)
    await s.wait()


async def test_review_diff_apply_and_discard_on_the_bus(
    bus_daemon: BusDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--review's Diff, Apply and Discard (issue 35 §2) on Manager1, over the core's
    own review of a held session: what diff lists, apply lands (one path), and
    discard drops; a session holding nothing is refused in one line."""
    from tests.unit.test_conformance import _hold

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    manager = Manager(FakeLauncher(), grace=0.05, keep_finished=4)  # the ended one kept
    service = DbusService(manager, lambda pid, pidfd: None)
    await service.start(bus_daemon.address)
    client = await MessageBus(bus_address=bus_daemon.address).connect()
    try:
        s = await manager.start(request(), [])
        await started(s)
        manager.stop(s.id, kill=True)
        await s.wait()
        _hold(s.id, tmp_path)
        m = (MANAGER_PATH, "dev.boxy.Manager1")
        reply = await call(client, *m, "Diff", "sb", [s.id, True])
        assert reply.message_type == MessageType.METHOD_RETURN, reply.body
        assert "a.txt" in reply.body[0] and "b.txt" in reply.body[0], reply.body
        reply = await call(client, *m, "Apply", "sas", [s.id, ["a.txt"]])
        assert reply.message_type == MessageType.METHOD_RETURN, reply.body
        assert (tmp_path / "held" / "a.txt").read_text() == "after\n"
        assert (tmp_path / "held" / "b.txt").read_text() == "before\n"
        reply = await call(client, *m, "Discard", "s", [s.id])
        assert reply.message_type == MessageType.METHOD_RETURN, reply.body
        assert (tmp_path / "held" / "b.txt").read_text() == "before\n"
        reply = await call(client, *m, "Diff", "sb", [s.id, False])
        assert reply.error_name == "dev.boxy.Error.InvalidArgument", reply.body
        assert "holds no changes for review" in reply.body[0]
    finally:
        client.disconnect()
        service.close()
