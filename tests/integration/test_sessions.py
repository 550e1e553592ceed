"""Sessions as another client sees them: `ps`, `show` and `stop` against real
sandboxes, and the records that outlive a restart of boxyd."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.integration.clients import client_err, daemon_pids, start_client

pytestmark = pytest.mark.sandbox


def ctl(user: User, *args: str) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], timeout=60)


def running_id(user: User, marker: str) -> str:
    """The id of the one running session whose command holds MARKER."""
    r = ctl(user, "ps")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0].split() == ["ID", "STATE", "STARTED", "TIME", "PROFILE", "PORTS", "COMMAND"]
    mine = [ln for ln in lines[1:] if marker in ln]
    assert len(mine) == 1, lines
    assert mine[0].split()[1] == "running"
    return mine[0].split()[0]


def test_ps_show_and_stop_a_running_session(boxy: Boxy, user: User, workdir: Path) -> None:
    proc, _ = start_client(user, workdir, "echo ready; exec sleep 61")
    try:
        sid = running_id(user, "sleep 61")
        shown = ctl(user, "show", sid).stdout.decode()
        assert f"session   {sid}" in shown and "state     running" in shown
        assert f"workdir   {workdir}" in shown and "running   for" in shown
        r = ctl(user, "stop", sid)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().strip() == f"session {sid}: killed SIGTERM"
        assert proc.wait(timeout=10) == 128 + 15
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sid not in ctl(user, "ps").stdout.decode()
    listed = [ln for ln in ctl(user, "ps", "-a").stdout.decode().splitlines() if ln.startswith(sid)]
    assert len(listed) == 1 and listed[0].split()[1:3] == ["killed", "SIGTERM"], listed


def test_stop_waits_out_the_grace_and_stop_k_does_not(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    proc, _ = start_client(user, workdir, "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    try:
        sid = running_id(user, "trap")
        r = ctl(user, "stop", sid)  # SIGTERM is ignored: SIGKILL after the grace
        assert r.stdout.decode().strip() == f"session {sid}: killed SIGKILL", r.stderr
        # the grace is said before it is waited out
        assert r.stderr.decode().startswith(
            f"boxyctl: stopping session {sid}: SIGTERM, then SIGKILL after 5s"
        ), r.stderr
        assert proc.wait(timeout=10) == 128 + 9
    finally:
        if proc.poll() is None:
            proc.kill()
    proc, _ = start_client(user, workdir, "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    try:
        sid = running_id(user, "trap")
        r = ctl(user, "stop", "-k", sid)
        assert r.stdout.decode().strip() == f"session {sid}: killed SIGKILL", r.stderr
        assert proc.wait(timeout=3) == 128 + 9
    finally:
        if proc.poll() is None:
            proc.kill()


def test_show_and_ps_a_after_a_daemon_restart(boxy: Boxy, user: User, workdir: Path) -> None:
    r = boxy.run("--", "sh", "-c", "echo hi; exit 3")
    assert r.returncode == 3
    sid = next(
        ln.split()[0]
        for ln in reversed(ctl(user, "ps", "-a").stdout.decode().splitlines())
        if "exit 3" in ln and ln.split()[1:3] == ["exited", "3"]
    )
    assert ctl(user, "daemon", "restart").returncode == 0
    listed = [ln for ln in ctl(user, "ps", "-a").stdout.decode().splitlines() if ln.startswith(sid)]
    assert len(listed) == 1 and listed[0].split()[1:3] == ["exited", "3"]
    shown = ctl(user, "show", sid).stdout.decode()
    assert "state     exited 3" in shown and "exit      3 (exit)" in shown
    assert "command   sh -c 'echo hi; exit 3'" in shown and "ended     " in shown


def test_unknown_and_malformed_ids(boxy: Boxy, user: User) -> None:
    r = ctl(user, "show", "deadbeef")
    assert r.returncode == 1
    assert r.stderr.decode().strip().endswith("no session deadbeef (`boxyctl ps -a` lists them)")
    r = ctl(user, "stop", "../../etc")
    assert r.returncode == 2 and b"is not a session id" in r.stderr


def test_a_stopped_client_line_names_the_session(boxy: Boxy, user: User, workdir: Path) -> None:
    """What the client says when it gives up names a session `ps -a` knows."""
    proc, client = start_client(user, workdir, "trap '' INT; echo ready; sleep 62")
    try:
        sid = running_id(user, "sleep 62")
        os.kill(client, signal.SIGINT)
        time.sleep(0.3)
        os.kill(client, signal.SIGINT)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"boxyd stops session {sid} when it sees this client gone" in client_err(workdir)


def test_daemon_stop_refuses_while_a_session_runs_unless_forced(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    proc, _ = start_client(user, workdir, "echo ready; exec sleep 63")
    try:
        sid = running_id(user, "sleep 63")
        r = ctl(user, "daemon", "stop")
        assert r.returncode == 1
        assert f"sessions are running ({sid}); --force stops them first" in r.stderr.decode()
        assert running_id(user, "sleep 63") == sid  # refused: nothing changed
        r = ctl(user, "daemon", "stop", "--force")
        assert r.returncode == 0, r.stderr
        assert proc.wait(timeout=15) == 128 + 15, client_err(workdir)  # its client heard the end
    finally:
        if proc.poll() is None:
            proc.kill()
    listed = [ln for ln in ctl(user, "ps", "-a").stdout.decode().splitlines() if ln.startswith(sid)]
    assert len(listed) == 1 and listed[0].split()[1] == "killed", listed


def _watch(user: User) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        user.cmd([str(BIN / "boxyctl"), "watch"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_watch_on_a_pipe_one_line_per_event_then_the_summary(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    proc, _ = start_client(
        user, workdir, "echo ready; while [ ! -e go ]; do sleep 0.05; done; exit 5"
    )
    watcher = None
    try:
        sid = running_id(user, "while")
        watcher = _watch(user)  # no id: the only running session
        assert watcher.stdout is not None
        first = watcher.stdout.readline().decode()
        assert first.startswith(f"session {sid}  running  "), first
        (workdir / "go").touch()
        out, err = watcher.communicate(timeout=20)
        assert watcher.returncode == 0, err
        assert proc.wait(timeout=10) == 5
    finally:
        for p in (proc, watcher):
            if p is not None and p.poll() is None:
                p.kill()
    lines = out.decode().splitlines()
    assert any(ln.split()[1:] == ["session", "exited"] for ln in lines), lines
    assert "\x1b" not in out.decode()  # a pipe gets no colours and no repaint
    assert "state     exited 5" in lines and "exit      5 (exit)" in lines


def test_watch_refuses_to_guess_and_ctrl_c_ends_only_the_watching(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    procs = [start_client(user, workdir, "echo ready; exec sleep 64")[0]]
    try:
        sid = running_id(user, "sleep 64")
        watcher = subprocess.Popen(
            user.cmd([str(BIN / "boxyctl"), "watch", sid]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert watcher.stdout is not None
        assert watcher.stdout.readline().decode().startswith(f"session {sid}  running")
        kid = subprocess.run(
            ["pgrep", "-P", str(watcher.pid)], capture_output=True, text=True
        ).stdout.split()
        os.kill(int(kid[0]) if kid and os.getuid() != user.uid else watcher.pid, signal.SIGINT)
        assert watcher.wait(timeout=10) == 130
        assert running_id(user, "sleep 64") == sid  # the session goes on
        (workdir / "second").mkdir()
        user.chown(workdir / "second")
        procs.append(start_client(user, workdir / "second", "echo ready; exec sleep 65")[0])
        r = ctl(user, "watch")
        assert r.returncode == 2 and b"several sessions are running (" in r.stderr, r.stderr
        assert b"); name one" in r.stderr
    finally:
        for p in procs:
            p.kill()
        subprocess.run(["pkill", "-u", str(user.uid), "-f", "^sleep 6[45]$"], check=False)


def test_an_idle_on_demand_daemon_exits_by_itself(boxy: Boxy, user: User, workdir: Path) -> None:
    ctl(user, "daemon", "stop", "--force")
    r = subprocess.run(
        user.cmd(
            [str(BIN / "boxyctl"), "run", "--net", "none", "--", "true"], {"BOXY_IDLE_EXIT": "1"}
        ),
        cwd=workdir,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert daemon_pids(user), "the run started no daemon"
    deadline = time.monotonic() + 10
    while daemon_pids(user) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon_pids(user) == [], "boxyd did not exit after 1 s idle"


def test_fifty_concurrent_sessions(boxy: Boxy, user: User, workdir: Path) -> None:
    ids = []
    try:
        for _ in range(50):
            r = ctl(user, "run", "-d", "-w", str(workdir), "--net", "none", "--", "sleep", "67")
            assert r.returncode == 0, r.stderr
            ids.append(r.stdout.decode().strip())
        assert len(set(ids)) == 50
        listed = {
            ln.split()[0]: ln.split()[1] for ln in ctl(user, "ps").stdout.decode().splitlines()[1:]
        }
        assert all(listed.get(sid) == "running" for sid in ids), listed
    finally:
        for sid in ids:
            ctl(user, "stop", "-k", sid)
    listed_all = {
        ln.split()[0]: ln.split()[1:3]
        for ln in ctl(user, "ps", "-a").stdout.decode().splitlines()[1:]
    }
    assert all(listed_all.get(sid) == ["killed", "SIGKILL"] for sid in ids)


def test_the_daemon_holds_no_more_than_the_user(boxy: Boxy, user: User) -> None:
    words = ctl(user, "daemon", "status").stdout.decode().split()
    pid = int(words[words.index("pid") + 1])
    status = dict(
        ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln
    )
    assert (
        status["Uid"].split() == [str(user.uid)] * 4
        and status["Gid"].split() == [str(user.gid)] * 4
    )
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[cap], 16) == 0, (cap, status[cap])


MALFORMED = r"""
import socket, sys
from boxy.paths import socket_path
cases = [b"{oops\0", b"[]\0", b'{"method": 3}\0', b"\xff\0", b"[" * 200000 + b"\0",
         b'{"method": "dev.boxy.Manager.Run", "parameters": {"argv": "x"}}\0']
