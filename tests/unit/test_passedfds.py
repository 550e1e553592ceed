"""boxyd/daemon/fdpolicy.py and passedfds.py: which descriptors may enter a sandbox.
The policy is pure and tested over every kind; the inspection runs on real
descriptors of every kind this process can make (no mocks: the kernel says what
each one is), and check() is the one line a client sees."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxy.errors import UsageError
from boxyd.daemon import fdpolicy as fp
from boxyd.daemon import passedfds

SENSITIVE = [
    ("/run/user/1000/boxy", "boxyd's socket directory"),
    ("/run/user/1000", "user runtime directory"),
    ("/tmp/ssh-XYZ/agent.1", "SSH agent socket"),
    ("/run", "system runtime directory"),
]
OWN = 4242


def unix(peer: str | None, local: str | None = "", pid: int = 1, **kw: object) -> fp.FdFacts:
    sock = fp.SockFacts(fp.AF_UNIX, kw.pop("type", 1), kw.pop("listening", False), local, peer, pid)  # type: ignore[arg-type]
    return fp.FdFacts(fp.Kind.SOCKET, 0x534F434B, sock=sock)


def inet(peer: str | None, type: int = 1, listening: bool = False) -> fp.FdFacts:
    sock = fp.SockFacts(fp.AF_INET, type, listening, "10.0.0.1:5", peer)
    return fp.FdFacts(fp.Kind.SOCKET, 0x534F434B, sock=sock)


ALLOWED = {
    "regular file": fp.FdFacts(fp.Kind.REGULAR, 0xEF53),
    "memfd": fp.FdFacts(fp.Kind.REGULAR, 0x01021994),
    "pipe": fp.FdFacts(fp.Kind.FIFO, 0x50495045),
    "/dev/null": fp.FdFacts(fp.Kind.CHAR, 0x01021994, (1, 3)),
    "/dev/urandom": fp.FdFacts(fp.Kind.CHAR, 0x01021994, (1, 9)),
    "a terminal": fp.FdFacts(fp.Kind.CHAR, 0x1CD1, (136, 4), tty=True),
    "socketpair": unix(""),
    "journald's stdout": unix(fp.JOURNAL_STDOUT),
    "a user's own server": unix("/home/u/project/app.sock"),
    "tcp connection": inet("93.184.216.34:443"),
}
REFUSED = {
    "boxyd's socket": (unix("/run/user/1000/boxy/boxyd.sock"), "boxyd's socket directory"),
    "boxyd's own end": (unix("", pid=OWN), "boxyd itself"),
    "session bus": (unix("/run/user/1000/bus"), "user runtime directory"),
    "ssh agent": (unix("/tmp/ssh-XYZ/agent.1"), "SSH agent"),
    "system bus": (unix("/run/dbus/system_bus_socket"), "system runtime"),
    "dotted path": (unix("/run/user/1000/./bus"), "user runtime"),
    "bound in runtime dir": (unix("", local="/run/user/1000/x.sock"), "bound at"),
    "abstract peer": (unix("@/tmp/.X11-unix/X0"), "abstract"),
    "relative peer": (unix("sock"), "relative"),
    "unconnected unix": (unix(None), "unconnected unix"),
    "listening unix": (unix(None, listening=True), "listening"),
    "journal as local name": (unix("", local=fp.JOURNAL_STDOUT), "system runtime"),
    "udp": (inet("1.1.1.1:53", type=2), "datagram"),
    "unconnected tcp": (inet(None), "unconnected IP"),
    "listening tcp": (inet(None, listening=True), "listening"),
    "netlink": (
        fp.FdFacts(fp.Kind.SOCKET, 0x534F434B, sock=fp.SockFacts(16, 3, False, None, None)),
        "family 16",
    ),
    "socket without facts": (fp.FdFacts(fp.Kind.SOCKET), "a socket"),
    "directory": (fp.FdFacts(fp.Kind.DIRECTORY, 0xEF53), "directory"),
    "O_PATH file": (fp.FdFacts(fp.Kind.REGULAR, 0xEF53, o_path=True), "O_PATH"),
    "/proc file": (fp.FdFacts(fp.Kind.REGULAR, 0x9FA0), "/proc"),
    "/sys file": (fp.FdFacts(fp.Kind.REGULAR, 0x62656572), "/sys"),
    "pidfd": (fp.FdFacts(fp.Kind.REGULAR, 0x50494446), "process descriptor"),
    "namespace": (fp.FdFacts(fp.Kind.REGULAR, 0x6E736673), "namespace"),
    "eventfd": (fp.FdFacts(fp.Kind.OTHER, 0x09041934), "anonymous inode"),
    "block device": (fp.FdFacts(fp.Kind.BLOCK, 0x01021994, (8, 0)), "block device"),
    "kvm": (fp.FdFacts(fp.Kind.CHAR, 0x01021994, (10, 232)), "device 10:232"),
    "symlink": (fp.FdFacts(fp.Kind.SYMLINK, 0xEF53), "symbolic link"),
    "unknown": (fp.FdFacts(fp.Kind.OTHER), "no file type"),
}


@pytest.mark.parametrize("name", ALLOWED)
def test_allowed(name: str) -> None:
    assert fp.judge(ALLOWED[name], SENSITIVE, OWN) is None


@pytest.mark.parametrize("name", REFUSED)
def test_refused(name: str) -> None:
    facts, said = REFUSED[name]
    why = fp.judge(facts, SENSITIVE, OWN)
    assert why is not None and said in why, why


def test_every_pseudo_filesystem_is_refused_for_every_file_kind() -> None:
    for fs in fp.PSEUDO_FS:
        for kind in (fp.Kind.REGULAR, fp.Kind.FIFO, fp.Kind.CHAR, fp.Kind.OTHER):
            assert fp.judge(fp.FdFacts(kind, fs, (1, 3)), SENSITIVE, OWN) is not None


def test_refusal_is_one_line_naming_the_fd() -> None:
    line = fp.refusal(0, "a socket connected to boxyd itself")
    assert "\n" not in line and line.startswith("stdin (fd 0) is a socket connected to boxyd")
    assert "</dev/null" in line
    assert fp.refusal(2, "x").startswith("stderr (fd 2)") and "2>/dev/null" in fp.refusal(2, "x")


# -- the inspection, on real descriptors ---------------------------------------------


@pytest.fixture
def fds() -> Iterator[list[int]]:
    held: list[int] = []
    yield held
    for fd in held:
        os.close(fd)


def hold(fds: list[int], fd: int) -> int:
    fds.append(fd)
    return fd


def judged(fd: int, sensitive: list[tuple[str, str]] | None = None) -> str | None:
    """FD judged as boxyd would if another process were boxyd (here we are both ends)."""
    return fp.judge(passedfds.inspect(fd), sensitive or SENSITIVE, OWN)


@contextlib.contextmanager
def listener_elsewhere(path: str) -> Iterator[None]:
    """A unix listener at PATH made by a child: SO_PEERCRED of a connection to it is
    the child's, not ours (boxyd's own pid is what check() compares with)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            lsn = socket.socket(socket.AF_UNIX)
            lsn.bind(path)
            lsn.listen()
            os.write(w, b"1")
            os.close(w)
            conn, _ = lsn.accept()
            conn.recv(1)
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
        yield
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_real_allowed(fds: list[int], tmp_path: Path) -> None:
    r, w = os.pipe()
    fds += [r, w]
    a, b = socket.socketpair()
    fds += [a.detach(), b.detach()]
    f = hold(fds, os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT))
    null = hold(fds, os.open("/dev/null", os.O_RDWR))
    memfd = hold(fds, os.memfd_create("x"))
    for fd in (r, w, fds[2], f, null, memfd):
        assert judged(fd) is None, (fd, passedfds.inspect(fd))


