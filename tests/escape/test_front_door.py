"""boxyd's front door (issue #30 §1, docs/design.md "The front door"): no descriptor
of the user's authority enters a sandbox, whatever state the client's stdio is in.

Every way a command reaches boxyd is started with stdin, stdout, stderr or all three
closed (as cron, units, nohup and agent harnesses do): boxyctl, boxy, boxy-sh, the
hook's rewritten line and the library. The payload scans every fd up to its limit;
on each socket it tries a Show and a Stop of another session (a detached sleeper of
the same user) and a Run, plain and oneway. It writes its report to a file (its
stdout may be closed). ESCAPED only when boxyd answered; the sleeper must still run.

The layers one by one: boxyd's refusal of a passed descriptor is run here end to end
with a client that bypasses the first layer (it hands boxyd its own connection);
the exclusive stream and the writer vetting have real-socket tests of their own
(tests/unit/test_varlink.py, tests/unit/test_insiders.py), since with the first two
layers on no socket of boxyd's reaches a payload at all.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, LIB, Boxy, User
from tests.escape.conftest import HOST_PY, PRELUDE, describe, output

SCAN = r"""
import json, resource
sys.stdout = open(REPORT, "w", buffering=1)
sid = SID

def call(s, method, params, oneway=False):
    msg = {"method": "dev.boxy.Manager." + method, "parameters": params}
    if oneway:
        msg["oneway"] = True
    s.sendall(json.dumps(msg).encode() + b"\0")

def answered(s):
    s.settimeout(1.0)
    try:
        return s.recv(65536)
    except OSError:
        return b""

limit = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 65536)
sockets = 0
for fd in range(limit):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if not stat.S_ISSOCK(st.st_mode):
        continue
    sockets += 1
    s = socket.socket(fileno=os.dup(fd))
    try:
        call(s, "Show", {"id": sid})
        got = answered(s)
        if got:
            escaped(f"show-on-fd{fd}", repr(got[:80]))
        call(s, "Stop", {"id": sid, "kill": True}, oneway=True)
        run = {"argv": ["true"], "cwd": "/", "options": {"ro": [os.environ.get("HOME", "/")]},
               "client_env": {}, "build": "x"}
        call(s, "Run", run, oneway=True)
        call(s, "Run", run)
        got = answered(s)
        if got:
            escaped(f"run-on-fd{fd}", repr(got[:80]))
    except OSError as e:
        tried(f"calls-on-fd{fd}", ename(e))
    finally:
        s.close()
tried("scan", f"fds:{limit} sockets:{sockets}")
"""

CLOSINGS = {"stdin": "<&-", "stdout": ">&-", "stderr": "2>&-", "all": "<&- >&- 2>&-"}


@pytest.fixture
def sleeper(user: User, workdir: Path) -> Iterator[str]:
    """Another session of the same user, detached: what the payload goes for."""
    r = user.run(
        [str(BIN / "boxyctl"), "run", "-d", "--net", "none", "--", "sleep", "120"], cwd=workdir
    )
    assert r.returncode == 0, describe(r)
    sid = r.stdout.decode().split()[-1]
    yield sid
    user.run([str(BIN / "boxyctl"), "stop", "-k", sid])


def state(user: User, sid: str) -> str:
    r = user.run([str(BIN / "boxyctl"), "show", "--json", sid])
    assert r.returncode == 0, describe(r)
    return str(json.loads(r.stdout)["state"])


def payload(boxy: Boxy, sid: str) -> tuple[Path, Path]:
    report = boxy.workdir / "report.txt"
    code = SCAN.replace("REPORT", repr(str(report))).replace("SID", repr(sid))
    script = boxy.workdir / "scan.py"
    script.write_text(PRELUDE + "\n" + code + "\nprint('DONE', flush=True)\n")
    boxy.user.chown(script)
    return script, report


def check(r: subprocess.CompletedProcess[bytes], report: Path, user: User, sid: str) -> None:
    text = report.read_text() if report.exists() else ""
    assert "ESCAPED" not in text + output(r), describe(r) + text
    assert "TRIED scan" in text and "DONE" in text, describe(r) + text
    assert "sockets:0" in text, text  # no socket at all reached the payload
    assert state(user, sid) == "running"  # the Stop never landed
    report.unlink()


def shell(user: User, workdir: Path, line: str) -> subprocess.CompletedProcess[bytes]:
    return user.run(["bash", "-c", line], cwd=workdir, timeout=120)


@pytest.mark.parametrize("closed", CLOSINGS)
@pytest.mark.parametrize("program", ["boxyctl", "boxy"])
def test_client_with_closed_stdio(boxy: Boxy, sleeper: str, program: str, closed: str) -> None:
    script, report = payload(boxy, sleeper)
    line = f"exec {BIN / program} run --net none -- python3 {script.name} {CLOSINGS[closed]}"
    check(shell(boxy.user, boxy.workdir, line), report, boxy.user, sleeper)


@pytest.fixture
def hook_yaml(user: User) -> Iterator[Path]:
    """The hook and boxy-sh intercept python3 here, with --net none."""
    path = user.home / ".config" / "boxy" / "hook.yaml"
    for d in (user.home / ".config", path.parent):
        d.mkdir(exist_ok=True)
        user.chown(d)
    path.write_text("intercept: [python3]\nflags: [--net, none]\n")
    user.chown(path)
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("closed", CLOSINGS)
def test_boxy_sh_with_closed_stdio(boxy: Boxy, sleeper: str, hook_yaml: Path, closed: str) -> None:
    script, report = payload(boxy, sleeper)
    line = f"exec {BIN / 'boxy-sh'} -c 'python3 {script.name}' {CLOSINGS[closed]}"
    check(shell(boxy.user, boxy.workdir, line), report, boxy.user, sleeper)


@pytest.mark.parametrize("closed", CLOSINGS)
def test_hooks_rewritten_line_with_closed_stdio(
    boxy: Boxy, sleeper: str, hook_yaml: Path, closed: str
) -> None:
    script, report = payload(boxy, sleeper)
    event = {
        "session_id": "s",
        "cwd": str(boxy.workdir),
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": f"python3 {script.name}"},
    }
    r = boxy.user.run(
        [str(BIN / "boxyctl"), "hook", "claude"], input=json.dumps(event).encode(), cwd=boxy.workdir
    )
    command = json.loads(r.stdout)["hookSpecificOutput"]["updatedInput"]["command"]
    assert shlex.split(command)[1] == "run", command
    check(
        shell(boxy.user, boxy.workdir, f"{command} {CLOSINGS[closed]}"), report, boxy.user, sleeper
    )


@pytest.mark.parametrize("closed", CLOSINGS)
def test_library_with_closed_stdio(boxy: Boxy, sleeper: str, closed: str) -> None:
    script, report = payload(boxy, sleeper)
    code = (
        f"import boxy; r = boxy.run(['python3', {script.name!r}], stdin=None, stdout=None,"
        " stderr=None, net='none'); raise SystemExit(r.exit_status)"
    )
    root = LIB  # boxy under test is importable from it
    line = f"cd {boxy.workdir} && PYTHONPATH={root} exec {HOST_PY} -c {shlex.quote(code)}"
    check(
        shell(boxy.user, boxy.workdir, f"({line}) {CLOSINGS[closed]}"), report, boxy.user, sleeper
    )


RAW = r"""
import os, socket, sys
from boxy.buildid import build_id
from boxy.client import client_env, connect
from boxy.errors import BoxyError
from boxy.request import RunOptions, RunRequest

