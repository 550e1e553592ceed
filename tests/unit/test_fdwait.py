"""Waiting on one fd (boxy/fdwait.py) works for fds numbered past 1023, where
select(2) refuses them: boxyd holds about ten fds per running session."""

from __future__ import annotations

import os
import resource
import select
import socket

import pytest

from boxy import fdwait

HIGH = 1500


@pytest.fixture
def high_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, HIGH + 1), hard))


def test_a_pipe_past_1023_is_waited_on(high_limit: None) -> None:
    r, w = os.pipe()
    high = os.dup2(r, HIGH)
    try:
        with pytest.raises(ValueError):
            select.select([high], [], [], 0)  # what boxyd used, and why it failed
        assert not fdwait.readable(high, 0)
        assert fdwait.writable(w, 0)
        os.write(w, b"x")
        assert fdwait.readable(high, 0.5)
    finally:
        for fd in (r, w, high):
            os.close(fd)


def test_a_hung_up_peer_reads_as_readable(high_limit: None) -> None:
    a, b = socket.socketpair()
    high = socket.socket(fileno=os.dup2(a.fileno(), HIGH))
    a.close()
    try:
        assert not fdwait.readable(high, 0.01)
        b.close()
        assert fdwait.readable(high, None)
    finally:
        high.close()