def test_real_tcp_connection_passes_and_its_listener_does_not(fds: list[int]) -> None:
    lsn = socket.create_server(("127.0.0.1", 0))
    conn = socket.create_connection(lsn.getsockname())
    try:
        assert judged(conn.fileno()) is None
        assert "listening" in (judged(lsn.fileno()) or "")
    finally:
        conn.close()
        lsn.close()


def test_real_refused(fds: list[int], tmp_path: Path) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    cases = {
        "datagram": udp.detach(),
        "unconnected IP": tcp.detach(),
        "family 16": nl.detach(),
        "directory": os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY),
        "O_PATH": os.open(tmp_path / ".", os.O_PATH),
        "/proc": os.open("/proc/self/status", os.O_RDONLY),
        "anonymous inode": os.eventfd(0),
        "process descriptor": os.pidfd_open(os.getpid()),
        "namespace": os.open("/proc/self/ns/net", os.O_RDONLY),
    }
    fds += cases.values()
    for said, fd in cases.items():
        why = judged(fd)
        if said == "process descriptor" and why is not None and "anonymous inode" in why:
            continue  # a kernel before pidfs (6.9) makes pidfds anonymous inodes
        assert why is not None and said in why, (said, why, passedfds.inspect(fd))


def test_real_unix_sockets_by_where_they_lead(fds: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        os.mkdir(run)
        path = os.path.join(run, "boxyd.sock")
        lsn = socket.socket(socket.AF_UNIX)
        lsn.bind(path)
        lsn.listen()
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)
        server, _ = lsn.accept()
        abstract = socket.socket(socket.AF_UNIX)
        abstract.bind(b"\0boxy-test-" + str(os.getpid()).encode())
        abstract.listen()
        to_abstract = socket.socket(socket.AF_UNIX)
        to_abstract.connect(abstract.getsockname())
        sensitive = [(run, "boxyd's socket directory")]
        try:
            assert "connected to " + path in (judged(client.fileno(), sensitive) or "")
            assert "bound at " + path in (judged(server.fileno(), sensitive) or "")
            assert "listening" in (judged(lsn.fileno(), sensitive) or "")
            assert "abstract" in (judged(to_abstract.fileno(), sensitive) or "")
            # the same connection, judged without the directory among the sensitive
            assert judged(client.fileno(), [("/nowhere", "x")]) is None
        finally:
            for s in (client, server, lsn, abstract, to_abstract):
                s.close()


