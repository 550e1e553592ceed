"""--json and run --report: the documents scripts read (their keys are the README's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from boxy import checks as doctor
from boxy.checks import Check
from boxy.errors import UsageError
from boxy.outcome import Destination, Outcome, Reason, Refusal
from boxyctl.cli import parse
from boxyctl.commands import run as run_command
from boxyctl.follow import Summary
from boxyd.config import profileview

ENV = {"HOME": "/home/u", "PATH": "/usr/bin"}


def test_report_is_a_client_flag_checked_before_the_run(tmp_path: Path) -> None:
    cmd = parse(["run", "--report", "r.json", "--", "true"], environ=ENV, cwd=str(tmp_path))
    assert cmd.args["report"] == str(tmp_path / "r.json")
    assert "report" not in cmd.args["request"].options.to_wire()  # boxyd never sees it
    for argv, why in (
        (["--report", "no/such/r.json"], "is not a directory"),
        (["--report", "."], "is a directory"),
        (["-d", "--report", "r.json"], "-d"),
    ):
        with pytest.raises(UsageError, match=why):
            parse(["run", *argv, "--", "true"], environ=ENV, cwd=str(tmp_path))
    with pytest.raises(UsageError, match="--json goes with --list"):
        parse(["trust", "--json"], environ=ENV, cwd=str(tmp_path))


def test_the_report_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    s = Summary()
    s.id, s.notices, s.denials = "ab12cd34", ["denied evil.example:443"], 1
    row = Destination("registry.example", 3, 1, 2, 2000, 9000)
    no = Refusal("net.dns", "dns", None, None, "evil.example", "not in the allowlist", 2)
    s.outcome = Outcome(3, Reason.EXIT, findings=["f"], destinations=[row], refusals=[no])
    run_command._write_report(str(path), s)
    doc = json.loads(path.read_text())
    assert doc == {
        "id": "ab12cd34",
        "exit_status": 3,
        "reason": "exit",
        "state": "exited",
        "signal": None,
        "message": None,
        "destinations": [
            {
                "name": "registry.example",
                "connections": 3,
                "denied": 1,
                "addresses": 2,
                "bytes_up": 2000,
                "bytes_down": 9000,
            }
        ],
        "refusals": [
            {
                "layer": "net.dns",
                "proto": "dns",
                "addr": None,
                "port": None,
                "host": "evil.example",
                "reason": "not in the allowlist",
                "count": 2,
            }
        ],
        "notices": ["denied evil.example:443"],
        "denials": 1,
        "findings": ["f"],
        "notes": [],
        "warnings": [],
    }
    assert os.listdir(tmp_path) == ["r.json"]  # no temporary file left behind


def test_doctor_json() -> None:
    doc = doctor.as_doc([Check("seccomp", True, "yes", True), Check("veth", False, "no", False)])
    assert doc["ok"] is True
    checks = doc["checks"]
    assert isinstance(checks, list)
    assert checks[1] == {
        "name": "veth",
        "ok": False,
        "required": False,
        "detail": "no",
        "to_get_it": doctor.TO_GET_IT["veth"],
    }
    assert doctor.as_doc([Check("seccomp", False, "", True)])["ok"] is False


def test_doctor_runs_the_checks_itself_when_boxyd_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The real probe (a child process), and the line that says where it ran (said on
    fd 2, as boxyctl says everything)."""
    from boxy.errors import DaemonError
    from boxyctl import connect
    from boxyctl.commands import doctor as command

    def unreachable(**_: object) -> None:
        raise DaemonError("cannot start boxyd: for this test")

    monkeypatch.setattr(connect, "connect", unreachable)
    status = command.main({"json": True})
    out, err = capfd.readouterr()
    assert "boxyd could not be reached (cannot start boxyd: for this test)" in err
    doc = json.loads(out)
    assert [c["name"] for c in doc["checks"]][:2] == ["kernel", "writer-pidfd"]
    assert status == (0 if doc["ok"] else 1)


def test_profile_list_rows_are_what_the_lines_say(tmp_path: Path) -> None:
    rows = profileview.list_rows(str(tmp_path))
    assert {r["name"] for r in rows} >= {"generic", "node"}
    assert all(set(r) == {"name", "kind", "path", "shadows_preset", "description"} for r in rows)
    assert len(profileview.list_lines(str(tmp_path))) == len(rows)
