"""The client's side of a newcomer's mistakes (issue 33 §2): each is one true line and
exit 2 before anything starts, or what the command is documented to do."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from boxy import pathcheck
from boxy.errors import UsageError
from boxyctl import main as boxyctl_main
from boxyctl.cli import parse

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
