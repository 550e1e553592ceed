#!/usr/bin/env python3
"""Start-up cost of a sandbox: the median wall time of `boxyctl run … -- true` (no
network, the public network, the node profile's allowlist) against `python3 -c pass`
measured in the same rounds, interleaved, as ratios with issue #18's targets;
bubblewrap and unshare beside them for scale.

Run as the user who will use boxy (not root): `make bench` or
`.venv/bin/python bench/startup.py [-n 30] [--json]`. With --json the figures are one
JSON list on stdout (bench/table.py) and everything else goes to stderr.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.table import Figure, at_most, emit  # noqa: E402

BIN = Path(sys.executable).parent
REFERENCE = "python3 -c pass"
# figure name, boxyctl run's arguments, the target: at most this many times the reference
RUNS = (
    ("run --net none", ["--net", "none"], 3.0),
    ("run --net public", ["--net", "public"], 3.5),
    ("run -p node", ["-p", "node"], 4.0),
)
BWRAP = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
BWRAP += ["--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"]
BWRAP += ["--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev"]
BWRAP += ["--tmpfs", "/tmp", "true"]


def cases() -> dict[str, list[str]]:
    """Every command measured, by name: the reference first."""
    python3 = shutil.which("python3") or "/usr/bin/python3"
    out = {REFERENCE: [python3, "-c", "pass"]}
    for name, flags, _ in RUNS:
        out[name] = [str(BIN / "boxyctl"), "run", *flags, "--", "true"]
    out["unshare -Urmpf --mount-proc true"] = ["unshare", "-Urmpf", "--mount-proc", "true"]
    if shutil.which("bwrap"):
        out["bwrap --unshare-all … true"] = BWRAP
    return out


def once(argv: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    took = time.perf_counter() - t
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()[-300:]
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {err}")
    return took


def measure(commands: dict[str, list[str]], n: int, cwd: Path) -> dict[str, float]:
    """Median seconds of each command over N rounds; each round runs every command
    once, so a busy moment of the machine falls on all of them alike."""
    for argv in commands.values():  # warm: boxyd started, its templates, the page cache
        once(argv, cwd)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(n):
        for name, argv in commands.items():
            times[name].append(once(argv, cwd))
    return {name: statistics.median(t) for name, t in times.items()}


def figures(medians: dict[str, float]) -> list[Figure]:
    ref = medians[REFERENCE]
    out = []
    for name, _, limit in RUNS:
        ratio, target, met = at_most(medians[name] / ref, limit)
        out.append(Figure("startup", name, medians[name] * 1000, "ms", ratio, target, met))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30, help="rounds (default 30)")
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = ap.parse_args()
    if os.getuid() == 0:
        raise SystemExit("run as the user who will use boxy, not root")
    # a project directory of its own: boxyctl refuses to run in the home directory
    with tempfile.TemporaryDirectory(prefix="boxy-bench-startup-", dir=Path.home()) as d:
        medians = measure(cases(), args.n, Path(d))
    prose = sys.stderr if args.json else sys.stdout
    print(f"median of {args.n} interleaved rounds", file=prose)
    ref = medians[REFERENCE]
    for name, t in medians.items():
        print(f"  {t * 1000:8.1f} ms  {t / ref:5.2f}× {REFERENCE}   {name}", file=prose)
    emit(figures(medians), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
