#!/usr/bin/env python3
"""The main job: `npm ci` of a real project (express, typescript, lodash and their
dependencies, about 70 packages) outside the sandbox with a warm cache, against
`boxyctl run --profile node -- npm ci` with its project cache cold and warm, in the
same run (outside and warm interleaved). Leaves the machine only for the registry npm
is configured with.

Run as the user who will use boxy (not root): `.venv/bin/python bench/npm.py [-n 3]`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import INFORMATION, Figure, at_most, emit  # noqa: E402
from boxy import caches  # noqa: E402
from boxyd.net.ranges import classify  # noqa: E402

DEPS = {"express": "^4", "typescript": "^5", "lodash": "^4"}


def registry_flags_for(hosts: list[str]) -> list[str]:
    """--allow-cidr for each registry address in a special-purpose range (as the tests do)."""
    flags: list[str] = []
    for host in hosts:
        for info in socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM):
            addr = ipaddress.ip_address(info[4][0].split("%")[0])
            flag = f"{addr}/{32 if addr.version == 4 else 128}"
            if classify(str(addr)) is not None and flag not in flags:
                flags += ["--allow-cidr", flag]
    return flags


def registry_flags() -> list[str]:
    url = subprocess.run(
        ["npm", "config", "get", "registry"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return registry_flags_for([url.split("://", 1)[-1].split("/", 1)[0]])


Fresh = str | Callable[[], None]  # what an install makes, removed first; or how to undo it


def timed(argv: list[str], cwd: Path, fresh: Fresh = "node_modules") -> float:
    """Wall time of ARGV in CWD, with what it installs (FRESH) removed first."""
    if callable(fresh):
        fresh()
    else:
        shutil.rmtree(cwd / fresh, ignore_errors=True)
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=cwd, capture_output=True)
    if r.returncode != 0:
        sys.exit(
            f"{' '.join(argv)}: exit {r.returncode}\n{r.stderr.decode(errors='replace')[-2000:]}"
        )
    return time.perf_counter() - t


def compare(
    what: str,
    outside_argv: list[str],
    boxy_argv: list[str],
    work: Path,
    profile: str,
    n: int,
    fresh: Fresh,
    bench: str = "main job",
    outside_at: tuple[Path, Fresh] | None = None,
    target: float | None = 1.05,
) -> Figure:
    """Boxy with its project cache cold; then outside (warm host cache) and boxy warm,
    interleaved round by round: the machine's load drifts (other jobs, the writeback
    of the cold runs), and a ratio of two medians taken minutes apart measures it.
    OUTSIDE_AT: the outside runs' own project and reset (default: WORK's, FRESH).
    TARGET None: the figure is information, not a target."""
    out_cwd, out_fresh = outside_at or (work, fresh)
    cache = caches.project_dir(None, profile, os.path.realpath(work))
    cold = []
    for _ in range(n):
        shutil.rmtree(cache, ignore_errors=True)
        cold.append(timed(boxy_argv, work, fresh))
    pairs = [
        (timed(outside_argv, out_cwd, out_fresh), timed(boxy_argv, work, fresh)) for _ in range(n)
    ]
    outside = statistics.median(o for o, _ in pairs)
    warm = statistics.median(b for _, b in pairs)
    say = _say
    say(f"{what}, median of {n}")
    say(f"  outside the sandbox, warm cache     {outside:6.2f} s  (reference)")
    say(
        f"  boxy --profile {profile}, cold cache {statistics.median(cold):6.2f} s  "
        f"{statistics.median(cold) / outside:5.2f}x"
    )
    paired = statistics.median(b / o for o, b in pairs)
    say(
        f"  boxy --profile {profile}, warm cache {warm:6.2f} s  {warm / outside:5.2f}x  "
        f"(paired per round: {paired:.2f}x)"
    )
    shutil.rmtree(cache, ignore_errors=True)
    # the paired ratio: each round's boxy run against the outside run next to it
    if target is None:
        return Figure(bench, f"warm {what}", warm, "s", paired, INFORMATION, True)
    return Figure(bench, f"warm {what}", warm, "s", *at_most(paired, target))


def _say(line: str) -> None:
    print(line, file=sys.stderr if JSON else sys.stdout)


JSON: list[bool] = []  # --json: the prose goes to stderr


def start(name: str) -> tuple[int, Path, bool]:
    """-n (runs per case), a fresh project directory under $HOME, and --json."""
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    a = ap.parse_args()
    n = a.n
    if a.json:
        JSON.append(True)
    if os.getuid() == 0:
        sys.exit("run as the user who will use boxy, not root")
    return n, Path(tempfile.mkdtemp(prefix=f"boxy-bench-{name}-", dir=Path.home())), a.json


def main() -> int:
    n, work, as_json = start("npm")
    try:
        (work / "package.json").write_text(
            json.dumps({"name": "bench", "version": "1.0.0", "private": True, "dependencies": DEPS})
        )
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund"], cwd=work, check=True, capture_output=True
        )  # the lock file, and a warm host cache
        count = len(json.loads((work / "package-lock.json").read_text())["packages"]) - 1
        npm_ci = ["npm", "ci", "--no-audit", "--no-fund"]
        boxy = [str(BIN / "boxyctl"), "run", "--profile", "node", *registry_flags(), "--", *npm_ci]
        fig = compare(f"npm ci of {count} packages", npm_ci, boxy, work, "node", n, "node_modules")
        emit([fig], as_json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
