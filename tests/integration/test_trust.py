"""`.boxy.yaml` and `boxyctl trust` with real runs: the payload can write the file
(the work directory is writable), so what it writes has no effect until a person
approves that exact content."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, Boxy, NetBoxy, User

pytestmark = pytest.mark.sandbox

PRINT = ["sh", "-c", "echo FROM_PROJECT=${FROM_PROJECT:-unset} FROM_HOST=${FROM_HOST:-unset}"]
HOST_ENV = {"FROM_HOST": "host-value"}


def ctl(
    user: User, workdir: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return user.run([str(BIN / "boxyctl"), *args], cwd=workdir, timeout=60, extra_env=extra_env)


def test_approve_apply_change_and_revoke(boxy: Boxy, user: User, workdir: Path) -> None:
    config = workdir / ".boxy.yaml"
    config.write_text("env: {FROM_PROJECT: 'yes'}\nenv_pass: [FROM_HOST]\n")
    user.chown(config)
    try:
        # unapproved: what cannot widen applies (env), what would (env_pass) does not
        r = boxy.run("--net", "none", cmd=PRINT, input=b"", extra_env=HOST_ENV)
        assert r.stdout == b"FROM_PROJECT=yes FROM_HOST=unset\n", r.stderr
        assert (
            f"{workdir}: not approved, so held back: env_pass (FROM_HOST) of {config}; "
            f"`boxyctl trust` in {workdir} approves it" in r.stderr.decode()
        ), r.stderr
        t = ctl(user, workdir, "trust")
        assert t.returncode == 0 and b"  env_pass: [FROM_HOST]" in t.stdout, t.stderr
        assert f"approved {workdir}'s configuration as shown" in t.stderr.decode()
        assert b"beyond the default profile this allows: env_pass (FROM_HOST)\n" in t.stderr, (
            t.stderr
        )
        r = boxy.run("--net", "none", cmd=PRINT, input=b"", extra_env=HOST_ENV)
        assert r.stdout == b"FROM_PROJECT=yes FROM_HOST=host-value\n", r.stderr
        assert b"not approved" not in r.stderr, r.stderr
        r = boxy.run("--net", "none", cmd=PRINT, input=b"")  # not set here: asked once, skipped
        assert (r.returncode, r.stdout) == (0, b"FROM_PROJECT=yes FROM_HOST=unset\n"), r.stderr
        # the payload edits a value that cannot widen: still approved
        r = boxy.run("--net", "none", cmd=["sed", "-i", "s/yes/edited/", ".boxy.yaml"], input=b"")
        assert r.returncode == 0, r.stderr
        r = boxy.run("--net", "none", cmd=PRINT, input=b"", extra_env=HOST_ENV)
        assert r.stdout == b"FROM_PROJECT=edited FROM_HOST=host-value\n", r.stderr
        # it adds a key that widens: the next run is back to the defaults, and says so
        r = boxy.run(
            "--net", "none", cmd=["sh", "-c", "echo 'seccomp: compat' >> .boxy.yaml"], input=b""
        )
        assert r.returncode == 0, r.stderr
        r = boxy.run(
            "--net", "none", "--audit-log", "audit.jsonl", cmd=PRINT, input=b"", extra_env=HOST_ENV
        )
        assert r.stdout == b"FROM_PROJECT=edited FROM_HOST=unset\n"
        assert b"held back: env_pass (FROM_HOST), seccomp (compat) of" in r.stderr, r.stderr
        records = [json.loads(x) for x in (workdir / "audit.jsonl").read_text().splitlines()]
        assert [x["mode"] for x in records if x.get("layer") == "seccomp"] == ["strict"], records
        listed = ctl(user, workdir, "trust", "--list").stdout.decode()
        assert str(workdir) in listed and ".boxy.yaml" in listed
    finally:
        gone = ctl(user, workdir, "trust", "--revoke")
    assert b"revoked 1 approval for" in gone.stderr, gone.stderr
    assert str(workdir) not in ctl(user, workdir, "trust", "--list").stdout.decode()


# A project's own registry: what .npmrc or a venv's pip.conf names opens nothing for
# a run until approved (the topology's hosts stand in).
PROBE = [
    "python3",
    "-c",
    "import json, urllib.request as u\ntry:\n print('GOT', json.loads(u.urlopen("
    "'http://other.boxy.test/', timeout=5).read())['server'])\n"
    "except OSError as e:\n print('REFUSED', e)",
]
FAMILIES = {
    "npm": (
        "{npm_registry}",
        {"npm_config_registry": "http://www.boxy.test/"},
        ".npmrc",
        "@corp:registry=http://other.boxy.test/\n",
    ),
    "pip": (
        "{pip_index}",
        {"PIP_INDEX_URL": "http://www.boxy.test/simple"},
        "venv/pip.conf",
        "[global]\nextra-index-url = http://other.boxy.test/simple\n",
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_registry_the_payload_names_opens_nothing_until_approved(
    netboxy: NetBoxy, user: User, workdir: Path, family: str
) -> None:
    template, env, name, line = FAMILIES[family]
    profiles = user.home / ".config/boxy/profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / f"reg-{family}.yaml").write_text(f'net: allowlist\nallow_hosts: ["{template}"]\n')
    user.chown(user.home / ".config")
    flags = ["--profile", f"reg-{family}", "--audit-log", "audit.jsonl"]
    # made on the host (a payload's own is quarantined at once: test_held_files.py)
    (workdir / "venv").mkdir()
    (workdir / "venv/pyvenv.cfg").touch()
    (workdir / name).write_text(line)
    user.chown(workdir)
    try:
        r = netboxy.run(*flags, cmd=PROBE, extra_env=env)
        assert r.stdout.startswith(b"REFUSED"), (r.stdout, r.stderr)
        assert (
            f"held back: {'@corp:registry' if family == 'npm' else 'global.extra-index-url'} "
            f"other.boxy.test of {workdir}/{name}" in r.stderr.decode()
        ), r.stderr
        t = ctl(user, workdir, "trust", extra_env=env)
        assert t.returncode == 0 and b"other.boxy.test" in t.stdout, t.stderr
        r = netboxy.run(*flags, cmd=PROBE, extra_env=env)
        assert r.stdout == b"GOT other\n", (r.stdout, r.stderr)
        assert b"held back" not in r.stderr
    finally:
        ctl(user, workdir, "trust", "--revoke")
        (profiles / f"reg-{family}.yaml").unlink()


def test_trust_refuses_what_it_cannot_read_as_data(boxy: Boxy, user: User, workdir: Path) -> None:
    r = ctl(user, workdir, "trust")
    assert r.returncode == 2 and b"has no .boxy.yaml, and no .npmrc" in r.stderr
    (workdir / ".boxy.yaml").symlink_to("/etc/passwd")
    r = ctl(user, workdir, "trust")
    assert r.returncode == 2 and b".boxy.yaml: a symlink (never followed)" in r.stderr, r.stderr
    # a run says it in one line and goes on: the payload may have planted it
    r = boxy.run("--net", "none", cmd=["true"], input=b"")
    assert (
        r.returncode == 0
        and b".boxy.yaml: a symlink (never followed), so it was not read" in r.stderr
    ), r.stderr


def test_a_profile_host_in_a_refused_range_is_said_before_the_payload_starts(
    netboxy: NetBoxy, user: User, workdir: Path
) -> None:
    """The first npm run waited 70 s in silence for a registry that resolves into a
    private range; the hint came at the end. Now it comes first, in one line."""
    profiles = user.home / ".config/boxy/profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "lanreg.yaml").write_text('net: allowlist\nallow_hosts: ["rebind-lan.boxy.test"]\n')
    user.chown(user.home / ".config")
    try:
        for _ in range(2):  # the second run from what the first one's preflight found
            r = netboxy.run("-p", "lanreg", cmd=["sh", "-c", "echo payload-started >&2"])
            assert r.returncode == 0, r.stderr
            lines = r.stderr.decode().splitlines()
            said = [i for i, ln in enumerate(lines) if "rebind-lan.boxy.test resolves to" in ln]
            assert len(said) == 1, lines
            assert said[0] < lines.index("payload-started"), lines
            line = lines[said[0]]
            assert "192.168.1.10" in line and "--allow-cidr 192.168.1.10" in line
    finally:
        (profiles / "lanreg.yaml").unlink()
