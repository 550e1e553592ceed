#!/usr/bin/env python3
"""What naming Landlock's refused ports costs a connect()-heavy payload (issue 34).

A run that asks to hear of refusals (-v, --audit-log, --net-log) in allowlist mode has
every connect() wait on PID 1 (boxyd/stage2/notify.py), which asks the reader for its
address and lets it through. This runs one loop of CONNECTS loopback connect()s inside
the sandbox (a listener on a port Landlock grants; the loop times itself, so start-up
is not in the figure) with and without -v, alternating, ROUNDS times, and prints the
median microseconds per connect() of each and their ratio; then the same for refused
connect()s (a port Landlock does not grant: EACCES). Nothing leaves the sandbox's own
loopback. As root, against a staged tree (tests/harness/stage.sh):
``.venv/bin/python bench/connectnotify.py --user boxytest4 --stage /opt/boxy-test4``.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import subprocess
import sys

LOOP = r"""
import socket, sys, time
port, target, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket()
srv.bind(("127.0.0.1", port)); srv.listen(1024)
t0 = time.perf_counter()
for _ in range(n):
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", target)); srv.accept()[0].close()
    except OSError:
        pass
    c.close()
print(f"{(time.perf_counter() - t0) / n * 1e6:.2f}")
"""
PORT, REFUSED = 8080, 8081  # granted by --allow-host bench.invalid:8080; not granted


def run(user: pwd.struct_passwd, stage: str, workdir: str, target: int, n: int, v: bool) -> float:
    env = {
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "PATH": f"{stage}/.venv/bin:/usr/bin:/bin",
        "XDG_RUNTIME_DIR": f"/run/user/{user.pw_uid}",
        "LANG": "C.UTF-8",
    }
    argv = ["boxyctl", "run", "--net", "allowlist", "--allow-host", f"bench.invalid:{PORT}"]
    argv += ["-v"] if v else []
    argv += ["--", "python3", "-c", LOOP, str(PORT), str(target), str(n)]
    envs = [f"{k}={x}" for k, x in env.items()]
    cmd = ["runuser", "-u", user.pw_name, "--", "env", "-i", *envs, *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=600)
    return float(out.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--user", default="boxytest4")
    ap.add_argument("--stage", default="/opt/boxy-test4")
    ap.add_argument("--connects", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    user = pwd.getpwnam(args.user)
    workdir = os.path.join(user.pw_dir, "bench-connectnotify")
    os.makedirs(workdir, exist_ok=True)
    shutil.chown(workdir, user.pw_uid, user.pw_gid)
    for label, target in (("allowed", PORT), ("refused", REFUSED)):
        plain: list[float] = []
        named: list[float] = []
        for _ in range(args.rounds):  # alternating: drift hits both
            plain.append(run(user, args.stage, workdir, target, args.connects, False))
            named.append(run(user, args.stage, workdir, target, args.connects, True))
        a, b = statistics.median(plain), statistics.median(named)
        print(
            f"{label} connect(): {a:.1f} us plain, {b:.1f} us named (-v): {b / a:.2f}x"
            f"  [plain {min(plain):.0f}-{max(plain):.0f}, named {min(named):.0f}-{max(named):.0f}]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
