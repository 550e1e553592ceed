"""What scripts use, against real sandboxes: --json, run --report, id prefixes,
`ps -q`, `stop A B`, `logs [-f]`, and `daemon status`'s exit status."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User
from tests.integration.test_attach import Term

pytestmark = pytest.mark.sandbox


def ctl(user: User, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], timeout=60, cwd=cwd)


def detached(user: User, workdir: Path, script: str) -> str:
    r = ctl(user, "run", "-d", "--net", "none", "--", "sh", "-c", script, cwd=workdir)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode().strip()


def test_json_quiet_prefixes_and_stopping_several(boxy: Boxy, user: User, workdir: Path) -> None:
    a = detached(user, workdir, "exec sleep 71")
    b = detached(user, workdir, "exec sleep 72")
    try:
        quiet = ctl(user, "ps", "-q").stdout.decode().split()
        assert {a, b} <= set(quiet) and all(len(i) == 8 for i in quiet)
        doc = json.loads(ctl(user, "ps", "--json").stdout)
        mine = {s["id"]: s for s in doc["sessions"] if s["id"] in (a, b)}
        assert set(mine) == {a, b} and mine[a]["state"] == "running"
        assert mine[a]["argv"] == ["sh", "-c", "exec sleep 71"] and mine[a]["ended_at"] is None
        ids = ctl(user, "ps", "-a", "-q").stdout.decode().split()
        # the shortest prefix of A no other id on record shares
        n = next(k for k in range(1, 9) if sum(i.startswith(a[:k]) for i in ids) == 1)
        shown = json.loads(ctl(user, "show", "--json", a[:n]).stdout)
        assert shown["id"] == a and shown["workdir"] == str(workdir) and shown["outcome"] is None
        assert f"session   {a}" in ctl(user, "show", a[:n]).stdout.decode()
        if n > 1:  # a[:n-1] is shared: refused, naming the ids
            r = ctl(user, "show", a[: n - 1])
            assert r.returncode == 2 and f"id {a[: n - 1]} is ambiguous: " in r.stderr.decode()
            err = r.stderr.decode()
            assert len(err.splitlines()) == 1, err
            named = err.split("ambiguous: ")[1].split(";")[0].split(" and ")[0].split(", ")
            assert len(named) >= 2 and all(i.startswith(a[: n - 1]) for i in named), err
        r = ctl(user, "stop", a[:n], b, "feedbee")
        assert r.returncode == 1 and b"no session feedbee" in r.stderr, r.stderr
        assert b"stopping session feedbee" not in r.stderr  # said only of a running one
        assert r.stderr.count(b"stopping session ") == 2, r.stderr
        assert r.stdout.decode().splitlines() == [
            f"session {a}: killed SIGTERM",
            f"session {b}: killed SIGTERM",
        ]
    finally:
        ctl(user, "stop", "-k", a, b)
    listed = [ln for ln in ctl(user, "ps", "-a").stdout.decode().splitlines()]
    assert listed[0].split()[:5] == ["ID", "STATE", "STARTED", "ENDED", "TIME"]
    row = next(ln for ln in listed if ln.startswith(a)).split()
    # killed SIGTERM, then two dates (YYYY-MM-DD HH:MM:SS)
    assert row[3][:2] == "20" and row[5][:2] == "20" and ":" in row[4] and ":" in row[6], row
    assert f"session   {a}" in ctl(user, "watch", a[:n]).stdout.decode()  # finished: its summary
    done = json.loads(ctl(user, "show", "--json", a).stdout)
    assert done["outcome"]["exit_status"] == 128 + 15 and done["ended_at"] >= done["started_at"]


def test_a_work_directory_the_user_cannot_read_changes_nothing(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """Issue 33 §2: one line and exit 2 before anything starts, no session on record
    (was: exit 125 after one, "the tree changed while it was being read?"); a -w is
    refused by the client, before a boxyd is started."""
    before = set(ctl(user, "ps", "-a", "-q").stdout.decode().split())
    ctl(user, "daemon", "stop")
    for w, says in (
        ("/root", "permission denied (you cannot list or enter it)"),
        ("/root/sub", "permission denied (/root is closed to you)"),  # was: not a directory
    ):
        r = boxy.run("-w", w, cmd=["true"])
        assert (r.returncode, r.stderr.decode()) == (2, f"boxyctl: --workdir {w}: {says}\n")
    assert ctl(user, "daemon", "status").returncode == 3  # no boxyd was started
    # a current directory the user may enter but not list: boxyd's own check
    closed = workdir / "closed"
    closed.mkdir()
    user.chown(closed)
    closed.chmod(0o100)
    r = user.run([str(BIN / "boxyctl"), "run", "--", "true"], cwd=closed, timeout=60)
    assert (r.returncode, r.stderr.decode()) == (
        2,
        f"boxyctl: the current directory {closed}: permission denied (you cannot list or "
        "enter it)\n",
    )
    r = ctl(user, "stop", "deadbeef")
    assert (r.returncode, r.stdout, r.stderr) == (
        1,
        b"",
        b"boxyctl: no session deadbeef (`boxyctl ps -a` lists them)\n",
    )
    assert set(ctl(user, "ps", "-a", "-q").stdout.decode().split()) == before
    closed.chmod(0o700)


def test_logs_and_logs_f(boxy: Boxy, user: User, workdir: Path) -> None:
    sid = detached(user, workdir, "echo one; sleep 2; echo two")
    t0 = time.monotonic()
    r = ctl(user, "logs", "-f", sid[:6])  # follows until the session ends
    assert r.returncode == 0, r.stderr
    assert r.stdout.replace(b"\r\n", b"\n") == b"one\ntwo\n"
    assert time.monotonic() - t0 > 1.0
    assert ctl(user, "logs", sid).stdout.replace(b"\r\n", b"\n") == b"one\ntwo\n"
    boxy.run("--net", "none", cmd=["true"])
    plain = next(
        ln.split()[0]
        for ln in reversed(ctl(user, "ps", "-a").stdout.decode().splitlines())
        if ln.split()[-1] == "true"
    )
    r = ctl(user, "logs", plain)
    assert r.returncode == 1 and b"kept no output" in r.stderr


def test_run_report(boxy: Boxy, user: User, workdir: Path) -> None:
    r = boxy.run("--net", "none", "--report", "out/r.json", cmd=["true"])
    assert r.returncode == 2 and b"is not a directory" in r.stderr
    r = boxy.run("--net", "none", "--report", "r.json", cmd=["sh", "-c", "exit 3"])
    assert r.returncode == 3, r.stderr
    doc = json.loads((workdir / "r.json").read_text())
    assert (doc["exit_status"], doc["reason"], doc["state"]) == (3, "exit", "exited")
    assert doc["findings"] == [] and doc["refusals"] == [] and doc["denials"] == 0
    assert doc["notices"] == []
    assert doc["destinations"] == [] and len(doc["id"]) == 8
    assert json.loads(ctl(user, "show", "--json", doc["id"]).stdout)["argv"][-1] == "exit 3"
    # bad input the client refuses changes nothing: no report is written
    before = (workdir / "r.json").read_bytes()
    r = boxy.run("--net", "none", "-p", "no-such-profile", "--report", "r.json", cmd=["true"])
    assert r.returncode == 2 and (workdir / "r.json").read_bytes() == before
    # one boxyd refuses before the start is recorded: no session, exit 2, its message
    r = boxy.run("--net", "none", "--ro", "/no/such/x", "--report", "r.json", cmd=["true"])
    doc = json.loads((workdir / "r.json").read_text())
    assert r.returncode == 2 and (doc["id"], doc["exit_status"]) == (None, 2), r.stderr
    assert "/no/such/x" in doc["message"]


def test_json_without_a_daemon_and_daemon_status(boxy: Boxy, user: User, workdir: Path) -> None:
    doc = json.loads(ctl(user, "doctor", "--json").stdout)
    assert doc["ok"] is True and {"name", "ok", "required", "detail"} <= set(doc["checks"][0])
    names = [
        p["name"] for p in json.loads(ctl(user, "profile", "list", "--json").stdout)["profiles"]
    ]
    assert "generic" in names and names == sorted(names)
    shown = json.loads(ctl(user, "profile", "show", "node", "--json", cwd=workdir).stdout)
    assert shown["name"] == "node" and shown["kind"] == "preset" and shown["allow_hosts"]
    assert "approvals" in json.loads(ctl(user, "trust", "--list", "--json").stdout)
    assert "caches" in json.loads(ctl(user, "cache", "list", "--json").stdout)
    assert ctl(user, "daemon", "status").returncode == 0
    r = ctl(user, "daemon", "status", "--json")  # was: "--json: unknown flag"
    status = json.loads(r.stdout)
    assert r.returncode == 0 and status["running"] is True and status["pid"] > 1
    assert {"build", "version", "uptime", "sessions_running"} <= set(status)
    assert ctl(user, "daemon", "stop").returncode == 0
    r = ctl(user, "daemon", "status")
    assert (r.returncode, r.stdout) == (3, b"boxyd: not running\n")
    r = ctl(user, "daemon", "status", "--json")
    assert (r.returncode, json.loads(r.stdout)) == (3, {"running": False})


def _shell_term(user: User, workdir: Path, shell: str) -> Term:
    """`boxyctl run --net none` (no command) on a fresh PTY, with SHELL=SHELL."""
    return Term(user, workdir, ["run", "--net", "none"], env={"SHELL": shell})


@pytest.mark.parametrize(
    "shell, want",
    [
        ("/bin/dash", "bash=<> shell=</bin/dash>"),
        ("/no/such/zsh", r"bash=<5\.[^>]*> shell=</bin/bash>"),
    ],
)
def test_run_without_a_command_on_a_terminal_is_the_shell(
    boxy: Boxy, user: User, workdir: Path, shell: str, want: str
) -> None:
    term = _shell_term(user, workdir, shell)
    try:
        term.expect(r"\$ ")  # its prompt: input typed before it could be flushed
        term.send(b'echo "bash=<$BASH_VERSION> shell=<$SHELL>"; exit 5\r')
        term.expect(want)
        assert term.wait() == 5
    finally:
        term.close()
    r = ctl(user, "run", "--net", "none", cwd=workdir)  # no terminal: still an error
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert b"run: missing command" in r.stderr
