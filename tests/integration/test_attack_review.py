"""Attacks on --review (docs/design.md, "Changes held for review"): a change that
reaches the host without the person having seen it as it lands, or the overlay
undoing a protection a live run has. Each test prints ESCAPED, and fails, only when
the attack succeeded."""

from __future__ import annotations

import json
import os
import re
import stat
import unicodedata

import pytest

from tests.conftest import Boxy
from tests.integration.reviewutil import ctl as _ctl
from tests.integration.reviewutil import nothing_held_after  # noqa: F401 (autouse)

pytestmark = pytest.mark.sandbox


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


BARE_REPO = r"""
import os
os.makedirs('evil/objects'); os.makedirs('evil/refs/heads')
open('evil/HEAD', 'w').write('ref: refs/heads/main\n')
open('evil/config', 'w').write('[core]\n\tfsmonitor = touch ../PWNED\n')
"""


def test_a_bare_repository_the_payload_made_is_held_as_a_live_run_holds_it(boxy: Boxy) -> None:
    boxy.user.chown(boxy.workdir)
    live = _live(boxy, BARE_REPO)
    assert not (boxy.workdir / "live" / "evil" / "config").exists(), live  # a live run's
    sid = _held(boxy, BARE_REPO)
    listed = {c["path"]: c for c in json.loads(_ctl(boxy, "diff", "--json", sid).stdout)["changes"]}
    a = _ctl(boxy, "apply", sid)
    if (boxy.workdir / "evil" / "config").exists():
        _escaped(f"apply landed a bare repository's config: {listed.get('evil/config')}")
    assert a.returncode == 1, a.stderr
    assert "git control file" in listed["evil/config"]["held"]


def _host_repo(boxy: Boxy, *config: str) -> None:
    boxy.user.chown(boxy.workdir)
    git = ["git", "-C", str(boxy.workdir)]
    assert boxy.user.run([*git, "init", "-q"]).returncode == 0
    for kv in config:
        k, v = kv.split("=", 1)
        assert boxy.user.run([*git, "config", k, v]).returncode == 0


def _live(boxy: Boxy, code: str, *config: str) -> str:
    """Run CODE live (no --review) in a project of its own beside BOXY's, set up as
    BOXY's is (CONFIG: its repository's); its stderr (the guard's last lines)."""
    other = Boxy(boxy.user, boxy.workdir / "live")
    other.workdir.mkdir()
    if config:
        _host_repo(other, *config)
    boxy.user.chown(other.workdir)
    r = other.run("--net", "none", cmd=["python3", "-c", code], input=b"")
    return r.stderr.decode(errors="replace")


def test_a_hook_in_the_hosts_core_hookspath_is_held(boxy: Boxy) -> None:
    code = (
        "import os; os.makedirs('githooks', exist_ok=True); "
        "open('githooks/pre-commit', 'w').write('#!/bin/sh\\ntouch PWNED\\n'); "
        "os.chmod('githooks/pre-commit', 0o755)"
    )
    live = _live(boxy, code, "core.hooksPath=githooks")
    assert not (boxy.workdir / "live" / "githooks" / "pre-commit").exists(), live
    _host_repo(boxy, "core.hooksPath=githooks")
    sid = _held(boxy, code)
    _ctl(boxy, "apply", sid)
    if (boxy.workdir / "githooks" / "pre-commit").exists():
        _escaped("apply landed a hook in the directory the host's core.hooksPath names")


def test_a_config_the_hosts_git_includes_is_held(boxy: Boxy) -> None:
    code = "open('project.gitconfig', 'w').write('[core]\\n\\tfsmonitor = touch PWNED\\n')"
    live = _live(boxy, code, "include.path=../project.gitconfig")
    assert not (boxy.workdir / "live" / "project.gitconfig").exists(), live
    _host_repo(boxy, "include.path=../project.gitconfig")
    sid = _held(boxy, code)
    _ctl(boxy, "apply", sid)
    if (boxy.workdir / "project.gitconfig").exists():
        _escaped("apply landed a config file the host's git includes")
