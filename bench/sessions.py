#!/usr/bin/env python3
"""boxyd's resident memory idle and with 50 detached sessions (the stage-2
template and each session's stage-2 processes counted apart), and how long the
50 take to start. Run as the user who will use boxy: `.venv/bin/python
bench/sessions.py [-n 50]` from a project directory."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def ctl(*args: str) -> str:
    return subprocess.run(
        [str(BIN / "boxyctl"), *args], check=True, capture_output=True, text=True
    ).stdout


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def pss_kib(pid: int) -> int:
    """Proportional set size: forked stage-2 processes share most pages with the
    template, which RSS counts once per process."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def daemon_pid() -> int:
    words = ctl("daemon", "status").split()
    return int(words[words.index("pid") + 1])


def measure(label: str) -> None:
    pid = daemon_pid()
    kids = children(pid)
    template = [k for k in kids if "boxyd.stage2" in Path(f"/proc/{k}/cmdline").read_text()]
    runs = [g for t in template for g in children(t)]
    print(
        f"  {label:<22} boxyd {rss_kib(pid) / 1024:6.1f} MiB   template "
        f"{sum(rss_kib(t) for t in template) / 1024:5.1f} MiB   sessions' stage 2: RSS "
        f"{sum(map(rss_kib, runs)) / 1024:6.1f} MiB, PSS {sum(map(pss_kib, runs)) / 1024:6.1f} MiB"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    n = ap.parse_args().n
    ctl("daemon", "restart", "--force")
    ctl("run", "--net", "none", "--", "true")  # the template is up
    time.sleep(1)
    print(f"resident memory (VmRSS), {n} sessions")
    measure("idle")
    t = time.perf_counter()
    ids = [ctl("run", "-d", "--net", "none", "--", "sleep", "600").strip() for _ in range(n)]
    took = time.perf_counter() - t
    running = [ln for ln in ctl("ps").splitlines()[1:] if ln.split()[0] in ids]
    assert len(running) == n, f"{len(running)} of {n} running"
    measure(f"{n} sessions running")
    print(f"  {n} detached runs started in {took:.2f} s ({took / n * 1000:.0f} ms each)")
    for sid in ids:
        ctl("stop", "-k", sid)
    time.sleep(1)
    measure("after they ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
