#!/usr/bin/env python3
"""`make bench`: every benchmark of issue #18, one table of every figure with its
target, its ratio (against the reference each bench measures in the same run) and
whether it is met; with `--before REV`, the tree at REV measured in the same run,
bench by bench (REV's tree first, then this one), in two more columns.

As root (the whole table): the tree is staged for an unprivileged user
(tests/harness/stage.sh; `--user`, default boxybench), the benches that must run as
a user run as that user, the network bench (its own test internet) and the scale
bench (it reads every sandbox process's memory) as root. As a user: what a user
can run; the rest are rows that say they need root.

Each bench prints its figures as JSON with `--json` (bench/table.py) and its prose
on stderr, which goes to ours.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import Figure, render  # noqa: E402

SRC = Path(__file__).resolve().parent.parent
STAGE, BEFORE_STAGE = Path("/opt/boxy-bench"), Path("/opt/boxy-bench-before")

# name, the script and its arguments, who runs it ("user" or "root": see above)
BENCHES: list[tuple[str, list[str], str]] = [
    ("startup", ["bench/startup.py", "-n", "40"], "user"),
    ("hook", ["bench/hook.py"], "user"),
    ("net", ["bench/net.py", "--user", "{user}"], "root"),
    ("ask", ["bench/ask.py", "--user", "{user}"], "root"),
    ("events", ["bench/events.py"], "user"),
    ("main job", ["bench/npm.py"], "user"),
    ("pip", ["bench/pip.py"], "user"),
    ("sessions", ["bench/sessions.py", "-n", "200", "--user", "{user}"], "root"),
    ("walk", ["bench/walk.py", "--entries", "1000000", "-n", "10"], "user"),
    ("review apply", ["bench/reviewapply.py", "-n", "3"], "user"),
]


def user_env(name: str, python: Path) -> list[str]:
    pw = pwd.getpwnam(name)
    env = {
        "HOME": pw.pw_dir, "USER": name, "LOGNAME": name, "LANG": "C.UTF-8",
        "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
        "XDG_RUNTIME_DIR": f"/run/user/{pw.pw_uid}",
    }  # fmt: skip
    return ["runuser", "-u", name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]


def project_dir(name: str) -> Path:
    """The user's project directory for the benches (never the home itself)."""
    pw = pwd.getpwnam(name)
    wd = Path(pw.pw_dir) / "boxy-bench"
    wd.mkdir(exist_ok=True)
    os.chown(wd, pw.pw_uid, pw.pw_gid)
    return wd


def run_bench(tree: Path, name: str, argv: list[str], who: str, user: str) -> list[Figure]:
    """One bench of TREE (its venv, its scripts) as WHO; its figures, or one row
    saying why there are none."""
    python = tree / ".venv" / "bin" / "python"
    script = [str(python), str(tree / argv[0]), *(a.format(user=user) for a in argv[1:]), "--json"]
    root = os.getuid() == 0
    if who == "root" and not root:
        return [Figure(name, "(needs root: make bench as root)", 0, "", None, "", False)]
    cmd = user_env(user, python) + script if who == "user" and root else script
    cwd = project_dir(user) if root else Path.cwd()
    if root:  # a daemon of the other tree must not serve this one's runs
        subprocess.run(["pkill", "-u", user, "-f", r"python[^ ]* -m boxyd( |$)"])
    print(f"== {name} ({tree})", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True)
    try:
        return [Figure.from_json(d) for d in json.loads(r.stdout.strip().splitlines()[-1])]
    except (ValueError, IndexError, KeyError, TypeError):
        return [Figure(name, f"(failed: exit {r.returncode})", 0, "", None, "", False)]


def stage(tree: Path, where: Path, user: str) -> Path:
    subprocess.run([str(SRC / "tests/harness/stage.sh"), user, str(where), str(tree)], check=True)
    return where


def before_tree(rev: str, user: str) -> Path:
    """REV's tree, staged, with this tree's bench scripts (the same measurements)."""
    tmp = Path(tempfile.mkdtemp(prefix="boxy-before-"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(SRC), "archive", rev], check=True, stdout=subprocess.PIPE
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        shutil.rmtree(tmp / "bench", ignore_errors=True)
        shutil.copytree(SRC / "bench", tmp / "bench")
        return stage(tmp, BEFORE_STAGE, user)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--user", default="boxybench", help="as root: the user the benches run as")
    ap.add_argument("--before", metavar="REV", help="also measure the tree at REV, same run")
    ap.add_argument("--only", help="comma-separated bench names")
    a = ap.parse_args()
    root = os.getuid() == 0
    if a.before and not root:
        sys.exit("--before stages REV's tree for the bench user: run as root")
    user = a.user if root else pwd.getpwuid(os.getuid()).pw_name
    tree = stage(SRC, STAGE, user) if root else SRC
    old = before_tree(a.before, user) if a.before else None
    chosen = [b for b in BENCHES if not a.only or b[0] in a.only.split(",")]
    figures: list[Figure] = []
    before: dict[tuple[str, str], Figure] = {}
    for name, argv, who in chosen:
        if old is not None:
            before.update({(f.bench, f.name): f for f in run_bench(old, name, argv, who, user)})
        figures += run_bench(tree, name, argv, who, user)
    print(render(figures, before if old is not None else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
