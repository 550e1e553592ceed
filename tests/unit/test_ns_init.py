"""scopes._is_ns_init: kill_frozen kills a PID namespace's init last, so that the
kernel's kill of the rest at its death takes none before boxyd's own SIGKILL did
(CI: a run's sleep reaped before its kill, so uncounted)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from boxyd.daemon.scopes import _is_ns_init


def _child_of(pid: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        words = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if words:
            return int(words[0])
        time.sleep(0.01)
    raise AssertionError(f"{pid} forked nothing")


def test_the_init_of_a_pid_namespace_is_told_from_the_rest() -> None:
    proc = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", "sleep", "30"]
    )
    try:
        init = _child_of(proc.pid)
        assert _is_ns_init(init)
        assert not _is_ns_init(proc.pid)  # unshare itself: in the outer namespace
        assert not _is_ns_init(os.getpid())
        assert not _is_ns_init(1 << 30)  # no such process
    finally:
        proc.kill()
        proc.wait()
