"""Every way a run can fail answers the client with one line and closes every fd boxyd
received: with boxyctl's stdout on a pipe, the reader reaches EOF (boxyd used to keep
the client's pipe on some paths, and `boxyctl … | cat` hung forever)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox


def _setup_symlinked_hooks(workdir: Path, user: User) -> None:
    os.makedirs(workdir / ".git/objects")
    os.makedirs(workdir / ".git/refs")
    (workdir / ".git/HEAD").write_text("ref: refs/heads/main\n")
    os.makedirs(workdir / "elsewhere")
    (workdir / ".git/hooks").symlink_to("../elsewhere")
    user.chown(workdir)


CASES = {
    # refused while the request is read (spec)
    "missing-ro": (["--ro", "/nonexistent/x"], None, 2, "no such file or directory"),
    "host-proc": (["--ro", "/proc"], None, 2, "the host's process table"),
    "bad-size": (["--memory", "lots"], None, 2, "--memory"),
    # refused while the sandbox is planned (a protected git entry is a symlink)
    "symlinked-hooks": ([], _setup_symlinked_hooks, 2, "a protected git entry is a symlink"),
    # the payload cannot even start
    "not-found": ([], None, 127, "command not found"),
}


@pytest.mark.parametrize("case", CASES)
def test_the_pipe_reaches_eof(boxy: Boxy, user: User, workdir: Path, case: str) -> None:
    flags, setup, want, words = CASES[case]
    if setup is not None:
        setup(workdir, user)
    cmd = ["no-such-command-here"] if case == "not-found" else ["echo", "ran"]
    argv = [str(BIN / "boxyctl"), "run", "--net", "none", *flags, "--", *cmd]
    script = f'{shlex.join(argv)} | cat; echo "rc=${{PIPESTATUS[0]}}"'
    r = user.run(["bash", "-c", script], cwd=workdir, timeout=30)  # a hang is a TimeoutExpired
    out = r.stdout.decode()
    assert f"rc={want}" in out, (out, r.stderr)
    lines = [
        ln for ln in r.stderr.decode().strip().splitlines() if "replaced an idle boxyd" not in ln
    ]  # a daemon of an earlier build, once
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.stderr.decode() and "internal error" not in r.stderr.decode()
