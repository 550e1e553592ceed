"""Attacks on what --review holds (docs/design.md, "Changes held for review"): a write
of the payload's that reaches the host's work directory before `boxyctl apply`, by
a writable tree around it, over it or spelled another way. Each test prints
ESCAPED, and fails, only when a write landed on the host unreviewed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy
from tests.integration.reviewutil import ctl as _ctl
from tests.integration.reviewutil import nothing_held_after  # noqa: F401 (autouse)

pytestmark = pytest.mark.sandbox


def _escaped(what: str) -> None:
    print(f"ESCAPED: {what}")
    pytest.fail(f"ESCAPED: {what}")


def _repo(boxy: Boxy, name: str = "proj") -> Path:
    """A git repository NAME inside the test's directory: the run's work directory."""
    proj = boxy.workdir / name
    proj.mkdir()
    (proj / "app.py").write_text("X = 1\n")
    boxy.user.chown(boxy.workdir)
    r = boxy.user.run(["git", "init", "-q", str(proj)], cwd=proj)
    assert r.returncode == 0, r.stderr
    return proj


def _held_in(boxy: Boxy, proj: Path, script: str, *flags: str) -> str:
    """SCRIPT run with --review in PROJ: the run's stderr."""
    argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--review", *flags]
    r = boxy.user.run([*argv, "--", "sh", "-c", script], cwd=proj, input=b"")
    text = r.stderr.decode(errors="replace")
    assert r.returncode == 0, text
    return text


def _sid(text: str) -> str:
    m = re.search(r"boxyctl diff (\w+)", text)
    assert m, text
    return m.group(1)


def test_a_writable_tree_around_the_work_directory_puts_no_host_tree_over_it(
    boxy: Boxy,
) -> None:
    """--rw of the directory above the work directory: that tree's walk finds the work
    directory's repository and pins it (the directory above a nested repository, its
    gitdir: `self` pins, writable) from the host, over the overlay, so everything the
    payload wrote in the work directory reached the host, and the run said it changed
    nothing there."""
    proj = _repo(boxy)
    text = _held_in(boxy, proj, "echo a > new.txt && echo b > .git/evil", "--rw", str(boxy.workdir))
    landed = [n for n in ("new.txt", ".git/evil") if (proj / n).exists()]
    if landed:
        _escaped(f"{', '.join(landed)} reached the host's work directory before apply")
    sid = _sid(text)
    d = _ctl(boxy, "diff", sid).stdout.decode()
    assert "A new.txt" in d, d
    a = _ctl(boxy, "apply", sid, "new.txt")
    assert a.returncode == 0, a.stderr
    assert (proj / "new.txt").read_text() == "a\n"
