"""boxyd under a real `systemd --user` (brought up by the harness for the test
user): `boxyctl setup`, socket activation, STATUS=, and a stop from systemd that
records the sessions it ends. Without a user manager: the on-demand daemon and
its idle exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.harness.usermanager import UserManager
from tests.integration.clients import daemon_pids

pytestmark = pytest.mark.sandbox


def ctl(
    user: User,
    *args: str,
    extra_env: dict[str, str] | None = None,
    manager: UserManager | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = {**(manager.env() if manager else {}), **(extra_env or {})}
    return user.run([str(BIN / "boxyctl"), *args], extra_env=env, timeout=60)


@pytest.fixture(scope="module")
def systemd_user(user: User) -> Iterator[UserManager]:
    if os.getuid() != 0:
        pytest.skip(
            "a user manager for the test user is brought up as root: run `make test` as root"
        )
    ctl(user, "daemon", "stop", "--force")  # the on-demand daemon of earlier tests makes way
    manager = UserManager(user.name, user.uid, user.home, user.runtime)
    manager.up()
    try:
        yield manager
    finally:
        manager.systemctl("disable", "--now", "boxyd.socket", "boxyd.service")
        manager.down()
        for name in ("boxyd.socket", "boxyd.service"):
            (user.home / ".config/systemd/user" / name).unlink(missing_ok=True)
        (user.home / ".local/share/dbus-1/services/dev.boxy.Daemon.service").unlink(missing_ok=True)


def test_setup_installs_enables_and_is_idempotent(
    boxy: Boxy, user: User, systemd_user: UserManager
) -> None:
    r = ctl(user, "setup", manager=systemd_user)
    assert r.returncode == 0, r.stderr
    unit_dir = user.home / ".config/systemd/user"
    assert f"{unit_dir / 'boxyd.service'}: installed" in r.stdout.decode()
    assert "boxyd.socket enabled" in r.stdout.decode()
    service = (unit_dir / "boxyd.service").read_text()
    assert f"ExecStart={BIN / 'boxyd'}\n" in service and "Type=notify" in service
    assert "ListenStream=%t/boxy/boxyd.sock" in (unit_dir / "boxyd.socket").read_text()
    assert systemd_user.systemctl("is-enabled", "boxyd.socket").stdout.strip() == "enabled"
    assert systemd_user.systemctl("is-active", "boxyd.socket").stdout.strip() == "active"
    again = ctl(user, "setup", manager=systemd_user)
    assert again.returncode == 0, again.stderr
    assert again.stdout.decode().count("up to date") == 3
    activation = (user.home / ".local/share/dbus-1/services/dev.boxy.Daemon.service").read_text()
    assert "Name=dev.boxy.Daemon\n" in activation and "SystemdService=boxyd.service\n" in activation


def test_the_first_run_starts_boxyd_by_socket_activation(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    systemd_user.systemctl("stop", "boxyd.service")
    assert systemd_user.systemctl("is-active", "boxyd.service").stdout.strip() != "active"
    assert daemon_pids(user) == []
    audit = workdir / "audit.jsonl"
    argv = ["run", "--net", "none", "--audit-log", str(audit), "--", "echo", "hi"]
    r = subprocess.run(
        user.cmd([str(BIN / "boxyctl"), *argv], systemd_user.env()),
        cwd=workdir,
        capture_output=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout) == (0, b"hi\n"), r.stderr
    # the very run that started boxyd has its scope: boxyd is on the bus before it serves
    records = [json.loads(ln) for ln in audit.read_text().splitlines()]
    scope = [x for x in records if x.get("layer") == "cgroup" and "scope" in x]
    assert scope and scope[0]["scope"] == f"boxy-{scope[0]['session']}.scope", json.dumps(scope)
    assert systemd_user.systemctl("is-active", "boxyd.service").stdout.strip() == "active"
    main_pid = int(
        systemd_user.systemctl("show", "-p", "MainPID", "--value", "boxyd.service").stdout
    )
    status = ctl(user, "daemon", "status", manager=systemd_user).stdout.decode().split()
    assert int(status[status.index("pid") + 1]) == main_pid  # the run went to systemd's boxyd
    assert (
        systemd_user.systemctl(
            "show", "-p", "StatusText", "--value", "boxyd.service"
        ).stdout.strip()
        == "0 sessions running"
    )


def test_a_stop_from_systemd_stops_and_records_the_sessions(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    r = ctl(
        user,
        "run",
        "-d",
        "-w",
        str(workdir),
        "--net",
        "none",
        "--",
        "sleep",
        "66",
        manager=systemd_user,
    )
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    deadline = time.monotonic() + 10
    while (
        time.monotonic() < deadline
        and systemd_user.systemctl(
            "show", "-p", "StatusText", "--value", "boxyd.service"
        ).stdout.strip()
        != "1 session running"
    ):
        time.sleep(0.1)
    assert (
        systemd_user.systemctl(
            "show", "-p", "StatusText", "--value", "boxyd.service"
        ).stdout.strip()
        == "1 session running"
    )
    stopped = systemd_user.systemctl("stop", "boxyd.service")
    assert stopped.returncode == 0, stopped.stderr
    shown = ctl(user, "show", sid, manager=systemd_user)  # the socket starts boxyd again
    assert shown.returncode == 0, shown.stderr
    assert "state     killed SIGTERM" in shown.stdout.decode(), shown.stdout


def busctl(um: UserManager, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        um.user_cmd(["busctl", "--user", *args]), capture_output=True, text=True, timeout=30
    )


def _detached(user: User, workdir: Path, um: UserManager, script: str) -> str:
    r = ctl(
        user, "run", "-d", "-w", str(workdir), "--net", "none", "--", "sh", "-c", script, manager=um
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def _monitor(um: UserManager) -> subprocess.Popen[str]:
    """`busctl monitor dev.boxy.Daemon`, once it has begun (it prints nothing until a
    message comes)."""
    monitor = subprocess.Popen(
        um.user_cmd(["busctl", "--user", "monitor", "dev.boxy.Daemon"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(1.5)
    return monitor


def test_dbus_tree_introspect_call_and_monitor(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    sid = _detached(user, workdir, systemd_user, "while [ ! -e go ]; do sleep 0.05; done; exit 4")
    path = f"/dev/boxy/session/{sid}"
    tree = busctl(systemd_user, "tree", "dev.boxy.Daemon")
    assert "/dev/boxy/Manager" in tree.stdout and path in tree.stdout, tree.stdout + tree.stderr
    intro = busctl(systemd_user, "introspect", "dev.boxy.Daemon", path).stdout
    for member in ("dev.boxy.Session1", ".State", ".Argv", ".ExitStatus", ".Connections", ".Event"):
        assert member in intro, intro
    listed = busctl(
        systemd_user,
        "call",
        "dev.boxy.Daemon",
        "/dev/boxy/Manager",
        "dev.boxy.Manager1",
        "List",
        "b",
        "false",
    ).stdout
    assert f'"{sid}" "running" "{path}"' in listed, listed
    state = busctl(
        systemd_user, "get-property", "dev.boxy.Daemon", path, "dev.boxy.Session1", "State"
    ).stdout.strip()
    assert state == 's "running"'
    monitor = _monitor(systemd_user)
    try:
        (workdir / "go").touch()
        deadline = time.monotonic() + 15
        while (
            time.monotonic() < deadline
            and busctl(
                systemd_user,
                "get-property",
                "dev.boxy.Daemon",
                path,
                "dev.boxy.Session1",
                "ExitStatus",
            ).stdout.strip()
            != "i 4"
        ):
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        monitor.terminate()
        out = monitor.communicate(timeout=10)[0]
    assert (
        busctl(
            systemd_user, "get-property", "dev.boxy.Daemon", path, "dev.boxy.Session1", "ExitStatus"
        ).stdout.strip()
        == "i 4"
    )
    assert "Member=Event" in out and 'STRING "exited"' in out, out[-3000:]
    assert "Member=PropertiesChanged" in out, out[-3000:]


def test_a_session_is_announced_once_from_the_object_managers_path(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    """Issue 32 §5: InterfacesAdded came twice per session (dbus-fast's own, from the
    session's path, beside the ObjectManager's from /dev/boxy)."""
    ctl(user, "setup", manager=systemd_user)
    ctl(user, "daemon", "status", manager=systemd_user)  # up before the monitor starts
    monitor = _monitor(systemd_user)
    try:
        sid = _detached(user, workdir, systemd_user, "exit 0")
        time.sleep(1.0)
    finally:
        monitor.terminate()
        out = monitor.communicate(timeout=10)[0]
    added = [m for m in out.split("‣") if "Member=InterfacesAdded" in m and sid in m]
    assert len(added) == 1, out[-4000:]
    assert re.search(r"Path=/dev/boxy\s", added[0]), added[0]


def test_dbus_stop_and_a_named_error(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    sid = _detached(user, workdir, systemd_user, "exec sleep 68")
    r = busctl(
        systemd_user,
        "call",
        "dev.boxy.Daemon",
        "/dev/boxy/Manager",
        "dev.boxy.Manager1",
        "Stop",
        "sb",
        sid,
        "true",
    )
    assert r.stdout.strip() == 's "killed"', r.stderr
    r = busctl(
        systemd_user,
        "call",
        "dev.boxy.Daemon",
        "/dev/boxy/Manager",
        "dev.boxy.Manager1",
        "Stop",
        "sb",
        "deadbeef",
        "false",
    )
    assert r.returncode != 0 and "no session deadbeef" in r.stderr, r.stderr


BURST = r"""
import asyncio, sys
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from boxyd.api.dbus import wait_when_full

