"""Attacks on --review (docs/design.md, "Changes held for review"): a change that
reaches the host without the person having seen it as it lands, or the overlay
undoing a protection a live run has. Each test prints ESCAPED, and fails, only when
the attack succeeded."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import unicodedata
from collections.abc import Iterator

import pytest

from tests.conftest import BIN, Boxy

pytestmark = pytest.mark.sandbox


@pytest.fixture(autouse=True)
def _nothing_held_after(boxy: Boxy) -> Iterator[None]:
    yield
    listed = _ctl(boxy, "ps", "--json")
    for s in json.loads(listed.stdout or b"{}").get("sessions", []):
        if s.get("review"):
            _ctl(boxy, "discard", s["id"])


def _ctl(boxy: Boxy, *args: str) -> subprocess.CompletedProcess[bytes]:
    return boxy.user.run([str(BIN / "boxyctl"), *args], cwd=boxy.workdir)


def _held(boxy: Boxy, code: str, *flags: str) -> str:
    """Run the Python CODE with --review; the session id its last line names."""
    r = boxy.run("--net", "none", "--review", *flags, cmd=["python3", "-c", code], input=b"")
    text = r.stderr.decode(errors="replace")
    assert r.returncode == 0, text
    m = re.search(r"boxyctl diff (\w+)", text)
    assert m, text
    return m.group(1)


def _escaped(what: str) -> None:
    print(f"ESCAPED: {what}")
    pytest.fail(f"ESCAPED: {what}")


def _unsafe_for_a_terminal(text: str) -> list[str]:
    """The characters of TEXT a terminal would act on or reorder: controls other than
    newline and tab, format characters (bidi overrides), line separators."""
    return sorted(
        {
            f"U+{ord(c):04X}"
            for c in text
            if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")
        }
    )


PAYLOAD_NAMES = r"""
import os
open('a\x1b]52;c;ZXZpbA==\x07b.txt', 'w').write('x\n')
open('notes.txt  3B\nA harmless.txt', 'w').write('y\n')
open('evil\u202etxt.sh', 'w').write('z\n')
open('src/app.py', 'w').write(
    'def f():\n    return 1\x1b[1A\x1b[2K\r    return 1\n'
    '# \u202e } if (admin) { \u2066\n'
)
"""


def test_diff_shows_the_payloads_names_and_content_with_no_terminal_control(boxy: Boxy) -> None:
    (boxy.workdir / "src").mkdir()
    (boxy.workdir / "src" / "app.py").write_text("def f():\n    return 1\n")
    boxy.user.chown(boxy.workdir)
    sid = _held(boxy, PAYLOAD_NAMES)
    d = _ctl(boxy, "diff", sid)
    assert d.returncode == 0, d.stderr
    out = d.stdout.decode(errors="replace")
    bad = _unsafe_for_a_terminal(out)
    if bad:
        _escaped(f"diff wrote {', '.join(bad)} to the terminal")
    if any(line.startswith("A harmless.txt") for line in out.splitlines()):
        _escaped("a file name made a summary line of its own")
    # the payload's content is still shown, made visible
    assert "return 1" in out and "admin" in out
    # --json carries the names as they are (JSON escapes them)
    data = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)
    assert "notes.txt  3B\nA harmless.txt" in {c["path"] for c in data["changes"]}


def test_a_mode_change_is_shown_in_the_diff(boxy: Boxy) -> None:
    (boxy.workdir / "run.sh").write_text("echo hi\n")
    os.chmod(boxy.workdir / "run.sh", 0o644)
    boxy.user.chown(boxy.workdir)
    sid = _held(boxy, "import os; os.chmod('run.sh', 0o755)")
    out = _ctl(boxy, "diff", sid).stdout.decode()
    a = _ctl(boxy, "apply", sid)
    assert a.returncode == 0, a.stderr
    landed = stat.S_IMODE(os.stat(boxy.workdir / "run.sh").st_mode)
    if landed & 0o111 and "755" not in out:
        _escaped(f"run.sh landed executable; the diff showed no mode: {out!r}")