answers = []
for case in cases:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(socket_path()))
    s.sendall(case)
    answers.append(s.recv(65536).split(b"\0")[0].decode(errors="replace"))
    s.close()
s = socket.socket(socket.AF_UNIX)
s.connect(str(socket_path()))
s.sendall(b'{"method": "dev.boxy.Manager.Version", "parameters": {}}\0')
answers.append(s.recv(65536).decode())
print("\n".join(answers))
"""


def test_malformed_input_gets_an_error_and_the_daemon_goes_on(boxy: Boxy, user: User) -> None:
    ctl(user, "daemon", "status")
    boxy.run("--net", "none", "--", "true")  # a daemon is up
    r = user.run([str(BIN / "python3"), "-c", MALFORMED], timeout=60)
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and len(lines) == 7, (r.stdout, r.stderr)
    for line in lines[:6]:
        assert "org.varlink.service.InvalidParameter" in line or "InvalidArgument" in line, line
    assert '"build"' in lines[-1]  # still answering


# a varlink client that passes no fds (the reference client, busctl's kin): a detached
# Run needs none (issue 32 §5: it was refused, "exactly three file descriptors")
NO_FDS = r"""
import json, socket
from boxy.library import request
from boxy.paths import socket_path
req = request(["sh", "-c", "echo detached-without-fds"], {"net": "none"}, "start")
req.options.detach = True
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(str(socket_path()))
s.sendall(json.dumps({"method": "dev.boxy.Manager.Run", "parameters": req.to_wire(),
                      "more": True}).encode() + b"\0")
