"""Every row of the option table through the five ways a run is asked for (issue 32 §1):
boxyctl's command line, the Python library, varlink's Run and D-Bus's Run (each a
real server over the real core, whose launcher keeps the request it was given), and
a profile file holding the row's profile key. Each route's request is checked into
a spec and a plan by the daemon's own code (build_spec, mountplan.build); the five
plans, and the specs but for the profile's name, must be the same. A row without a
profile key goes four ways."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from boxy import library
from boxy.buildid import build_id
from boxy.client import add_secrets
from boxy.errors import SecretsNeeded
from boxy.options import BY_FIELD, RUN_OPTIONS, Option
from boxy.request import RunRequest
from boxyctl import cli
from boxyd.api.dbus import MANAGER_PATH, DbusService
from boxyd.config.runspec import RunSpec
from boxyd.config.spec import build_spec
from boxyd.daemon.manager import Manager
from boxyd.daemon.seam import Sink
from boxyd.plan import mountplan
from tests.unit.test_core import FakeLauncher, FakeSandbox
from tests.unit.test_dbus import BusDaemon, call
from tests.unit.test_service import Peer, serve

SECRET = "BOXY_ROUTE_SECRET"


class Paths(NamedTuple):
    home: Path
    project: Path
    data: Path  # an existing directory outside the project
    file: Path  # an existing file, to copy in


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    home, project, data = tmp_path / "home", tmp_path / "home/proj", tmp_path / "data"
    for d in (home, project, data, home / ".ssh"):
        d.mkdir(parents=True, exist_ok=True)
    (data / "f.txt").write_text("x\n")
    (project / "keep").write_text("kept\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv(SECRET, "s3cr3t")
    monkeypatch.chdir(project)
    return Paths(home, project, data, data / "f.txt")


def sample(option: Option, p: Paths) -> tuple[object, object]:
    """The row's value: as its flag's text (True for a switch), and as its profile key
    holds it."""
    if option.kind == "true":
        return True, True
    if option.choices:
        value = next(c for c in option.choices if c != option.default)
        return value, value
    by_type: dict[str, tuple[object, object]] = {
        "profile": ("node", None),
        "path": (str(p.data), [str(p.data)]),
        "copy": (f"{p.file}:/opt/f.txt", [f"{p.file}:/opt/f.txt"]),
        "host": ("example.com:443", ["example.com:443"]),
        "port": ("8443", [8443]),
        "cidrs": ("192.0.2.0/24", ["192.0.2.0/24"]),
        "publish": ("127.0.0.1:8080:80", ["127.0.0.1:8080:80"]),
        "env": ("A=1", {"A": "1"}),
        "secret": (SECRET, [SECRET]),
        "size": ("64MiB", "64MiB"),
        "count": ("64", 64),
        "cpus": ("1.5", 1.5),
        "duration": ("90s", "90s"),
    }
    flag_text, held = by_type[option.type]
    if option.field == "mkdir":
        return str(p.data / "new"), [str(p.data / "new")]
    if option.field == "edit_config":
        return str(p.project / ".vscode"), None
    if option.field == "allow_host_config":  # with BESIDE's --rw on it
        return str(p.home / ".ssh"), None
    if option.field == "protect":
        return str(p.project / "keep"), [str(p.project / "keep")]
    if option.field == "reveal":
        return str(p.project / ".env"), [str(p.project / ".env")]
    if option.field == "workdir":
        return str(p.project), None
    if option.field in ("audit_log", "net_log", "pcap"):
        return str(p.data / f"{option.field}.out"), None
    return flag_text, held


# what a row needs beside it to be given at all (the table's refused combinations)
BESIDE: dict[str, dict[str, object]] = {
    "allow_host": {"net": "allowlist"},
    "allow_port": {"net": "allowlist"},
    "allow_cidr": {"net": "allowlist"},
    "ask": {"net": "allowlist"},
    "ask_timeout": {"net": "allowlist"},
    "ask_notify": {"net": "allowlist"},
    "pcap_max": {"pcap": "/tmp/route.pcap"},
    "tty_raw": {"tty": True},
    "review_limit": {"review": True},
    "allow_host_config": {"rw": "~/.ssh"},
}


def _flags(fields: dict[str, object]) -> list[str]:
    argv: list[str] = []
    for name, value in fields.items():
        argv += [BY_FIELD[name].flag] if value is True else [BY_FIELD[name].flag, str(value)]
    return argv


def by_cli(fields: dict[str, object], p: Paths) -> RunRequest:
    cmd = cli.parse(
        ["run", *_flags(fields), "--", "true"], environ=dict(os.environ), cwd=str(p.project)
    )
    request = cmd.args["request"]
    assert isinstance(request, RunRequest)
    request.build = build_id()  # as boxyctl's run sets it before sending
    return request


def by_library(fields: dict[str, object]) -> RunRequest:
    """boxy.run's request (boxy.start's for -d, which is no keyword: start() gives it)."""
    kw = {k: v if v is True or BY_FIELD[k].kind != "append" else [v] for k, v in fields.items()}
    if kw.pop("detach", None):
        return library.start_request(["true"], kw)
    return library.request(["true"], kw, "run")


class Keeping(FakeLauncher):
    """The core's launcher, keeping each request as the wire's adapter decoded it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[RunRequest] = []

    async def prepare(self, request: RunRequest, stdio: list[int], sink: Sink) -> FakeSandbox:
        self.requests.append(request)
        for fd in stdio:
            os.close(fd)
        return await super().prepare(request, [], sink)


