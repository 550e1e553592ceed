"""The client's side of a newcomer's mistakes (issue 33 §2): each is one true line and
exit 2 before anything starts, or what the command is documented to do; `stop` says
it is stopping only a session that runs; the man page says each command's arguments
as the parser takes them."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boxy import pathcheck
from boxy.errors import NoSuchSession, UsageError
from boxy.outcome import Outcome, Reason, SessionInfo, State
from boxyctl import completion, parser
from boxyctl import main as boxyctl_main
from boxyctl.cli import parse
from boxyctl.commands import stop as stop_command
from boxyctl.commands.table import SUBCOMMANDS

ENV = {"HOME": "/home/u", "PATH": "/usr/bin"}
CWD = "/home/u/proj"


def refused(*argv: str, prog: str = "boxyctl", cwd: str = CWD) -> str:
    with pytest.raises(UsageError) as e:
        parse(list(argv), environ=ENV, cwd=cwd, prog=prog)
    assert "\n" not in str(e.value)
    return str(e.value)


# --- the work directory -------------------------------------------------------------


@pytest.fixture
def closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A directory the user may neither list nor enter, as an unprivileged user sees
    it (the unit tests may run as root, whom modes do not stop): os.access says no
    for it, and os.stat of anything below it is EACCES."""
    path = str(tmp_path / "closed")
    os.mkdir(path)
    os.mkdir(path + "/sub")
    real_access, real_stat = os.access, os.stat

    def access(p: Any, mode: int, **kw: Any) -> bool:
        return not str(p).startswith(path) and real_access(p, mode, **kw)

    def stat(p: Any, **kw: Any) -> os.stat_result:
        if str(p).startswith(path + "/"):
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real_stat(p, **kw)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "stat", stat)
    return path


def test_a_workdir_the_user_cannot_read_is_refused_by_the_client(closed: str) -> None:
    # was: accepted, then exit 125 after a session record ("Permission denied (the
    # tree changed while it was being read?); run again")
    assert refused("run", "-w", closed, "--", "true") == (
        f"--workdir {closed}: permission denied (you cannot list or enter it)"
    )
    # was: "not a directory"
    assert refused("run", "-w", closed + "/sub", "--", "true") == (
        f"--workdir {closed}/sub: permission denied ({closed} is closed to you)"
    )


def test_a_workdir_that_is_no_directory_says_which(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    cwd = str(tmp_path)
    assert (
        refused("run", "-w", "nope", "true", cwd=cwd) == f"--workdir {cwd}/nope: no such directory"
    )
    assert refused("run", "-w", "f", "true", cwd=cwd) == f"--workdir {cwd}/f: not a directory"
    assert refused("run", "-w", "f/x", "true", cwd=cwd) == (
        f"--workdir {cwd}/f/x: {cwd}/f is not a directory"
    )
    ok = parse(["run", "-w", ".", "true"], environ=ENV, cwd=cwd)
    assert ok.args["request"].options.workdir == cwd


def test_the_refusal_comes_before_a_daemon_is_contacted(
    closed: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    def contacted(*_: object) -> int:
        raise AssertionError("boxyd was contacted")

    monkeypatch.setattr("boxyctl.commands.run._run", contacted)
    assert boxyctl_main.main(["run", "-w", closed, "--", "true"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "permission denied" in err and "Traceback" not in err


def test_boxyd_refuses_a_current_directory_the_user_cannot_read(closed: str) -> None:
    """The daemon's own check (a library caller, or a cwd with x but not r): before
    the session is recorded, as the spec's first step."""
    from boxy.request import RunRequest
    from boxyd.config.spec import build_spec

    request = RunRequest(["true"], closed, None, {})
    with pytest.raises(UsageError) as e:
        build_spec(request, uid=os.getuid(), user="u", home="/nonexistent")
    assert str(e.value) == (
        f"the current directory {closed}: permission denied (you cannot list or enter it)"
    )


@pytest.mark.parametrize("flag", ["-w", "--ro", "--report"])
def test_a_path_over_the_kernels_limit_is_too_long(flag: str) -> None:
    long = "/" + "a/" * 2500
    line = refused("run", flag, long, "--", "true")  # was: "not a directory"
    name = "--workdir" if flag == "-w" else flag
    assert line.startswith(f"{name} /a/a/a") and "…" in line and len(line) < 300
    assert line.endswith(": too long (5000 bytes; Linux takes a path of at most 4095)")
    assert refused("run", "-w", "/" + "b" * 256, "true").endswith(
        ": a name in it is too long (256 bytes; Linux takes names of at most 255)"
    )


def test_pathcheck_on_the_real_filesystem(tmp_path: Path) -> None:
    assert pathcheck.directory_problem(str(tmp_path)) is None
    assert pathcheck.length_problem("/" + "a" * 255) is None
    assert pathcheck.length_problem("/" + "a/" * 2046) is None  # 4093 bytes
    assert pathcheck.shown("x" * 10) == "x" * 10
    assert len(pathcheck.shown("x" * 1000)) == 99


# --- `boxy` without `run` ----------------------------------------------------------------


def test_run_flags_without_run_say_so() -> None:
    # was: "none: not a command"
    assert refused("--net", "none", "--", "cmd", "a b", prog="boxy") == (
        "--net is a flag of run; did you mean: boxy run --net none -- cmd 'a b'"
    )
    assert refused("-pnode", "npm", "ci") == (
        "-p is a flag of run; did you mean: boxyctl run -pnode npm ci"
    )
    assert refused("--", "ls") == "no command before --; did you mean: boxyctl run -- ls"
    assert refused("--bogus") == "--bogus: unknown flag"


# --- --json and other flags a command has not --------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["watch", "--json"],
            "watch takes no --json: into a pipe it writes one line per event; "
            "`show --json ID` has the session",
        ),
        (
            ["logs", "--json", "ab12"],
            "logs takes no --json: it writes the session's output as the session wrote it; "
            "`show --json ID` has the session",
        ),
        (["attach", "--json", "ab12"], "attach takes no --json"),
        (
            ["daemon", "stop", "--json"],
            "daemon stop takes no --json: `daemon status --json` says what runs",
        ),
        (
            ["run", "--json", "--", "true"],
            "run takes no --json: --report FILE writes the run's summary as JSON",
        ),
        (
            ["cache", "clean", "--json"],
            "cache clean takes no --json: `cache list --json` lists the caches",
        ),
        (["ps", "-k"], "ps takes no -k"),
        (["stop", "--all", "ab12"], "stop takes no --all"),
    ],
)
def test_a_flag_of_another_command_is_named_as_such(argv: list[str], line: str) -> None:
    # was: "--json: unknown flag (did you mean --json?)"
    assert refused(*argv) == line


def test_daemon_status_and_stop_take_json() -> None:
    assert parse(["daemon", "status", "--json"], environ=ENV, cwd=CWD).args["json"] is True
    assert parse(["stop", "--json", "ab12"], environ=ENV, cwd=CWD).args["json"] is True


def test_an_unknown_flag_never_suggests_itself() -> None:
    line = parser._unrecognized("unrecognized arguments: --json", ["--json", "--jsonl"])
    assert line == "--json: unknown flag (did you mean --jsonl?)"


def test_the_missing_command_line_names_every_command() -> None:
    names = ", ".join(s.name for s in SUBCOMMANDS)
    assert "hook" in names
    assert refused() == f"missing command ({names}); see boxyctl --help"


# --- stop ---------------------------------------------------------------------------------


class FakeClient:
    """boxyd as stop sees it: Show and Stop over SESSIONS (id -> state)."""

    def __init__(self, sessions: dict[str, State]) -> None:
        self.sessions = sessions
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        name = method.rpartition(".")[2]
        self.calls.append((name, params))
        sid = next((s for s in self.sessions if s.startswith(params["id"])), None)
        if sid is None:
            raise NoSuchSession(params["id"])
        state = self.sessions[sid]
        if name == "Stop":
            state = State.KILLED
        outcome = Outcome(143, Reason.SIGNAL, signal=15) if state.finished else None
        info = SessionInfo(sid, state, ["sleep", "9"], "/w", None, 1.0, 2.0, outcome)
        return {"session": info.to_wire()}

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClient]:
    client = FakeClient({"0123abcd": State.RUNNING, "4567ef01": State.EXITED})
    monkeypatch.setattr("boxyctl.connect.connect", lambda: client)
    yield client


