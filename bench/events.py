#!/usr/bin/env python3
"""Events per second a watcher sustains: a session publishing audit records as
fast as it can, one `Watch` client reading them over the real varlink server,
in one process (the fake launcher of the core's tests stands in for the
sandbox: this measures the fan-out and the wire, not a payload). Reports the
rate the watcher received, what it lost (its bounded queue), and the rate of
publishing with no watcher as the reference."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from boxyd.api.service import VarlinkService  # noqa: E402
from boxyd.api.varlink import VarlinkServer  # noqa: E402
from boxyd.daemon.manager import Manager  # noqa: E402
from tests.unit.test_core import FakeLauncher, request, started  # noqa: E402

N = 200_000
WATCHER = r"""
import json, sys, time
from boxy import INTERFACE
from boxy.varlink import Client
got = lost = 0
with Client.connect(sys.argv[1]) as c:
    t = None
    for reply in c.stream(INTERFACE + ".Watch", {"id": sys.argv[2]}):
        ev = reply.get("event") or {}
        if ev.get("kind") == "audit":
            t = t or time.perf_counter()
            got += 1
        elif ev.get("kind") == "lost":
            lost += ev["count"]
print(json.dumps([got, lost, time.perf_counter() - (t or time.perf_counter())]))
"""


async def publish(s, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        s.record("net", verdict="deny", host="evil.example", port=443, n=i)
        if i % 1000 == 0:
            await asyncio.sleep(0)  # a real session yields between events
    return time.perf_counter() - t


async def main() -> None:
    manager = Manager(FakeLauncher(), grace=0.05)
    server = VarlinkServer(VarlinkService(manager).handle)
    path = tempfile.mktemp(prefix="boxy-bench-", suffix=".sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen()
    serving = asyncio.create_task(server.serve(sock))
    alone = await manager.start(request(), [])
    await started(alone)
    ref = await publish(alone, N)
    s = await manager.start(request(), [])
    await started(s)
    # the watcher: another process, boxyctl's own synchronous client
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WATCHER, path, s.id, stdout=asyncio.subprocess.PIPE
    )
    while not s.events.watchers:
        await asyncio.sleep(0.01)
    took_publish = await publish(s, N)
    s.stop(kill=True)
    got, lost, took = json.loads(await child.stdout.read())
    await child.wait()
    print(f"{N} audit events")
    print(f"  publishing, nobody watching   {N / ref:10.0f} events/s  (reference)")
    print(
        f"  publishing, one watcher       {N / took_publish:10.0f} events/s  "
        f"{ref / took_publish:5.2f}x the reference"
    )
    print(
        f"  the watcher received          {got / took:10.0f} events/s  ({got} received, "
        f"{lost} lost and told)"
    )
    alone.stop(kill=True)
    server.close()
    serving.cancel()


if __name__ == "__main__":
    asyncio.run(main())
