"""Helpers for the adversarial cases: payloads written into the work directory, host-side
targets (files, listening sockets, processes) owned by the test user, and the checks
every escape case makes.

The rule (docs/design.md, "Testing"): a payload prints ``ESCAPED <what>`` only when an attack
succeeded, and ``TRIED <what> <result>`` for every attempt it made, so a case can assert
both that nothing got out and that the attempt really ran.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Unpack

import pytest

from tests.conftest import BIN, Boxy, BoxyRunKw, User

HOST_PY = "/usr/bin/python3"  # the test user cannot execute the default python under /root

# Prepended to every python payload: one line per attempt, machine-readable.
PRELUDE = r'''
import errno, os, socket, stat, sys, time

def ename(e):
    if isinstance(e, OSError) and e.errno is not None:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__

def tried(label, detail=""):
    print(f"TRIED {label} {detail}".rstrip(), flush=True)

def escaped(label, detail=""):
    print(f"ESCAPED {label} {detail}".rstrip(), flush=True)

def read(label, path, limit=1 << 16):
    """TRIED with the errno, or the bytes read (and TRIED label read:N)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError as e:
        tried(label, ename(e))
        return None
    tried(label, f"read:{len(data)}")
    return data

def connect(label, path):
    """Connect to a unix socket (str path, or bytes starting with NUL for abstract)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(path)
    except OSError as e:
        tried(label, ename(e))
        return False
    greeting = b""
    try:
        greeting = s.recv(64)
    except OSError:
        pass
    s.close()
    escaped(label, f"connected {greeting!r}")
    return True

def write(label, path, data=b"boxy-escape\n", mode="wb"):
    try:
        with open(path, mode) as f:
            f.write(data)
    except OSError as e:
        tried(label, ename(e))
        return False
    tried(label, "written")
    return True
'''


def output(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")


def describe(r: subprocess.CompletedProcess[bytes]) -> str:
    return (
        f"exit {r.returncode}\n--- stdout\n{r.stdout.decode(errors='replace')}"
        f"--- stderr\n{r.stderr.decode(errors='replace')}"
    )


def tried(r: subprocess.CompletedProcess[bytes]) -> dict[str, str]:
    """label -> result of every TRIED line."""
    out: dict[str, str] = {}
    for line in r.stdout.decode(errors="replace").splitlines():
        if line.startswith("TRIED "):
            label, _, detail = line[6:].partition(" ")
            out[label] = detail
    return out


def assert_contained(
    r: subprocess.CompletedProcess[bytes],
    *labels: str,
    rc: int = 0,
    results: dict[str, set[str]] | None = None,
) -> dict[str, str]:
    """Nothing escaped; the payload ran to its end (exit RC) and made every attempt in
    LABELS; where RESULTS names the acceptable outcomes of an attempt, it had one."""
    assert "ESCAPED" not in output(r), describe(r)
    assert r.returncode == rc, describe(r)
    got = tried(r)
    missing = [label for label in labels if label not in got]
    assert not missing, f"attempts that never ran: {missing}\n{describe(r)}"
    for label, ok in (results or {}).items():
        assert got.get(label) in ok, (
            f"{label}: {got.get(label)!r} not in {sorted(ok)}\n{describe(r)}"
        )
    return got


def write_payload(boxy: Boxy, code: str, name: str = "payload.py") -> Path:
    path = boxy.workdir / name
    path.write_text(PRELUDE + "\n" + code + "\nprint('DONE', flush=True)\n")
    boxy.user.chown(path)
    return path


def run_py(
    boxy: Boxy,
    code: str,
    *flags: str,
    args: tuple[str, ...] = (),
    name: str = "payload.py",
    **kw: Unpack[BoxyRunKw],
) -> subprocess.CompletedProcess[bytes]:
    """Run CODE (after PRELUDE) as `python3 payload.py ARGS` in a --net none sandbox."""
    write_payload(boxy, code, name)
    return boxy.run("--net", "none", *flags, cmd=["python3", name, *args], **kw)


def boxy_argv(*flags: str, cmd: list[str]) -> list[str]:
    return [str(BIN / "boxyctl"), "run", "--net", "none", *flags, "--", *cmd]


# --- host-side processes of the test user ---------------------------------------------


def spawn(
    user: User,
    argv: list[str],
    *,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
) -> subprocess.Popen[bytes]:
    """A real process of the test user (its own pid, not runuser's), in its own session."""
    root = os.getuid() == 0
    return subprocess.Popen(
        argv,
        env=user.env(extra_env),
        cwd=cwd or user.home,
        start_new_session=True,
        stdout=stdout,
        stderr=stderr,
        user=user.uid if root else None,
        group=user.gid if root else None,
        extra_groups=[] if root else None,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a process this test started (by its pid only)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def host_sleeper(user: User) -> Iterator[subprocess.Popen[bytes]]:
    """A host process of the test user holding a secret in its environment."""
    proc = spawn(
        user, ["sleep", "600"], extra_env={"BOXY_HOST_SECRET": "host-secret-" + uuid.uuid4().hex}
    )
    try:
        yield proc
    finally:
        stop(proc)


LISTENER = r"""
import os, socket, sys
path, log = sys.argv[1], sys.argv[2]
addr = b"\0" + path[1:].encode() if path.startswith("@") else path
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(addr)
s.listen(16)
print("READY", flush=True)
while True:
    c, _ = s.accept()
    with open(log, "a") as f:
        f.write("ACCEPT\n")
    try:
        c.sendall(b"HELLO-FROM-HOST\n")
    except OSError:
        pass
    c.close()
"""


@dataclass
class Listener:
    path: str  # a filesystem path, or "@name" for an abstract socket
    proc: subprocess.Popen[bytes]
    log: Path

    def accepts(self) -> int:
        try:
            return self.log.read_text().count("ACCEPT")
        except FileNotFoundError:
            return 0


class Listeners:
    """Unix sockets served by host processes of the test user, as agents and buses are."""

    def __init__(self, user: User) -> None:
        self.user = user
        self.tmp = Path(tempfile.mkdtemp(prefix="boxy-escape-listen-"))
        os.chmod(self.tmp, 0o755)
        self.all: list[Listener] = []

    def start(self, path: str) -> Listener:
        log = self.tmp / f"{len(self.all)}.log"
        log.touch()
        os.chmod(log, 0o666)
        proc = spawn(self.user, [HOST_PY, "-c", LISTENER, path, str(log)], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 15)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"READY":
            stop(proc)
            raise AssertionError(f"listener on {path} did not start: {line!r}")
        listener = Listener(path, proc, log)
        self.all.append(listener)
        # positive control: the test user can reach it on the host
        addr = b"\0" + path[1:].encode() if path.startswith("@") else path
        probe = (
            f"import socket; s=socket.socket(socket.AF_UNIX); s.connect({addr!r}); "
            "print(s.recv(64).decode())"
        )
        r = self.user.run([HOST_PY, "-c", probe])
        assert b"HELLO-FROM-HOST" in r.stdout, r.stderr
        return listener

    def close(self) -> None:
        for listener in self.all:
            stop(listener.proc)
            if not listener.path.startswith("@"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(listener.path)
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def listeners(user: User) -> Iterator[Listeners]:
    ls = Listeners(user)
    try:
        yield ls
    finally:
        ls.close()


# --- host files and mounts ------------------------------------------------------------


def plant(user: User, path: Path, content: str, mode: int = 0o600) -> list[Path]:
    """Create PATH (and missing parents) owned by the test user; returns what was created,
    deepest first, for cleanup. A file that already exists is left as it is."""
    created: list[Path] = []
    parent = path.parent
    missing = []
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700)
        os.chown(d, user.uid, user.gid)
        created.append(d)
    if not path.exists():
        path.write_text(content)
        os.chmod(path, mode)
        os.chown(path, user.uid, user.gid)
        created.append(path)
    return list(reversed(created))


def unplant(created: list[Path]) -> None:
    for p in created:
        with contextlib.suppress(FileNotFoundError, OSError):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()  # only if still empty: never someone else's files
            else:
                p.unlink()


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --- git repositories of the test user, and the host's git on them -----------------------

IDENTITY = {
    "GIT_AUTHOR_NAME": "Boxy",
    "GIT_AUTHOR_EMAIL": "boxy@example.invalid",
    "GIT_COMMITTER_NAME": "Boxy",
    "GIT_COMMITTER_EMAIL": "boxy@example.invalid",
}
HOST_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", **IDENTITY}
# the identity inside the sandbox: a fresh $HOME has no ~/.gitconfig
GIT_FLAGS = [x for k, v in IDENTITY.items() for x in ("-e", f"{k}={v}")]

HOOK = b"#!/bin/sh\ntouch /tmp/boxy-escape-hook-ran\n"


def git(
    user: User, cwd: Path, *args: str, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """git on the host, as the user, as they would run it later."""
    r = user.run(["git", *args], cwd=cwd, extra_env=HOST_GIT_ENV)
    if check:
        assert r.returncode == 0, f"git {' '.join(args)}: {r.stderr.decode()}"
    return r


def init_repo(user: User, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    user.chown(path)
    git(user, path, "init", "-q")
    (path / "README").write_text("hello\n")
    user.chown(path / "README")
    git(user, path, "add", "README")
    git(user, path, "commit", "-q", "-m", "init")
    return path


@pytest.fixture
def repo(user: User, workdir: Path) -> Path:
    return init_repo(user, workdir)


def findings(r: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [ln for ln in r.stderr.decode().splitlines() if "git guard" in ln]
