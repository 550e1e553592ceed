"""Shared fixtures: run `boxyctl` as the unprivileged test user, in work directories
that user owns. As root (CI) the user is BOXY_TEST_USER (created by the harness);
as a normal user, sandboxes run as you."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import pytest
from pluggy import Result

if TYPE_CHECKING:
    from tests.harness.topology import Topology

# The bin directory of the boxy under test: this interpreter's venv (the staged tree), or
# BOXY_TEST_BIN for an installed copy (/usr/lib/boxy/bin: CI's run against the package).
BIN = Path(os.environ.get("BOXY_TEST_BIN") or Path(sys.executable).parent)


def _lib() -> Path:
    """The directory holding the boxy package under test, for a client the attack cases
    drive with PYTHONPATH (its build must be boxyd's): the staged tree, or the installed
    copy's site-packages."""
    if not os.environ.get("BOXY_TEST_BIN"):
        return Path(__file__).resolve().parent.parent
    code = "import boxy, os; print(os.path.dirname(os.path.dirname(boxy.__file__)))"
    r = subprocess.run([str(BIN / "python3"), "-I", "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"BOXY_TEST_BIN={BIN}: its python3 cannot import boxy: {r.stderr}")
    return Path(r.stdout.strip())


LIB = _lib()


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path
    runtime: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "HOME": str(self.home),
            "USER": self.name,
            "LOGNAME": self.name,
            "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
            "XDG_RUNTIME_DIR": str(self.runtime),
            "LANG": "C.UTF-8",
        }
        env.update(extra or {})
        return env

    def cmd(self, argv: list[str], extra_env: dict[str, str] | None = None) -> list[str]:
        """ARGV as this user with a clean environment (runuser when we are root)."""
        env = [f"{k}={v}" for k, v in self.env(extra_env).items()]
        if os.getuid() == self.uid:
            return ["env", "-i", *env, *argv]
        return ["runuser", "-u", self.name, "--", "env", "-i", *env, *argv]

    def run(
        self,
        argv: list[str],
        *,
        extra_env: dict[str, str] | None = None,
        timeout: float = 120,
        input: bytes | None = None,
        cwd: str | Path | None = None,
        **kw: Any,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            self.cmd(argv, extra_env),
            input=input,
            capture_output=True,
            timeout=timeout,
            cwd=cwd,
            **kw,
        )

    def chown(self, path: Path) -> None:
        if os.getuid() == 0:
            for p in [path, *path.rglob("*")]:
                os.lchown(p, self.uid, self.gid)

    def makedirs(self, path: Path) -> None:
        """PATH and every directory missing on the way, the user's (a mkdir as root
        left ~/.local/share root's, and the next `boxyctl setup` could not write there)."""
        missing = [p for p in [path, *path.parents] if not p.exists()]
        path.mkdir(parents=True, exist_ok=True)
        if os.getuid() == 0:
            for p in missing:
                os.lchown(p, self.uid, self.gid)


def _test_user() -> User:
    if os.getuid() == 0:
        name = os.environ.get("BOXY_TEST_USER", "boxytest")
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
            pw = pwd.getpwnam(name)
    else:
        pw = pwd.getpwuid(os.getuid())
    runtime = (
        Path(os.environ.get("XDG_RUNTIME_DIR", ""))
        if os.getuid() == pw.pw_uid and os.environ.get("XDG_RUNTIME_DIR")
        else Path(f"/run/user/{pw.pw_uid}")
    )
    if os.getuid() == 0:
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chown(runtime, pw.pw_uid, pw.pw_gid)
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir), runtime)


@pytest.fixture(scope="session")
def user() -> User:
    return _test_user()


