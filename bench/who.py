"""What finding who asked costs (--ask, boxyd/daemon/who.py): the lookup of the program
holding a flow's socket, in a user namespace of its own (as a sandbox's) holding N
other processes (each a `sleep` with a few fds), the holder the newest or the oldest
of them (the walk goes newest first), or one holder with F fds (the socket the last).
Run it as a user who may make a user namespace (`unshare --user`).

    python3 bench/who.py [N ...]        # e.g. 100 1000 4000
    python3 bench/who.py --fds F [F ...] # e.g. 1000 10000

Prints the median and the worst of ROUNDS lookups (milliseconds), and whether each
found the holder (past its budget a lookup gives up: "an unknown process")."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from boxyd.daemon import who
from boxyd.net import sockdiag

ROUNDS = 20
# In a user namespace of its own, as a sandbox is: N sleepers, then the holder of F
# fds and the socket (the newest process: the walk's best case), or the holder first
# and the sleepers after it (WORST: the oldest, found last).
HOLDER = (
    "import socket, sys\n"
    "extra = [open('/dev/null') for _ in range(int(sys.argv[1]))]\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.connect(('127.0.0.1', 9))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "sys.stdin.read()\n"
)
SANDBOX = """\
import os, subprocess, sys
n, fds, worst, holder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
def sleepers():
    return [subprocess.Popen(["sleep", "600"]) for _ in range(n)]
kids = [] if worst else sleepers()
h = subprocess.Popen([sys.executable, "-c", holder, str(fds)], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, text=True)
port = h.stdout.readline().strip()
kids += sleepers() if worst else []
print(h.pid, port, flush=True)
sys.stdin.read()
h.communicate("")
for k in kids:
    k.kill()
for k in kids:
    k.wait()
"""


def measure(others: int, fds: int, worst: bool) -> str:
    diag = sockdiag.SockDiag(sockdiag.open_socket())
    box = subprocess.Popen(
        ["unshare", "--user", "--map-current-user", "--", sys.executable, "-c", SANDBOX,
         str(others), str(fds), "1" if worst else "0", HOLDER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert box.stdout is not None
    pid, port = map(int, box.stdout.readline().split())
    userns = os.readlink(f"/proc/{pid}/ns/user")
    flow = sockdiag.Flow("udp", ("127.0.0.1", port), ("127.0.0.1", 9))
    try:
        times, found = [], 0
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            got = who.who_sent(diag, flow, userns)
            times.append((time.perf_counter() - t0) * 1000)
            found += got is not None and got.host_pid == pid
        procs = sum(n.isdigit() for n in os.listdir("/proc"))
        return (
            f"{others:>5} processes in the sandbox ({procs:>5} in /proc), the holder "
            f"{'oldest' if worst else 'newest'} with {fds:>5} fds: median "
            f"{statistics.median(times):7.2f} ms, worst {max(times):7.2f} ms, found {found}/{ROUNDS}"
        )
    finally:
        box.communicate("")
        diag.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="*", default=[0, 100, 1000, 4000])
    ap.add_argument("--fds", type=int, nargs="*", default=[])
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for n in args.n:
        for worst in (False, True):
            print(measure(n, 0, worst), flush=True)
    for f in args.fds:
        print(measure(0, f, True), flush=True)


if __name__ == "__main__":
    main()
