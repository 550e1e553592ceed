"""Secrets of the host user: key files, other users' files, tokens in the environment,
agent/engine/bus sockets, abstract sockets, and exposures boxy must refuse.

Every target is real: planted in the test user's actual home or runtime directory,
served by a process of that user, and checked reachable from the host first.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import (
    Listeners,
    assert_contained,
    describe,
    output,
    plant,
    run_py,
    tried,
    unplant,
)

pytestmark = pytest.mark.sandbox

SECRET_FILES = {
    "ssh": ".ssh/id_ed25519",
    "gnupg": ".gnupg/private-keys-v1.d/x.key",
    "aws": ".aws/credentials",
    "gcloud": ".config/gcloud/credentials.db",
    "kube": ".kube/config",
}


@pytest.fixture
def secrets(user: User) -> Iterator[dict[str, tuple[Path, str]]]:
    """The usual credential files, planted in the test user's real home (mode 0600).
    name -> (path, the marker its content holds)."""
    created: list[Path] = []
    out = {}
    for name, rel in SECRET_FILES.items():
        marker = f"boxy-secret-{name}-{uuid.uuid4().hex}"
        path = user.home / rel
        created += plant(
            user, path, f"-----BEGIN PRIVATE KEY-----\n{marker}\n-----END PRIVATE KEY-----\n"
        )
        content = path.read_text()  # a pre-existing file keeps its own content
        out[name] = (path, marker if marker in content else content.strip()[:40])
    try:
        for path, _ in out.values():  # positive control: the user can read them on the host
            assert user.run(["cat", str(path)]).returncode == 0, path
        yield out
    finally:
        unplant(created)


@pytest.mark.parametrize("name", sorted(SECRET_FILES))
def test_secret_file_unreadable(
    boxy: Boxy, secrets: dict[str, tuple[Path, str]], name: str
) -> None:
    path, marker = secrets[name]
    r = run_py(
        boxy,
        """
path = sys.argv[1]
data = read("secret", path)
if data:
    escaped("secret", f"{path}: {data[:80]!r}")
""",
        args=(str(path),),
    )
    got = assert_contained(r, "secret")
    assert not got["secret"].startswith("read:"), describe(r)
    assert marker not in output(r)


def test_no_secret_anywhere_in_sandbox(boxy: Boxy, secrets: dict[str, tuple[Path, str]]) -> None:
    """A payload that greps every file it can see for the planted key material."""
    r = run_py(
        boxy,
        """
needle = b"boxy-secret-"
seen = 0
for top in ("/", ):
    for d, dirs, files in os.walk(top):
        if d in ("/proc", "/usr", "/dev", "/sys"):
            dirs[:] = []
            continue
        for f in files:
            p = os.path.join(d, f)
            try:
                if not stat.S_ISREG(os.lstat(p).st_mode) or p.endswith("payload.py"):
                    continue
                with open(p, "rb") as fh:
                    data = fh.read(1 << 20)
            except OSError:
                continue
            seen += 1
            if needle in data:
                escaped("grep", p)
tried("grep", f"files:{seen}")
""",
    )
    got = assert_contained(r, "grep")
    assert int(got["grep"].split(":")[1]) > 5, describe(r)  # it really read files (/etc …)
    for _, marker in secrets.values():
        assert marker not in output(r)


def test_etc_shadow_and_host_accounts(boxy: Boxy, user: User) -> None:
    r = run_py(
        boxy,
        """
for p in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers"):
    data = read(p, p)
    if data:
        escaped(p, repr(data[:60]))
data = read("passwd", "/etc/passwd") or b""
names = [line.split(b":")[0].decode() for line in data.splitlines() if line]
tried("accounts", ",".join(names))
if names != [os.environ["USER"]]:
    escaped("passwd", f"host accounts visible: {names}")
""",
    )
    got = assert_contained(r, "/etc/shadow", "passwd", "accounts")
    assert not got["/etc/shadow"].startswith("read:"), describe(r)
    assert got["accounts"] == user.name, describe(r)


@pytest.fixture
def host_only_files(user: User) -> Iterator[tuple[Path, Path]]:
    """A root-owned 0600 file the test user can see but not read, and a world-readable
    one in /srv: both exist only on the host."""
    tag = uuid.uuid4().hex
    private = Path(f"/var/tmp/boxy-other-secret-{tag}")
    public = Path(f"/srv/boxy-host-only-{tag}")
    private.write_text(f"boxy-secret-private-{tag}\n")
    os.chmod(private, 0o600)
    public.write_text(f"boxy-secret-public-{tag}\n")
    os.chmod(public, 0o644)
    try:
        # positive control: on the host the user sees both and reads the public one
        assert user.run(["test", "-e", str(private)]).returncode == 0
        assert user.run(["cat", str(public)]).returncode == 0
        yield private, public
    finally:
        private.unlink()
        public.unlink()


def test_other_users_and_host_only_files_invisible(
    boxy: Boxy, host_only_files: tuple[Path, Path]
) -> None:
    private, public = host_only_files
    r = run_py(
        boxy,
        """
