"""What the --review tests share: boxyctl as the test user, and nothing held after."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy


def ctl(boxy: Boxy, *args: str) -> subprocess.CompletedProcess[bytes]:
    return boxy.user.run([str(BIN / "boxyctl"), *args], cwd=boxy.workdir)


@pytest.fixture(autouse=True)
def nothing_held_after(boxy: Boxy) -> Iterator[None]:
    """What a test leaves held is discarded: a held session is listed by every `ps`
    and List of the user's, so it would reach the tests after this one. (Autouse in
    each module that imports it.)"""
    yield
    listed = ctl(boxy, "ps", "--json")
    for s in json.loads(listed.stdout or b"{}").get("sessions", []):
        if s.get("review"):
            ctl(boxy, "discard", s["id"])


def held_in(boxy: Boxy, proj: Path, script: str, *flags: str) -> str:
    """SCRIPT run with --review in PROJ: the run's stderr."""
    argv = [str(BIN / "boxyctl"), "run", "--net", "none", "--review", *flags]
    r = boxy.user.run([*argv, "--", "sh", "-c", script], cwd=proj, input=b"")
    text = r.stderr.decode(errors="replace")
    assert r.returncode == 0, text
    return text


def held_sid(text: str) -> str:
    """The session id a --review run's last line names."""
    m = re.search(r"boxyctl diff (\w+)", text)
    assert m, text
    return m.group(1)
