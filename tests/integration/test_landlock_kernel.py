"""The Landlock layer against the real kernel.

Every case runs in a forked child: it sets no_new_privs, optionally becomes uid
65534 (so nothing relies on root), applies, attempts, reports errnos through a
pipe and `os._exit`s. Everything the child needs after apply is imported here,
before the fork: once restricted it can no longer read Python's own files.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from boxyd.stage2 import landlock

ABI = landlock.abi_version()
NOBODY = 65534
CHILD_TIMEOUT_MS = 20_000

pytestmark = pytest.mark.skipif(ABI == 0, reason="Landlock unsupported by this kernel (ABI 0)")

_libc = ctypes.CDLL(None, use_errno=True)


def _set_no_new_privs() -> None:
    one, zero = ctypes.c_ulong(1), ctypes.c_ulong(0)
    if _libc.prctl(ctypes.c_int(38), one, zero, zero, zero) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def attempt(fn: Callable[[], object]) -> int:
    """0 when fn succeeds, else its errno."""
    try:
        fn()
    except OSError as e:
        return e.errno if e.errno is not None else -1
    return 0


def run_child(
    body: Callable[[], dict[str, Any]], *, nobody: bool, nnp: bool = True
) -> dict[str, Any]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            os.setpgid(0, 0)  # so a hung case can be killed with everything it forked
            try:
                if nobody:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                if nnp:
                    _set_no_new_privs()
                out = body()
            except BaseException as e:  # reported, asserted on by the parent
                out = {"exception": type(e).__name__, "message": str(e)}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    poller = select.poll()
    poller.register(r, select.POLLIN)
    while True:
        if not poller.poll(CHILD_TIMEOUT_MS):
            os.killpg(pid, signal.SIGKILL)  # the child's own group: it and its children
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail("the sandboxed child did not report in time")
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return cast(dict[str, Any], json.loads(b"".join(chunks)))


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert "exception" not in result, result
    return result


# Only root can switch to uid 65534; as a normal user "self" already is unprivileged.
@pytest.fixture(params=["self", "nobody"] if os.geteuid() == 0 else ["self"])
def nobody(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "nobody")


@pytest.fixture
def tree() -> Iterator[Path]:
    """ro/, rw/, other/ — all world-writable, so a denial is Landlock's, not DAC's."""
    base = Path(tempfile.mkdtemp(prefix="boxy-ll-", dir="/tmp"))
    dirs = ["ro", "ro/sub", "rw", "rw/d1", "rw/d2", "other"]
    files = ["ro/a.txt", "ro/b.txt", "rw/d1/f", "rw/d1/g", "rw/file", "other/secret.txt"]
    for d in dirs:
        (base / d).mkdir()
    for f in files:
        (base / f).write_text("hello\n")
    for p in [base, *(base / d for d in dirs)]:
        p.chmod(0o777)
    for f in files:
        (base / f).chmod(0o666)
    yield base
    shutil.rmtree(base)


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path: Path, flags: int = os.O_WRONLY | os.O_CREAT) -> None:
    os.close(os.open(path, flags, 0o666))


def test_filesystem_rules(tree: Path, nobody: bool) -> None:
    ro, rw, other = tree / "ro", tree / "rw", tree / "other"

    def body() -> dict[str, Any]:
        probe_fd = os.dup(0)
        os.close(probe_fd)
        notes = landlock.apply([(str(ro), "ro"), (str(rw), "rw")])
        leaked = os.dup(0)  # lowest free fd: the same one unless apply leaked fds
        return {
            "notes": notes,
            "fd_leak": leaked != probe_fd,
            "read_ro": attempt(lambda: _read(ro / "a.txt")),
            "write_ro": attempt(lambda: _write(ro / "a.txt", os.O_WRONLY)),
            "create_ro": attempt(lambda: _write(ro / "new")),
            "write_rw": attempt(lambda: _write(rw / "new.txt")),
            "mkdir_rw": attempt(lambda: os.mkdir(rw / "newdir")),
            "rename_rw_to_ro": attempt(lambda: os.rename(rw / "d1" / "g", ro / "sub" / "g")),
            "read_other": attempt(lambda: _read(other / "secret.txt")),
            "listdir_root": attempt(lambda: os.listdir("/")),
        }

    res = ok(run_child(body, nobody=nobody))
    assert res["notes"] == landlock.missing_features(ABI)
    assert res["fd_leak"] is False
    assert res["read_ro"] == 0
    assert res["write_ro"] == errno.EACCES
    assert res["create_ro"] == errno.EACCES
    assert res["write_rw"] == 0
    assert res["mkdir_rw"] == 0
    assert res["rename_rw_to_ro"] in (errno.EXDEV, errno.EACCES)
    assert res["read_other"] == errno.EACCES
    assert res["listdir_root"] == errno.EACCES
    assert (rw / "new.txt").exists() and (rw / "newdir").is_dir()
    assert not (ro / "new").exists() and not (ro / "sub" / "g").exists()
    assert (rw / "d1" / "g").exists()


@pytest.mark.skipif(ABI < 2, reason="Landlock ABI < 2: no REFER")
def test_cross_directory_rename_inside_rw_tree(tree: Path, nobody: bool) -> None:
    rw = tree / "rw"

    def body() -> dict[str, Any]:
        landlock.apply([(str(tree / "ro"), "ro"), (str(rw), "rw")])
        return {"rename": attempt(lambda: os.rename(rw / "d1" / "f", rw / "d2" / "f"))}

    assert ok(run_child(body, nobody=nobody))["rename"] == 0
    assert (rw / "d2" / "f").exists() and not (rw / "d1" / "f").exists()


def test_dir_rule_on_root_lists_but_does_not_read(tree: Path, nobody: bool) -> None:
    def body() -> dict[str, Any]:
        landlock.apply([("/", "dir")])
        return {
            "listdir_root": attempt(lambda: os.listdir("/")),
            "read_other": attempt(lambda: _read(tree / "other" / "secret.txt")),
            "write_other": attempt(lambda: _write(tree / "other" / "new")),
        }

    res = ok(run_child(body, nobody=nobody))
    assert res == {"listdir_root": 0, "read_other": errno.EACCES, "write_other": errno.EACCES}


def test_rules_on_files_drop_directory_rights(tree: Path, nobody: bool) -> None:
    secret = tree / "other" / "secret.txt"

    def body() -> dict[str, Any]:
        notes = landlock.apply(
            [
                (str(tree / "ro" / "a.txt"), "ro"),
                (str(tree / "rw" / "file"), "rw"),
                ("/dev/null", "dev"),
                (str(secret), "dir"),  # grants nothing on a file: skipped, with a note
            ]
        )
        return {
            "notes": notes,
            "read_a": attempt(lambda: _read(tree / "ro" / "a.txt")),
            "read_b": attempt(lambda: _read(tree / "ro" / "b.txt")),
            "write_a": attempt(lambda: _write(tree / "ro" / "a.txt", os.O_WRONLY)),
            "trunc_rw_file": attempt(
                lambda: _write(tree / "rw" / "file", os.O_WRONLY | os.O_TRUNC)
            ),
            "dev_null": attempt(lambda: _write(Path("/dev/null"), os.O_WRONLY | os.O_TRUNC)),
            "read_secret": attempt(lambda: _read(secret)),
        }

    res = ok(run_child(body, nobody=nobody))
    assert any(str(secret) in n and "skipped" in n for n in res["notes"])
    assert res["read_a"] == 0
    assert res["read_b"] == errno.EACCES
    assert res["write_a"] == errno.EACCES
    assert res["trunc_rw_file"] == 0
    assert res["dev_null"] == 0
    assert res["read_secret"] == errno.EACCES


def test_missing_path_is_a_setup_error(tree: Path, nobody: bool) -> None:
    missing = tree / "nope"

    def body() -> dict[str, Any]:
        landlock.apply([(str(tree / "ro"), "ro"), (str(missing), "rw")])
        return {}

    res = run_child(body, nobody=nobody)
    assert res["exception"] == "SetupError"
    assert str(missing) in res["message"]


def test_refuses_without_no_new_privs(tree: Path, nobody: bool) -> None:
    def body() -> dict[str, Any]:
        landlock.apply([(str(tree / "ro"), "ro")])
        return {"read_other": attempt(lambda: _read(tree / "other" / "secret.txt"))}

    res = run_child(body, nobody=nobody, nnp=False)
    assert res["exception"] == "SetupError"
    assert "PR_SET_NO_NEW_PRIVS" in res["message"]


def _listener(family: int = socket.AF_INET, addr: Any = ("127.0.0.1", 0)) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(addr)
    s.listen(8)
    return s


def _connect(family: int, addr: Any) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as c:
        c.connect(addr)


@pytest.mark.skipif(ABI < 4, reason="Landlock ABI < 4: no TCP port rules")
@pytest.mark.parametrize("restricted", [True, False], ids=["connect_ports", "unhandled"])
def test_tcp_connect_ports(nobody: bool, restricted: bool) -> None:
    def body() -> dict[str, Any]:
        l1, l2 = _listener(), _listener()
        p1, p2 = l1.getsockname()[1], l2.getsockname()[1]
        landlock.apply([], connect_ports=[p1] if restricted else None)
        return {
            "p1": attempt(lambda: _connect(socket.AF_INET, ("127.0.0.1", p1))),
            "p2": attempt(lambda: _connect(socket.AF_INET, ("127.0.0.1", p2))),
            "bind": attempt(lambda: _listener().close()),
        }

    res = ok(run_child(body, nobody=nobody))
    assert res == {"p1": 0, "p2": errno.EACCES if restricted else 0, "bind": 0}


@pytest.mark.skipif(ABI < 6, reason="Landlock ABI < 6: no scoping")
@pytest.mark.parametrize("scope", [True, False], ids=["scoped", "unscoped"])
def test_abstract_unix_socket_scope(nobody: bool, scope: bool) -> None:
    outer_name = f"\0boxy-ll-{os.getpid()}-{os.urandom(4).hex()}"
    outer = _listener(socket.AF_UNIX, outer_name)  # made by the parent, outside any domain

    def body() -> dict[str, Any]:
        landlock.apply([], scope=scope)
        inner = _listener(socket.AF_UNIX, outer_name + "-inner")
        return {
            "outer": attempt(lambda: _connect(socket.AF_UNIX, outer_name)),
            "inner": attempt(lambda: _connect(socket.AF_UNIX, inner.getsockname())),
        }

    try:
        res = ok(run_child(body, nobody=nobody))
    finally:
        outer.close()
    assert res == {"outer": errno.EPERM if scope else 0, "inner": 0}


def _sleeper() -> tuple[int, int]:
    """A child that waits until the returned pipe end is closed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


