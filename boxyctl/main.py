"""boxyctl (also installed as boxy): the client. Imports neither asyncio, D-Bus nor
dnspython to run a command: start-up time is part of every sandboxed run."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from boxyd.errors import BoxyError, DaemonError

IFACE = "dev.boxy.Manager"


def _prog() -> str:
    from boxyctl.cli import prog_name

    return prog_name(sys.argv[0] if sys.argv else "boxyctl")


def say(msg: str) -> None:
    """One line on stderr; \\r\\n when the terminal may be in raw mode."""
    end = "\r\n" if os.isatty(2) else "\n"
    os.write(2, f"{_prog()}: {msg}{end}".encode(errors="replace"))


def main(argv: list[str] | None = None) -> int:
    from boxyctl import cli

    argv = sys.argv[1:] if argv is None else argv
    try:
        cmd = cli.parse(argv, environ=dict(os.environ), cwd=os.getcwd(), prog=_prog())
        if cmd.name == "help":
            sys.stdout.write(cmd.args["text"])
            return 0
        if cmd.name == "version":
            from boxyd.buildid import build_id

            print(f"boxy 0.1.0 (build {build_id()})")
            return 0
        if cmd.name == "run":
            return run(cmd.args)
        if cmd.name == "doctor":
            from boxyctl.doctor import run as doctor

            return doctor()
        if cmd.name == "daemon":
            return daemon(cmd.args)
        if cmd.name == "profile":
            return profile(cmd.args)
        say(f"{cmd.name}: sessions are not inspectable in this build yet")
        return 1
    except BoxyError as e:
        say(str(e))
        return e.exit_status
    except KeyboardInterrupt:
        return 130


def _stdio() -> list[int]:
    """Our fds 0–2 for the payload; a closed one is replaced by /dev/null."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def run(args: dict) -> int:
    from boxyctl.connect import connect, wait_gone
    from boxyctl.varlink import VarlinkError
    from boxyd.buildid import build_id

    args = {**args, "build": build_id()}
    for attempt in (1, 2):
        client = connect()
        try:
            return _run_once(client, args)
        except VarlinkError as e:
            name = e.name.removeprefix(IFACE + ".")
            if name == "BuildMismatch" and attempt == 1:
                try:
                    client.call(f"{IFACE}.Shutdown", {})
                except VarlinkError as busy:
                    raise DaemonError(
                        f"boxyd is running another build ({e.parameters.get('daemon_build')}) and has "
                        "sessions; run `boxyctl daemon restart` when they finish") from busy
                say("replaced an idle boxyd of another build")
                wait_gone()
                continue
            msg = e.parameters.get("message") or name
            if name == "InvalidArgument":
                say(msg)
                return 2
            raise DaemonError(msg) from None
        finally:
            client.close()
    return 1


def _run_once(client, args: dict) -> int:
    sid: list[str] = []

    def forward(signum: int, _frame: object) -> None:
        if sid:
            client.send_oneway(f"{IFACE}.Signal", {"id": sid[0], "signal": signum})

    def winch(rows: int, cols: int) -> None:
        if sid:
            client.send_oneway(f"{IFACE}.Resize", {"id": sid[0], "rows": rows, "cols": cols})

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(s, forward)
    raw = contextlib.ExitStack()
    final: dict = {}
    with raw:
        for reply in client.stream(f"{IFACE}.Run", args, fds=_stdio()):
            if "notice" in reply:  # -v: a denial, as it happens
                say(str(reply["notice"]))
            elif reply.get("state") == "running":
                sid.append(reply["id"])
                for w in reply.get("warnings", []):
                    say(w)
                if os.isatty(0) and not args["options"].get("detach"):
                    from boxyctl import tty  # threading and termios: only for a terminal

                    raw.enter_context(tty.raw_mode(0))
                    tty.on_winch(winch)
            else:
                final = reply
    if final.get("destinations"):  # every run with network: where it went
        os.write(2, str(final["destinations"]).encode(errors="replace"))
    for note in final.get("notes", []):
        say(str(note))
    if final.get("message"):
        say(final["message"])
    for line in final.get("findings", []):
        say(line)
    return int(final.get("exit_status", 1))


def daemon(args: dict) -> int:
    from boxyctl.connect import connect, wait_gone
    from boxyctl.varlink import VarlinkError

    action = args.get("action", "status")
    if action == "status":
        try:
            client = connect(start=False)
        except DaemonError:
            print("boxyd: not running")
            return 0
        st = client.call(f"{IFACE}.DaemonStatus", {})
        print(f"boxyd: running  pid {st.get('pid')}  build {st.get('build')}  "
              f"sessions running {st.get('sessions_running')}  up {st.get('uptime')}s")
        return 0
    try:
        client = connect(start=False)
        try:
            client.call(f"{IFACE}.Shutdown", {})
        except VarlinkError as e:
            say(f"daemon {action}: {e.parameters.get('message', e.name)}")
            return 1
        wait_gone()
    except DaemonError:
        pass
    if action == "restart":
        connect().close()
        print("boxyd: restarted")
    return 0


def profile(args: dict) -> int:
    from boxyd import profiles

    if args.get("action") == "list":
        for name in profiles.list_profiles():
            print(name)
        return 0
    sys.stdout.write(profiles.profile_text(args["name"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