class Wires(NamedTuple):
    launcher: Keeping
    manager: Manager
    varlink: str  # the socket's path
    bus: str  # the private bus's address


@pytest.fixture
async def wires(tmp_path: Path) -> AsyncIterator[Wires]:
    launcher = Keeping()
    manager = Manager(launcher, grace=0.05, keep_finished=0)
    path, server, task = serve(tmp_path, manager)
    bus = BusDaemon(tmp_path)
    dbus = DbusService(manager, lambda pid, pidfd: None)
    await dbus.start(bus.address)
    yield Wires(launcher, manager, str(path), bus.address)
    for s in manager.running():
        manager.stop(s.id, kill=True)
    dbus.close()
    bus.kill()
    server.close()
    task.cancel()


async def by_varlink(w: Wires, request: RunRequest) -> RunRequest:
    peer = await Peer.connect(w.varlink)
    try:
        peer.send("Run", request.to_wire(), more=True)
        reply = await peer.reply()  # the first: running (the session goes on)
        assert reply.get("parameters", {}).get("kind") == "running", reply
    finally:
        peer.close()
    return w.launcher.requests.pop()


async def by_dbus(w: Wires, request: RunRequest) -> RunRequest:
    from dbus_fast import MessageType
    from dbus_fast.aio import MessageBus

    client = await MessageBus(bus_address=w.bus, negotiate_unix_fd=True).connect()
    fds = [os.open(os.devnull, os.O_RDWR) for _ in range(3)]
    try:
        body = [json.dumps(request.to_wire()), 0, 1, 2]
        reply = await call(
            client, MANAGER_PATH, "dev.boxy.Manager1", "Run", "shhh", body, unix_fds=fds
        )
        assert reply.message_type == MessageType.METHOD_RETURN, reply.body
    finally:
        for fd in fds:
            os.close(fd)
        client.disconnect()
    return w.launcher.requests.pop()


def by_profile(option: Option, held: object, p: Paths) -> RunRequest:
    """A profile file that extends the default one and holds the row's key (with what
    the row needs beside it, in the profile too)."""
    doc: dict[str, Any] = {"extends": "generic"}
    for field, value in [(option.field, held), *BESIDE.get(option.field, {}).items()]:
        row = BY_FIELD[field]
        key = str(row.profile_key)
        if field != option.field:
            value = [value] if row.kind == "append" else value
        top, _, sub = key.partition(".")
        if sub:
            doc.setdefault(top, {})[sub] = value
        else:
            doc[top] = value
    profile = p.home / "route.yaml"
    profile.write_text(yaml.safe_dump(doc))
    return by_cli({"profile": str(profile)}, p)


def spec_of(request: RunRequest, p: Paths) -> RunSpec:
    """The daemon's check of a request, answering SecretsNeeded as boxyctl does."""
    me = pwd.getpwuid(os.getuid())
    for _ in range(2):
        try:
            return build_spec(request, uid=me.pw_uid, user=me.pw_name, home=str(p.home))
        except SecretsNeeded as e:
            add_secrets(request, e, dict(os.environ))
    raise AssertionError("SecretsNeeded twice")


def plan_of(spec: RunSpec) -> dict[str, Any]:
    plan = mountplan.build(spec, seccomp_bpf=b"", protections={}, ctty=False)
    return plan.to_json()


def _comparable(spec: RunSpec) -> dict[str, Any]:
    """The spec but for what names the route: the profile, and the lines said about it."""
    out = dict(spec.__dict__)
    for k in ("profile", "notes", "warnings"):
        out.pop(k)
    return out


ROWS = [o for o in RUN_OPTIONS if o.field != "profile"]


@pytest.mark.parametrize("option", ROWS, ids=lambda o: o.field)
async def test_every_row_means_the_same_by_each_route(
    option: Option, paths: Paths, wires: Wires
) -> None:
    flag_text, held = sample(option, paths)
    fields = {option.field: flag_text, **BESIDE.get(option.field, {})}
    requests = {"cli": by_cli(fields, paths), "library": by_library(fields)}
    requests["varlink"] = await by_varlink(wires, requests["cli"])
    requests["dbus"] = await by_dbus(wires, requests["cli"])
    options = {route: r.options for route, r in requests.items()}
    assert getattr(options["cli"], option.field) not in (None, [], False), option.field
    for route, o in options.items():
        assert o == options["cli"], (route, o, options["cli"])
    if option.profile_key is not None:
        requests["profile"] = by_profile(option, held, paths)
    specs = {route: spec_of(r, paths) for route, r in requests.items()}
    plans = {route: plan_of(s) for route, s in specs.items()}
    for route in specs:
        assert _comparable(specs[route]) == _comparable(specs["cli"]), route
        assert plans[route] == plans["cli"], route
