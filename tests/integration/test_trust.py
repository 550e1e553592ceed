"""`.boxy.yaml` and `boxyctl trust` with real runs: the payload can write the file
(the work directory is writable), so what it writes has no effect until a person
approves that exact content."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, User

pytestmark = pytest.mark.sandbox

PRINT = ["sh", "-c", "echo FROM_PROJECT=${FROM_PROJECT:-unset}"]


def ctl(user: User, workdir: Path, *args: str):
    return user.run([str(BIN / "boxyctl"), *args], cwd=workdir, timeout=60)


def test_approve_apply_change_and_revoke(boxy: Boxy, user: User, workdir: Path) -> None:
    config = workdir / ".boxy.yaml"
    config.write_text("env: {FROM_PROJECT: 'yes'}\n")
    user.chown(config)
    try:
        r = boxy.run("--net", "none", cmd=PRINT, input=b"")
        assert r.stdout == b"FROM_PROJECT=unset\n", r.stderr
        assert f"{config}: not approved, so ignored (env); `boxyctl trust` in {workdir} approves " \
               "this content" in r.stderr.decode()
        t = ctl(user, workdir, "trust")
        assert t.returncode == 0 and b"  env: {FROM_PROJECT: 'yes'}" in t.stdout, t.stderr
        assert f"approved {config} as shown" in t.stderr.decode()
        r = boxy.run("--net", "none", cmd=PRINT, input=b"")
        assert r.stdout == b"FROM_PROJECT=yes\n" and b"not approved" not in r.stderr, r.stderr
        # the payload rewrites it: the next run is back to the defaults, and says so
        r = boxy.run("--net", "none", cmd=["sh", "-c", "echo 'net: public' >> .boxy.yaml"], input=b"")
        assert r.returncode == 0, r.stderr
        r = boxy.run("--net", "none", cmd=PRINT, input=b"")
        assert r.stdout == b"FROM_PROJECT=unset\n"
        assert b"not approved, so ignored (env, net)" in r.stderr, r.stderr
        listed = ctl(user, workdir, "trust", "--list").stdout.decode()
        assert str(workdir) in listed
    finally:
        gone = ctl(user, workdir, "trust", "--revoke")
    assert b"revoked 1 approval for" in gone.stderr, gone.stderr
    assert str(workdir) not in ctl(user, workdir, "trust", "--list").stdout.decode()


def test_trust_refuses_what_it_cannot_read_as_data(boxy: Boxy, user: User, workdir: Path) -> None:
    r = ctl(user, workdir, "trust")
    assert r.returncode == 2 and b"has no .boxy.yaml" in r.stderr
    (workdir / ".boxy.yaml").symlink_to("/etc/passwd")
    r = ctl(user, workdir, "trust")
    assert r.returncode == 2 and b".boxy.yaml: a symlink (never followed)" in r.stderr, r.stderr
    r = boxy.run("--net", "none", cmd=["true"], input=b"")
    assert r.returncode == 2 and b".boxy.yaml: a symlink (never followed)" in r.stderr
