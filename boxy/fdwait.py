"""Waiting on one fd with poll(2), never select(2): select takes no fd numbered 1024
or above (ValueError), and boxyd holds about ten fds per running session, so past
about a hundred sessions every select in the daemon failed."""

from __future__ import annotations

import select
from typing import Protocol


class HasFileno(Protocol):
    def fileno(self) -> int: ...


def _ready(fd: int | HasFileno, events: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(None if timeout is None else max(timeout, 0.0) * 1000))


def readable(fd: int | HasFileno, timeout: float | None) -> bool:
    """FD has something to read, or its peer hung up, within TIMEOUT seconds (None:
    however long it takes; 0: now)."""
    return _ready(fd, select.POLLIN, timeout)


def writable(fd: int | HasFileno, timeout: float | None) -> bool:
    """FD takes a write, or failed, within TIMEOUT seconds (None: however long)."""
    return _ready(fd, select.POLLOUT, timeout)
