#!/usr/bin/env python3
"""Start-up of boxyd itself: the first run after `systemctl --user start
boxyd.socket` (socket activation, the daemon and its stage-2 template started by
that run), the first run with no daemon and no user manager (boxyctl starts it),
and a run against a warm daemon, measured in the same run, as ratios to the warm
one. Needs root (the harness brings up a real `systemd --user` for the user).

`sudo .venv/bin/python bench/activation.py [-u boxytest] [-n 5]`
"""

from __future__ import annotations

import argparse
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness.usermanager import UserManager  # noqa: E402

BIN = Path(sys.executable).parent


def timed(argv: list[str], cwd: str) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-u", "--user", default="boxytest")
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    pw = pwd.getpwnam(args.user)
    um = UserManager(pw.pw_name, pw.pw_uid, Path(pw.pw_dir), Path(f"/run/user/{pw.pw_uid}"))
    run = um.user_cmd([str(BIN / "boxyctl"), "run", "--net", "none", "--", "true"])
    work = tempfile.mkdtemp(prefix="boxy-bench-", dir="/tmp")
    subprocess.run(["chown", args.user, work], check=True)
    stop = um.user_cmd([str(BIN / "boxyctl"), "daemon", "stop", "--force"])
    on_demand, activated, warm = [], [], []
    for _ in range(args.n):
        subprocess.run(stop, capture_output=True)
        on_demand.append(timed(run, work))
    warm = [timed(run, work) for _ in range(args.n * 4)]
    subprocess.run(stop, capture_output=True)
    um.up()
    try:
        subprocess.run(
            um.user_cmd([str(BIN / "boxyctl"), "setup"]), check=True, capture_output=True
        )
        start = ["systemctl", "--user", "start", "boxyd.socket"]
        for _ in range(args.n):
            um.systemctl("stop", "boxyd.service", "boxyd.socket")
            t = time.perf_counter()
            subprocess.run(um.user_cmd(start), check=True, capture_output=True)
            subprocess.run(run, check=True, capture_output=True, cwd=work)
            activated.append(time.perf_counter() - t)
    finally:
        um.systemctl("disable", "--now", "boxyd.socket", "boxyd.service")
        um.down()
        for name in ("boxyd.socket", "boxyd.service"):
            (Path(pw.pw_dir) / ".config/systemd/user" / name).unlink(missing_ok=True)
    ref = statistics.median(warm)
    print(f"median of {args.n} (warm: {len(warm)})")
    for label, xs in (
        ("warm daemon: boxyctl run --net none -- true", warm),
        ("no daemon, boxyctl starts it, first run", on_demand),
        ("systemctl --user start boxyd.socket, then the first run", activated),
    ):
        m = statistics.median(xs)
        print(f"  {m * 1000:8.1f} ms  {m / ref:6.2f}x  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
