"""--review end to end (issue 35 §2): the work directory is an overlay whose upper
layer is the session's, on the real kernel; `diff`, `apply` and `discard` through
boxyctl. Each test checks the host's tree before and after, so a write that reached
it early, or an apply that followed a symlink, fails it."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.conftest import Boxy
from tests.integration.reviewutil import ctl as _ctl
from tests.integration.reviewutil import nothing_held_after  # noqa: F401 (autouse)

pytestmark = pytest.mark.sandbox

AGENT_EDIT = (
    "sed -i 's/return 1/return 2/' src/app.py && echo 'new file' > notes.txt "
    "&& rm old.txt && mkdir -p build && echo out > build/a.o"
)


def _project(boxy: Boxy) -> None:
    (boxy.workdir / "src").mkdir()
    (boxy.workdir / "src" / "app.py").write_text("def f():\n    return 1\n")
    (boxy.workdir / "src" / "util.py").write_text("X = 1\n")
    (boxy.workdir / "old.txt").write_text("old\n")
    boxy.user.chown(boxy.workdir)


def _held_run(boxy: Boxy, script: str) -> str:
    """Run SCRIPT with --review; the session id its last line names."""
    r = boxy.sh(script, "--review", input=b"")
    text = r.stderr.decode(errors="replace")
    assert r.returncode == 0, text
    m = re.search(r"boxyctl diff (\w+)", text)
    assert m, text
    return m.group(1)


def test_an_agent_edit_is_held_diffed_and_applied(boxy: Boxy) -> None:
    _project(boxy)
    sid = _held_run(boxy, AGENT_EDIT)
    # nothing reached the host yet
    assert (boxy.workdir / "src" / "app.py").read_text() == "def f():\n    return 1\n"
    assert (boxy.workdir / "old.txt").exists() and not (boxy.workdir / "notes.txt").exists()
    show = _ctl(boxy, "show", sid).stdout.decode()
    assert re.search(r"state\s+review \(exited 0\)", show), show
    assert sid in _ctl(boxy, "ps").stdout.decode()
    d = _ctl(boxy, "diff", sid)
    text = d.stdout.decode()
    assert d.returncode == 0, d.stderr
    assert "M src/app.py" in text and "A notes.txt" in text and "D old.txt" in text
    assert "-    return 1\n+    return 2\n" in text
    assert "--- a/src/app.py\n+++ b/src/app.py\n" in text
    data = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)
    kinds = {c["path"]: c["kind"] for c in data["changes"]}
    assert kinds == {
        "src/app.py": "changed", "notes.txt": "added", "old.txt": "removed",
        "build": "added", "build/a.o": "added",
    }  # fmt: skip
    a = _ctl(boxy, "apply", sid)
    assert a.returncode == 0, a.stderr
    assert (boxy.workdir / "src" / "app.py").read_text() == "def f():\n    return 2\n"
    assert (boxy.workdir / "notes.txt").read_text() == "new file\n"
    assert not (boxy.workdir / "old.txt").exists()
    assert (boxy.workdir / "build" / "a.o").read_text() == "out\n"
    again = _ctl(boxy, "diff", sid)
    assert again.returncode == 2 and b"holds no changes" in again.stderr


def test_apply_of_one_path_then_discard_leaves_the_rest_untouched(boxy: Boxy) -> None:
    _project(boxy)
    sid = _held_run(boxy, "echo 'X = 2' > src/util.py && " + AGENT_EDIT)
    a = _ctl(boxy, "apply", sid, "src/util.py")
    assert a.returncode == 0, a.stderr
    assert (boxy.workdir / "src" / "util.py").read_text() == "X = 2\n"
    assert (boxy.workdir / "src" / "app.py").read_text() == "def f():\n    return 1\n"
    left = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)
    assert "src/util.py" not in {c["path"] for c in left["changes"]}
    assert "src/app.py" in {c["path"] for c in left["changes"]}
    d = _ctl(boxy, "discard", sid)
    assert d.returncode == 0, d.stderr
    assert (boxy.workdir / "src" / "app.py").read_text() == "def f():\n    return 1\n"
    assert (boxy.workdir / "old.txt").read_text() == "old\n"
    assert not (boxy.workdir / "notes.txt").exists() and not (boxy.workdir / "build").exists()
    assert _ctl(boxy, "apply", sid).returncode == 2


def test_a_host_edit_during_review_makes_apply_refuse_that_file(boxy: Boxy) -> None:
    _project(boxy)
    sid = _held_run(boxy, AGENT_EDIT)
    (boxy.workdir / "src" / "app.py").write_text("def f():\n    return 'host'\n")
    a = _ctl(boxy, "apply", sid)
    err = a.stderr.decode()
    assert a.returncode == 1, err
    assert "apply: src/app.py: refused: the host changed it meanwhile" in err
    assert (boxy.workdir / "src" / "app.py").read_text() == "def f():\n    return 'host'\n"
    assert (boxy.workdir / "notes.txt").read_text() == "new file\n"  # the rest landed
    left = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)
    assert [c["path"] for c in left["changes"]] == ["src/app.py"]


def test_a_symlink_planted_in_the_upper_layer_is_not_followed(boxy: Boxy) -> None:
    outside = boxy.workdir.parent / f"{boxy.workdir.name}-outside"
    outside.mkdir()
    (outside / "secret").write_text("keep\n")
    boxy.user.chown(outside)
    try:
        _project(boxy)
        # a symlink out of the tree, and a directory replaced by one (what a later
        # write through it would follow)
        sid = _held_run(boxy, f"ln -s {outside}/secret leak && rm -r src && ln -s {outside} src")
        listed = json.loads(_ctl(boxy, "diff", "--json", sid).stdout)["changes"]
        assert {"path": "leak", "kind": "added", "type": "symlink"}.items() <= next(
            c for c in listed if c["path"] == "leak"
        ).items()
        a = _ctl(boxy, "apply", sid)
        assert a.returncode == 0, a.stderr
        assert os.readlink(boxy.workdir / "leak") == f"{outside}/secret"
        assert os.readlink(boxy.workdir / "src") == str(outside)
        assert (outside / "secret").read_text() == "keep\n"
        assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    finally:
        import shutil

        shutil.rmtree(outside, ignore_errors=True)


def test_a_host_symlink_on_the_way_is_not_followed_on_apply(boxy: Boxy) -> None:
    outside = boxy.workdir.parent / f"{boxy.workdir.name}-outside"
    outside.mkdir()
    boxy.user.chown(outside)
    try:
        _project(boxy)
        sid = _held_run(boxy, "echo 'X = 3' > src/util.py && echo made > src/new.py")
        # the host swaps src for a symlink out of the tree before apply
        os.rename(boxy.workdir / "src", boxy.workdir / "src.moved")
        os.symlink(outside, boxy.workdir / "src")
        a = _ctl(boxy, "apply", sid)
        assert a.returncode == 1, a.stderr
        assert b"a symlink on the way (not followed)" in a.stderr
        assert list(outside.iterdir()) == []
    finally:
        import shutil

        shutil.rmtree(outside, ignore_errors=True)


def test_a_fifo_and_a_git_hook_are_listed_but_never_applied(boxy: Boxy) -> None:
    _project(boxy)
    sid = _held_run(
        boxy, "mkfifo pipe && mkdir -p sub/.git/hooks && echo x > sub/.git/hooks/post-checkout"
    )
    listed = {c["path"]: c for c in json.loads(_ctl(boxy, "diff", "--json", sid).stdout)["changes"]}
    assert "device node, FIFO" in listed["pipe"]["held"]
    assert "git control file" in listed["sub/.git/hooks/post-checkout"]["held"]
    a = _ctl(boxy, "apply", sid)
    assert a.returncode == 1
    assert not (boxy.workdir / "pipe").exists()
    assert not (boxy.workdir / "sub" / ".git" / "hooks" / "post-checkout").exists()


def test_a_run_that_changes_nothing_holds_nothing(boxy: Boxy) -> None:
    _project(boxy)
    r = boxy.sh("cat src/app.py >/dev/null", "--review", input=b"")
    assert r.returncode == 0
    assert b"--review: the payload changed nothing" in r.stderr


def test_doctor_says_whether_review_works(boxy: Boxy) -> None:
    r = _ctl(boxy, "doctor")
    line = next(x for x in r.stdout.decode().splitlines() if "review" in x)
    assert "--review: unprivileged overlayfs, layers by fd" in line, line


def test_diff_of_a_thousand_files_and_apply(boxy: Boxy) -> None:
    _project(boxy)
    sid = _held_run(boxy, "mkdir gen && for i in $(seq 1000); do echo $i > gen/f$i.txt; done")
    d = _ctl(boxy, "diff", "--json", sid)
    assert len(json.loads(d.stdout)["changes"]) == 1001
    a = _ctl(boxy, "apply", sid)
    assert a.returncode == 0, a.stderr
    assert len(list((boxy.workdir / "gen").iterdir())) == 1000


# A payload that writes 1 MiB at a time (64 at most, 20 s at most): past a 4 MiB limit
# the watch stops it long before it is done.
WRITER = (
    'python3 -c "import time\n'
    "end = time.monotonic() + 20\n"
    "with open('big', 'wb') as f:\n"
    "    for i in range(64):\n"
    "        f.write(bytes(1 << 20)); f.flush(); time.sleep(0.2)\n"
    "        if time.monotonic() > end: break\n"
    "print('WROTE ALL')\""
)


@pytest.mark.parametrize(
    "script", [WRITER, "truncate -s 100G sparse && sleep 20 && echo WROTE ALL"]
)
def test_a_layer_past_its_limit_stops_the_run_and_stays_held(boxy: Boxy, script: str) -> None:
    """--review-limit: a layer growing past it (written, or a sparse file apply would
    write whole) stops the run; what it wrote stays held, and `show` says how much."""
    _project(boxy)
    r = boxy.sh(script, "--review", "--review-limit", "4MiB", input=b"")
    out, err = r.stdout.decode(), r.stderr.decode(errors="replace")
    assert "WROTE ALL" not in out, f"ESCAPED: the layer grew past its limit: {err}"
    assert re.search(r"--review: its layer holds \S+, past its limit of 4(\.0)?MiB \(--review-limit\): "
                     r"the run was stopped", err), err  # fmt: skip
    assert r.returncode != 0, err
    m = re.search(r"are held \((\S+) in (\d+ entr(y|ies))\): `boxyctl diff (\w+)`", err)
    assert m, err
    assert not (boxy.workdir / "big").exists() and not (boxy.workdir / "sparse").exists()
    show = _ctl(boxy, "show", m.group(4)).stdout.decode()
    assert f"held ({m.group(1)} in {m.group(2)})" in show, show


def test_a_review_limit_without_a_review_is_refused(boxy: Boxy) -> None:
    r = boxy.sh("echo ran", "--review-limit", "1GiB", input=b"")
    assert r.returncode == 2 and b"ran" not in r.stdout
    assert (
        r.stderr.decode()
        .strip()
        .splitlines()[-1]
        .endswith("--review-limit: needs --review (or a profile with review: true)")
    ), r.stderr


def test_a_commit_in_a_held_run_is_one_held_line_and_the_work_tree_lands(boxy: Boxy) -> None:
    """A commit writes dozens of entries under .git, each held: diff and apply fold
    them into one line per gitdir; the work tree's change lands, and the host's git
    sees it uncommitted, its history as it was."""
    _project(boxy)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "start"]):
        assert boxy.user.run([*git, *args], cwd=boxy.workdir).returncode == 0
    head = boxy.user.run(["git", "rev-parse", "HEAD"], cwd=boxy.workdir).stdout
    sid = _held_run(
        boxy,
        "sed -i 's/return 1/return 2/' src/app.py && "
        "git -c user.name=a -c user.email=a@a commit -qam 'agent'",
    )
    now = boxy.user.run(["git", "log", "--oneline"], cwd=boxy.workdir).stdout.decode()
    assert boxy.user.run(["git", "rev-parse", "HEAD"], cwd=boxy.workdir).stdout == head, (
        f"ESCAPED: the payload's commit reached the host's repository: {now}"
    )
    text = _ctl(boxy, "diff", "--stat", sid).stdout.decode()
    assert "M src/app.py" in text and "H .git/  " in text, text
    assert ".git/objects/" not in text, text
    a = _ctl(boxy, "apply", sid)
    err = a.stderr.decode()
    assert a.returncode == 1 and "entries git writes as it works" in err, err
    assert ".git/objects/" not in err, err
    assert boxy.user.run(["git", "rev-parse", "HEAD"], cwd=boxy.workdir).stdout == head
    status = boxy.user.run(["git", "status", "--porcelain"], cwd=boxy.workdir).stdout.decode()
    assert status == " M src/app.py\n", status


def test_a_writable_tree_inside_the_work_directory_is_held_with_it(boxy: Boxy) -> None:
    """--rw ./sub and --mkdir ./made were bound from the host over the overlay: what
    the payload wrote there reached the host at once, and the run said it changed
    nothing. Both are held now, with the rest; a --rw tree outside the work directory
    is written as the run goes, and the run's last lines say so."""
    _project(boxy)
    (boxy.workdir / "sub").mkdir()
    other = boxy.workdir.parent / f"{boxy.workdir.name}-other"
    other.mkdir()
    boxy.user.chown(boxy.workdir / "sub")
    boxy.user.chown(other)
    try:
        r = boxy.sh(
            f"echo a > sub/f && echo b > made/g && echo c > {other}/h",
            "--review",
            "--rw",
            str(boxy.workdir / "sub"),
            "--mkdir",
            str(boxy.workdir / "made"),
            "--rw",
            str(other),
            input=b"",
        )
        text = r.stderr.decode(errors="replace")
        assert r.returncode == 0, text
        m = re.search(r"boxyctl diff (\w+)", text)
        assert m, text
        assert not (boxy.workdir / "sub" / "f").exists()
        assert not (boxy.workdir / "made").exists()  # not even made on the host
        assert (other / "h").read_text() == "c\n"
        assert f"--review: not held, written as it ran: {other}" in text, text
        assert "not watched" not in text, text
        d = _ctl(boxy, "diff", m.group(1)).stdout.decode()
        assert "A sub/f" in d and "A made/g" in d, d
        a = _ctl(boxy, "apply", m.group(1))
        assert a.returncode == 0, a.stderr
        assert (boxy.workdir / "sub" / "f").read_text() == "a\n"
        assert (boxy.workdir / "made" / "g").read_text() == "b\n"
    finally:
        subprocess.run(["rm", "-rf", str(other)], check=False)
