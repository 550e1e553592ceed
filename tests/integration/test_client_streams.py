"""No traceback, ever: boxyctl with its current directory removed, with stdout closed,
with stdout on a full device. One line on stderr and a sensible exit status."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.conftest import BIN, User

BOXYCTL = str(BIN / "boxyctl")

CASES = {
    # (shell redirection or setup, arguments, exit status, what stderr says: "" for nothing)
    "gone-cwd-help": ("gone", ["--help"], 0, ""),
    "gone-cwd-version": ("gone", ["--version"], 0, ""),
    "gone-cwd-run": (
        "gone",
        ["run", "--net", "none", "--", "true"],
        2,
        "the current directory was removed",
    ),
    "closed-help": (">&-", ["--help"], 1, "cannot write to standard output: it is closed"),
    "closed-version": (">&-", ["--version"], 1, "cannot write to standard output: it is closed"),
    "closed-profile-list": (">&-", ["profile", "list"], 1, "cannot write to standard output"),
    "full-help": (">/dev/full", ["--help"], 1, "cannot write to standard output: No space left"),
    "full-run-help": (">/dev/full", ["run", "--help"], 1, "No space left on device"),
    "full-doctor": (">/dev/full", ["doctor"], 1, "No space left on device"),
    "closed-stderr-bad-flag": ("2>&-", ["run", "--bogus"], 2, None),
}


@pytest.mark.parametrize("case", CASES)
def test_no_traceback(user: User, workdir: Path, case: str) -> None:
    how, args, status, words = CASES[case]
    cmd = shlex.join([BOXYCTL, *args])
    script = f"mkdir gone && cd gone && rmdir ../gone && {cmd}" if how == "gone" else f"{cmd} {how}"
    r = user.run(["bash", "-c", script], cwd=workdir, timeout=60)
    err = r.stderr.decode()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert r.returncode == status, (r.returncode, err)
    lines = err.strip().splitlines()
    if words is None:
        assert lines == []  # stderr closed: nothing, and no crash
    elif words:
        assert len(lines) == 1 and words in lines[0], err
    else:
        assert lines == [], err
