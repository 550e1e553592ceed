"""boxyd/daemon/insiders.py and the varlink server's vetting of every writer, on the
real kernel: processes in user namespaces of their own stand for a sandbox's (the
registry is what stage 2's hand-over fills in), and a connection of ours that such a
process writes on is ended before its bytes are read as a call. The integration
escape test (tests/escape/test_front_door.py) runs the real daemon."""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from boxy.varlink import Client, encode
from boxyd.daemon.insiders import Insiders
from tests.unit.test_varlink import STREAMS, ServerThread, _ended

M = "dev.boxy.Manager."
CLONE_NEWUSER = 0x10000000


@pytest.fixture
def userns_child() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a user namespace of its own (unshare -U -r: root in it, so it
    can nest another), alive until the test ends."""
    child = subprocess.Popen(["unshare", "-U", "-r", "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        own = os.stat("/proc/self/ns/user").st_ino
        while os.stat(f"/proc/{child.pid}/ns/user").st_ino == own:  # not yet unshared
            assert time.monotonic() < deadline
            time.sleep(0.005)
        yield child
    finally:
        child.kill()
        child.wait()


def register(ins: Insiders, pid: int) -> tuple[int, int]:
    fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    try:
        return ins.add(fd)
    finally:
        os.close(fd)


def test_boxyd_and_its_own_users_processes_are_not_inside() -> None:
    assert Insiders().inside(os.getpid()) is None
    assert Insiders().inside(os.getppid()) is None


def test_a_registered_namespace_is_inside_until_discarded(
    userns_child: subprocess.Popen[bytes],
) -> None:
    ins = Insiders()
    assert ins.inside(userns_child.pid) is None  # a user's own namespace: no sandbox
    key = register(ins, userns_child.pid)
    assert "inside a sandbox" in (ins.inside(userns_child.pid) or "")
    ins.discard(key)
    assert ins.inside(userns_child.pid) is None
    assert len(ins) == 0


def test_a_namespace_nested_below_a_sandboxs_is_inside(
    userns_child: subprocess.Popen[bytes],
) -> None:
    ins = Insiders()
    register(ins, userns_child.pid)
    nested = subprocess.Popen(
        ["nsenter", "-t", str(userns_child.pid), "-U", "--preserve-credentials",
         "unshare", "-U", "sleep", "60"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 5
        outer = os.stat(f"/proc/{userns_child.pid}/ns/user").st_ino
        while os.stat(f"/proc/{nested.pid}/ns/user").st_ino in (
            outer,
            os.stat("/proc/self/ns/user").st_ino,
        ):
            assert nested.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        assert "inside a sandbox" in (ins.inside(nested.pid) or "")
    finally:
        nested.kill()
        nested.wait()


def test_a_process_that_cannot_be_looked_at_counts_as_inside() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert "could not be looked at" in (Insiders().inside(gone.pid) or "")
    assert Insiders().inside(0) is not None


@pytest.mark.parametrize("early", [False, True])
def test_a_write_from_inside_ends_the_connection_before_it_is_read(early: bool) -> None:
    """boxyctl's connection, inherited by a process that then entered a registered
    namespace: what it writes is never a call (a Show, a Stop, a Run of its own).
    EARLY: the connection was made before boxyd had its listener (socket activation
    queues it), so it did not inherit SO_PASSCRED from it."""
    ins = Insiders()
    made: list[Client] = []

    def connect_early(address: str) -> None:
        made.append(Client.connect(address))

    srv = ServerThread(STREAMS, vet=ins.inside, before_serve=connect_early if early else None)
    with srv, made[0] if early else Client.connect(srv.address) as client:
        assert client.call(M + "Version", {})["build"] == "b1"  # ours: served
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the "payload": a user namespace of its own, then a call
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                ok = libc.unshare(CLONE_NEWUSER) == 0
                os.write(ready_w, b"1" if ok else b"0")
                os.read(go_r, 1)
                stop = {"method": M + "Stop", "parameters": {"id": "s1", "kill": True}}
                client._sock.sendall(encode(stop))
            finally:
                os._exit(0)
        try:
            assert os.read(ready_r, 1) == b"1"
            register(ins, pid)
            os.write(go_w, b"1")
            assert _ended(client)
        finally:
            os.waitpid(pid, 0)
            for fd in (ready_r, ready_w, go_r, go_w):
                os.close(fd)
        assert srv.handler.calls == ["Version"]  # the Stop never reached the handler


def test_a_connection_made_from_inside_is_refused_at_the_accept(
    userns_child: subprocess.Popen[bytes],
) -> None:
    ins = Insiders()
    with ServerThread(vet=ins.inside) as srv:
        register(ins, userns_child.pid)
        # nsenter: a process in the registered namespace connects by the address
        out = subprocess.run(
            ["nsenter", "-t", str(userns_child.pid), "-U", "--preserve-credentials",
             "python3", "-c",
             "import socket,sys; s=socket.socket(socket.AF_UNIX);"
             "s.connect(bytes.fromhex(sys.argv[1])); s.settimeout(5); print(repr(s.recv(10)))",
             srv.address.encode().hex()],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert out.stdout.strip() == "b''", out
        assert srv.handler.calls == []


def test_an_ordinary_client_is_served_with_vetting_on() -> None:
    ins = Insiders()
    with ServerThread(STREAMS, vet=ins.inside) as srv, Client.connect(srv.address) as client:
        for _ in range(3):
            assert client.call(M + "Version", {})["build"] == "b1"
        a = socket.socket(socket.AF_UNIX)
        a.connect(srv.address)
        a.close()


def test_a_starting_sandbox_is_inside_before_it_is_registered(
    userns_child: subprocess.Popen[bytes],
) -> None:
    """Between step 0 and Started, the outer stage 2 (here: the unshare'd child) stands
    for its sandbox: a process in its namespace (the payload PID 1 started before boxyd
    read Started) is inside; once that ends, or the stage 2 is gone, it stands for
    nothing."""
    ins = Insiders()
    token = ins.pending(userns_child.pid)
    payload = subprocess.Popen(
        ["nsenter", "-t", str(userns_child.pid), "-U", "--preserve-credentials", "sleep", "60"]
    )
    try:
        own = os.stat("/proc/self/ns/user").st_ino
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{payload.pid}/ns/user").st_ino == own:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert "(starting)" in (ins.inside(payload.pid) or "")
        assert ins.inside(os.getpid()) is None
        userns_child.kill()
        userns_child.wait()  # the outer stage 2 exited: it stands for nothing now
        assert ins.inside(payload.pid) is None
        ins.pending_done(token)
        ins.pending_done(token)  # twice: nothing
    finally:
        payload.kill()
        payload.wait()


def test_the_writers_pidfd_makes_the_answer_that_processes() -> None:
    """Pid reuse: the pid a read names now belongs to a process outside every sandbox,
    but the writer (its pidfd, SCM_PIDFD) has exited: it counts as inside."""
    gone = subprocess.Popen(["true"])
    pidfd = os.pidfd_open(gone.pid)
    gone.wait()
    try:
        ins = Insiders()
        assert ins.inside(os.getpid()) is None  # the pid alone: an outsider's
        assert "exited" in (ins.inside(os.getpid(), pidfd) or "")
    finally:
        os.close(pidfd)


def test_each_read_carries_its_writers_pidfd() -> None:
    """SO_PASSPIDFD (Linux 6.5; this machine's kernel has it): the pidfd names the
    process that wrote, a child here, not the reader."""
    from boxy.varlink import SO_PASSPIDFD, recv_with_creds

    a, b = socket.socketpair()
    b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    b.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)
    pid = os.fork()
    if pid == 0:
        try:
            a.sendall(b"x")
            time.sleep(2)
        finally:
            os._exit(0)
    try:
        data, fds, writer = recv_with_creds(b)
        assert data == b"x" and fds == [] and writer is not None
        assert writer.pid == pid and writer.pidfd is not None and writer.pidfd >= 0
        with open(f"/proc/self/fdinfo/{writer.pidfd}") as f:
            assert f"Pid:\t{pid}\n" in f.read()
        os.close(writer.pidfd)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        a.close()
        b.close()
