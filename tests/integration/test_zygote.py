"""PID 1's parent (boxyd/stage2/zygote.py) on the real kernel, as the unprivileged test
user.

This file is also the script that user runs (``python -I test_zygote.py ROOT CASE``),
in a fresh single-threaded interpreter, as the outer stage 2 would: it forks the
zygote first, then makes the namespaces of steps 1–5 itself, hands the zygote the
plan's rest and PID 1's fds, and prints one JSON report; the tests assert on it.
Nothing here uses the network: the network namespace made is empty.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from tests.conftest import User

NS = ("user", "mnt", "net", "ipc", "uts", "cgroup", "pid")
HEAD = b'{"the outer stage 2\'s line": 1}\n'
REST = b'{"PID 1\'s line": 2}\n{"the plan": [3]}'


def _links() -> dict[str, str]:
    return {n: os.readlink(f"/proc/self/ns/{n}") for n in NS}


def _init(rest: bytes, stdio: list[int], status_w: int, alive_r: int, pty: Any) -> NoReturn:
    """PID 1 here: says where it is and what it got, on its status pipe."""
    got = {
        "pid": os.getpid(),
        "ns": _links(),
        "rest": rest.decode(),
        "stdio": [os.readlink(f"/proc/self/fd/{fd}") for fd in stdio],
        "alive_open": os.fstat(alive_r).st_mode != 0,
        "pty": pty is not None,
    }
    os.write(status_w, json.dumps(got).encode())
    os._exit(0)


def _never(*_: object) -> NoReturn:
    os.write(2, b"PID 1 forked by a zygote told nothing\n")
    os._exit(3)


def _gone(pid: int, timeout: float = 5.0) -> bool:
    """PID has exited (its pidfd is readable) within TIMEOUT; a pid already reaped is
    gone too."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def case_start() -> dict[str, Any]:
    from boxyd.kernel.sys import (
        CLONE_NEWCGROUP,
        CLONE_NEWIPC,
        CLONE_NEWNET,
        CLONE_NEWNS,
        CLONE_NEWUTS,
        check,
        libc,
    )
    from boxyd.stage2 import namespaces, zygote

    ctl, _boxyd = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zyg = zygote.fork(_init, ctl)  # first, as the outer stage 2 does
    before = _links()
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
    check(libc.unshare(flags), "unshare")
    ours = _links()
    plan = os.memfd_create("plan")
    os.write(plan, HEAD + REST)
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()
    stdio = [os.open(p, os.O_RDWR) for p in ("/dev/null", "/dev/zero", "/dev/full")]
    pid, pidfd = zyg.start(plan, len(HEAD), stdio, status_w, alive_r, None)
    zygote_waits = not _gone(zyg.pid, 0.2)  # until its socket's end: PID 1's pid is stable
    zyg.close()
    os.close(status_w)
    chunks = []
    while chunk := os.read(status_r, 65536):
        chunks.append(chunk)
    _, status = os.waitpid(zyg.pid, 0)
    fdinfo = Path(f"/proc/self/fdinfo/{pidfd}").read_text()
    return {
        "init": json.loads(b"".join(chunks)),
        "before": before,
        "ours": ours,
        "pid": pid,
        "pidfd_names_it": f"Pid:\t{pid}\n" in fdinfo,
        "pid1_gone": bool(select.select([pidfd], [], [], 5)[0]),
        "zygote_exit": os.waitstatus_to_exitcode(status),
        "zygote_waited": zygote_waits,
    }


def case_not_needed() -> dict[str, Any]:
    """A template's child that turns out to be a joiner, or a run that ended first."""
    from boxyd.stage2 import zygote

    ctl, _boxyd = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zyg = zygote.fork(_never, ctl)
    zyg.close()
    _, status = os.waitpid(zyg.pid, 0)
    return {"zygote_exit": os.waitstatus_to_exitcode(status)}


def case_orphaned() -> dict[str, Any]:
    """The outer stage 2 dies while its zygote waits."""
    from boxyd.stage2 import zygote

    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        ctl, _boxyd = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zyg = zygote.fork(_never, ctl)
        os.write(w, b"%d" % zyg.pid)
        os._exit(0)  # with the zygote's socket still open: only its death signal ends it
    os.close(w)
    zpid = int(os.read(r, 64))
    os.waitpid(middle, 0)
    return {"zygote_gone": _gone(zpid)}


def case_refusals() -> dict[str, Any]:
    """What the zygote says of a message it cannot use, and of a namespace it cannot enter."""
    from boxy.errors import SetupError
    from boxyd.stage2 import zygote

    said = []
    for bad in ("malformed", "not a namespace"):
        ctl, _boxyd = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zyg = zygote.fork(_never, ctl)
        if bad == "malformed":
            zyg.sock.send(b"12")  # no fds at all
        else:  # a file where each namespace should be
            fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(len(zygote.NAMESPACES) + 6)]
            socket.send_fds(zyg.sock, [b"0"], fds)
        try:
            zyg._started()
            said.append("no error")
        except SetupError as e:
            said.append(str(e))
        _, status = os.waitpid(zyg.pid, 0)
        said.append(str(os.waitstatus_to_exitcode(status)))
    return {"said": said}


CASES = {
    "start": case_start,
    "not_needed": case_not_needed,
    "orphaned": case_orphaned,
    "refusals": case_refusals,
}


# ---------------------------------------------------------------------- the tests ---


def _report(user: User, case: str) -> dict[str, Any]:
    from tests.integration import scriptcases

    return scriptcases.report(user, __file__, case)


def test_pid1_is_the_first_process_of_a_pid_namespace_in_the_outer_stage_2s_others(
    user: User,
) -> None:
    rep = _report(user, "start")
    init, ours, before = rep["init"], rep["ours"], rep["before"]
    assert init["pid"] == 1, init
    for name in ("user", "mnt", "net", "ipc", "uts", "cgroup"):
        assert init["ns"][name] == ours[name] != before[name], (name, init["ns"], ours)
    # a PID namespace of its own, made by the zygote (none can be entered before its
    # first process exists)
    assert init["ns"]["pid"] != ours["pid"] == before["pid"], (init["ns"], ours)
    assert init["rest"] == REST.decode(), init
    assert init["stdio"] == ["/dev/null", "/dev/zero", "/dev/full"], init
    assert init["alive_open"] and not init["pty"], init
    assert rep["pidfd_names_it"] and rep["pid"] > 1, rep
    assert rep["pid1_gone"], rep
    assert rep["zygote_exit"] == 0 and rep["zygote_waited"], rep


def test_a_zygote_not_needed_exits_at_its_sockets_end(user: User) -> None:
    assert _report(user, "not_needed") == {"zygote_exit": 0}


def test_a_zygote_dies_with_the_outer_stage_2(user: User) -> None:
    assert _report(user, "orphaned") == {"zygote_gone": True}


def test_a_zygote_says_why_it_could_not_start_pid1(user: User) -> None:
    said = _report(user, "refusals")["said"]
    assert said[0] == "PID 1's parent: the outer stage 2's message is malformed", said
    assert said[1] == "1", said
    assert said[2].startswith("PID 1's parent: setns(user): Invalid argument"), said
    assert said[3] == "1", said


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])  # (-I: the tree the test named)
    from tests.integration import scriptcases

    scriptcases.main(CASES)