async def main():
    bus = await MessageBus(bus_address=sys.argv[1]).connect()
    wait_when_full(bus)  # the client has dbus-fast's EAGAIN defect too
    calls = [bus.call(Message(destination="dev.boxy.Daemon", path="/dev/boxy/Manager",
                              interface="dev.boxy.Manager1", member="List", signature="b",
                              body=[False])) for _ in range(3000)]
    replies = await asyncio.gather(*calls, return_exceptions=True)
    print(sum(1 for r in replies if getattr(r, "message_type", None) == MessageType.METHOD_RETURN))

asyncio.run(main())
"""


def test_a_burst_of_3000_calls_leaves_the_daemon_on_the_bus(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    for _ in range(5):  # sessions to list: replies of some size
        _detached(user, workdir, systemd_user, "exec sleep 69")
    pid = busctl(systemd_user, "status", "dev.boxy.Daemon").stdout
    r = subprocess.run(
        systemd_user.user_cmd(
            [str(BIN / "python3"), "-c", BURST, systemd_user.env()["DBUS_SESSION_BUS_ADDRESS"]]
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.strip() == "3000", r.stderr[-2000:]
    after = busctl(
        systemd_user,
        "call",
        "dev.boxy.Daemon",
        "/dev/boxy/Manager",
        "dev.boxy.Manager1",
        "List",
        "b",
        "false",
    )
    assert after.returncode == 0 and after.stdout.startswith("a(sso) "), after.stderr
    assert (
        busctl(systemd_user, "status", "dev.boxy.Daemon").stdout.split("\n")[0]
        == pid.split("\n")[0]
    )
    for line in ctl(user, "ps", manager=systemd_user).stdout.decode().splitlines()[1:]:
        if "sleep 69" in line:
            ctl(user, "stop", "-k", line.split()[0], manager=systemd_user)


def test_calling_the_bus_name_starts_boxyd(
    boxy: Boxy, user: User, systemd_user: UserManager
) -> None:
    """D-Bus activation: the bus asks systemd for boxyd.service (SystemdService=)."""
    ctl(user, "setup", manager=systemd_user)
    systemd_user.systemctl("stop", "boxyd.service")
    assert daemon_pids(user) == []
    r = busctl(
        systemd_user,
        "call",
        "dev.boxy.Daemon",
        "/dev/boxy/Manager",
        "dev.boxy.Manager1",
        "List",
        "b",
        "false",
    )
    assert r.returncode == 0 and r.stdout.startswith("a(sso) "), r.stderr
    assert systemd_user.systemctl("is-active", "boxyd.service").stdout.strip() == "active"


def test_each_run_is_a_delegated_transient_scope(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    audit = workdir / "audit.jsonl"
    r = ctl(
        user,
        "run",
        "-d",
        "-w",
        str(workdir),
        "--net",
        "none",
        "--pids",
        "300",
        "--memory",
        "1GiB",
        "--cpus",
        "0.5",
        "--audit-log",
        str(audit),
        "--",
        "sleep",
        "70",
        manager=systemd_user,
    )
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    unit = f"boxy-{sid}.scope"
    try:
        status = systemd_user.systemctl("status", unit)
        # the run is under way once boxyd has PID 1; the payload's exec may still be in
        # progress as systemd reads its command line ("[sleep]"): asked again, bounded
        for _ in range(50):
            if "sleep 70" in status.stdout:
                break
            time.sleep(0.05)
            status = systemd_user.systemctl("status", unit)
        assert "Active: active (running)" in status.stdout, status.stdout + status.stderr
        assert "sleep 70" in status.stdout, status.stdout
        # PID 1 too, though the zygote forked it (placed with the outer stage 2)
        assert "boxy-init" in status.stdout, status.stdout
        props = systemd_user.systemctl(
            "show",
            "-p",
            "Delegate",
            "-p",
            "TasksMax",
            "-p",
            "MemoryMax",
            "-p",
            "CPUQuotaPerSecUSec",
            unit,
        ).stdout
        for want in (
            "Delegate=yes",
            "TasksMax=300",
            f"MemoryMax={1 << 30}",
            "CPUQuotaPerSecUSec=500ms",
        ):
            assert want in props, props
        shown = ctl(user, "show", sid, manager=systemd_user).stdout.decode()
        # these machines' v2 hierarchy has no memory/pids/cpu controller: said, not faked
        assert (
            f"--memory 1.0GiB: sizes the scratch tmpfs ($HOME, /tmp, /dev/shm); the memory limit "
            f"itself is not enforced (no memory controller in {unit})" in shown
        ), shown
        assert (
            f"--pids 300: enforced with RLIMIT_NPROC in the sandbox's user namespace "
            f"(no pids controller in {unit})" in shown
        ), shown
        assert f"--cpus 0.5: not enforced (no cpu controller in {unit})" in shown, shown
    finally:
        ctl(user, "stop", "-k", sid, manager=systemd_user)
    records = [json.loads(ln) for ln in audit.read_text().splitlines()]
    scope = [x for x in records if x.get("layer") == "cgroup" and "scope" in x]
    assert scope and scope[0]["scope"] == unit, records
    memory = [x for x in records if x.get("layer") == "cgroup" and x.get("limit") == "memory"]
    assert memory and memory[0]["enforced"] is False, records
    # stop -k: every process of the run SIGKILLed while its cgroup was frozen (PID 1
    # and sleep at least), so none ran once PID 1's seccomp listener was let go
    frozen = [x for x in records if x.get("layer") == "cgroup" and "killed_frozen" in x]
    assert frozen and frozen[0]["killed_frozen"] >= 2, records
    deadline = time.monotonic() + 10
    while (
        time.monotonic() < deadline
        and systemd_user.systemctl("is-active", unit).stdout.strip() == "active"
    ):
        time.sleep(0.1)
    assert systemd_user.systemctl("is-active", unit).stdout.strip() != "active"  # gone with the run


def test_a_run_whose_network_was_made_ahead_is_placed_in_its_scope_too(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    """The second networked run takes the spare stage 2 that made its user and network
    namespaces before the run came (docs/design.md, "Steps 1–3 ahead"): the user
    manager still moves it into the run's scope, and the payload starts there. The
    payload sends nothing: no network is used."""
    ctl(user, "setup", manager=systemd_user)
    sids = []
    try:
        for _ in range(2):
            r = ctl(user, "run", "-d", "-w", str(workdir), "--net", "public", "--", "sleep", "71",
                    manager=systemd_user)  # fmt: skip
            assert r.returncode == 0, r.stderr
            sids.append(r.stdout.decode().strip())
            time.sleep(0.5)  # the next networked spare prepares meanwhile
        status = systemd_user.systemctl("status", f"boxy-{sids[1]}.scope")
        assert "Active: active (running)" in status.stdout, status.stdout + status.stderr
        assert "sleep 71" in status.stdout, status.stdout
    finally:
        for sid in sids:
            ctl(user, "stop", "-k", sid, manager=systemd_user)


def _python_on_the_bus(
    um: UserManager, script: str, workdir: Path
) -> subprocess.CompletedProcess[str]:
    """SCRIPT run by the venv's python as the user, with the bus's address and WORKDIR."""
    address = um.env()["DBUS_SESSION_BUS_ADDRESS"]
    argv = [str(BIN / "python3"), "-c", script, address, str(workdir)]
    return subprocess.run(um.user_cmd(argv), capture_output=True, text=True, timeout=90)


RUN_OVER_DBUS = r"""
import asyncio, json, os, sys
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

