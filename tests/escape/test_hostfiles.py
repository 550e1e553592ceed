"""Files boxyd writes on the host for a run (--audit-log here; --net-log and --pcap go
through the same opener) when the payload owns the directory they are in. The verdict is
taken on the host: what boxyd wrote where, and whether it still answers."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import describe

pytestmark = pytest.mark.sandbox


def _answers(boxy: Boxy) -> None:
    """Another run goes through (a daemon frozen by the FIFO: TimeoutExpired)."""
    r = boxy.sh("true", timeout=30)
    assert r.returncode == 0, describe(r)


def test_fifo_swapped_in_during_the_run_does_not_freeze_the_daemon(boxy: Boxy) -> None:
    r = boxy.sh(
        "rm -f audit.jsonl && mkfifo audit.jsonl && echo TRIED fifo",
        "--audit-log",
        "audit.jsonl",
        timeout=60,
    )
    assert r.returncode == 0 and b"TRIED fifo" in r.stdout, describe(r)
    _answers(boxy)  # the daemon still answers everyone
    err = r.stderr.decode()
    assert "audit.jsonl: removed or replaced during the run" in err, describe(r)
    kept = Path(err.split("the records are in ", 1)[1].split()[0])
    records = [json.loads(line) for line in kept.read_text().splitlines()]
    assert any(rec["layer"] == "seccomp" for rec in records)  # the trail is not lost


def test_fifo_at_the_path_is_refused_before_anything_starts(boxy: Boxy, user: User) -> None:
    fifo = boxy.workdir / "audit.jsonl"
    user.run(["mkfifo", str(fifo)])
    r = boxy.sh("echo ESCAPED ran", "--audit-log", "audit.jsonl", timeout=30)
    assert r.returncode == 2 and b"ESCAPED" not in r.stdout, describe(r)
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "is a FIFO" in lines[0], describe(r)
    _answers(boxy)


def test_log_directory_swapped_for_a_symlink(boxy: Boxy, user: User) -> None:
    """`rmdir logs && ln -s ~/.ssh logs` in one run; the same flag in the next one."""
    target = user.home / f".boxy-escape-ssh-{uuid.uuid4().hex[:8]}"
    user.run(["mkdir", "-m", "700", str(target)])
    (boxy.workdir / "logs").mkdir()
    user.chown(boxy.workdir / "logs")
    try:
        r1 = boxy.sh(
            f"rm -f logs/audit.jsonl; rmdir logs && ln -s {target} logs && echo TRIED swap",
            "--audit-log",
            "logs/audit.jsonl",
        )
        assert r1.returncode == 0 and b"TRIED swap" in r1.stdout, describe(r1)
        r2 = boxy.sh("echo TRIED second", "--audit-log", "logs/audit.jsonl")
        assert list(target.iterdir()) == [], (
            f"ESCAPED: boxyd wrote into the symlink's target\n{describe(r1)}{describe(r2)}"
        )
        assert r2.returncode == 2 and b"TRIED second" not in r2.stdout, describe(r2)
        assert "logs is a symlink inside a tree the sandbox can write" in r2.stderr.decode()
    finally:
        user.run(["rm", "-rf", str(target)])


def test_hard_link_to_another_file_is_refused(boxy: Boxy, user: User) -> None:
    make = boxy.workdir / "Makefile"
    make.write_text("all:\n\ttrue\n")
    user.chown(make)
    r1 = boxy.sh(
        "rm -f audit.jsonl && ln Makefile audit.jsonl && echo TRIED link",
        "--audit-log",
        "audit.jsonl",
    )
    assert b"TRIED link" in r1.stdout, describe(r1)
    r2 = boxy.sh("echo TRIED second", "--audit-log", "audit.jsonl")
    assert make.read_text() == "all:\n\ttrue\n", "ESCAPED: boxyd appended to the linked file"
    assert r2.returncode == 2 and "hard links" in r2.stderr.decode(), describe(r2)
