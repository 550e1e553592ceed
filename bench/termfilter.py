#!/usr/bin/env python3
"""What the terminal filter costs: the session PTY's output relayed through
`PtyRelay` to a PTY standing in for the user's terminal, filtered and with
--tty-raw, printed as a throughput ratio; and the filter alone on 64 KiB chunks
(the relay's read size) for a few kinds of output.

Usage: `.venv/bin/python bench/termfilter.py [--size-mib 64] [-n 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import statistics
import sys
import time
import tty
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from boxy import termsettings  # noqa: E402
from boxyd.daemon.pty import CHUNK, PtyRelay  # noqa: E402
from boxyd.daemon.termfilter import TermFilter  # noqa: E402

MiB = 1 << 20
KINDS = {
    "ascii text": b"the quick brown fox jumps over the lazy dog 0123456789\n",
    "utf-8 text": "naïve café — “quoted” ✓ 中文字符 🐍\n".encode(),
    "coloured (ls, compilers)": b"\x1b[01;34mdir\x1b[0m  \x1b[01;32mtool\x1b[0m  file.c\n",
    "tui redraw": b"\x1b[H\x1b[2J\x1b[?25l\x1b[1;1H\x1b[7m top \x1b[0m\x1b[2;5H42%\x1b[?25h",
}


def _sample(line: bytes, size: int) -> bytes:
    return (line * (size // len(line) + 1))[:size]


def filter_alone(data: bytes) -> float:
    """MiB/s of TermFilter.feed over DATA in CHUNK pieces."""
    f = TermFilter()
    t = time.perf_counter()
    for i in range(0, len(data), CHUNK):
        f.feed(data[i : i + CHUNK])
    return len(data) / MiB / (time.perf_counter() - t)


def _drain(fd: int, total: int, done: int) -> None:
    """The user's terminal: reads until TOTAL bytes came, then says when."""
    got = 0
    while got < total:
        select.select([fd], [], [])
        got += len(os.read(fd, 1 << 20))
    os.write(done, str(time.perf_counter()).encode())


def _write(fd: int, data: bytes) -> None:
    """The payload."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:CHUNK]) :]


def _fork(target: Callable[..., None], *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            target(*args)
        finally:
            os._exit(0)
    return pid


async def relayed(data: bytes, raw: bool) -> float:
    """MiB/s from the payload's PTY slave to the client terminal's master. The payload
    and the terminal are processes of their own, as they are for boxyd: this process
    runs only the relay."""
    ctl_master, ctl_slave = os.openpty()
    tty.setraw(ctl_slave)
    relay = PtyRelay(None, os.dup(ctl_slave))
    relay.raw = raw
    master, slave = os.openpty()
    termsettings.apply(slave, relay.settings)
    tty.setraw(slave)
    expected = len(data) if raw else len(TermFilter().feed(data))
    done_r, done_w = os.pipe()
    t = time.perf_counter()
    pids = [_fork(_drain, ctl_master, expected, done_w), _fork(_write, slave, data)]
    os.close(slave)
    relay.attach(master)
    end = float(await asyncio.to_thread(os.read, done_r, 64))
    for pid in pids:
        os.waitpid(pid, 0)
    relay.close()
    for fd in (ctl_master, ctl_slave, done_r, done_w):
        os.close(fd)
    return len(data) / MiB / (end - t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("-n", type=int, default=3)
    args = ap.parse_args()
    size = args.size_mib * MiB
    print(f"{args.size_mib} MiB per run, median of {args.n}, {os.cpu_count()} CPUs")
    for kind, line in KINDS.items():
        data = _sample(line, size)
        alone = statistics.median(filter_alone(data) for _ in range(args.n))
        runs = [
            (asyncio.run(relayed(data, True)), asyncio.run(relayed(data, False)))
            for _ in range(args.n)
        ]  # interleaved: a busy moment hits both alike
        raw = statistics.median(r for r, _ in runs)
        filt = statistics.median(f for _, f in runs)
        print(
            f"{kind:26} filter alone {alone:8.0f} MiB/s   relay raw {raw:6.0f} MiB/s   "
            f"filtered {filt:6.0f} MiB/s   ratio {filt / raw:4.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
