"""The claude profile with a stand-in `claude` and a fake ~/.claude: it works on the
first run in a new project, the token is readable, nothing of other projects (their
transcripts, the prompt history, shell snapshots) is there, a refreshed token cannot
rewrite the host's, and this project's transcripts are kept. The stand-in prints
ESCAPED for anything of the host it can reach that it should not."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Boxy, User

pytestmark = pytest.mark.sandbox

TOKEN = '{"claudeAiOauth": {"accessToken": "sk-ant-oat-test-7d1f", "refreshToken": "r1"}}\n'
STAND_IN = r"""#!/bin/sh
c="$HOME/.claude"
grep -q sk-ant-oat-test-7d1f "$c/.credentials.json" && echo TOKEN-READABLE
[ -e "$c/history.jsonl" ] && echo "ESCAPED: the prompt history"
[ -e "$c/shell-snapshots" ] && echo "ESCAPED: shell snapshots"
[ -e "$c/projects/-home-someone-other" ] && echo "ESCAPED: another project's transcripts"
ls "$c/projects" | tr '\n' ' ' | sed 's/^/PROJECTS /'; echo
grep -q '"mcpServers"' "$HOME/.claude.json" && echo MCP-CONFIG
grep -q "Be brief" "$c/CLAUDE.md" && echo CLAUDE-MD
(echo tampered >> "$c/CLAUDE.md") 2>/dev/null && echo "ESCAPED: CLAUDE.md is writable"
(echo tampered >> "$0") 2>/dev/null && echo "ESCAPED: the claude binary is writable"
echo '{"claudeAiOauth": {"accessToken": "refreshed"}}' > "$c/.credentials.json" && echo REFRESHED
echo '{"type": "user", "text": "hi"}' > "$c/projects/$1/session-1.jsonl" && echo TRANSCRIPT
"""


@pytest.fixture
def fake_claude(user: User) -> Iterator[Path]:
    """~/.claude and ~/.local/bin/claude -> a versioned binary, in the test user's home."""
    home = user.home
    made = [
        home / ".claude",
        home / ".local/share/claude-test",
        home / ".config/boxy/claude-mcp.json",
    ]
    link = home / ".local/bin/claude"
    for p in made + [link]:
        if p.exists() or p.is_symlink():
            pytest.fail(f"{p} exists in the test user's home: not ours to replace")
    claude = home / ".claude"
    (claude / "projects/-home-someone-other").mkdir(parents=True)
    (claude / "projects/-home-someone-other/old.jsonl").write_text('{"secret": "other project"}\n')
    (claude / "shell-snapshots").mkdir()
    (claude / "history.jsonl").write_text('{"display": "my private prompt"}\n')
    (claude / ".credentials.json").write_text(TOKEN)
    (claude / "CLAUDE.md").write_text("Be brief.\n")
    binary = home / ".local/share/claude-test/versions/1.0.0"
    binary.parent.mkdir(parents=True)
    binary.write_text(STAND_IN)
    binary.chmod(0o755)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(binary)
    mcp = home / ".config/boxy/claude-mcp.json"
    mcp.parent.mkdir(parents=True, exist_ok=True)
    mcp.write_text('{"mcpServers": {}}\n')
    for p in [
        *claude.rglob("*"),
        claude,
        binary,
        link,
        mcp,
        *binary.parents,
        *link.parents,
        *mcp.parents,
    ]:
        if p.is_relative_to(home) and p != home:
            user.chown(p)  # created as root: the user's, as its own tools would make them
    try:
        yield claude
    finally:
        shutil.rmtree(claude, ignore_errors=True)
        shutil.rmtree(home / ".local/share/claude-test", ignore_errors=True)
        link.unlink(missing_ok=True)
        mcp.unlink(missing_ok=True)


def test_the_claude_profile_with_a_stand_in(
    boxy: Boxy, user: User, workdir: Path, fake_claude: Path
) -> None:
    slug = re.sub(r"[^A-Za-z0-9]", "-", str(workdir))
    transcripts = fake_claude / "projects" / slug
    assert not transcripts.exists()  # a new project: the first run creates it
    r = boxy.run(
        "-p", "claude", "--net", "none", cmd=[str(user.home / ".local/bin/claude"), slug], input=b""
    )
    out = r.stdout.decode()
    assert r.returncode == 0, (out, r.stderr.decode())
    assert "ESCAPED" not in out, out
    for line in ("TOKEN-READABLE", "MCP-CONFIG", "CLAUDE-MD", "REFRESHED", "TRANSCRIPT"):
        assert line in out.splitlines(), (line, out, r.stderr.decode())
    assert f"PROJECTS {slug} " in out  # this project only
    assert (fake_claude / ".credentials.json").read_text() == TOKEN  # the host's is unchanged
    assert (fake_claude / "CLAUDE.md").read_text() == "Be brief.\n"
    assert (transcripts / "session-1.jsonl").read_text() == '{"type": "user", "text": "hi"}\n'
    again = boxy.run(
        "-p",
        "claude",
        "--net",
        "none",
        cmd=["ls", str(user.home / f".claude/projects/{slug}")],
        input=b"",
    )
    assert again.stdout.decode().split() == ["session-1.jsonl"]  # kept for /resume
