"""Attacks on what --review holds (docs/design.md, "Changes held for review"), third
round: what `diff` reads and `apply` lands after the run, where the run could change
the host's tree around the work directory. Each test prints ESCAPED, and fails, only
when a write of the payload's landed outside the work directory the run held, or
reached the host unreviewed."""

from __future__ import annotations

import pytest

from tests.conftest import Boxy
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


def test_apply_lands_in_no_directory_swapped_in_for_the_work_directory(boxy: Boxy) -> None:
    """--rw of a tree around the work directory (written as it ran, and said so): the
    payload cannot rename the work directory (a mount point in the sandbox) but can
    rename the directory above it, and leave a symlink to any directory of the user's
    at the work directory's path. apply opened that path following it, and landed the
    payload's held files there (~/.local/bin, ~/.config/autostart …); diff read that
    directory as the host's tree."""
    proj = boxy.workdir / "a" / "proj"
    proj.mkdir(parents=True)
    (proj / "app.py").write_text("X = 1\n")
    target = boxy.workdir / "target"
    target.mkdir()
    boxy.user.chown(boxy.workdir)
    a, b = boxy.workdir / "a", boxy.workdir / "b"
    script = f"echo evil > planted.sh && mv {a} {b} && mkdir {a} && ln -s {target} {a}/proj"
    sid = held_sid(held_in(boxy, proj, script, "--rw", str(boxy.workdir)))
    assert not (target / "planted.sh").exists()  # nothing landed before apply
    d = _ctl(boxy, "diff", sid)
    a_ = _ctl(boxy, "apply", sid)
    if (target / "planted.sh").exists():
        _escaped("apply landed a held file in the directory a symlink at the work directory names")
    said = (d.stderr + a_.stderr).decode()
    assert d.returncode != 0 and a_.returncode != 0, said
    assert "not the one the session ran in" in said, said
    # put back where it was, the review is the work directory's again and lands there
    (a / "proj").unlink()
    a.rmdir()
    b.rename(a)
    got = _ctl(boxy, "apply", sid)
    assert got.returncode == 0, got.stderr
    assert (proj / "planted.sh").read_text() == "evil\n"
