"""`boxyctl run`: a command in a fresh sandbox, followed until it ends (or, with -d,
left running with its id on stdout); --report FILE writes its summary."""

from __future__ import annotations

import os

from boxy import INTERFACE as IFACE
from boxy.errors import BoxyError, DaemonError
from boxyctl import sig
from boxyctl.follow import ENDING, Summary, decode, follow, report
from boxyctl.output import say

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:
    from typing import Any

    from boxy.request import RunRequest
    from boxy.varlink import Client


def main(args: dict[str, Any]) -> int:
    """A run; with --report FILE its summary is written there as it ends."""
    summary = Summary(counting=bool(args.get("report")))
    try:
        status = _run(args["request"], summary)
    except BoxyError as e:  # refused before it started: the report says so too
        if args.get("report"):
            summary.refused = (e.exit_status, str(e))
            _write_report(args["report"], summary)
        raise
    if args.get("report"):
        _write_report(args["report"], summary)
    return status


def _write_report(path: str, summary: Summary) -> None:
    """Written whole under a temporary name in FILE's directory, then renamed over
    FILE: a reader sees the old file or the new one, never half of one."""
    import json
    import tempfile

    out = summary.outcome
    doc: dict[str, Any] = {
        "id": summary.id or None,
        "exit_status": out.exit_status if out else None,
        "reason": out.reason.value if out else None,
        "state": out.state.value if out else None,
        "signal": out.signal if out else None,
        "message": (out.message or None) if out else None,
        "destinations": [d.to_wire() for d in out.destinations] if out else [],
        "refusals": [r.to_wire() for r in out.refusals] if out else [],
        "notices": summary.notices,
        "denials": summary.denials,
        "findings": list(out.findings) if out else [],
        "notes": list(out.notes) if out else [],
        "warnings": list(out.warnings) if out else [],
    }
    if summary.refused is not None:
        doc["exit_status"], doc["message"] = summary.refused
    directory = os.path.dirname(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".boxy-report.", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644 & ~_umask())
            os.replace(tmp, path)
        except BaseException:
            import contextlib

            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise BoxyError(f"--report {path}: not written: {e.strerror}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _run(request: RunRequest, summary: Summary) -> int:
    from boxy.buildid import build_id
    from boxy.client import with_retries

    request.build = build_id()
    # until a session follows (_follow): connecting, starting boxyd, `run -d`'s call
    for s in ENDING:
        sig.signal(s, _end_now)

    def once(client: Client, req: RunRequest) -> int:
        status = _run_once(client, req, summary)
        if summary.counting and summary.id and summary.outcome is not None:
            summary.denials = _denials(client, summary.id)
        return status

    return with_retries(request, once, environ=os.environ, say=say)


def _end_now(signum: int, _frame: object) -> None:
    """No session to pass it on to yet: the client ends (a session boxyd starts for a
    client already gone is stopped as it notices)."""
    raise DaemonError(f"{sig.name(signum)} before the session started: stopped waiting for boxyd")


def _denials(client: Client, sid: str) -> int | None:
    """The gateway's count of refused connections, for --report (None: not known)."""
    try:
        session = client.call(f"{IFACE}.Show", {"id": sid}).get("session") or {}
        return int(session.get("counters", {}).get("denials", 0))
    except (BoxyError, OSError, ValueError, AttributeError):
        return None


def _run_once(client: Client, request: RunRequest, summary: Summary | None = None) -> int:
    if request.options.detach:
        return _run_detached(client, request)
    return follow(client, "Run", request.to_wire(), [], summary)


def _run_detached(client: Client, request: RunRequest) -> int:
    """run -d: the session gets a terminal of its own (this one's settings, when
    there is one) and none of our fds; its id on stdout."""
    if os.isatty(0):
        from boxy import termsettings
        from boxy.request import Terminal

        request.terminal = Terminal.from_wire(termsettings.capture(0))
    from boxy.outcome import Ended, Running

    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        reply = decode(client.call(f"{IFACE}.Run", request.to_wire(), fds=[null, null, null]))
    finally:
        os.close(null)
    if isinstance(reply, Ended):  # it never started: how it ended
        return report(reply.outcome)
    if not isinstance(reply, Running):
        raise DaemonError(f"run -d: boxyd answered {reply.kind} instead of the session's id")
    for w in reply.warnings:
        say(w)
    print(reply.id)
    return 0
