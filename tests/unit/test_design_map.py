"""docs/design.md, "Where things are": every path the map names is a real file (or,
ending in /, a directory), so a reader who follows it lands somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TITLE = "## Where things are"
LIVE_GUARD = (
    "boxyd/plan/live.py",
    "boxyd/daemon/liveguard.py",
    "boxyd/daemon/livewatch.py",
    "boxyd/daemon/joinproc.py",
    "boxyd/stage2/joiner.py",
    "boxyd/stage2/live.py",
)


def _section(text: str) -> str:
    start = text.index(TITLE + "\n")
    end = text.find("\n## ", start + len(TITLE))
    return text[start : end if end != -1 else len(text)]


def _paths(section: str) -> list[str]:
    """Each `quoted` token that names a path in the repository: one that holds a / (a
    module, a directory), not an option, an absolute or a home path."""
    quoted = re.findall(r"`([^`\s]+)`", section)
    return [q for q in quoted if "/" in q and not q.startswith(("-", "/", "~"))]


def test_the_map_is_read() -> None:
    # the control: the section is found, and with it the paths it is known to name
    paths = _paths(_section((ROOT / "docs" / "design.md").read_text()))
    assert "boxyd/__main__.py" in paths and "boxyctl/commands/" in paths
    assert len(paths) > 100


def test_every_path_the_map_names_exists() -> None:
    paths = _paths(_section((ROOT / "docs" / "design.md").read_text()))
    missing = [
        p for p in paths if not ((ROOT / p).is_dir() if p.endswith("/") else (ROOT / p).is_file())
    ]
    assert not missing, f"docs/design.md, {TITLE!r} names what is not there: {missing}"


def test_the_live_guard_is_named_layer_by_layer() -> None:
    section = _section((ROOT / "docs" / "design.md").read_text())
    lines = [line for line in section.splitlines() if line.lstrip().startswith("- `")]
    for path in LIVE_GUARD:
        assert any(line.lstrip().startswith(f"- `{path}`: ") for line in lines), path