for label, p in (("private", sys.argv[1]), ("public", sys.argv[2])):
    if os.path.lexists(p):
        escaped(label, f"{p} is visible")
    data = read(label, p)
    if data:
        escaped(label, repr(data[:60]))
    parent = os.path.dirname(p)
    try:
        names = os.listdir(parent)
    except OSError as e:
        tried(label + "-dir", ename(e))
    else:
        tried(label + "-dir", f"entries:{len(names)}")
        if os.path.basename(p) in names:
            escaped(label + "-dir", f"{p} listed")
""",
        args=(str(private), str(public)),
    )
    assert_contained(
        r,
        "private",
        "public",
        "private-dir",
        "public-dir",
        results={"private": {"ENOENT"}, "public": {"ENOENT"}},
    )


TOKENS = {
    "GITHUB_TOKEN": "ghp_" + uuid.uuid4().hex,
    "AWS_SECRET_ACCESS_KEY": "aws-" + uuid.uuid4().hex,
    "SSH_AUTH_SOCK": f"/run/user/boxy-escape-{uuid.uuid4().hex[:8]}/agent.sock",
    "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/boxy-escape-{uuid.uuid4().hex[:8]}/bus",
}

ENV_PAYLOAD = """
import json
env = dict(os.environ)
try:
    with open("/proc/self/environ", "rb") as f:
        raw = f.read().decode(errors="replace")
except OSError as e:
    raw = ""
tried("env", json.dumps(sorted(env)))
print("ENVDUMP", json.dumps(env))
print("RAWENV", raw.replace("\\0", " "))
for name in sys.argv[1:]:
    if name in env:
        print("PASSED", name, env[name], flush=True)
"""


def _env_of(r: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    for line in r.stdout.decode().splitlines():
        if line.startswith("ENVDUMP "):
            return cast(dict[str, str], json.loads(line.split(" ", 1)[1]))
    raise AssertionError(describe(r))


def test_client_tokens_not_in_environment(boxy: Boxy) -> None:
    r = run_py(boxy, ENV_PAYLOAD, args=tuple(TOKENS), extra_env=TOKENS)
    assert_contained(r, "env")
    env = _env_of(r)
    assert env.get("HOME") == str(boxy.user.home)  # the dump is real
    for name, value in TOKENS.items():
        assert name not in env, describe(r)
        assert value not in output(r), f"{name}'s value leaked\n{describe(r)}"


@pytest.mark.parametrize("name", sorted(TOKENS))
def test_dash_e_passes_exactly_one(boxy: Boxy, name: str) -> None:
    r = run_py(boxy, ENV_PAYLOAD, "-e", name, args=tuple(TOKENS), extra_env=TOKENS)
    assert_contained(r, "env")
    env = _env_of(r)
    assert env.get(name) == TOKENS[name], describe(r)  # positive: -e NAME is the client's value
    for other, value in TOKENS.items():
        if other != name:
            assert other not in env, describe(r)
            assert value not in output(r), describe(r)


# --- sockets ----------------------------------------------------------------------------

SOCKET_PAYLOAD = """
import json
targets = json.loads(sys.argv[1])
for label, path in targets.items():
    if os.path.lexists(path):
        escaped(label, f"{path} is visible")
    connect(label, path)
for name in ("SSH_AUTH_SOCK", "DOCKER_HOST", "DBUS_SESSION_BUS_ADDRESS"):
    value = os.environ.get(name, "")
    path = value.split("=", 1)[-1] if name == "DBUS_SESSION_BUS_ADDRESS" else value.removeprefix("unix://")
    if path:
        connect("env-" + name, path)
runtime = os.path.dirname(targets["ssh-agent"])
try:
    tried("runtime-dir", f"entries:{os.listdir(runtime)}")
except OSError as e:
    tried("runtime-dir", ename(e))
