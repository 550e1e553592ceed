"""The varlink contract, generated from the IDL (boxy/dev.boxy.Manager.varlink,
parsed): every method it declares is called against the real server and the real
core (the fake launcher of test_core) with good parameters, and each reply checked
against the declared reply fields (every field declared, each of its type) or the
declared errors; then with each parameter missing, wrongly typed, and one too
many, which is org.varlink.service.InvalidParameter naming it."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from boxy import INTERFACE
from boxy.buildid import build_id
from boxyd.api import idl
from boxyd.api.varlink import SERVICE_IDL, interface_description
from boxyd.daemon.manager import Manager
from boxyd.daemon.session import Session
from tests.unit.test_core import FakeLauncher, request, started
from tests.unit.test_service import Peer, serve

IDL = idl.parse(interface_description())
SERVICE = "org.varlink.service"


def wrong(t: idl.Type) -> Any:
    """A value that is not a T (nor null)."""
    if t.array or t.map:
        return "not a list" if t.array else ["not", "a", "map"]
    if t.name in ("string", "") or t.enum is not None:
        return 7
    if t.name in ("int", "float"):
        return "7"
    if t.name == "bool":
        return "yes"  # never read as false
    return [1]  # object, a struct: not an object


def check_reply(iface: idl.Interface, method: str, msg: dict[str, Any]) -> None:
    """A reply has exactly the declared fields; an error is a declared one."""
    if "error" in msg:
        prefix, _, name = msg["error"].rpartition(".")
        decl = {INTERFACE: IDL, SERVICE: SERVICE_IDL}[prefix]
        assert name in decl.errors, msg
        bad = idl.check_fields(decl, decl.errors[name], msg["parameters"])
        assert bad is None, f"{method}: error {name}: {bad} not as declared: {msg}"
        return
    bad = idl.check_fields(iface, iface.methods[method].returns, msg.get("parameters", {}))
    assert bad is None, f"{method}: reply field {bad} not as declared: {msg}"


async def call(
    peer: Peer, iface: idl.Interface, method: str, params: dict[str, Any], **flags: bool
) -> list[dict[str, Any]]:
    """Every reply to one call, each checked against the IDL."""
    peer.writer.write(
        json.dumps({"method": f"{iface.name}.{method}", "parameters": params, **flags}).encode()
        + b"\0"
    )
    replies: list[dict[str, Any]] = []
    while True:
        msg = await peer.reply()
        check_reply(iface, method, msg)
        replies.append(msg)
        if not msg.get("continues"):
            return replies


World = tuple[Manager, Peer, dict[str, Session]]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """A server over a core with one session running, one detached, one ended."""
    manager = Manager(FakeLauncher(ignore=(signal.SIGWINCH,)), grace=0.05)
    path, server, task = serve(tmp_path, manager)
    running = await manager.start(request(), [])
    detached = await manager.start(request(detach=True), [])
    ended = await manager.start(request(), [])
    for s in (running, detached, ended):
        await started(s)
    manager.stop(ended.id, kill=True)
    await ended.wait()
    peer = await Peer.connect(path)
    yield manager, peer, {"running": running, "detached": detached, "ended": ended}
    peer.close()
    server.close()
    task.cancel()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A project with a .boxy.yaml to trust; approvals under a config home of the test's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    wd = tmp_path / "proj"
    wd.mkdir()
    (wd / ".boxy.yaml").write_text("profile: node\n")
    return str(wd)


def _hold(sid: str, base: Path) -> None:
    """Session SID held for review (--review's layers, as a run leaves them): two files
    changed in its upper layer, for Diff, Apply (of one) and Discard."""
    from boxyd.config.runspec import RunSpec
    from boxyd.daemon import review

    if review.get(sid) is not None:
        return
    work = base / "held"
    work.mkdir()
    for name in ("a.txt", "b.txt"):
        (work / name).write_text("before\n")
    upper, _ = review.prepare(sid, RunSpec(argv=["true"], workdir=str(work)))
    for name in ("a.txt", "b.txt"):
        Path(upper, name).write_text("after\n")


def good(
    sessions: dict[str, Any], project: str
) -> dict[str, tuple[dict[str, Any], dict[str, bool]]]:
    """Good parameters for every method (the values the IDL's types cannot say)."""
    _hold(sessions["ended"].id, Path(project).parent)
    run = {
        "argv": ["true"],
        "cwd": "/w",
        "options": {},
        "client_env": {"TERM": "xterm"},
        "env_unset": [],
        "build": build_id(),
        "terminal": None,
    }
    sid = sessions["running"].id
    return {
        "Run": (run, {"more": True}),
        "Resize": ({"id": sid, "rows": 24, "cols": 80}, {}),
        "Signal": ({"id": sid, "signal": int(signal.SIGWINCH)}, {}),
        "List": ({"all": True}, {}),
        "Show": ({"id": sessions["ended"].id}, {}),
        "Stop": ({"id": sessions["ended"].id, "kill": False}, {}),
        "Allow": ({"id": sid, "hosts": ["registry.example"]}, {}),
        "Deny": ({"id": sid, "hosts": ["registry.example"]}, {}),
        "Diff": ({"id": sessions["ended"].id, "text": True}, {}),
        "Apply": ({"id": sessions["ended"].id, "paths": ["a.txt"]}, {}),
        "Discard": ({"id": sessions["ended"].id}, {}),
        "Watch": ({"id": sessions["ended"].id}, {"more": True}),
        "Output": ({"id": sessions["ended"].id, "offset": 0}, {}),
        "Attach": ({"id": sessions["detached"].id, "terminal": None}, {"more": True}),
        "Version": ({}, {}),
        "DaemonStatus": ({}, {}),
        "Shutdown": ({"force": False}, {}),
        "JoinBus": ({"address": "unix:path=/nonexistent"}, {}),
        "Doctor": ({}, {}),
        "Profiles": ({}, {}),
        "ProfileShow": ({"name": "node", "cwd": project, "client_env": {}}, {}),
        "Trust": ({"cwd": project, "client_env": {}}, {}),
        "Trusted": ({"cwd": project, "client_env": {}}, {}),
        "Approvals": ({}, {}),
        "Revoke": ({"cwd": project}, {}),
    }


async def test_every_method_with_good_parameters_replies_as_declared(
    world: World, project: str
) -> None:
    manager, peer, sessions = world
    cases = good(sessions, project)
    assert set(cases) == set(IDL.methods), "a method of the IDL without a case here"
    # List says what it lists: without all, the sessions under way and those held for
    # review (the ended one, by _hold), which says so
    running = {sessions["running"].id, sessions["detached"].id}
    (now,) = await call(peer, IDL, "List", {})
    listed = {x["id"]: x for x in now["parameters"]["sessions"]}
    assert set(listed) == running | {sessions["ended"].id}
    assert listed[sessions["ended"].id]["review"] == "held"
    (every,) = await call(peer, IDL, "List", {"all": True})
    assert {x["id"] for x in every["parameters"]["sessions"]} == running | {sessions["ended"].id}
    for method, (params, flags) in cases.items():
        assert idl.check_fields(IDL, IDL.methods[method].params, params) is None, method
        if method in ("Run", "Attach"):  # followed until we end them
            peer.writer.write(
                json.dumps(
                    {"method": f"{INTERFACE}.{method}", "parameters": params, **flags}
                ).encode()
                + b"\0"
            )
            first = await peer.reply()
            check_reply(IDL, method, first)
            assert first["parameters"]["kind"] == "running", first
            manager.stop(first["parameters"]["id"], kill=True)
            last = await peer.reply()
            check_reply(IDL, method, last)
            assert last["parameters"]["kind"] == "ended" and "continues" not in last
            continue
        replies = await call(peer, IDL, method, params, **flags)
        if method == "Watch":  # a finished session: itself, once
            assert len(replies) == 1 and "session" in replies[0]["parameters"]
        elif method == "Shutdown":  # sessions run: refused, as the IDL says
            assert replies[0]["error"] == f"{INTERFACE}.Busy"
        elif method == "JoinBus":  # no bus there (and this server has no D-Bus API)
            assert replies[0]["error"] == f"{INTERFACE}.DaemonFailed"
        else:
            assert "error" not in replies[0], (method, replies)
    for method in SERVICE_IDL.methods:
        params = {"interface": INTERFACE} if method == "GetInterfaceDescription" else {}
        await call(peer, SERVICE_IDL, method, params)


@pytest.mark.parametrize("method", sorted(IDL.methods))
async def test_every_parameter_missing_or_mistyped_is_invalid_parameter(
    world: World, method: str, project: str
) -> None:
    _, peer, sessions = world
    params, flags = good(sessions, project)[method]
    cases = [("bogus", {**params, "bogus": 1})]
    for name, t in IDL.methods[method].params:
        cases.append((name, {**params, name: wrong(t)}))
        if not t.nullable:
            cases.append((name, {k: v for k, v in params.items() if k != name}))
    for named, case in cases:
        (reply,) = await call(peer, IDL, method, case, **flags)
        assert reply.get("error") == f"{SERVICE}.InvalidParameter", (method, case, reply)
        assert reply["parameters"]["parameter"].split(".")[0].split("[")[0] == named


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("ProfileShow", {"name": "node", "cwd": "/tmp/\0x", "client_env": {}}),
        ("ProfileShow", {"name": "a\0b", "cwd": "/tmp", "client_env": {}}),
        ("Trusted", {"cwd": "/tmp/\0x", "client_env": {}}),
        ("Trust", {"cwd": "/tmp/\0x", "client_env": {}}),
    ],
)
async def test_a_nul_in_a_path_is_one_line_not_an_internal_error(
    world: World, method: str, params: dict[str, Any]
) -> None:
    """Attack finding F6: a NUL byte in cwd or a name was InternalError, with a
    traceback in boxyd's log."""
    _, peer, _ = world
    (reply,) = await call(peer, IDL, method, params)
    assert reply.get("error") == f"{INTERFACE}.InvalidArgument", reply