print(s.recv(65536).split(b"\0")[0].decode())
"""


def test_a_detached_run_needs_no_fds(boxy: Boxy, user: User, workdir: Path) -> None:
    r = user.run([str(BIN / "python3"), "-c", NO_FDS], cwd=workdir, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    reply = json.loads(r.stdout)
    assert "error" not in reply, reply
    sid = json.dumps(reply)
    ids = [ln.split()[0] for ln in ctl(user, "ps", "-a").stdout.decode().splitlines()[1:]]
    sid = next(i for i in ids if i in sid)
    deadline = time.monotonic() + 30
    out = b""
    while time.monotonic() < deadline and b"detached-without-fds" not in out:
        out = ctl(user, "logs", sid).stdout
        time.sleep(0.2)
    assert b"detached-without-fds" in out, out


def test_a_daemon_of_another_build_is_replaced_when_idle_and_kept_when_busy(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """The client's build id is its installed sources' (boxy.buildid): touching one
    makes the running daemon another build."""
    source = BIN.parent.parent / "boxy" / "__init__.py"
    st = source.stat()
    r = ctl(user, "run", "-d", "-w", str(workdir), "--net", "none", "--", "sleep", "71")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    try:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        busy = boxy.run("--net", "none", "--", "true")
        assert busy.returncode == 1
        assert "boxyd is running another build" in busy.stderr.decode()
        assert "has sessions; run `boxyctl daemon restart` when they finish" in busy.stderr.decode()
        assert running_id(user, "sleep 71") == sid  # refused: nothing changed
        ctl(user, "stop", "-k", sid)
        idle = boxy.run("--net", "none", "--", "echo", "new-build")
        assert idle.returncode == 0 and idle.stdout == b"new-build\n", idle.stderr
        assert "replaced an idle boxyd of another build" in idle.stderr.decode()
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
        ctl(user, "stop", "-k", sid)


def test_without_a_user_manager_a_delegated_cgroup_holds_each_run(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """boxyd started inside a cgroup delegated to the user: each run in a child
    boxy-<id> of it (the harness, as root, delegates it and moves the client there)."""
    if os.getuid() != 0:
        pytest.skip("delegating a cgroup to the test user needs root: run `make test` as root")
    mount = next(
        ln.split()[4]
        for ln in Path("/proc/self/mountinfo").read_text().splitlines()
        if " - cgroup2 " in ln
    )
    deleg = Path(mount) / f"boxyt-deleg-{user.uid}"
    deleg.mkdir(exist_ok=True)
    for p in (
        deleg,
        deleg / "cgroup.procs",
        deleg / "cgroup.subtree_control",
        deleg / "cgroup.threads",
    ):
        os.chown(p, user.uid, user.gid)
    ctl(user, "daemon", "stop", "--force")
    argv = user.cmd(
        [
            str(BIN / "boxyctl"),
            "run",
            "-d",
            "-w",
            str(workdir),
            "--net",
            "none",
            "--",
            "sleep",
            "72",
        ]
    )
    script = f'echo $$ > {deleg}/cgroup.procs && exec "$@"'
    r = subprocess.run(["sh", "-c", script, "sh", *argv], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    try:
        shown = ctl(user, "show", sid).stdout.decode()
        assert f"(no memory controller in boxy-{sid})" in shown, shown
        sleeper = subprocess.run(
            ["pgrep", "-u", str(user.uid), "-x", "sleep"], capture_output=True, text=True
        ).stdout.split()
        groups = [Path(f"/proc/{p}/cgroup").read_text() for p in sleeper]
        assert any(f"/boxyt-deleg-{user.uid}/boxy-{sid}\n" in g for g in groups), groups
    finally:
        ctl(user, "stop", "-k", sid)
        ctl(user, "daemon", "stop", "--force")
        deadline = time.monotonic() + 10
        while (deleg / f"boxy-{sid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (deleg / f"boxy-{sid}").exists(), "the run's cgroup was left behind"
        for _ in range(50):
            try:
                deleg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
