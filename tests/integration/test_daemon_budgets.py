"""The daemon cannot be stalled or filled by a payload: FIFOs where git expects its
files, a flood of findings, a quarantine that would fill the disk, and other
sessions' slow checks (DESIGN: Daemon budgets). Only generous bounds are asserted:
the figures are bench/walk.py's."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxy.outcome import MAX_LINES
from boxyd.daemon.pools import CHECK_WORKERS
from tests.conftest import BIN, Boxy, User
from tests.integration.clients import sessions_running

pytestmark = pytest.mark.sandbox


def err(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stderr.decode(errors="replace")


def ctl(user: User, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], timeout=timeout)


def git_init(user: User, where: Path) -> None:
    r = user.run(["git", "init", "-q", str(where)])
    assert r.returncode == 0, err(r)


def full_list(text: str, what: str) -> Path:
    """The file the last line of a bounded list names."""
    m = re.search(rf"more {what} \(([\d,]+) in all; the full list is in (\S+)\)", text)
    assert m, text[-2000:]
    return Path(m.group(2))


FIFOS = (
    "i=0; while [ $i -lt 300 ]; do d=vendor/x$i/.git; mkdir -p $d/objects $d/refs; "
    "mkfifo $d/HEAD; i=$((i+1)); done; echo made"
)


def test_fifo_heads_are_reported_moved_and_the_host_git_returns(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """300 nested repositories with a FIFO as HEAD: each cost the host-git check 5 s
    and made the user's `git status` at the root hang forever."""
    git_init(user, workdir)
    r = boxy.sh(FIFOS, timeout=120)
    assert r.returncode == 0 and r.stdout == b"made\n", err(r)
    # git was asked nowhere it would block (300 x 5 s before), told by what the run
    # says, not by its time: no ask timed out, no budget spent (nor any other note
    # beside the 300 moves in the full list below)
    assert "could not be asked" not in err(r) and "budget" not in err(r), err(r)[-3000:]
    lines = [ln for ln in err(r).splitlines() if "git guard" in ln or ": … and " in ln]
    assert len(lines) == MAX_LINES, err(r)[-3000:]
    assert "not a regular file where git expects a HEAD" in lines[0], lines[0]
    listed = full_list(err(r), "findings").read_text().splitlines()
    # every HEAD moved and said; under load the live guard may take one while the run
    # goes on and say it once more at the end (CI run 26: 301 lines): every line a move
    moved = [re.search(r"moved (vendor/x\d+/\.git/HEAD) to ", ln) for ln in listed]
    odd = [ln for ln, m in zip(listed, moved, strict=True) if m is None]
    assert not odd, odd[:3]
    heads = sorted({m.group(1) for m in moved if m is not None})
    assert heads == sorted(f"vendor/x{i}/.git/HEAD" for i in range(300)), heads[:3]
    assert not any(os.path.lexists(workdir / f"vendor/x{i}/.git/HEAD") for i in range(300))
    status = user.run(["git", "-C", str(workdir), "status", "--porcelain"], timeout=30)
    assert status.returncode == 0, err(status)


def test_a_flood_of_findings_still_ends_with_the_status_and_show_works(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    """100,000 long-named hooks made the Run reply 45.9 MB, over the wire's 16 MiB: the
    client never returned, and `show` hung on the record. 40,000 here (~18 MB: still
    over it, in less than half the time)."""
    git_init(user, workdir)
    # in a new repository: the work directory's own hooks directory is pinned read-only
    plant = (
        "import os\nos.makedirs('sub/.git/hooks')\nfor i in range(40_000):\n"
        "    os.mknod(f'sub/.git/hooks/{i:06d}' + 'h' * 200)\nraise SystemExit(7)\n"
    )
    r = boxy.run("--net", "none", cmd=["python3", "-c", plant], timeout=300)
    assert r.returncode == 7, err(r)[-3000:]
    text = err(r)
    hooks = [ln for ln in text.splitlines() if "a new or changed git hook" in ln]
    assert len(hooks) == MAX_LINES - 1, len(hooks)
    kept = full_list(text, "findings")
    listed = kept.read_text().splitlines()
    assert sum("a new or changed git hook" in ln for ln in listed) == 40_000
    # on a loaded machine the checks' budget may run out after the moves: said, once
    assert all("git hook" in ln or "time budget is spent" in ln for ln in listed)
    assert kept.stat().st_mode & 0o777 == 0o600
    sid = kept.parent.name
    shown = ctl(user, "show", sid)
    assert shown.returncode == 0, err(shown)
    # the full list's own count (40,001 when the budget line is one of them)
    assert f"{len(listed):,} in all" in shown.stdout.decode(), shown.stdout.decode()[-2000:]


@pytest.fixture
def tmpfs_workdir(user: User, workdir: Path) -> Iterator[Path]:
    """The work directory on a tmpfs of its own, the quarantine in the user's
    ~/.local/state: every move out of it is a copy across filesystems."""
    d = workdir / "fs"
    d.mkdir()
    subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size=2g,mode=0755,uid={user.uid},gid={user.gid}",
            "tmpfs",
            str(d),
        ],
        check=True,
    )
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=True)


