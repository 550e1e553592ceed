"""`boxyctl profile list|show` and user profiles, as the unprivileged user: what a
profile does, resolved; only profiles are shown; NAME finds the user's own first."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox


@pytest.fixture
def user_profile(user: User) -> Iterator[Path]:
    d = user.home / ".config/boxy/profiles"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "boxytest-mine.yaml"
    path.write_text("description: the test's own\nnet: none\nenv:\n  MINE: from-my-profile\n")
    user.chown(user.home / ".config")
    yield path
    path.unlink(missing_ok=True)


def _boxyctl(user: User, cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], cwd=cwd)


def test_list_says_where_each_comes_from(user: User, workdir: Path, user_profile: Path) -> None:
    r = _boxyctl(user, workdir, "profile", "list")
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0, r.stderr
    mine = [ln for ln in lines if ln.startswith("boxytest-mine ")]
    assert mine and f"user {user_profile}" in mine[0] and "the test's own" in mine[0], lines
    assert any(ln.startswith("node ") and " preset " in ln and "registry" in ln for ln in lines), (
        lines
    )


def test_show_is_resolved_and_refuses_what_is_not_a_profile(user: User, workdir: Path) -> None:
    r = _boxyctl(user, workdir, "profile", "show", "offline")
    assert r.returncode == 0 and "  net: none" in r.stdout.decode(), r.stderr
    r = _boxyctl(user, workdir, "profile", "show", "/etc/passwd")
    err = r.stderr.decode().strip().splitlines()
    assert r.returncode == 2 and r.stdout == b"" and len(err) == 1, (r.stdout, r.stderr)
    assert "profile /etc/passwd:" in err[0]


def test_a_user_profile_is_used_by_name(boxy: Boxy, user_profile: Path) -> None:
    r = boxy.run("-p", "boxytest-mine", cmd=["sh", "-c", "echo $MINE"])
    assert r.returncode == 0 and r.stdout == b"from-my-profile\n", r.stderr
