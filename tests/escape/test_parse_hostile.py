"""Files a payload wrote that made boxyd's parsers hang or fail (issue #30 §2's table)
and variants of them: every one is in a project at once, and two runs in it in a row
start, run and end (before: 16 s to never; every later run exit 125). The terminal
sequence that took the filter days goes through a real PTY session. What is asserted is
that nothing hangs (the timeouts are generous: a loaded 2-core machine) or breaks, and
that what a run covers is covered; how long a run takes is no bound here."""

from __future__ import annotations

import os

import pytest

from tests.conftest import LIB, Boxy
from tests.escape.conftest import HOST_PY, describe

pytestmark = pytest.mark.sandbox

HOSTILE: dict[str, bytes] = {
    # the table
    ".npmrc": b"a" + b" " * (64 << 10) + b"b\n//r.test/:_authToken=npm-canary\n",
    "venv1/pip.conf": b"[global]\nindex-url" + b" " * (64 << 10) + b"x\n",
    "venv2/pip.conf": b"[global]\nk" + b" " * (64 << 10) + b"=v\n",
    "poetry.toml": b"[" + b" [" * 2000 + b"\n",
    ".git-credentials": b"https://" + b"a" * (256 << 10) + b"\n",
    "sub/.yarnrc.yml": b"a: &a [*a]\n",
    ".yarnrc.yml": b"[" * 3000,
    "package.json": b"[" * 100_000,
    ".boxy.yaml": b"x: 0x" + b"1" * 4400 + b"\n",
    # variants the issue does not name
    "pnpm-workspace.yaml": b"a: &a [x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n"
    + b"".join(
        b"%c: &%c [*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c]\n" % ((c, c) + (c - 1,) * 8)
        for c in range(99, 110)
    ),
    "w/.yarnrc.yml": b"-" * (64 << 10) + b"x\n",
    "w/.npmrc": b"k" + b"\t" * (64 << 10) + b"\n",
    ".cargo/config.toml": b"[[" + b" " * 4000 + b"a\n",
    ".kube/config": b"users:\n" + b"- " * (32 << 10) + b"a:\n",
    ".netrc": b"machine h login u password" + b" " * (64 << 10) + b"\n",
    "venv1/pyvenv.cfg": b"home = /usr/bin\n",
    "venv2/pyvenv.cfg": b"home = /usr/bin\n",
}


def plant(boxy: Boxy) -> None:
    for rel, data in HOSTILE.items():
        path = boxy.workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    boxy.user.chown(boxy.workdir)


def test_every_hostile_file_at_once_and_two_runs_in_a_row(boxy: Boxy) -> None:
    plant(boxy)
    for _attempt in (1, 2):
        # (a hang is the 120 s TimeoutExpired; how long a run takes is no bound here)
        r = boxy.sh("cat .npmrc .git-credentials | grep -c canary; echo ran", timeout=120)
        assert r.returncode == 0, describe(r)
        assert r.stdout.endswith(b"ran\n") and b"npm-canary" not in r.stdout, describe(r)
        assert b"internal error" not in r.stderr, describe(r)


FLOOD = (
    "import sys, time\n"
    "seq = b'\\x1b[?' + b'0;' * 40 + b'2h'\n"
    "sys.stdout.buffer.write(seq * 200 + b'then-this\\n'); sys.stdout.flush()\n"
)


def test_a_terminal_sequence_that_took_the_filter_days(boxy: Boxy) -> None:
    """86 bytes of ESC[?0;0;…;2h (exponential in the old filter), 200 times over a
    real PTY session: the line after them arrives, and nothing of them does."""
    script = boxy.workdir / "flood.py"
    script.write_text(FLOOD)
    boxy.user.chown(script)
    code = (
        "import boxy, sys, time\n"
        "with boxy.spawn_pty(['python3', 'flood.py'], cols=80, rows=24, net='none') as p:\n"
        "    out = b''\n"
        "    deadline = time.monotonic() + 60\n"
        "    while b'then-this' not in out and time.monotonic() < deadline:\n"
        "        try:\n"
        "            chunk = p.read(timeout=1)\n"
        "        except TimeoutError:\n"
        "            continue\n"
        "        if not chunk:\n"
        "            break\n"
        "        out += chunk\n"
        "    sys.stdout.buffer.write(out)\n"
    )
    root = LIB
    r = boxy.user.run(
        [HOST_PY, "-c", code], cwd=boxy.workdir, extra_env={"PYTHONPATH": str(root)}, timeout=120
    )
    assert r.returncode == 0, describe(r)
    assert b"then-this" in r.stdout, describe(r)
    assert b"\x1b[?0;" not in r.stdout, r.stdout[:200]
    os.unlink(script)


BIG_BESIDE_EVIL = """
import os
def repo(g, cfg):
    os.makedirs(g + "/objects"); os.makedirs(g + "/refs/heads")
    open(g + "/HEAD", "w").write("ref: refs/heads/main\\n")
    open(g + "/config", "w").write(cfg)
repo("evil/.git", '[core]\\n\\tbare = false\\n\\tfsmonitor = "touch MARKER; false"\\n')
repo("big/.git", "[core]\\n\\tbare = false\\n[a]\\n" + "\\tb = c\\n" * 140000)
print("planted")
"""


def test_a_large_harmless_config_beside_a_hostile_one_hides_nothing(boxy: Boxy) -> None:
    """A git config of ~1 MiB (within what the guard reads) made every verdict about
    it too large for the wire, and the scan after the run stopped at it (exit 125):
    the hostile config beside it stayed, and the host's `git status` ran its
    fsmonitor. Both are judged now; the hostile one is moved aside, and a later run
    in the directory starts."""
    marker = boxy.workdir / "evil" / "ran-on-the-host"
    script = boxy.workdir / "plant.py"
    script.write_text(BIG_BESIDE_EVIL.replace("MARKER", str(marker)))
    boxy.user.chown(script)
    r = boxy.run("--net", "none", cmd=["python3", "plant.py"], timeout=120)
    assert r.returncode == 0 and b"planted" in r.stdout, describe(r)
    assert b"fsmonitor" in r.stderr, describe(r)  # found, and said
    config = boxy.workdir / "evil" / ".git" / "config"
    assert not config.exists() or b"fsmonitor" not in config.read_bytes()
    boxy.user.run(["git", "-C", str(boxy.workdir / "evil"), "status"], timeout=60)
    if marker.exists():
        print("ESCAPED the host's git ran the payload's fsmonitor")
    assert not marker.exists()
    again = boxy.sh("echo again", timeout=120)
    assert again.returncode == 0 and again.stdout == b"again\n", describe(again)