@pytest.fixture
def workdir(user: User, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh work directory owned by the test user (under its home, like a project)."""
    base = user.home / "boxy-tests"
    if os.getuid() == 0:
        base.mkdir(exist_ok=True)
        os.chown(base, user.uid, user.gid)
    else:
        base.mkdir(exist_ok=True)
    d = base / f"{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    user.chown(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class BoxyRunKw(TypedDict, total=False):
    """The keywords Boxy.run takes besides the command (for Boxy.sh and helpers)."""

    input: bytes | None
    timeout: float
    extra_env: dict[str, str] | None


class Boxy:
    def __init__(self, user: User, workdir: Path) -> None:
        self.user = user
        self.workdir = workdir

    def run(
        self,
        *args: str,
        cmd: list[str] | None = None,
        input: bytes | None = None,
        timeout: float = 120,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        argv = [str(BIN / "boxyctl"), "run", *args]
        if cmd is not None:
            argv += ["--", *cmd]
        return self.user.run(
            argv, input=input, timeout=timeout, cwd=self.workdir, extra_env=extra_env
        )

    def sh(
        self, script: str, *flags: str, **kw: Unpack[BoxyRunKw]
    ) -> subprocess.CompletedProcess[bytes]:
        return self.run("--net", "none", *flags, cmd=["sh", "-c", script], **kw)


@pytest.fixture
def boxy(user: User, workdir: Path) -> Boxy:
    return Boxy(user, workdir)


# --- the test internet (tests/harness/topology.py) -------------------------------------


@pytest.fixture(scope="session")
def topology() -> Iterator[Topology]:
    """The test internet, built once per session. Building network namespaces needs
    root (CI runs the suite as root); the sandboxes in it still run as the test user."""
    if os.getuid() != 0:
        pytest.skip(
            "the test internet (network namespaces) is built as root: run `make test` as root"
        )
    from tests.harness import topology as topo

    # One topology per pytest process: two suites on one machine must not tear down
    # each other's test internet (`up` first removes what its prefix left behind).
    prefix = f"boxyt{os.getpid()}"
    t = topo.up(state_dir=f"/run/{prefix}", prefix=prefix)
    try:
        yield t
    finally:
        topo.down(prefix, state_dir=t.state_dir)


@pytest.fixture
def net(topology: Topology) -> Topology:
    """Before every network test: the daemon's netns routes nowhere but the topology."""
    topology.assert_isolated()
    topology.reset_records()
    return topology


class NetBoxy(Boxy):
    """boxyctl as the test user inside the topology's host netns, talking to a boxyd of
    its own there (its own XDG_RUNTIME_DIR: a daemon in the machine's netns must never
    serve these runs, its upstream connections would leave the machine)."""

    def __init__(self, user: User, workdir: Path, topo: Topology) -> None:
        super().__init__(user, workdir)
        self.topo = topo

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self.topo.user_env(self.user.uid, self.user.gid), **(extra or {})}

    def run(
        self,
        *args: str,
        cmd: list[str] | None = None,
        input: bytes | None = None,
        timeout: float = 120,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        argv = [str(BIN / "boxyctl"), "run", *args, *(["--", *cmd] if cmd is not None else [])]
        return subprocess.run(
            self.topo.exec_in_host(self.user.cmd(argv, self.env(extra_env))),
            input=input,
            capture_output=True,
            timeout=timeout,
            cwd=self.workdir,
        )


@pytest.fixture
def netboxy(user: User, workdir: Path, net: Topology) -> NetBoxy:
    return NetBoxy(user, workdir, net)


# --- skips: only for a named missing kernel feature (issue 32 §6) ---------------------

# What a skip may name when the suite runs as root (as CI runs it): a kernel feature
# `boxyctl doctor` reports. Any other skip there fails: a skip is never a way around a
# failure, nor a whole suite turned green.
KERNEL_FEATURES = ("Landlock", "nft_tproxy", "unprivileged user namespaces", "user_notif")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.getuid() != 0 or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(feature in reason for feature in KERNEL_FEATURES):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped as root for a reason that names no missing kernel feature "
            f"`boxyctl doctor` reports ({', '.join(KERNEL_FEATURES)}): {reason}"
        )
