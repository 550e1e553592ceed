#!/usr/bin/env python3
"""What a payload's attack on the daemon's budgets costs an unrelated session.

The attack of the issue: three `run -d` sessions each make FIFOs as the HEAD of 300
nested repositories (each used to cost the host-git check 5 s, in asyncio's default
executor, which also built every run's spec). Meanwhile, and idle, another session
in another directory is started; its start-up is timed to its payload's first line
(`echo ready`), so its own checks afterwards are not counted.

Run as the user who will use boxy (not root): `.venv/bin/python bench/budgets.py`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
FIFOS = (
    "i=0; while [ $i -lt 300 ]; do d=vendor/x$i/.git; mkdir -p $d/objects $d/refs; "
    "mkfifo $d/HEAD; i=$((i+1)); done"
)


def start_up(workdir: Path) -> float:
    """Seconds from `boxyctl run` to the payload's first line."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "boxyctl"), "run", "--net", "none", "--", "echo", "ready"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    took = time.perf_counter() - t
    proc.stdout.close()
    proc.wait()
    if line != b"ready\n":
        raise SystemExit(f"the small run did not start: {line!r}")
    return took


def running() -> int:
    words = subprocess.run(
        [str(BIN / "boxyctl"), "daemon", "status"], capture_output=True, text=True
    ).stdout.split()
    return int(words[words.index("sessions") + 2]) if "sessions" in words else 0


def attack(base: Path, n: int) -> float:
    """N detached sessions planting the FIFOs, each in a repository of its own; returns
    when they were started."""
    for i in range(n):
        d = base / f"attack{i}"
        d.mkdir()
        subprocess.run(["git", "init", "-q", str(d)], check=True)
        subprocess.run(
            [str(BIN / "boxyctl"), "run", "-d", "--net", "none", "--", "sh", "-c", FIFOS],
            cwd=d,
            check=True,
            capture_output=True,
        )
    return time.monotonic()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10, help="samples")
    ap.add_argument("--sessions", type=int, default=3, help="attacking sessions")
    args = ap.parse_args()
    if os.getuid() == 0:
        sys.exit("run as the user who will use boxy, not root")
    base = Path(tempfile.mkdtemp(prefix="boxy-bench-budgets-", dir=Path.home()))
    try:
        small = base / "small"
        small.mkdir()
        start_up(small)  # daemon start, page cache
        idle = [start_up(small) for _ in range(args.n)]
        t0 = attack(base, args.sessions)
        during, overlapped = [], []
        while len(during) < args.n and running() > 0:
            during.append(start_up(small))
            overlapped.append(running())
        while running() > 0:
            time.sleep(0.2)
        ended = time.monotonic() - t0
        print(
            f"idle daemon: another session's start-up  median {statistics.median(idle) * 1000:7.1f} ms,"
            f" max {max(idle) * 1000:7.1f} ms"
        )
        if during:
            print(
                f"{args.sessions} sessions planting 300 FIFO HEADs each: median "
                f"{statistics.median(during) * 1000:7.1f} ms, max {max(during) * 1000:7.1f} ms "
                f"({len(during)} samples, {statistics.median(overlapped):.0f} sessions live) "
                f"= {statistics.median(during) / statistics.median(idle):4.2f}x idle"
            )
        print(f"the attacking sessions all ended {ended:5.1f} s after they were started")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