def test_stop_says_nothing_of_stopping_a_session_that_does_not_exist(
    fake: FakeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    status = stop_command.main({"ids": ["deadbeef"], "kill": False})
    cap = capfd.readouterr()
    assert status == NoSuchSession("x").exit_status
    # was: "stopping session deadbeef: SIGTERM, then SIGKILL…", then "no session"
    assert cap.err == "boxyctl: no session deadbeef (`boxyctl ps -a` lists them)\n"
    assert cap.out == "" and [c[0] for c in fake.calls] == ["Show"]


def test_stop_says_it_is_stopping_only_a_running_session(
    fake: FakeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    assert stop_command.main({"ids": ["0123", "4567ef01"], "kill": False}) == 0
    cap = capfd.readouterr()
    assert cap.err.count("stopping session") == 1 and "stopping session 0123abcd:" in cap.err
    assert [c[0] for c in fake.calls] == ["Show", "Stop", "Show"]
    assert fake.calls[1][1] == {"id": "0123abcd", "kill": False}  # the id boxyd named
    assert cap.out.splitlines()[0].startswith("session 0123abcd: ")
    assert cap.out.splitlines()[1].startswith("session 4567ef01: ")


def test_stop_json(fake: FakeClient, capfd: pytest.CaptureFixture[str]) -> None:
    status = stop_command.main({"ids": ["0123abcd", "nope"], "kill": True, "json": True})
    assert status == NoSuchSession("nope").exit_status
    doc = json.loads(capfd.readouterr().out)
    assert [(s["id"], s["state"]) for s in doc["sessions"]] == [("0123abcd", "killed")]


# --- the man page ---------------------------------------------------------------------


def test_the_man_page_says_each_commands_arguments() -> None:
    page = completion.man()
    assert "\\fBwatch\\fR [\\fIID\\fR]\n" in page  # was: watch ID (it is optional)
    assert "\\fBstop\\fR \\fIID\\fR...\n" in page  # was: stop ID (it takes several)
    assert "\\fBhook install\\fR \\fIHARNESS\\fR\n" in page
    assert "\\fBprofile show\\fR \\fINAME\\fR\n" in page
    # was: "Print the completion script for SHELL on stdout, e.g." and no example
    assert "bash\\-completion/completions/boxyctl" in page
    for name in ("BOXY_UPSTREAM_DNS", "BOXY_IDLE_EXIT", "BOXY_DEBUG"):
        assert f"\n{name}\n" in page, name
    for row in SUBCOMMANDS:  # hook too
        assert f".TP\n\\fB{row.name}\\fR" in page, row.name
