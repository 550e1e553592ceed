"""Nested and split daemons (issue 33 §2): boxyctl inside a sandbox started a second
boxyd there that died, and an XDG_RUNTIME_DIR that does not exist was made and a
second boxyd started in it whose sessions `ps` never showed. Both are one line, exit 2,
before anything is made or started (boxy/client.py connect, boxy/paths.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boxy import client, paths
from boxy.errors import UsageError
from boxyd.plan import mountplan
from boxyd.plan.ops import File
from tests.unit.test_mountplan import _spec


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What connect would have started: nothing, or the test fails."""
    started: list[str] = []
    monkeypatch.setattr(client, "_start_daemon", lambda: started.append("boxyd"))
    return started


def test_inside_a_sandbox_no_daemon_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_start: list[str]
) -> None:
    mark = tmp_path / "container-manager"
    mark.write_text("boxy\n")
    monkeypatch.setattr(paths, "SANDBOX_MARK", str(mark))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    with pytest.raises(UsageError) as e:
        client.connect()
    assert str(e.value) == (
        "already inside a boxy sandbox: boxyctl talks to your boxyd from outside it (run it there)"
    )
    assert e.value.exit_status == 2 and no_start == []
    assert not (tmp_path / "run").exists()
    # another container manager's mark (podman, a toolbox) is not boxy's
    mark.write_text("podman\n")
    assert not paths.inside_sandbox()


def test_a_runtime_dir_that_does_not_exist_is_refused_not_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_start: list[str]
) -> None:
    monkeypatch.setattr(paths, "SANDBOX_MARK", str(tmp_path / "absent"))
    gone = tmp_path / "no/such/run"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(gone))
    with pytest.raises(UsageError) as e:
        client.connect()
    assert str(e.value) == (
        f"XDG_RUNTIME_DIR={gone}: no such directory (your login makes it, as /run/user/"
        f"{os.getuid()}); boxy would start a second boxyd there, apart from yours: "
        "unset it or set it to your own"
    )
    assert not (tmp_path / "no").exists() and no_start == []


def test_every_sandbox_carries_the_mark_and_may_read_it() -> None:
    plan = mountplan.build(_spec(), seccomp_bpf=b"", protections={}, ctty=False)
    marks = [op for op in plan.ops if isinstance(op, File) and op.dst == paths.SANDBOX_MARK]
    assert [m.content for m in marks] == ["boxy\n"]
    assert ("/run/host", "ro") in [(r.path, r.access) for r in plan.landlock]