def test_check_names_the_first_refused_fd(fds: list[int], tmp_path: Path) -> None:
    null = hold(fds, os.open("/dev/null", os.O_RDWR))
    d = hold(fds, os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    passedfds.check([null, null, null], {}, str(tmp_path))
    with pytest.raises(UsageError, match=r"^stdout \(fd 1\) is a directory"):
        passedfds.check([null, d, null], {}, str(tmp_path))


def test_check_refuses_a_connection_into_boxyds_runtime_dir(
    fds: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the client's environment claims: boxyd's own directory counts."""
    with tempfile.TemporaryDirectory() as d:
        monkeypatch.setenv("XDG_RUNTIME_DIR", d)
        os.mkdir(os.path.join(d, "boxy"))
        path = os.path.join(d, "boxy", "boxyd.sock")
        null = hold(fds, os.open("/dev/null", os.O_RDWR))
        with listener_elsewhere(path):
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)
            try:
                with pytest.raises(UsageError, match=r"^stdin \(fd 0\) is a unix socket connected"):
                    passedfds.check([client.fileno(), null, null], {"XDG_RUNTIME_DIR": "/x"}, "/h")
            finally:
                client.close()


def test_check_refuses_boxyds_own_end(fds: list[int]) -> None:
    """A socketpair whose other end boxyd holds (SO_PEERCRED: boxyd's pid)."""
    a, b = socket.socketpair()
    null = hold(fds, os.open("/dev/null", os.O_RDWR))
    try:
        with pytest.raises(UsageError, match=r"^stderr \(fd 2\) is a socket connected to boxyd"):
            passedfds.check([null, null, a.fileno()], {}, "/h")
    finally:
        a.close()
        b.close()
