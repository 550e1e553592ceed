#!/usr/bin/env python3
"""A held review of a 10,000-file node_modules: `boxyctl diff --stat`, `boxyctl
apply ID` of all of it and `boxyctl discard ID`, each against the same tree copied
with `cp -a` between two directories on the same filesystem, in the same run (the
reference: what landing those files costs the file system without boxy).

The payload writes the tree itself (GEN: nested package directories, mostly small
.js/.json files, a few of dozens of KiB, symlinks in .bin), seeded, so every round
holds the same tree and the bench needs no network. Each round: `cp -a` of a host
copy of that tree, then a fresh held session for each of: apply of a new
node_modules, apply into a node_modules whose directories the host already has (so
each file lands on its own), discard.

Run as the user who will use boxy (not root): `.venv/bin/python bench/reviewapply.py
[-n 3] [--files 10000]`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import INFORMATION, Figure, at_most, emit  # noqa: E402

BIN = Path(sys.executable).parent

# node_modules of about FILES entries under ROOT, the same every time (seeded)
GEN = r"""
import os, random, sys
root, files = sys.argv[1], int(sys.argv[2])
rnd = random.Random(18)
nm = os.path.join(root, "node_modules")
os.makedirs(os.path.join(nm, ".bin"), exist_ok=True)
made = i = 0
while made < files:
    i += 1
    name = f"pkg-{i:04d}"
    if i % 11 == 0:  # another version, nested under the package that needs it
        base = os.path.join(nm, f"pkg-{i // 2:04d}", "node_modules", name)
    elif i % 9 == 0:
        base = os.path.join(nm, f"@scope{i % 7}", name)
    else:
        base = os.path.join(nm, name)
    os.makedirs(os.path.join(base, "lib"), exist_ok=True)
    for k in range(rnd.randint(3, 25)):
        if k < 3:
            p = ("package.json", "index.js", "README.md")[k]
            size = rnd.randint(100, 4000)
        else:
            p = f"lib/m{k}.{'json' if k % 4 == 0 else 'js'}"
            big = rnd.random() < 0.03
            size = rnd.randint(20_000, 90_000) if big else rnd.randint(50, 4000)
        line = f"// {name} {k}".ljust(63) + "\n"
        with open(os.path.join(base, p), "w") as f:
            f.write(line * (size // 64) + "x" * (size % 64))
        made += 1
        if made >= files:
            break
    if i % 20 == 0 and i % 11 and i % 9:
        os.symlink(f"../{name}/index.js", os.path.join(nm, ".bin", name))
        made += 1
"""


def ctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "boxyctl"), *args], cwd=cwd, capture_output=True, text=True)


def timed_ctl(*args: str, cwd: Path) -> float:
    t = time.perf_counter()
    r = ctl(*args, cwd=cwd)
    took = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"boxyctl {' '.join(args)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return took


def held(work: Path, files: int) -> str:
    """A fresh session held for review whose payload wrote the tree; its id."""
    r = ctl(
        "run", "--review", "--net", "none", "--", "python3", "-c", GEN, ".", str(files), cwd=work
    )
    m = re.search(r"boxyctl diff (\w+)", r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"the held run failed: exit {r.returncode}\n{r.stderr[-2000:]}")
    return m.group(1)


def cp_a(src: Path, dst: Path) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return time.perf_counter() - t


def applied(work: Path, files: int, sid: str) -> float:
    """`boxyctl apply SID`, timed; checked to have landed the whole tree."""
    took = timed_ctl("apply", sid, cwd=work)
    landed = sum(len(f) for _, _, f in os.walk(work / "node_modules"))
    if landed < files:
        sys.exit(f"apply landed {landed} files of {files}")
    shutil.rmtree(work / "node_modules")
    return took


def dirs_of(ref: Path, work: Path) -> None:
    """REF's directories made in WORK before the run: the payload's files then land
    one by one (an install into an existing node_modules), not as one new tree."""
    for path, _, _ in os.walk(ref / "node_modules"):
        (work / Path(path).relative_to(ref)).mkdir(parents=True, exist_ok=True)


def rounds(base: Path, files: int, n: int) -> dict[str, list[float]]:
    work, ref = base / "proj", base / "ref"
    work.mkdir()
    (work / "package.json").write_text('{"name": "bench", "version": "1.0.0"}\n')
    subprocess.run([sys.executable, "-c", GEN, str(ref), str(files)], check=True)
    got: dict[str, list[float]] = {"cp": [], "diff": [], "apply": [], "each": [], "discard": []}
    for _ in range(n):
        got["cp"].append(cp_a(ref / "node_modules", base / "copy"))
        shutil.rmtree(base / "copy")
        shutil.rmtree(work / "node_modules", ignore_errors=True)
        sid = held(work, files)
        subprocess.run(["sync"], check=True)
        got["diff"].append(timed_ctl("diff", "--stat", sid, cwd=work))
        got["apply"].append(applied(work, files, sid))
        dirs_of(ref, work)
        sid = held(work, files)
        subprocess.run(["sync"], check=True)
        got["each"].append(applied(work, files, sid))
        sid = held(work, files)
        subprocess.run(["sync"], check=True)
        got["discard"].append(timed_ctl("discard", sid, cwd=work))
    return got


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    a = ap.parse_args()
    if os.getuid() == 0:
        sys.exit("run as the user who will use boxy, not root")
    base = Path(tempfile.mkdtemp(prefix="boxy-bench-review-", dir=Path.home()))
    try:
        got = rounds(base, a.files, a.n)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cp = statistics.median(got["cp"])
    med = {k: statistics.median(v) for k, v in got.items()}
    # each round's figure against that round's cp -a: the machine's load drifts
    ratio = {
        k: statistics.median(x / c for x, c in zip(got[k], got["cp"], strict=True)) for k in med
    }
    say = sys.stderr if a.json else sys.stdout
    print(f"a held node_modules of {a.files:,} files, median of {a.n}", file=say)
    print(f"  cp -a of the same tree, same filesystem  {cp:6.2f} s  (reference)", file=say)
    for k, what in (
        ("diff", "diff --stat"),
        ("apply", "apply ID (a new node_modules)"),
        ("each", "apply ID (into its directories)"),
        ("discard", "discard ID"),
    ):
        print(f"  boxyctl {what:<32} {med[k]:6.2f} s  {ratio[k]:5.2f}x", file=say)
    figs = [
        Figure("review", "diff --stat, 10k files", med["diff"], "s", ratio["diff"], INFORMATION, True),
        Figure("review", "apply of 10k files", med["apply"], "s", *at_most(ratio["apply"], 1.0)),
        Figure("review", "apply of 10k files, one by one", med["each"], "s",
               *at_most(ratio["each"], 1.0)),
        Figure("review", "discard, 10k files", med["discard"], "s", ratio["discard"], INFORMATION, True),
    ]  # fmt: skip
    emit(figs, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
