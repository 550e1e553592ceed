#!/usr/bin/env python3
"""Events: what watchers cost a session that publishes audit records, and whether
ten watchers keep up with a steady stream. In one process: the real varlink server
and core over the fake launcher of the core's tests (this measures the fan-out and
the wire, not a payload); each watcher is another process, boxyctl's own
synchronous client.

- publish, no watcher: a session publishing as fast as it can (the reference);
- publish, one watcher: the same with one `Watch` client reading as fast as it can
  (ratio: how many times slower; target ≤ 2×);
- ten watchers at 10,000 events/s: a paced publisher, each of ten watchers must
  receive every event (target: 0 lost, at the pace: 95% of it at least).

Publishing rates are events per second of the daemon's CPU time: the publisher
never waits, so on a quiet machine that is its wall-clock rate, and on a shared
one it leaves out the time other processes (the watchers among them) held the
CPU. The two publishing runs alternate, ROUNDS times; the figures are the medians
(the ratio: of each round's own).
`--json` prints the figures as one JSON list on stdout (the prose goes to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import Figure, at_most, emit  # noqa: E402
from boxyd.api.service import VarlinkService  # noqa: E402
from boxyd.api.varlink import VarlinkServer  # noqa: E402
from boxyd.daemon.manager import Manager  # noqa: E402
from boxyd.daemon.session import Session  # noqa: E402
from tests.unit.test_core import FakeLauncher, request, started  # noqa: E402

BENCH = "events"
WATCHER = r"""
import json, sys, time
from boxy import INTERFACE
from boxy.varlink import Client
got = lost = 0
t = None
with Client.connect(sys.argv[1]) as c:
    for reply in c.stream(INTERFACE + ".Watch", {"id": sys.argv[2]}):
        ev = reply.get("event") or {}
        if ev.get("kind") == "audit":
            t = t or time.perf_counter()
            got += 1
        elif ev.get("kind") == "lost":
            lost += ev["count"]
