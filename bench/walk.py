#!/usr/bin/env python3
"""The run's walks of a big work directory, and what they cost everyone else.

For work directories of 20,000 and 300,000 directories (and one git repository):

- the walk before the run and the walk after it, timed in this process
  (boxyd.plan.worktree: the git guard's layout, the credentials, the tools' files;
  then the guard's scan with the host's git);
- `boxyctl run -w TREE -- true` end to end, against the same run in a small tree;
- another session's `boxyctl run -- true` while the big run is being prepared,
  against an idle daemon measured in the same run: the daemon must keep serving.

With `--walk-only`, just the walk before the run, three ways on the same tree (with
`--files` regular files in every directory): no credential with a second link (the
hard-link check costs one lstat per credential), a `.env` hard-linked deep in the tree
(the whole tree searched by the listings' inode numbers), and that search with an
lstat of every regular file (what checking every file's link count would cost).

With `--entries N` (make bench: 1,000,000), the figures of issue #18 for a tree of N
entries (ten in each directory, as node_modules has about): the walk before the run
(median of three, target ≤ 2 s) and another session's start-up during that run's
walk against an idle daemon (target ≤ 1.5×); `--json` prints them for bench/all.py.
The tree is kept under ~/.cache/boxy-bench (building it takes a minute).

Run as the user who will use boxy (not root): `.venv/bin/python bench/walk.py`.
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
from boxyd.plan import masking, worktree  # noqa: E402
from tests.harness import toolshed  # noqa: E402

BIN = Path(sys.executable).parent


def make_tree(root: Path, dirs: int, files: int = 0) -> None:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    width = 1000
    for i in range(0, dirs, width):
        parent = root / f"d{i // width}"
        parent.mkdir()
        for j in range(min(width, dirs - i) - 1):
            (parent / f"e{j}").mkdir()
            for k in range(files):
                (parent / f"e{j}" / f"f{k}").touch()


def links(base: Path, size: int, files: int, n: int) -> None:
    """The walk before the run with and without a hard-linked credential (same tree)."""
    tree = base / f"l{size}"
    make_tree(tree, size, files)
    (tree / ".env").write_text("KEY=x\n")

    def timed() -> float:
        t = time.perf_counter()
        worktree.prepare([str(tree)], git_guard=True)
        return time.perf_counter() - t

    timed()  # page cache
    plain = median(timed, n)
    last = sorted(tree.glob("d*/e*"))[-1]
    os.link(tree / ".env", last / "linked")
    linked = median(timed, n)
    found = {f.rel: f.note for f in worktree.walk(str(tree), git_guard=False).credentials}
    assert found.get(str((last / "linked").relative_to(tree))) == "a hard link of .env", found
    root_fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.stat(tree / ".env")
        t = time.perf_counter()
        masking.search_links(
            root_fd,
            {(st.st_dev, st.st_ino): masking._Linked(".env", 99, [])},
            stat_all=True,
            limit=None,
        )
        every = time.perf_counter() - t
    finally:
        os.close(root_fd)
    print(
        f"{size:>7} directories, {size * files:,} files: walk before {plain:6.2f} s; with a "
        f"hard-linked .env {linked:6.2f} s (+{linked - plain:.2f} s: the search); "
        f"the search with an lstat of every file {every:6.2f} s"
    )
    shutil.rmtree(tree)


def boxy(workdir: Path) -> float:
    t = time.perf_counter()
    subprocess.run(
        [str(BIN / "boxyctl"), "run", "--net", "none", "-w", str(workdir), "--", "true"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t


def median(f, n: int) -> float:
    return statistics.median(f() for _ in range(n))


def during(big: Path, small: Path, n: int) -> list[float]:
    """Start-ups of a small run while the big one is being walked (the big one is
    restarted whenever it ends, so every sample overlaps a walk)."""
    times: list[float] = []
    proc = None
    try:
        while len(times) < n:
            if proc is None or proc.poll() is not None:
                proc = subprocess.Popen(
                    [str(BIN / "boxyctl"), "run", "--net", "none", "-w", str(big), "--", "true"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(0.05)  # let it reach its walk
            times.append(boxy(small))
    finally:
        if proc is not None:
            proc.wait()
    return times


def entries_tree(n: int) -> Path:
    """A tree of about N entries, nine files in each directory, kept between runs."""
    tree = Path.home() / ".cache" / "boxy-bench" / f"tree-{n}"
    done = tree / ".built"
    if not done.exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.parent.mkdir(parents=True, exist_ok=True)
        make_tree(tree, n // 10, files=9)
        done.touch()
    return tree


def figures_for(n: int, samples: int) -> list[Figure]:
    """#18's walk figures: the walk before the run, another start-up during it."""
    tree = entries_tree(n)
    small = Path(tempfile.mkdtemp(prefix="boxy-bench-small-", dir=Path.home()))
    try:
        make_tree(small, 10)
        worktree.prepare([str(tree)], git_guard=True)  # page cache

        def walk() -> float:
            t = time.perf_counter()
            worktree.prepare([str(tree)], git_guard=True)
            return time.perf_counter() - t

        took = median(walk, 3)
        boxy(small)  # daemon start
        idle = median(lambda: boxy(small), samples)
        busy = statistics.median(during(tree, small, samples))
    finally:
        shutil.rmtree(small, ignore_errors=True)
    print(
        f"{n:,} entries: walk before the run {took:.2f} s; another start-up {busy * 1000:.0f} ms "
        f"during its walk against {idle * 1000:.0f} ms idle",
        file=sys.stderr,
    )
    return [
        Figure("walk", f"walk of {n:,} entries", took, "s", None, "≤ 2 s", took <= 2.0),
        Figure("walk", "start-up during that walk", busy * 1000, "ms", *at_most(busy / idle, 1.5)),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,300000")
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument(
        "--walk-only", action="store_true", help="only the walk, with and without a hard link"
    )
    ap.add_argument("--files", type=int, default=5, help="files per directory (--walk-only)")
    ap.add_argument("--entries", type=int, help="#18's figures for a tree of this many entries")
    ap.add_argument("--json", action="store_true", help="with --entries: the figures as JSON")
    args = ap.parse_args()
    if os.getuid() == 0:
        sys.exit("run as the user who will use boxy, not root")
    if args.entries:
        emit(figures_for(args.entries, args.n), args.json)
        return 0
    base = Path(tempfile.mkdtemp(prefix="boxy-bench-walk-", dir=Path.home()))
    if args.walk_only:
        try:
            for size in (int(s) for s in args.sizes.split(",")):
                links(base, size, args.files, max(3, args.n // 3))
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return 0
    try:
        small = base / "small"
        make_tree(small, 10)
        boxy(small)  # daemon start, page cache
        idle = median(lambda: boxy(small), args.n)
        print(
            f"idle daemon: `boxyctl run -- true` in a small tree  {idle * 1000:8.1f} ms (reference)"
        )
        for size in (int(s) for s in args.sizes.split(",")):
            tree = base / f"t{size}"
            make_tree(tree, size)
            t = time.perf_counter()
            trees = worktree.prepare([str(tree)], git_guard=True)
            before = time.perf_counter() - t
            t = time.perf_counter()
            worktree.after(
                trees,
                {str(tree): trees[str(tree)].baseline},
                str(base / "q"),
                str(Path.home()),
                toolshed.opener(),
            )
            after = time.perf_counter() - t
            run = median(lambda tree=tree: boxy(tree), 3)
            others = during(tree, small, args.n)
            print(
                f"{size:>7} directories: walk before {before:6.2f} s, after {after:6.2f} s; "
                f"the run {run:6.2f} s ({run / idle:5.1f}x the small run)"
            )
            print(
                f"{'':>7}  another session during its walk: median {statistics.median(others) * 1000:7.1f} ms,"
                f" max {max(others) * 1000:7.1f} ms  = {statistics.median(others) / idle:4.2f}x idle"
            )
            shutil.rmtree(tree)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
