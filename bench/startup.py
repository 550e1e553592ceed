#!/usr/bin/env python3
"""Start-up cost of a sandbox: median wall time of `boxyctl run --net none -- true`
against bubblewrap and unshare measured in the same run, printed as ratios.

Run as the user who will use boxy (not root): `make bench` or
`.venv/bin/python bench/startup.py [-n 30]`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def measure(argv: list[str], n: int) -> float:
    warm = subprocess.run(argv, capture_output=True)  # daemon start, page cache
    if warm.returncode != 0:
        sys.exit(
            f"{' '.join(argv)}: exit {warm.returncode}: {warm.stderr.decode(errors='replace').strip()}"
        )
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30)
    n = ap.parse_args().n
    cases: dict[str, list[str]] = {
        "boxyctl run --net none -- true": [
            str(BIN / "boxyctl"),
            "run",
            "--net",
            "none",
            "--",
            "true",
        ],
        "python3 -c pass (interpreter start)": [sys.executable, "-I", "-c", "pass"],
        "unshare -Urmpf --mount-proc true": ["unshare", "-Urmpf", "--mount-proc", "true"],
    }
    if shutil.which("bwrap"):
        cases["bwrap --unshare-all --die-with-parent … true"] = [
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "true",
        ]
    results = {name: measure(argv, n) for name, argv in cases.items()}
    ref = results["boxyctl run --net none -- true"]
    print(f"median of {n} runs")
    for name, t in results.items():
        print(f"  {t * 1000:8.1f} ms   boxy/this = {ref / t:5.2f}x   {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
