"""The tool sandbox boxyd runs git, npm and pip in: real stage 2, real namespaces.

What a tool inside may do: read the trees it was shown and run the system's
programs. What it may not: write those trees, execute anything from them or from
its /tmp, reach any network (the host's loopback included), see the user's home,
reach the server's own descriptors, or outlast its deadline.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxyd.config.hosttools import Answer, Exposure, Runner, ToolError
from tests.harness import toolshed

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C"}


@pytest.fixture
def home() -> Iterator[Path]:
    """A home outside /tmp (the sandbox's /tmp is its own scratch, covering any path there)."""
    h = Path.home() / f".boxy-test-home-{uuid.uuid4().hex[:8]}"
    h.mkdir()
    yield h
    shutil.rmtree(h, ignore_errors=True)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "tree"
    t.mkdir()
    (t / "file").write_text("hello\n")
    (t / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (t / "run.sh").chmod(0o755)
    return t


def sh(
    box: Runner, script: str, cwd: str = "/", timeout: float = 10, limit: int = 1 << 16
) -> Answer:
    return box.run(["sh", "-c", script], cwd=cwd, env=ENV, timeout=timeout, limit=limit)


def test_reads_the_tree_and_writes_nothing(tree: Path, home: Path) -> None:
    with toolshed.opener()(Exposure(home=str(home), read=(str(tree),))) as box:
        assert sh(box, "cat file", cwd=str(tree)) == Answer(rc=0, out=b"hello\n")
        r = sh(box, "touch new 2>&1; echo x >> file 2>&1; rm file 2>&1; echo rc=$?", cwd=str(tree))
        assert b"rc=1" in r.out, r
    assert sorted(p.name for p in tree.iterdir()) == ["file", "run.sh"]
    assert (tree / "file").read_text() == "hello\n"


def test_executes_nothing_from_the_tree_or_its_tmp(tree: Path, home: Path) -> None:
    with toolshed.opener()(Exposure(home=str(home), read=(str(tree),))) as box:
        r = sh(
            box,
            f"{tree}/run.sh; echo tree=$?; cp {tree}/run.sh /tmp/r && /tmp/r; echo tmp=$?;"
            " /usr/bin/true; echo usr=$?",
        )
        assert b"ran" not in r.out, r
        assert b"tree=126" in r.out and b"tmp=126" in r.out and b"usr=0" in r.out, r


def test_no_network_not_even_the_hosts_loopback(home: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        with toolshed.opener()(Exposure(home=str(home))) as box:
            links = sh(box, "cat /proc/net/dev").out.decode()
            assert [ln.split(":")[0].strip() for ln in links.splitlines()[2:]] == ["lo"]
            r = box.run(
                [
                    "python3",
                    "-c",
                    f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as e:
    print("refused", e.errno)
""",
                ],
                cwd="/",
                env=ENV,
                timeout=10,
                limit=4096,
            )
            assert r.out.startswith(b"refused"), r
    finally:
        listener.close()


def test_the_users_home_is_empty(home: Path) -> None:
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_ed25519").write_text("SECRET\n")
    with toolshed.opener()(Exposure(home=str(home))) as box:
        assert sh(box, f"ls -A {home}") == Answer(rc=0, out=b"")
        r = sh(box, f"cat {home}/.ssh/id_ed25519 2>&1")
    assert r.rc != 0 and b"SECRET" not in r.out, r


def test_the_servers_descriptors_are_out_of_reach(home: Path) -> None:
    """A tool's child forging the server's answers through /proc/PPID/fd/1."""
    with toolshed.opener()(Exposure(home=str(home))) as box:
        r = sh(box, "echo forged > /proc/$PPID/fd/1 2>/dev/null; echo rc=$?")
        assert r.out == b"rc=2\n" or r.out.endswith(b"rc=1\n"), r
        assert sh(box, "echo still").out == b"still\n"


def test_a_call_past_its_timeout_is_killed(home: Path) -> None:
    with toolshed.opener()(Exposure(home=str(home))) as box:
        t = time.monotonic()
        r = sh(box, "sleep 300 & sleep 300", timeout=1)
        # back before the sleeps would have ended by themselves: the 1 s timeout did it
        assert r.timed_out and time.monotonic() - t < 300
        assert sh(box, "echo next").out == b"next\n"  # the box goes on


def test_output_is_cut_at_the_limit(home: Path) -> None:
    with toolshed.opener()(Exposure(home=str(home))) as box:
        r = sh(box, "yes", limit=1000)
        assert r.truncated and r.out == b"y\n" * 500


def test_the_budget_bounds_every_call_of_the_box(home: Path) -> None:
    with toolshed.opener(budget=2.0)(Exposure(home=str(home))) as box:
        t = time.monotonic()
        first = sh(box, "sleep 300", timeout=600)
        assert first.timed_out or first.rc is None
        with pytest.raises(ToolError, match="budget"):
            sh(box, "echo late")
        # before the sleep or the call's own timeout: the 2 s budget ended it
        assert time.monotonic() - t < 300
        with pytest.raises(ToolError):  # failed once, failed for good
            sh(box, "echo again")


def test_a_set_up_error_is_said(tmp_path: Path, home: Path) -> None:
    missing = str(tmp_path / "gone")
    with (
        pytest.raises(ToolError, match="gone"),
        toolshed.opener()(Exposure(home=str(home), read=(missing,))) as box,
    ):
        sh(box, "true")


def test_a_tool_that_is_not_there(home: Path) -> None:
    with toolshed.opener()(Exposure(home=str(home))) as box:
        r = box.run(["/nonexistent/tool"], cwd="/", env=ENV, timeout=5, limit=10)
        assert r.rc is None and r.out == b""
        assert sh(box, "echo ok").out == b"ok\n"


def test_closing_ends_everything_inside(home: Path) -> None:
    box = toolshed.opener()(Exposure(home=str(home)))
    sh(box, "sleep 300 >/dev/null 2>&1 & echo $!")
    before = set(os.listdir("/proc"))
    box.close()
    deadline = time.monotonic() + 10
    sleepers: list[str] = []
    while time.monotonic() < deadline:
        sleepers = [
            p
            for p in before
            if p.isdigit() and _comm(p) == "sleep" and _cmd(p) == "sleep300" and _inside(p)
        ]
        if not sleepers:
            break
        time.sleep(0.05)
    assert not sleepers, f"left running: {sleepers}\n{_who_keeps(sleepers)}"


def _who_keeps(pids: list[str]) -> str:
    """What keeps a box alive (it failed 2 runs in ~8 of the whole suite, never alone):
    each process in the sleepers' PID namespace and every process outside it holding a
    pipe or socket the box's PID 1 holds too, for the next look."""
    lines = []
    for pid in pids:
        try:
            ns = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        inside = [p for p in os.listdir("/proc") if p.isdigit() and _ns(p) == ns]
        lines += [f"in {ns}: {p} {_cmd(p)!r} {_fds(p)}" for p in inside]
        held = {f for p in inside for f in _fds(p) if f.startswith(("pipe:", "socket:"))}
        for p in (p for p in os.listdir("/proc") if p.isdigit() and _ns(p) != ns):
            shared = held & set(_fds(p))
            if shared:
                lines.append(f"outside: {p} {_cmd(p)!r} holds {sorted(shared)}")
    return "\n".join(lines)


def _ns(pid: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _fds(pid: str) -> list[str]:
    try:
        return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return []


def _inside(pid: str) -> bool:
    """PID lives in another PID namespace than the test's: the box's, not a `sleep 300`
    of the machine's own (one such, of an unrelated job, was this test's one flake)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmd(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b"").decode()
    except OSError:
        return ""


def test_a_tool_cannot_take_the_machines_memory(home: Path) -> None:
    with toolshed.opener()(Exposure(home=str(home))) as box:
        r = box.run(
            ["python3", "-c", "b = bytearray(6 << 30); print('allocated')"],
            cwd="/",
            env=ENV,
            timeout=20,
            limit=4096,
        )
        assert b"allocated" not in r.out and r.rc != 0, r
        assert sh(box, "echo fine").out == b"fine\n"
