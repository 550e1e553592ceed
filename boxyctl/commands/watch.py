"""`boxyctl watch [ID]`: a session as it happens (a board on a terminal, one line
per event into a pipe), then its summary."""

from __future__ import annotations

import os
import sys

from boxy import INTERFACE as IFACE
from boxyctl import sig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def main(args: dict[str, Any]) -> int:
    """One line per event as it happens (a pipe: `boxyctl watch ID | grep deny`); a
    finished session prints its summary. ^C ends the watching, not the session."""
    import time

    from boxy.outcome import SessionInfo
    from boxyctl import sessions as text
    from boxyctl.connect import connect

    # ^C ends the watching (exit 130), even when started with SIGINT ignored (a
    # background job of a script): the session is not ours to stop
    sig.signal(sig.SIGINT, sig.default_int_handler())
    client = connect()
    screen = os.isatty(1)  # a terminal: repainted; a pipe: one line per event, no repaint
    last: SessionInfo | None = None
    board: text.Board | None = None
    painted = 0.0
    try:
        params = {"id": args["id"]} if args.get("id") else {}
        for reply in client.stream(f"{IFACE}.Watch", params):
            ev = reply.get("event")
            if isinstance(ev, dict):
                if board is not None:
                    board.event(ev)
                    # a flood repaints ten times a second, not once an event
                    if ev.get("kind") in ("counters", "state") or time.monotonic() - painted > 0.1:
                        _paint(board.render(time.time()))
                        painted = time.monotonic()
                elif ev.get("kind") != "counters":  # snapshots, not events
                    start = last.started_at if last is not None else 0.0
                    print(text.event_line(ev, start=start, color=False), flush=True)
            elif (info := SessionInfo.from_wire(reply.get("session"))) is not None:
                if last is None and not info.state.finished:
                    if screen:
                        board = text.Board(info)
                        _paint(board.render(time.time()))
                    else:
                        print(text.header_line(info, time.time()), flush=True)
                last = info
    finally:
        client.close()
    if last is not None and last.state.finished:
        for line in text.show_lines(last, time.time()):
            print(line)
    return 0


def _paint(lines: list[str]) -> None:
    """Home, clear, the board: one write, so a frame never shows half drawn."""
    sys.stdout.write("\x1b[H\x1b[J" + "\n".join(lines) + "\n")
    sys.stdout.flush()