M = dict(destination="dev.boxy.Daemon", path="/dev/boxy/Manager", interface="dev.boxy.Manager1")

async def main():
    bus = await MessageBus(bus_address=sys.argv[1], negotiate_unix_fd=True).connect()
    from boxy.buildid import build_id  # the core refuses a client of another build
    request = json.dumps({"argv": ["sh", "-c", "echo hello-over-dbus; exit 3"], "cwd": sys.argv[2],
                          "options": {"net": "none"}, "build": build_id()})
    r, w = os.pipe()
    null = os.open(os.devnull, os.O_RDWR)
    reply = await bus.call(Message(**M, member="Run", signature="shhh", body=[request, 0, 1, 2],
                                   unix_fds=[null, w, null]))
    os.close(w)
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    print("RUN", reply.message_type.name, reply.body[0] if reply.body else reply.error_name)
    print("OUT", out.decode().strip())
    # an "h" argument without the fds: refused, never taken for one of the daemon's fds
    bad = await bus.call(Message(**M, member="Run", signature="shhh", body=[request, 0, 1, 2]))
    print("NOFDS", bad.message_type.name, bad.error_name)
    # fds brought to a call that takes none: closed by the daemon (our reader sees EOF)
    r2, w2 = os.pipe()
    listed = await bus.call(Message(**M, member="List", signature="b", body=[False], unix_fds=[w2]))
    os.close(w2)
    os.set_blocking(r2, True)
    print("LIST", listed.message_type.name, os.read(r2, 1) == b"")

