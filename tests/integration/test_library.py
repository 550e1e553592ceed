"""The Python library (`import boxy`) driving real sandboxes, as the test user: a
script of the test's runs in that user's Python, talks to that user's boxyd, and
prints what it saw as one JSON line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, cast

import pytest

from tests.conftest import BIN, User

pytestmark = pytest.mark.sandbox


def lib(
    user: User, workdir: Path, body: str, timeout: float = 120, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """BODY (Python, with boxy imported and `out`, a dict, to fill) as USER in WORKDIR."""
    script = "import json, sys, time\nimport boxy\nout = {}\n"
    script += textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    r = user.run([str(BIN / "python3"), "-c", script], cwd=workdir, timeout=timeout, extra_env=env)
    assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())
    return cast(dict[str, Any], json.loads(r.stdout.decode().splitlines()[-1]))


def test_run_gives_the_exit_status_the_reason_and_the_output(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        r = boxy.run(["sh", "-c", "echo out:$PWD; echo err >&2; exit 3"], net="none",
                     stdout=boxy.PIPE, stderr=boxy.PIPE)
        out.update(status=r.exit_status, reason=r.reason.value, stdout=r.stdout.decode(),
                   stderr=r.stderr.decode(), id=r.id)
        k = boxy.run(["sh", "-c", "kill -9 $$"], net="none")
        out.update(kstatus=k.exit_status, kreason=k.reason.value)
        t = boxy.run(["sleep", "30"], net="none", timeout="1s")
        out.update(treason=t.reason.value)
        i = boxy.run(["cat"], net="none", stdin=b"fed in\\n", stdout=boxy.PIPE)
        out.update(fed=i.stdout.decode())
        """,
    )
    assert out["status"] == 3 and out["reason"] == "exit"
    assert out["stdout"] == f"out:{workdir}\n" and out["stderr"] == "err\n"
    assert out["kstatus"] == 137 and out["kreason"] == "signal"
    assert out["treason"] == "timeout"
    assert out["fed"] == "fed in\n"


def test_bad_keywords_and_refused_combinations_raise_before_anything_starts(
    user: User, workdir: Path
) -> None:
    out = lib(
        user,
        workdir,
        """
        before = len(boxy.sessions(all=True))
        caught = []
        for kw in ({"bogus": 1}, {"detach": True}):
            try:
                boxy.run(["true"], **kw)
            except TypeError as e:
                caught.append(["TypeError", str(e)])
        for kw in ({"net": "none", "allow_hosts": ["example.com"]}, {"memory": "lots"},
                   {"pcap_max": "1MiB"}, {"net": "everywhere"}, {"pids": -1}):
            try:
                boxy.start(["true"], **kw)
            except boxy.UsageError as e:
                caught.append(["UsageError", str(e)])
        out.update(caught=caught, same=len(boxy.sessions(all=True)) == before)
        """,
    )
    assert out["same"], "a session started"
    kinds = [k for k, _ in out["caught"]]
    assert kinds == ["TypeError"] * 2 + ["UsageError"] * 5, out["caught"]
    messages = [m for _, m in out["caught"]]
    assert "unexpected keyword argument 'bogus'" in messages[0]
    # the command line's own messages
    assert messages[2] == "--allow-host: cannot be combined with --net none (it implies allowlist)"
    assert messages[3].startswith("--memory: 'lots' is not a size")
    assert messages[4] == "--pcap-max: needs --pcap"
    assert messages[5].startswith("--net: 'everywhere'")
    assert messages[6].startswith("--pids: '-1'")


def test_start_then_sessions_show_watch_and_stop(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        s = boxy.start(["sh", "-c", "echo started; sleep 60"], net="none")
        out["id"] = s.id
        out["listed"] = [i.id for i in boxy.sessions()]
        info = boxy.show(s.id)
        out["state"] = info.state.value
        out["argv"] = info.argv
        kinds = []
        watching = boxy.watch(s.id)
        first = next(watching)
        kinds.append(type(first).__name__)
        stopped = boxy.stop(s.id)
        for item in watching:
            kinds.append(type(item).__name__)
        out["kinds"] = kinds
        out["last"] = item.session.state.value
        out["stopped"] = [stopped.state.value, stopped.outcome.reason.value]
        out["waited"] = s.wait(timeout=10).reason.value
        """,
    )
    assert out["id"] in out["listed"]
    assert out["state"] == "running" and out["argv"] == ["sh", "-c", "echo started; sleep 60"]
    assert out["kinds"][0] == "Snapshot" and out["kinds"][-1] == "Snapshot"
    assert "Exited" in out["kinds"], out["kinds"]
    assert out["last"] == "killed"
    assert out["stopped"] == ["killed", "signal"] and out["waited"] == "signal"


def test_a_pty_follows_resize_and_reads_empty_after_the_exit(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        def until(pty, text):
            seen = b""
            deadline = time.monotonic() + 30
            while text.encode() not in seen:
                seen += pty.read(timeout=max(0.1, deadline - time.monotonic()))
            return seen.decode()

        pty = boxy.spawn_pty(["sh"], cols=91, rows=27, net="none")
        out["id"] = pty.id
        pty.write(b"stty size; tty\\n")
        out["first"] = until(pty, "/dev/pts/")
        pty.resize(cols=120, rows=40)
        time.sleep(0.2)
        pty.write(b"stty size\\n")
        out["second"] = until(pty, "40 120")
        pty.write(b"exit 5\\n")
        out["status"] = pty.wait(timeout=30)
        rest = b""
        while chunk := pty.read(timeout=10):
            rest += chunk
        out["after"] = pty.read(timeout=1).decode()
        pty.close()
        """,
    )
    assert "27 91" in out["first"] and "/dev/pts/" in out["first"]
    assert "40 120" in out["second"]
    assert out["status"] == 5
    assert out["after"] == ""


