"""Sockets in the work tree (issue 31 §5): on a kernel whose Landlock has no unix-socket
scope (ABI < 9; these machines have 7) a host server listening on a socket in the work
directory would be reachable from inside. Each one is covered by a stand-in, a read-only
regular file, and a connect() to it is refused: at the start, and live for one a host server
makes during the session. And the directories that hold boxy's own trust and hook
settings are refused as work directories, as ~ and / are."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import Listeners, assert_contained, describe, run_py

pytestmark = pytest.mark.sandbox

# a connect() to a file: refused (the stand-in is a read-only one: EACCES first)
REFUSED = {"EACCES", "ECONNREFUSED"}
CONNECT = """
deadline = time.monotonic() + float(sys.argv[2])
while not os.path.exists("GO") and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(float(sys.argv[3]))
for path in sys.argv[1].split(","):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    try:
        s.connect(path)
        data = s.recv(64)
    except OSError as e:
        tried("connect-" + os.path.basename(path), ename(e))
    else:
        tried("connect-" + os.path.basename(path), "connected")
        if b"HELLO-FROM-HOST" in data:
            escaped("connect-" + os.path.basename(path), "reached the host's server")
"""


def test_a_server_in_the_tree_is_not_reachable(
    boxy: Boxy, user: User, workdir: Path, listeners: Listeners
) -> None:
    (workdir / "run").mkdir()
    user.chown(workdir / "run")
    a = listeners.start(str(workdir / "wd.sock"))  # each accepted start()'s own probe
    b = listeners.start(str(workdir / "run/db.sock"))
    (workdir / "GO").touch()
    r = run_py(boxy, CONNECT, args=("wd.sock,run/db.sock", "0", "0"))
    assert_contained(
        r,
        "connect-wd.sock",
        "connect-db.sock",
        results={"connect-wd.sock": REFUSED, "connect-db.sock": REFUSED},
    )
    assert "2 unix sockets in the work tree covered" in r.stderr.decode(), describe(r)
    assert a.accepts() == 1 and b.accepts() == 1
    # --reveal exposes one on purpose (the control: the server is reachable then)
    r = run_py(boxy, CONNECT, "--reveal", "wd.sock", args=("wd.sock", "0", "0"))
    assert b"TRIED connect-wd.sock connected" in r.stdout, describe(r)


def test_a_server_started_during_the_session_is_covered_as_it_listens(
    boxy: Boxy, user: User, workdir: Path, listeners: Listeners
) -> None:
    import subprocess

    from tests.conftest import BIN

    argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--", "python3", "payload.py"]
    from tests.escape.conftest import spawn, stop, write_payload

    write_payload(boxy, CONNECT)
    proc = spawn(
        user,
        [*argv, "late.sock", "20", "0.5"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.5)  # the session runs, its guard watches
        listener = listeners.start(str(workdir / "late.sock"))
        (workdir / "GO").touch()
        out, err = proc.communicate(timeout=60)
        assert b"ESCAPED" not in out, out + err
        assert any(b"TRIED connect-late.sock " + e.encode() in out for e in REFUSED), out + err
        assert listener.accepts() == 1  # start()'s own probe
    finally:
        stop(proc)


@pytest.mark.parametrize(
    "rel",
    [".config", ".config/boxy", ".local/state/boxy", ".claude", ".local/share/systemd/user"],
)
def test_boxy_s_own_settings_are_refused_as_work_directories(
    user: User, workdir: Path, rel: str
) -> None:
    from tests.conftest import BIN

    target = user.home / rel
    made = not target.exists()
    user.makedirs(target)
    try:
        r = user.run([str(BIN / "boxyctl"), "run", "-w", str(target), "--net", "none", "true"])
        assert r.returncode == 2, describe(r)
        assert "would let the run rewrite" in r.stderr.decode(), describe(r)
    finally:
        if made and rel == ".claude":
            target.rmdir()
