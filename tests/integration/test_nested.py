"""Nested and split daemons (issue 33 §2): `boxyctl` inside a sandbox started a second
boxyd there that died ("lost the connection to boxyd"); an XDG_RUNTIME_DIR that does
not exist was made, and a second boxyd started in it whose sessions `ps` never showed.
Each is one line and exit 2 now, and nothing is started or made."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox

STAGE = BIN.parent.parent  # the checkout the test user runs (its venv inside)


def test_boxyctl_inside_a_sandbox_says_so(boxy: Boxy) -> None:
    script = (
        f"cat /run/host/container-manager; {BIN}/boxyctl run --net none -- true; "
        f'echo "rc=$?"; {BIN}/boxyctl ps; echo "rc=$?"'
    )
    r = boxy.run("--net", "none", "--ro", str(STAGE), cmd=["sh", "-c", script], input=b"")
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, err
    assert out.splitlines() == ["boxy", "rc=2", "rc=2"], (out, err)
    said = "boxyctl: already inside a boxy sandbox: boxyctl talks to your boxyd from outside it"
    assert err.count(said) == 2 and "lost the connection" not in err, err
    assert "Traceback" not in err


def test_a_runtime_dir_that_does_not_exist_is_refused(user: User, workdir: Path) -> None:
    gone = workdir / "no-such-runtime"
    for argv in (["run", "--net", "none", "--", "true"], ["ps"]):
        r = user.run(
            [str(BIN / "boxyctl"), *argv], cwd=workdir, extra_env={"XDG_RUNTIME_DIR": str(gone)}
        )
        err = r.stderr.decode()
        assert r.returncode == 2 and len(err.splitlines()) == 1, (argv, r.returncode, err)
        assert f"XDG_RUNTIME_DIR={gone}: no such directory" in err, err
        assert not gone.exists()  # nothing made there, so no second boxyd either
