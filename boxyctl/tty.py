"""The client's own terminal: raw mode while a run owns it, window size, SIGWINCH.

Standard library only (client start-up path).
"""

from __future__ import annotations

import contextlib
import os
import signal
import termios
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

# Signals whose default action ends the client; the terminal is restored first.
_FATAL = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

_IFLAG, _OFLAG, _CFLAG, _LFLAG, _CC = 0, 1, 2, 3, 6


def _make_raw(attrs: list[Any]) -> list[Any]:
    """cfmakeraw(3), as tty.setraw does: bytes in and out untouched, no signals
    from keys (the PTY inside the daemon interprets Ctrl-C for the payload)."""
    new = list(attrs)
    new[_IFLAG] &= ~(
        termios.IGNBRK
        | termios.BRKINT
        | termios.PARMRK
        | termios.ISTRIP
        | termios.INLCR
        | termios.IGNCR
        | termios.ICRNL
        | termios.IXON
    )
    new[_OFLAG] &= ~termios.OPOST
    new[_CFLAG] &= ~(termios.CSIZE | termios.PARENB)
    new[_CFLAG] |= termios.CS8
    new[_LFLAG] &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cc = list(new[_CC])
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    new[_CC] = cc
    return new


class Raw:
    """The terminal while a run owns it (what raw_mode yields)."""

    def __init__(self, fd: int, saved: list[Any]) -> None:
        self.fd = fd
        self.saved = saved

    def restore(self) -> None:
        # TCSANOW: TCSADRAIN could wait forever on a terminal stopped with Ctrl-S.
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetattr(self.fd, termios.TCSANOW, self.saved)

    def suspend(self) -> None:
        """The payload stopped (^Z): give the shell its terminal back as it was and stop
        as a job does; once `fg` continues us, take the terminal's settings as they are
        now (the user may have changed them meanwhile) and go raw again."""
        self.restore()
        previous = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signal.SIGTSTP)  # returns once we are continued
        finally:
            signal.signal(signal.SIGTSTP, previous)
        with contextlib.suppress(termios.error, OSError):
            self.saved = termios.tcgetattr(self.fd)
            termios.tcsetattr(self.fd, termios.TCSANOW, _make_raw(self.saved))


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[Raw]:
    """Put terminal FD in raw mode; restore the saved attributes on exit, and also
    when SIGTERM, SIGHUP or SIGQUIT would end the process: restore, then die of the
    signal's default action. A Python handler installed before entering is still
    called instead (its exception unwinds through here and restores too); an
    ignored signal stays ignored. Handlers are only installed on the main thread."""
    raw = Raw(fd, termios.tcgetattr(fd))
    restore = raw.restore
    previous: dict[int, Any] = {}

    def on_fatal(signum: int, frame: FrameType | None) -> None:
        prev = previous.get(signum)
        if callable(prev):  # the caller handles it (e.g. forwards it to the payload)
            prev(signum, frame)
            return
        if prev == signal.SIG_IGN:
            return
        restore()
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)

    if threading.current_thread() is threading.main_thread():
        for sig in _FATAL:
            previous[sig] = signal.signal(sig, on_fatal)
    try:
        termios.tcsetattr(fd, termios.TCSANOW, _make_raw(raw.saved))
        yield raw
    finally:
        restore()
        for signum, handler in previous.items():
            # None: a handler installed outside Python, which we cannot reinstall.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def window_size(fd: int) -> tuple[int, int] | None:
    """(rows, cols) of terminal FD, or None when it is not a terminal or has no size."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    if size.lines == 0 and size.columns == 0:
        return None
    return size.lines, size.columns


def on_winch(callback: Callable[[int, int], None], fd: int | None = None) -> Callable[[], None]:
    """Call CALLBACK(rows, cols) with FD's new size (default: the first of 0, 1, 2
    that has one) whenever the window changes; it runs on the main thread between
    bytecodes. Returns a function that puts the previous handler back."""

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        for candidate in (fd,) if fd is not None else (0, 1, 2):
            size = window_size(candidate)
            if size is not None:
                callback(*size)
                return

    previous = signal.signal(signal.SIGWINCH, on_signal)

    def put_back() -> None:
        signal.signal(signal.SIGWINCH, signal.SIG_DFL if previous is None else previous)

    return put_back
