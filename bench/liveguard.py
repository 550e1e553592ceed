#!/usr/bin/env python3
"""The live guard's window: how long a payload can read a credential the host saved
(a new file renamed over the covered one, as an editor saves) or created during a
session, before its stand-in is in place again.

A detached session's payload reads the files in a tight loop and keeps every change
it saw, with the time; the host saves N times. Printed: the window per save (from
the host's rename to the payload's first sight of the stand-in), the guard's own
figure from the audit log (inotify event to mount), both as multiples of the
payload's own read period measured in the same run (the finest a payload can see).

Run as the user who will use boxy: `.venv/bin/python bench/liveguard.py [-n 20]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent

WATCHER = r"""
import json, sys, time
names, seconds = sys.argv[1].split(","), float(sys.argv[2])
end, last, seen, reads = time.time() + seconds, {}, [], 0
while time.time() < end:
    for n in names:
        try:
            with open(n) as f:
                text = f.read()
        except OSError:
            text = "!"
        reads += 1
        if last.get(n) != text:
            last[n] = text
            seen.append((time.time(), n, text))
json.dump({"seen": seen, "period": seconds / max(reads / len(names), 1)}, open("obs.json", "w"))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20)
    n = ap.parse_args().n
    with tempfile.TemporaryDirectory(dir=Path.home()) as d:
        work = Path(d)
        (work / ".env").write_text("TOKEN=initial\n")
        (work / "watch.py").write_text(WATCHER)
        audit = work.parent / f".boxy-bench-audit-{os.getpid()}.jsonl"
        seconds = 1.5 + n * 0.25
        r = subprocess.run(
            [
                str(BIN / "boxyctl"),
                "run",
                "-d",
                "--net",
                "none",
                "--audit-log",
                str(audit),
                "--",
                "python3",
                "watch.py",
                ".env,.env.local",
                str(seconds),
            ],
            cwd=work,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            sys.exit(f"boxyctl run: {r.stderr.strip()}")
        time.sleep(1.0)
        saves = []
        for i in range(n):
            tmp = work / f".save-{i}"
            tmp.write_text(f"TOKEN=saved-{i}\n")
            saves.append((time.time(), f"TOKEN=saved-{i}\n"))
            tmp.rename(work / ".env")
            time.sleep(0.2)
        created = time.time()
        (work / ".env.local").write_text("KEY=created\n")
        deadline = time.time() + seconds + 10  # the payload writes what it saw, then ends
        while not (work / "obs.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        obs = json.loads((work / "obs.json").read_text())
        audit_lines = (
            [json.loads(ln) for ln in audit.read_text().splitlines()] if audit.exists() else []
        )
        audit.unlink(missing_ok=True)
    report(obs, saves, created, audit_lines, n)
    return 0


def _cover(seen: list, name: str, since: float) -> float | None:
    """When the payload first saw the stand-in (empty) in NAME after SINCE."""
    return next((t for t, nm, text in seen if nm == name and t >= since and text == ""), None)


def _read(seen: list, name: str, start: float, end: float, secret: str) -> bool:
    return any(nm == name and start <= t <= end and text == secret for t, nm, text in seen)


def report(obs: dict, saves: list, created: float, audit: list, n: int) -> None:
    seen, period = obs["seen"], obs["period"]
    windows, new_read, old_read = [], 0, 0
    previous = "TOKEN=initial\n"
    for t, secret in saves:
        covered = _cover(seen, ".env", t)
        if covered is None:
            print(f"  NOT covered again after the save at {t:.3f}")
            continue
        windows.append(covered - t)
        new_read += _read(seen, ".env", t, covered, secret)
        old_read += _read(seen, ".env", t, covered, previous)  # the kernel's own moment
        previous = secret
    guard = [a["window_ms"] for a in audit if a.get("layer") == "fs.live" and "window_ms" in a]
    ref = period * 1e3
    print(f"the payload's own read period: {ref:.3f} ms (reference)")
    if windows:
        med = statistics.median(windows) * 1e3
        print(
            f"{n} host saves of a covered .env: covered again {med:.1f} ms after the rename "
            f"(median; max {max(windows) * 1e3:.1f} ms; {med / ref:.0f}x the read period)"
        )
    print(
        f"  the payload read the newly saved secret within that window after {new_read} of {n} saves,"
    )
    print(
        f"  and the file the save replaced after {old_read} (vfs_rename detaches the stand-in before "
        "it moves the new file in)"
    )
    if guard:
        g = statistics.median(guard)
        print(
            f"the guard's figure (inotify event to mount, {len(guard)} redos): median {g:.1f} ms, "
            f"max {max(guard):.1f} ms ({g / ref:.0f}x the read period)"
        )
    cov = _cover(seen, ".env.local", created)
    leaked = cov is not None and _read(seen, ".env.local", created, cov, "KEY=created\n")
    print(
        "a .env.local created during the session: "
        + (
            "NOT covered"
            if cov is None
            else f"covered {(cov - created) * 1e3:.1f} ms after it was written"
            + ("; read before that" if leaked else "; never read")
        )
    )


if __name__ == "__main__":
    sys.exit(main())
