"""A terminal's settings (termios and window size) as plain JSON, captured from the
client's terminal by boxyd and set on the sandbox's PTY by PID 1 before the payload
can read them (its first prompt must already have the user's erase key and size)."""

from __future__ import annotations

import fcntl
import struct
import termios
from typing import Any

_WINSIZE = struct.Struct("HHHH")


def capture(fd: int) -> dict[str, Any]:
    attrs = termios.tcgetattr(fd)
    attrs[6] = [c[0] if isinstance(c, bytes) else c for c in attrs[6]]  # cc: bytes → int
    size = _WINSIZE.unpack(fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(_WINSIZE.size)))
    return {"termios": attrs, "winsize": list(size)}


def apply(fd: int, settings: dict[str, Any]) -> None:
    """Raises ValueError/TypeError for a malformed SETTINGS, OSError from the kernel."""
    attrs = list(settings["termios"])
    if len(attrs) != 7 or len(attrs[6]) != len(termios.tcgetattr(fd)[6]):
        raise ValueError("terminal settings: unexpected termios shape")
    attrs[6] = [int(c) for c in attrs[6]]
    termios.tcsetattr(fd, termios.TCSANOW, [int(a) for a in attrs[:6]] + [attrs[6]])
    rows, cols, xpix, ypix = (int(v) for v in settings["winsize"])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, _WINSIZE.pack(rows, cols, xpix, ypix))


def defaults(rows: int = 24, cols: int = 80) -> dict[str, Any]:
    """A fresh PTY's settings (cooked, echo, the kernel's control characters) at
    ROWS x COLS: for a session started with no terminal of the client's to copy."""
    import os

    master, slave = os.openpty()
    try:
        settings = capture(slave)
    finally:
        os.close(master)
        os.close(slave)
    settings["winsize"] = [rows, cols, 0, 0]
    return settings