@pytest.mark.skipif(ABI < 6, reason="Landlock ABI < 6: no scoping")
@pytest.mark.parametrize("scope", [True, False], ids=["scoped", "unscoped"])
def test_signal_scope(nobody: bool, scope: bool) -> None:
    def body() -> dict[str, Any]:
        # Same uid, forked before apply: only Landlock can stop the signal.
        before, before_w = _sleeper()
        landlock.apply([], scope=scope)
        after, after_w = _sleeper()
        res = {
            "parent": attempt(lambda: os.kill(os.getppid(), 0)),
            "before": attempt(lambda: os.kill(before, 0)),
            "own_child": attempt(lambda: os.kill(after, 0)),
        }
        # The later sleeper holds a copy of the earlier one's pipe: release it first.
        for pid, w in ((after, after_w), (before, before_w)):
            os.close(w)
            os.waitpid(pid, 0)
        return res

    res = ok(run_child(body, nobody=nobody))
    assert res["own_child"] == 0
    assert res["before"] == (errno.EPERM if scope else 0)
    if nobody:
        assert res["parent"] == errno.EPERM  # the parent is root: DAC alone refuses
    else:
        assert res["parent"] == (errno.EPERM if scope else 0)


def test_probe_matches_the_kernel() -> None:
    info = landlock.probe()
    assert info == {"abi": ABI, "supported": True, "notes": landlock.missing_features(ABI)}