def test_detach_and_attach_through_the_library(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        s = boxy.start(["sh", "-c", "echo before; read x; echo got:$x; exit 4"], net="none")
        time.sleep(0.5)
        pty = s.attach(cols=100, rows=30)
        seen = b""
        deadline = time.monotonic() + 20
        while b"before" not in seen and time.monotonic() < deadline:
            seen += pty.read(timeout=20)
        pty.write(b"hello\\r")
        while b"got:hello" not in seen and time.monotonic() < deadline:
            seen += pty.read(timeout=20)
        out["seen"] = seen.decode()
        out["status"] = pty.wait(timeout=20)
        pty.close()
        """,
    )
    assert "before" in out["seen"] and "got:hello" in out["seen"]
    assert out["status"] == 4


def test_an_unknown_session_is_a_typed_error(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        got = []
        for call in (boxy.show, boxy.stop, lambda i: list(boxy.watch(i))):
            try:
                call("deadbeef")
            except boxy.NoSuchSession as e:
                got.append([type(e).__name__, e.sid, e.exit_status])
        out["got"] = got
        """,
    )
    assert out["got"] == [["NoSuchSession", "deadbeef", 1]] * 3


def test_the_asyncio_variant_runs_a_pty(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        import asyncio
        import boxy.aio

        async def main():
            pty = await boxy.aio.spawn_pty(["sh"], cols=70, rows=20, net="none")
            await pty.write(b"stty size; exit 6\\n")
            seen = b""
            while chunk := await pty.read(timeout=30):
                seen += chunk
            out["seen"] = seen.decode()
            out["status"] = await pty.wait(timeout=30)
            pty.close()
            r = await boxy.aio.run(["sh", "-c", "echo aio"], net="none", stdout=boxy.PIPE)
            out["run"] = r.stdout.decode()
            try:
                await boxy.aio.spawn_pty(["sh"], cols=70, rows=20, nope=1)
            except TypeError as e:
                out["refused"] = str(e)

        asyncio.run(main())
        """,
    )
    assert "20 70" in out["seen"] and out["status"] == 6
    assert out["run"] == "aio\n"
    assert "unexpected keyword argument 'nope'" in out["refused"]


def test_a_profiles_secret_comes_from_the_callers_environment(user: User, workdir: Path) -> None:
    profile = workdir / "secretive.yaml"
    profile.write_text("net: none\nenv_secrets: [BOXY_LIB_TOKEN]\n")
    user.chown(profile)
    out = lib(
        user,
        workdir,
        """
        r = boxy.run(["sh", "-c", 'printf %s "$BOXY_LIB_TOKEN"'], profile="secretive.yaml",
                     stdout=boxy.PIPE)
        out.update(status=r.exit_status, stdout=r.stdout.decode())
        """,
        env={"BOXY_LIB_TOKEN": "lib-s3cret"},
    )
    assert out == {"status": 0, "stdout": "lib-s3cret"}


def test_a_pty_detached_runs_on_and_is_taken_back(user: User, workdir: Path) -> None:
    out = lib(
        user,
        workdir,
        """
        pty = boxy.spawn_pty(["sh", "-c", "read x; echo got:$x; exit 9"], cols=80, rows=24,
                             net="none")
        sid = pty.id
        pty.detach()
        time.sleep(0.3)
        out["state"] = boxy.show(sid).state.value
        back = boxy.attach(sid, cols=80, rows=24)
        back.write(b"again\\r")
        out["status"] = back.wait(timeout=20)
        back.close()
        """,
    )
    assert out == {"state": "running", "status": 9}
