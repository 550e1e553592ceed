"""The unit tests call the walk, the guard and the scrubbers in their own process:
a process apart from boxyd, so the parsers of payload bytes may run in it
(boxyd/config/parsedoor.py refuses that in boxyd; tests/unit/test_parseproc.py
checks both)."""

from boxyd.config import parsedoor

parsedoor.allow_local()


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_verdicts() -> None:
    """Each test judges its own bytes (the door keeps verdicts across a daemon's runs)."""
    parsedoor.MEMO.clear()