"""


@pytest.mark.parametrize("pass_env", [False, True], ids=["env-not-passed", "env-passed-with-e"])
def test_runtime_sockets_unreachable(
    boxy: Boxy, user: User, listeners: Listeners, pass_env: bool
) -> None:
    tag = uuid.uuid4().hex[:8]
    rt = user.runtime
    agent = listeners.start(str(rt / f"boxy-escape-{tag}-ssh-agent.sock"))
    docker = listeners.start(str(rt / f"boxy-escape-{tag}-docker.sock"))
    bus = listeners.start(str(rt / f"boxy-escape-{tag}-bus"))
    env = {
        "SSH_AUTH_SOCK": agent.path,
        "DOCKER_HOST": f"unix://{docker.path}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={bus.path}",
    }
    targets = {
        "ssh-agent": agent.path,
        "docker": docker.path,
        "dbus": bus.path,
        # boxy's own front door: a run from inside could ask for a weaker sandbox
        "boxyd": str(rt / "boxy" / "boxyd.sock"),
    }
    for extra in ("bus", "docker.sock", "gnupg/S.gpg-agent", "systemd/private"):
        if (rt / extra).exists():  # whatever real ones the machine has, too
            targets["real-" + extra] = str(rt / extra)
    before = [x.accepts() for x in listeners.all]
    flags = (
        ["-e", "SSH_AUTH_SOCK", "-e", "DOCKER_HOST", "-e", "DBUS_SESSION_BUS_ADDRESS"]
        if pass_env
        else []
    )
    r = run_py(boxy, SOCKET_PAYLOAD, *flags, args=(json.dumps(targets),), extra_env=env)
    labels = list(targets) + ["runtime-dir"]
    if pass_env:
        labels += ["env-SSH_AUTH_SOCK", "env-DOCKER_HOST", "env-DBUS_SESSION_BUS_ADDRESS"]
    got = assert_contained(r, *labels)
    for label in targets:
        assert got[label] == "ENOENT", describe(r)  # not even visible
    assert [x.accepts() for x in listeners.all] == before, "a host socket accepted a connection"


def test_abstract_socket_unreachable(boxy: Boxy, listeners: Listeners) -> None:
    host = listeners.start("@boxy-test-abstract")
    before = host.accepts()
    r = run_py(boxy, 'connect("abstract", b"\\0boxy-test-abstract")')
    assert_contained(r, "abstract", results={"abstract": {"ECONNREFUSED", "EPERM", "EACCES"}})
    assert host.accepts() == before


# --- exposures refused before anything runs ----------------------------------------------


def _assert_refused(r: subprocess.CompletedProcess[bytes], boxy: Boxy, *, names: str) -> None:
    lines = [ln for ln in r.stderr.decode().splitlines() if ln.strip()]
    assert r.returncode == 2, describe(r)
    assert b"RAN" not in r.stdout and not (boxy.workdir / "ran-marker").exists(), describe(r)
    assert len(lines) == 1, describe(r)
    assert names in lines[0], describe(r)


@pytest.mark.parametrize("case", ["gnupg", "home", "runtime-rw", "run", "var-run", "ssh-agent-dir"])
def test_exposing_socket_trees_refused(
    boxy: Boxy, user: User, listeners: Listeners, case: str
) -> None:
    created: list[Path] = []
    env: dict[str, str] = {}
    try:
        if case in ("gnupg", "home"):
            gnupg = user.home / ".gnupg"
            created += plant(user, gnupg / ".boxy-escape-keep", "")
            os.chmod(gnupg, 0o700)
            sock = gnupg / "S.gpg-agent"
            if not sock.exists():
                listeners.start(str(sock))
            assert stat.S_ISSOCK(os.lstat(sock).st_mode)
            flags, names = (
                (["--ro", "~/.gnupg"], ".gnupg")
                if case == "gnupg"
                else (["--ro", "~"], str(user.home))
            )
        elif case == "runtime-rw":
            flags, names = ["--rw", str(user.runtime)], str(user.runtime)
        elif case == "run":
            flags, names = ["--ro", "/run"], "/run"
        elif case == "var-run":
            flags, names = ["--ro", "/var/run"], "/var/run"
        else:
            agent_dir = user.home / f".boxy-escape-agent-{uuid.uuid4().hex[:6]}"
            created += plant(user, agent_dir / ".keep", "")
            listeners.start(str(agent_dir / "agent.sock"))
            env = {"SSH_AUTH_SOCK": str(agent_dir / "agent.sock")}
            flags, names = ["--ro", str(agent_dir)], str(agent_dir)
        r = boxy.sh("echo RAN; touch ran-marker", *flags, extra_env=env)
        _assert_refused(r, boxy, names=names)
    finally:
        for listener in listeners.all:  # sockets first, or the directories stay non-empty
            if not listener.path.startswith("@"):
                Path(listener.path).unlink(missing_ok=True)
        unplant(created)


@pytest.mark.parametrize("case", ["1password-agent", "tmux-server"])
def test_unlisted_socket_in_exposed_tree(
    boxy: Boxy, user: User, listeners: Listeners, case: str
) -> None:
    """A live socket at a place no variable names: an SSH agent (1Password-style
    IdentityAgent ~/.1password/agent.sock) or a tmux server (/tmp/tmux-UID/, where a
    client can make the server run any command as the user). Exposing that tree must not
    hand the payload the socket: refusing the run or making it unreachable are both fine."""
    if case == "1password-agent":
        tree, name = user.home / ".1password", "agent.sock"
    else:
        tree, name = Path(f"/tmp/tmux-{user.uid}"), f"boxy-escape-{uuid.uuid4().hex[:6]}"
    created = plant(user, tree / ".boxy-escape-keep", "")
    sock = tree / name
    try:
        server = listeners.start(str(sock))
        before = server.accepts()
        r = run_py(
            boxy,
            'print("RAN", flush=True)\nconnect("socket", sys.argv[1])',
            "--ro",
            str(tree),
            args=(str(sock),),
        )
        assert "ESCAPED" not in output(r), describe(r)
        if r.returncode == 2:  # refused up front
            assert b"RAN" not in r.stdout, describe(r)
        else:
            assert "socket" in tried(r) and r.returncode == 0, describe(r)
        assert server.accepts() == before, "the host socket accepted a connection from the sandbox"
    finally:
        sock.unlink(missing_ok=True)
        unplant(created)
