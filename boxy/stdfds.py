"""Descriptors 0, 1 and 2 are open before a client opens anything (docs/design.md,
"The front door").

A program started with stdin, stdout or stderr closed (cron, a systemd unit, nohup,
an agent harness) hands the lowest free numbers to whatever it opens next: the
varlink connection to boxyd would become fd 0, and be passed into the sandbox as the
payload's stdin, with the user's whole authority over boxyd behind it. Every client
(boxyctl, boxy, boxy-sh, the hook, the library) calls ensure() first; boxyd's own
check of the fds it is handed (boxyd/daemon/passedfds.py) is the layer behind it.

Standard library only and cheap: the first thing every run does.
"""

from __future__ import annotations

import errno
import fcntl
import os


def ensure() -> list[int]:
    """Open each of 0–2 that is closed on /dev/null (read-write: a closed stdin and a
    closed stdout are both fine on it); the fds it opened. An fd that cannot be made
    /dev/null is an OSError: nothing may be opened while one of them is free."""
    opened: list[int] = []
    for fd in (0, 1, 2):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
            continue
        except OSError as e:
            if e.errno != errno.EBADF:
                raise
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: FD itself
        if null != fd:  # (a thread opened FD meanwhile): ours goes, FD is open now
            os.close(null)
            continue
        opened.append(fd)
    return opened
