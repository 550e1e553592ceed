"""Append-only logs the servers write and the tests read (one line per event).

Each line is flushed as it is written, so a test can read the file the moment
its probe returns.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

# A socket address as accept() and recvfrom() give it: (host, port) for IPv4,
# (host, port, flowinfo, scope_id) for IPv6.
Peer = tuple[str, int] | tuple[str, int, int, int]


class LineLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        # O_APPEND: a test may truncate the file under us and lines still land at the end.
        self._f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def line(self, text: str) -> None:
        with self._lock:
            self._f.write(text.rstrip("\n") + "\n")

    def event(self, **fields: Any) -> None:
        self.line(json.dumps({"t": round(time.time(), 3), **fields}, sort_keys=True))


def peer_text(peer: Peer) -> str:
    """A socket address as text, IPv6 in brackets: "1.2.3.4:5", "[fd77::2]:5"."""
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of PATH ([] if it does not exist yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]