def test_a_sparse_hook_does_not_fill_the_quarantine(user: User, tmpfs_workdir: Path) -> None:
    """A 1 GiB hook of holes became 1.1 GiB kept for 90 days; a dense one past the
    run's budget leaves only its metadata and hash."""
    git_init(user, tmpfs_workdir)
    # made aside and moved in whole: the live guard's check may come at any moment
    script = (
        "mkdir stage; cd stage; printf '#!/bin/sh\\n' > pre-commit; "
        "truncate -s 1G pre-commit; head -c 70M /dev/urandom > post-checkout; "
        "cd ..; mkdir -p sub/.git; mv stage sub/.git/hooks; "
        "sha256sum sub/.git/hooks/post-checkout | cut -d' ' -f1"
    )
    r = Boxy(user, tmpfs_workdir).sh(script, timeout=300)
    assert r.returncode == 0, err(r)
    digest = r.stdout.decode().strip()
    sparse = re.search(r"moved sub/\.git/hooks/pre-commit to (\S+): a new", err(r))
    assert sparse, err(r)
    st = os.stat(sparse.group(1))
    assert st.st_size == 1 << 30 and st.st_blocks * 512 < 1 << 20, st
    dense = next(ln for ln in err(r).splitlines() if "sub/.git/hooks/post-checkout" in ln)
    assert "over the quarantine's budget" in dense and f"sha256 {digest}" in dense, dense
    assert dense.split(" to ", 1)[1].split(":", 1)[0].endswith("post-checkout.removed"), dense


def test_a_start_does_not_wait_behind_other_sessions_checks(user: User, workdir: Path) -> None:
    """As many sessions as the checks have workers, each check lasting seconds (trees of
    257 places where git may find a repository: the host's git is asked in each), hold
    every worker of the checks; another session still starts. Its start-up is timed to
    its payload's first line: its own checks afterwards may wait. (The sample asserts
    they were all still checking.)"""
    trees = [workdir / f"t{i}" for i in range(2)]
    for t in trees:
        git_init(user, t)
        for j in range(257):
            (t / f"d{j}" / ".git").mkdir(parents=True)
        user.chown(t)
    small = workdir / "small"
    small.mkdir()
    user.chown(small)

    def start_up(overlapped: list[int] | None = None) -> float:
        """Seconds to the payload's first line; OVERLAPPED: the sessions running then."""
        argv = user.cmd([str(BIN / "boxyctl"), "run", "--net", "none", "--", "echo", "ready"])
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=small, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        took = time.monotonic() - t0
        if overlapped is not None:
            overlapped.append(sessions_running(user))
        proc.stdout.close()
        proc.wait(timeout=300)
        assert line == b"ready\n"
        return took

    idle = min(start_up() for _ in range(3))
    flags = [a for t in trees[1:] for a in ("--rw", str(t))]
    for _ in range(CHECK_WORKERS):
        r = ctl(user, "run", "-d", "--net", "none", "-w", str(trees[0]), *flags, "--", "true")
        assert r.returncode == 0, err(r)
    try:
        time.sleep(2)  # their payloads are done: all are in their checks
        running: list[int] = []
        during = start_up(running)
    finally:
        deadline = time.monotonic() + 240
        while sessions_running(user) and time.monotonic() < deadline:
            time.sleep(1)
    # the others, and the sample itself
    assert running[0] >= CHECK_WORKERS, (
        f"the others' checks were over before the sample ({during:.2f}s)"
    )
    # a shared pool made it wait for a whole budget (30 s) at least; 2 loaded cores
    assert during < idle + 10, (during, idle)