asyncio.run(main())
"""


def test_run_over_dbus_with_fds_and_the_fd_defects(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    ctl(user, "setup", manager=systemd_user)
    r = _python_on_the_bus(systemd_user, RUN_OVER_DBUS, workdir)
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines())
    assert lines.get("RUN", "").startswith("METHOD_RETURN "), r.stdout + r.stderr
    sid = lines["RUN"].split()[1]
    assert lines["OUT"] == "hello-over-dbus"
    assert lines["NOFDS"] == "ERROR dev.boxy.Error.InvalidArgument"
    assert lines["LIST"] == "METHOD_RETURN True"
    deadline = time.monotonic() + 10
    status = ""
    while time.monotonic() < deadline and status != "i 3":
        status = busctl(
            systemd_user,
            "get-property",
            "dev.boxy.Daemon",
            f"/dev/boxy/session/{sid}",
            "dev.boxy.Session1",
            "ExitStatus",
        ).stdout.strip()
        time.sleep(0.1)
    assert status == "i 3"


DBUS_PYTHON = r"""
import json, os, sys, time
import xml.etree.ElementTree as ET
import dbus
from boxy.buildid import build_id  # the core refuses a client of another build

bus = dbus.bus.BusConnection(sys.argv[1])
def obj(path):  # a proxy: dbus-python introspects it to learn each method's signature
    return bus.get_object("dev.boxy.Daemon", path)