print(json.dumps([got, lost, time.perf_counter() - (t or time.perf_counter())]))
"""


@dataclass
class Watched:
    """What one watcher process said: audit events received, lost (told), seconds."""

    got: int
    lost: int
    took: float


class Daemon:
    """The varlink server over a Manager with the fake launcher, on a socket."""

    def __init__(self) -> None:
        self.manager = Manager(FakeLauncher(), grace=0.05)
        self.server = VarlinkServer(VarlinkService(self.manager).handle)
        self.path = tempfile.mktemp(prefix="boxy-bench-", suffix=".sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        sock.listen()
        self.serving = asyncio.create_task(self.server.serve(sock))

    async def session(self) -> Session:
        s = await self.manager.start(request(), [])
        await started(s)
        return s

    async def watchers(self, s: Session, n: int) -> list[asyncio.subprocess.Process]:
        """N watcher processes, each subscribed to S when this returns."""
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", WATCHER, self.path, s.id, stdout=asyncio.subprocess.PIPE
            )
            for _ in range(n)
        ]
        while s.events.watchers < n:
            await asyncio.sleep(0.01)
        return children

    @staticmethod
    async def results(s: Session, children: list[asyncio.subprocess.Process]) -> list[Watched]:
        """End S (its watchers' streams end with it) and collect what each received."""
        s.stop(kill=True)
        out = []
        for child in children:
            assert child.stdout is not None
            out.append(Watched(*json.loads(await child.stdout.read())))
            await child.wait()
        return out

    def close(self) -> None:
        self.server.close()
        self.serving.cancel()
        Path(self.path).unlink(missing_ok=True)


async def flood(s: Session, n: int) -> float:
    """Publish N records as fast as possible; the daemon's CPU seconds it took."""
    c = time.process_time()
    for i in range(n):
        s.record("net", verdict="deny", host="evil.example", port=443, n=i)
        if i % 1000 == 0:
            await asyncio.sleep(0)  # a real session yields between events
    return time.process_time() - c


async def paced(s: Session, rate: int, seconds: float) -> tuple[int, float, float]:
    """Publish RATE records a second for SECONDS, yielding after each tick's worth
    (what the loop missed while away comes in turns, as a real source's would);
    (published, the rate achieved, the daemon's share of a CPU)."""
    tick = max(1, rate // 1000)
    t0, c0 = time.perf_counter(), time.process_time()
    done = 0
    while (now := time.perf_counter() - t0) < seconds:
        due = int(now * rate)
        while done < due:
            for _ in range(min(tick, due - done)):
                s.record("net", verdict="deny", host="evil.example", port=443, n=done)
                done += 1
            await asyncio.sleep(0)
        await asyncio.sleep(0.001)
    wall = time.perf_counter() - t0
    return done, done / wall, (time.process_time() - c0) / wall


async def publishing(
    d: Daemon, n: int, rounds: int
) -> tuple[list[float], list[float], list[Watched]]:
    """Publishing rates without and with one watcher, alternated ROUNDS times (a
    round's pair runs close in time: its ratio is what counts), and what the
    watcher received in each round."""
    alone: list[float] = []
    watched: list[float] = []
    received: list[Watched] = []
    for _ in range(rounds):
        s = await d.session()
        alone.append(n / await flood(s, n))
        s.stop(kill=True)
        s = await d.session()
        children = await d.watchers(s, 1)
        watched.append(n / await flood(s, n))
        received += await d.results(s, children)
    return alone, watched, received


def say(line: str) -> None:
    print(line, file=sys.stderr)


async def main(args: argparse.Namespace) -> list[Figure]:
    d = Daemon()
    try:
        alone, watched, received = await publishing(d, args.events, args.rounds)
        s = await d.session()
        children = await d.watchers(s, args.watchers)
        published, rate, cpu = await paced(s, args.rate, args.seconds)
        ten = await d.results(s, children)
    finally:
        d.close()
    ref, one = statistics.median(alone), statistics.median(watched)
    slower = statistics.median(a / w for a, w in zip(alone, watched, strict=True))
    say(f"{args.events} audit events a run, {args.rounds} rounds; rates in the daemon's CPU time")
    for a, w, got in zip(alone, watched, received, strict=True):
        say(
            f"  nobody watching {a:8.0f}/s, one watcher {w:8.0f}/s ({a / w:.2f}x slower):"
            f" it received {got.got} ({got.got / max(got.took, 1e-9):.0f}/s), lost {got.lost}"
        )
    say(f"  medians: {ref:.0f}/s, {one:.0f}/s, {slower:.2f}x slower")
    say(
        f"{args.watchers} watchers, {published} events at {rate:.0f}/s (boxyd: {cpu:.0%} of a CPU):"
    )
    for w in ten:
        say(f"  received {w.got}, lost {w.lost} (told)")
    missing = sum(published - w.got for w in ten)
    kept_pace = rate >= 0.95 * args.rate  # else the figure would be of a slower stream
    if not kept_pace:
        say(f"  the publisher did not keep {args.rate}/s: boxyd did not get the CPU it needed")
    ratio, target, met = at_most(slower, 2)
    return [
        Figure(BENCH, "publish, no watcher", ref, "events/s", None, "reference", True),
        Figure(BENCH, "publish with one watcher", one, "events/s", ratio, target, met),
        Figure(
            BENCH,
            f"{args.watchers} watchers at {args.rate / 1000:g}k/s lost",
            missing,
            "events",
            None,
            "0",
            missing == 0 and kept_pace,
        ),
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    ap.add_argument("--events", type=int, default=200_000, help="records per publishing run")
    ap.add_argument("--rounds", type=int, default=5, help="publishing runs of each kind")
    ap.add_argument("--watchers", type=int, default=10)
    ap.add_argument("--rate", type=int, default=10_000, help="events/s of the paced run")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of the paced run")
    a = ap.parse_args()
    emit(asyncio.run(main(a)), a.json)