async def test_unknown_interfaces_and_methods(world: World) -> None:
    _, peer, _ = world
    peer.send("Version", {})
    await peer.reply()
    for method, error, field in (
        ("org.example.Nope.Version", "InterfaceNotFound", "interface"),
        (f"{INTERFACE}.Nope", "MethodNotFound", "method"),
        (f"{SERVICE}.Nope", "MethodNotFound", "method"),
    ):
        peer.writer.write(json.dumps({"method": method, "parameters": {}}).encode() + b"\0")
        reply = await peer.reply()
        assert reply["error"] == f"{SERVICE}.{error}" and field in reply["parameters"], reply
    (desc,) = await call(
        peer, SERVICE_IDL, "GetInterfaceDescription", {"interface": "org.example.Nope"}
    )
    assert desc["error"] == f"{SERVICE}.InterfaceNotFound"


async def test_watch_streams_events_as_declared_and_a_gone_watcher_is_no_error(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    manager, peer, sessions = world
    s = sessions["running"]
    peer.writer.write(
        json.dumps(
            {"method": f"{INTERFACE}.Watch", "parameters": {"id": s.id}, "more": True}
        ).encode()
        + b"\0"
    )
    check_reply(IDL, "Watch", await peer.reply())
    s.record("net", verdict="deny", host="example.org")
    s.notice("denied")
    kinds: list[str] = []
    for _ in range(2):
        msg = await peer.reply()
        check_reply(IDL, "Watch", msg)
        kinds.append(msg["parameters"]["event"]["kind"])
    assert kinds == ["audit", "notice"]
    peer.close()  # gone mid-stream
    await asyncio.sleep(0.05)
    s.notice("after")
    await asyncio.sleep(0.05)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