def run(stdio):
    c = connect()
    req = RunRequest(["sh", "-c", "echo ESCAPED ran"], os.getcwd(), RunOptions(net="none"),
                     client_env(os.environ), build=build_id())
    try:
        for reply in c.stream("dev.boxy.Manager.Run", req.to_wire(), fds=stdio(c)):
            print("REPLY", reply.get("kind"), flush=True)
    except BoxyError as e:
        print(f"REFUSED {type(e).__name__}: {e}", flush=True)
    finally:
        c.close()

other = connect()  # a second connection of ours, to boxyd
lsn = socket.create_server(("127.0.0.1", 0))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
home = os.open(os.environ["HOME"], os.O_RDONLY | os.O_DIRECTORY)
for name, stdio in [
    ("own", lambda c: [c._sock.fileno(), 1, 2]),
    ("other", lambda c: [0, other._sock.fileno(), 2]),
    ("listener", lambda c: [lsn.fileno(), 1, 2]),
    ("udp", lambda c: [0, 1, udp.fileno()]),
    ("home", lambda c: [home, 1, 2]),
]:
    print("CASE", name, flush=True)
    run(stdio)
"""


def test_boxyd_refuses_its_own_socket_and_other_authority_as_stdio(
    boxy: Boxy, sleeper: str
) -> None:
    """The second layer alone: a client that skips the first hands boxyd a connection
    to boxyd (its own, another), a listening and a datagram socket of the host's
    network and the home directory. Each is one line naming the fd; nothing runs."""
    root = LIB
    r = boxy.user.run(
        [HOST_PY, "-c", RAW], cwd=boxy.workdir, extra_env={"PYTHONPATH": str(root)}, input=b""
    )
    out = r.stdout.decode()
    assert "ESCAPED" not in out and "REPLY" not in out, describe(r)
    lines = [x for x in out.splitlines() if x.startswith("REFUSED")]
    assert len(lines) == 5, describe(r)
    expect = [
        "stdin (fd 0) is a socket connected to boxyd itself",
        "stdout (fd 1) is a socket connected to boxyd itself",
        "stdin (fd 0) is a listening socket",
        "stderr (fd 2) is a network socket of the host's",
        "stdin (fd 0) is a directory",
    ]
    for line, want in zip(lines, expect, strict=True):
        assert line.startswith(f"REFUSED UsageError: {want}"), (line, want)
    assert state(boxy.user, sleeper) == "running"


LOOPBACK_SERVICE = r"""
import os, socket, subprocess, sys
svc = socket.create_server(("127.0.0.1", 0))  # a host service: a database, say
os.close(0)  # started with stdin closed (cron, a unit)
db = socket.create_connection(svc.getsockname())  # fd 0 now
assert db.fileno() == 0, db.fileno()
peer, _ = svc.accept()
peer.sendall(b"ESCAPED host-service-reached\n")
db.set_inheritable(True)
r = subprocess.run([sys.argv[1], "run", "--net", "none", "--", "head", "-c", "64"],
                   close_fds=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
print("EXIT", r.returncode, r.stdout.decode(), r.stderr.decode(), flush=True)
"""


def test_a_connection_to_a_host_service_on_stdin_is_refused(boxy: Boxy) -> None:
    """A program whose stdin was closed connects to a service on loopback (the
    connection takes fd 0) and runs boxyctl: the payload would talk to the service
    with the user's session. boxyd refuses the fd; nothing runs."""
    r = boxy.user.run([HOST_PY, "-c", LOOPBACK_SERVICE, str(BIN / "boxyctl")], cwd=boxy.workdir)
    out = r.stdout.decode()
    assert "ESCAPED" not in out, describe(r)
    assert out.startswith("EXIT 2 "), describe(r)
    assert "stdin (fd 0) is a network socket of the host's connected to 127.0.0.1:" in out, out
