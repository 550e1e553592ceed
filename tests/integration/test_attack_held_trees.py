"""Attacks on what --review holds (docs/design.md, "Changes held for review"): a write
of the payload's that reaches the host's work directory before `boxyctl apply`, by
a writable tree around it, over it or spelled another way. Each test prints
ESCAPED, and fails, only when a write landed on the host unreviewed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy
from tests.integration.reviewutil import ctl as _ctl
from tests.integration.reviewutil import (
    held_in,
    held_sid,
    nothing_held_after,  # noqa: F401 (autouse)
)

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


def test_a_writable_tree_around_the_work_directory_puts_no_host_tree_over_it(
    boxy: Boxy,
) -> None:
    """--rw of the directory above the work directory: that tree's walk finds the work
    directory's repository and pins it (the directory above a nested repository, its
    gitdir: `self` pins, writable) from the host, over the overlay, so everything the
    payload wrote in the work directory reached the host, and the run said it changed
    nothing there."""
    proj = _repo(boxy)
    text = held_in(boxy, proj, "echo a > new.txt && echo b > .git/evil", "--rw", str(boxy.workdir))
    landed = [n for n in ("new.txt", ".git/evil") if (proj / n).exists()]
    if landed:
        _escaped(f"{', '.join(landed)} reached the host's work directory before apply")
    sid = held_sid(text)
    d = _ctl(boxy, "diff", sid).stdout.decode()
    assert "A new.txt" in d, d
    a = _ctl(boxy, "apply", sid, "new.txt")
    assert a.returncode == 0, a.stderr
    assert (proj / "new.txt").read_text() == "a\n"


def test_a_writable_tree_spelled_through_a_symlink_is_refused(boxy: Boxy) -> None:
    """--rw LINK/sub, LINK a symlink to the work directory: the spelling lies outside
    it, so it was a tree of its own, the host's work directory's sub bound writable
    (said as `not held` under a name the person does not read as the work directory).
    Refused, with the name to give it by (then held as any tree inside it)."""
    proj = _repo(boxy)
    (proj / "sub").mkdir()
    link = boxy.workdir / "link"
    link.symlink_to("proj")
    boxy.user.chown(boxy.workdir)
    argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--review", "--rw", f"{link}/sub"]
    r = boxy.user.run([*argv, "--", "sh", "-c", f"echo a > {link}/sub/f"], cwd=proj, input=b"")
    if (proj / "sub" / "f").exists():
        _escaped("a write through a symlinked --rw reached the host's work directory")
    assert r.returncode == 2 and b"by another name" in r.stderr, r.stderr


def test_a_writable_tree_above_spelled_through_a_symlink_is_refused(
    boxy: Boxy,
) -> None:
    """--rw LINK, LINK a symlink to the directory above the work directory: in the
    sandbox LINK/proj is the host's work directory, writable, beside the overlay."""
    proj = _repo(boxy)
    link = boxy.user.home / f".{boxy.workdir.name}-link"
    # relative: an absolute one is not found under stage 2's old root, and the run fails
    link.symlink_to(boxy.workdir.relative_to(boxy.user.home))
    try:
        argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--review", "--rw", str(link)]
        script = f"echo a > {link}/proj/f"
        r = boxy.user.run([*argv, "--", "sh", "-c", script], cwd=proj, input=b"")
        if (proj / "f").exists():
            _escaped("a write through a symlinked --rw above reached the host's work directory")
        assert r.returncode == 2 and b"by another name" in r.stderr, r.stderr
    finally:
        subprocess.run(["rm", "-f", str(link)], check=False)
