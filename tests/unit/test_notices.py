"""boxy/notices.py: what boxyd left for the hook's next answer, taken once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boxy import notices


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path / "boxy" / "notices"


def test_left_then_taken_once(state: Path) -> None:
    notices.leave("ab12", ["quarantined /w/.mcp.json", "quarantined /w/.claude"])
    notices.leave("cd34", [])  # nothing to say: no file
    assert len(os.listdir(state)) == 1 and state.stat().st_mode & 0o777 == 0o700
    assert notices.take() == [
        "session ab12: quarantined /w/.mcp.json",
        "session ab12: quarantined /w/.claude",
    ]
    assert notices.take() == []


def test_bounded_in_count_and_length(state: Path) -> None:
    for i in range(notices.KEEP + 5):
        notices.leave(f"s{i}", ["y" * (notices.LINE_MAX * 2)])
    assert len(os.listdir(state)) == notices.KEEP
    got = notices.take()
    assert len(got) == notices.TAKE and all(len(x) < notices.LINE_MAX + 20 for x in got)


def test_a_planted_entry_is_never_followed(state: Path, tmp_path: Path) -> None:
    state.mkdir(parents=True)
    (tmp_path / "secret").write_text("not yours")
    (state / "x").symlink_to(tmp_path / "secret")
    os.mkfifo(state / "y")
    assert notices.take() == []  # neither read nor waited on
    assert (tmp_path / "secret").read_text() == "not yours"


def test_never_raises_where_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "file"))
    notices.leave("ab12", ["x"])
    assert notices.take() == []
