"""Reach boxyd: the client's connection logic lives in boxy.client (the library
shares it); these names stay importable from here for boxyctl's commands."""

from __future__ import annotations

from boxy.client import DAEMON_ENV, START_TIMEOUT, connect, wait_gone

__all__ = ["DAEMON_ENV", "START_TIMEOUT", "connect", "wait_gone"]