out = {}
manager = dbus.Interface(obj("/dev/boxy/Manager"), "dev.boxy.Manager1")
request = json.dumps({"argv": ["sh", "-c", "echo hello-dbus-python; exit 5"], "cwd": sys.argv[2],
                      "options": {"net": "none"}, "build": build_id()})
r, w = os.pipe()
null = os.open(os.devnull, os.O_RDWR)
sid, path = manager.Run(request, dbus.types.UnixFd(null), dbus.types.UnixFd(w),
                        dbus.types.UnixFd(null))
os.close(w)  # UnixFd sent a copy: the payload holds the other end
output = b""
while chunk := os.read(r, 4096):
    output += chunk
out["run"], out["output"] = [str(sid), str(path)], output.decode()
props = dbus.Interface(obj(path), "org.freedesktop.DBus.Properties")
deadline = time.monotonic() + 30
while int(props.Get("dev.boxy.Session1", "ExitStatus")) == -1 and time.monotonic() < deadline:
    time.sleep(0.05)
out["exit"] = int(props.Get("dev.boxy.Session1", "ExitStatus"))
managed = dbus.Interface(obj("/dev/boxy"), "org.freedesktop.DBus.ObjectManager").GetManagedObjects()
out["managed"] = sorted(str(p) for p in managed)
out["interfaces"] = {}
for p in ("/dev/boxy", "/dev/boxy/Manager", str(path)):
    xml = dbus.Interface(obj(p), "org.freedesktop.DBus.Introspectable").Introspect()
    node = ET.fromstring(str(xml))
    out["interfaces"][p] = sorted(i.get("name") for i in node.iter("interface"))
    out.setdefault("unnamed", []).extend(
        f"{p} {i.get('name')}" for i in node.iter("interface") for a in i.iter("arg")
        if not a.get("name"))
