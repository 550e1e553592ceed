"""The few signal calls a run makes, on the signal module's C half (_signal).

The signal module turns its constants into enums as it is imported (2 ms of every
client start); a run needs only to install handlers and a timer, by number. A
signal's name, for a message, comes from the signal module, loaded only then.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub: the names below are typed

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

    Handler = Callable[[int, FrameType | None], object] | int

SIGINT: int = _signal.SIGINT
SIGTERM: int = _signal.SIGTERM
SIGHUP: int = _signal.SIGHUP
SIGQUIT: int = _signal.SIGQUIT
SIGALRM: int = _signal.SIGALRM
SIGCONT: int = _signal.SIGCONT
ITIMER_REAL: int = _signal.ITIMER_REAL


def signal(signum: int, handler: Handler) -> object:
    """signal.signal: the previous handler."""
    return _signal.signal(signum, handler)


def setitimer(which: int, seconds: float) -> None:
    _signal.setitimer(which, seconds)


def default_int_handler() -> Handler:
    """signal.default_int_handler (what raises KeyboardInterrupt)."""
    handler: Handler = _signal.default_int_handler
    return handler


def name(signum: int) -> str:
    """SIGTERM for 15: for a message, never on the way of a run."""
    import signal as signal_module

    try:
        return signal_module.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
