"""A parser of what the payload wrote that never returns holds nobody but its own run
(issue #30 §2; docs/design.md, "Nothing the payload wrote is parsed in boxyd's
process"): a real boxyd whose walk template's parse children loop forever on a marked
file (tests/harness/hangwalk.py, named by BOXY_WALK_MODULE). While one run's parse
hangs, another session starts within a few times its idle time, and a running session's
live guard still covers a credential the host saves; the run with the marked file
starts once the parse's budget is spent, with the file covered, and says why."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, User

pytestmark = pytest.mark.sandbox

MARKER = "BOXY-PARSE-NEVER-RETURNS"
NET = ["--net", "none"]


@pytest.fixture
def hanging_daemon(user: User) -> Iterator[dict[str, str]]:
    """A boxyd of this test's own (a private runtime directory) with the hanging
    walk template."""
    runtime = user.runtime / f"parse-{uuid.uuid4().hex[:8]}"
    runtime.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(runtime, user.uid, user.gid)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    daemon = subprocess.Popen(
        user.cmd(
            [str(BIN / "python3"), "-m", "boxyd"],
            {**env, "BOXY_WALK_MODULE": "tests.harness.hangwalk"},
        ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd="/",
    )
    try:
        sock = runtime / "boxy" / "boxyd.sock"
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert daemon.poll() is None and time.monotonic() < deadline, daemon.stderr
            time.sleep(0.02)
        yield env
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(runtime, ignore_errors=True)


def project(user: User, base: Path, name: str) -> Path:
    d = base / name
    d.mkdir()
    user.chown(d)
    return d


def run(user: User, where: Path, env: dict[str, str], *cmd: str) -> tuple[float, bytes]:
    t = time.monotonic()
    r = user.run([str(BIN / "boxyctl"), "run", *NET, "--", *cmd], cwd=where, extra_env=env)
    assert r.returncode == 0, r.stderr
    return time.monotonic() - t, r.stdout


def start(user: User, where: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        user.cmd([str(BIN / "boxyctl"), "run", *args], env),
        cwd=where,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


GUARDED = (
    "i=0; while [ ! -e sub/.env ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
    "sleep 0.5; echo READ; cat sub/.env; echo END"
)


def test_a_parse_that_never_returns_holds_only_its_own_run(
    user: User, workdir: Path, hanging_daemon: dict[str, str]
) -> None:
    env = hanging_daemon
    calm = project(user, workdir, "calm")
    hostile = project(user, workdir, "hostile")
    (hostile / ".npmrc").write_text(f"//registry.example/:_authToken={MARKER}\n")
    user.chown(hostile)
    guarded = project(user, workdir, "guarded")
    (guarded / "sub").mkdir()
    user.chown(guarded)

    run(user, calm, env, "true")  # the templates and spares warm
    idle = statistics.median(run(user, calm, env, "true")[0] for _ in range(5))

    watcher = start(user, guarded, env, *NET, "--", "sh", "-c", GUARDED)
    time.sleep(1.0)  # its live guard is up
    t0 = time.monotonic()
    stuck = start(user, hostile, env, *NET, "-v", "--", "cat", ".npmrc")
    time.sleep(0.3)  # its walk is in the parse that never returns
    during = [run(user, calm, env, "true")[0] for _ in range(3)]
    secret = guarded / "sub" / ".env"
    secret.write_text("API_KEY=boxy-live-canary\n")  # the host saves a credential
    user.chown(secret)
    assert time.monotonic() - t0 < 2.0, "the other runs took the hang's whole budget"
    out, err = stuck.communicate(timeout=60)
    took = time.monotonic() - t0
    w_out, w_err = watcher.communicate(timeout=60)

    # another session's start: not held by the hang (the 1.5x is a figure to
    # measure, not a timed test on a shared machine: a stall would be the 2 s budget)
    assert statistics.median(during) <= 4 * idle, (idle, during)
    # the live guard covered the new credential meanwhile
    assert watcher.returncode == 0 and b"READ" in w_out, w_err
    assert b"boxy-live-canary" not in w_out, w_out
    # the run with the hostile file waited for its own budget only, then ran covered
    assert stuck.returncode == 0, err
    assert took >= 1.5, f"the parse did not hang ({took:.2f}s): the injection did not work"
    assert MARKER.encode() not in out, out
    assert b"not judged" in err and b"ran over" in err, err