try:
    manager.Stop("0000dead", False)
except dbus.exceptions.DBusException as e:
    out["error"] = e.get_dbus_name()
print(json.dumps(out))
"""


def test_dbus_python_runs_introspects_and_reads_the_object_manager(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    """The D-Bus wire through dbus-python (the reference binding; its proxies read the
    introspection for every call's signature): issue 32 §5's deviations, each
    checked where this client sees it."""
    ctl(user, "setup", manager=systemd_user)
    r = _python_on_the_bus(systemd_user, DBUS_PYTHON, workdir)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    sid, path = out["run"]
    assert path == f"/dev/boxy/session/{sid}"
    assert out["output"] == "hello-dbus-python\n"
    assert out["exit"] == 5
    assert {"/dev/boxy/Manager", path} <= set(out["managed"]), out["managed"]
    om = "org.freedesktop.DBus.ObjectManager"
    assert om in out["interfaces"]["/dev/boxy"], out["interfaces"]
    assert om not in out["interfaces"]["/dev/boxy/Manager"] + out["interfaces"][path]
    assert "dev.boxy.Session1" in out["interfaces"][path]
    assert out["unnamed"] == [], out["unnamed"]
    assert out["error"] == "dev.boxy.Error.NoSuchSession"


# A payload that keeps moving a directory holding a sparse 100 GiB file (apply would
# write it whole) through 16 names, so a walk of the layer may never meet it.
MOVER = r"""
import os, time
os.mkdir("d15")
with open("d15/big", "wb") as f:
    f.truncate(100 << 30)
end, i = time.monotonic() + 10, 15
while time.monotonic() < end:
    os.rename(f"d{i}", f"d{(i - 1) % 16}")
    i = (i - 1) % 16
print("DODGED")
"""


def test_a_review_in_a_scope_is_measured_frozen(
    boxy: Boxy, user: User, workdir: Path, systemd_user: UserManager
) -> None:
    """--review-limit: in a scope the run is frozen (FreezeUnit) while its layer is
    measured, so a directory kept moving is met by the walk; the run is stopped."""
    ctl(user, "setup", manager=systemd_user)
    audit = workdir / "audit.jsonl"
    r = ctl(
        user, "run", "-w", str(workdir), "--net", "none", "--review", "--review-limit", "4MiB",
        "--audit-log", str(audit), "--", "python3", "-c", MOVER, manager=systemd_user,
    )  # fmt: skip
    err = r.stderr.decode()
    assert b"DODGED" not in r.stdout, f"ESCAPED: the moving directory passed every measure: {err}"
    assert "past its limit of 4.0MiB (--review-limit): the run was stopped" in err, err
    records = [json.loads(ln) for ln in audit.read_text().splitlines()]
    review = [x for x in records if x.get("layer") == "review" and "measures_frozen" in x]
    assert review and review[0]["measures_frozen"] >= 1, records
    sid = re.search(r"boxyctl discard (\w+)", err)
    assert sid, err
    ctl(user, "discard", sid.group(1), manager=systemd_user)
