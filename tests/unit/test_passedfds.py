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

OWN = 4242


def unix(peer: str | None, local: str | None = "", pid: int = 1, **kw: object) -> fp.FdFacts:
    sock = fp.SockFacts(fp.AF_UNIX, kw.pop("type", 1), kw.pop("listening", False), local, peer, pid)  # type: ignore[arg-type]
    return fp.FdFacts(fp.Kind.SOCKET, 0x534F434B, sock=sock)


def inet(peer: str | None, type: int = 1, listening: bool = False) -> fp.FdFacts:
    sock = fp.SockFacts(fp.AF_INET, type, listening, "10.0.0.1:5", peer)
    return fp.FdFacts(fp.Kind.SOCKET, 0x534F434B, sock=sock)


ALLOWED = {
    "regular file": fp.FdFacts(fp.Kind.REGULAR, 0xEF53),
    "file on xfs": fp.FdFacts(fp.Kind.REGULAR, 0x58465342),
    "memfd": fp.FdFacts(fp.Kind.REGULAR, 0x01021994),
    "pipe": fp.FdFacts(fp.Kind.FIFO, 0x50495045),
    "/dev/null": fp.FdFacts(fp.Kind.CHAR, 0x01021994, (1, 3)),
    "/dev/urandom": fp.FdFacts(fp.Kind.CHAR, 0x01021994, (1, 9)),
    "a terminal": fp.FdFacts(fp.Kind.CHAR, 0x1CD1, (136, 4), tty=True),
    "socketpair": unix(""),
    "seqpacket socketpair": unix("", type=5),
    "journald's stdout": unix(fp.JOURNAL_STDOUT),
}
REFUSED = {
    "boxyd's socket": (unix("/run/user/1000/boxy/boxyd.sock"), "connected to /run/user"),
    "boxyd's own end": (unix("", pid=OWN), "boxyd itself"),
    "session bus": (unix("/run/user/1000/bus"), "a service of the host's"),
    "a bus outside every known place": (unix("/var/tmp/atkbus/bus"), "a service"),
    "two slashes": (unix("//tmp/x/svc.sock"), "a service"),
    "through a symlink": (unix("/var/tmp/rtlink/bus"), "a service"),
    "a user's own server": (unix("/home/u/project/app.sock"), "a service"),
    "bound (a server's end)": (unix("", local="/run/user/1000/x.sock"), "bound at"),
    "journal as local name": (unix("", local=fp.JOURNAL_STDOUT), "bound at"),
    "abstract peer": (unix("@/tmp/.X11-unix/X0"), "'@/tmp/.X11-unix/X0'"),
    "relative peer": (unix("sock"), "'sock'"),
    "unconnected unix": (unix(None), "unconnected unix"),
    "listening unix": (unix(None, listening=True), "listening"),
    "unix datagram pair": (unix("", type=2), "datagram"),
    "tcp to loopback": (inet("127.0.0.1:5432"), "connected to 127.0.0.1:5432"),
    "tcp to the internet": (inet("93.184.216.34:443"), "network socket"),
    "udp": (inet("1.1.1.1:53", type=2), "network socket"),
    "unconnected tcp": (inet(None), "network socket"),
    "listening tcp": (inet(None, listening=True), "listening"),
    "netlink": (
        fp.FdFacts(fp.Kind.SOCKET, 0x534F434B, sock=fp.SockFacts(16, 3, False, None, None)),
        "network socket",
    ),
    "socket without facts": (fp.FdFacts(fp.Kind.SOCKET), "a socket"),
    "directory": (fp.FdFacts(fp.Kind.DIRECTORY, 0xEF53), "directory"),
    "O_PATH file": (fp.FdFacts(fp.Kind.REGULAR, 0xEF53, o_path=True), "O_PATH"),
    "/proc file": (fp.FdFacts(fp.Kind.REGULAR, 0x9FA0), "/proc"),
    "/sys file": (fp.FdFacts(fp.Kind.REGULAR, 0x62656572), "/sys"),
    "message queue": (fp.FdFacts(fp.Kind.REGULAR, 0x19800202), "mqueue"),
    "pidfd": (fp.FdFacts(fp.Kind.REGULAR, 0x50494446), "process descriptor"),
    "namespace": (fp.FdFacts(fp.Kind.REGULAR, 0x6E736673), "namespace"),
    "a filesystem boxy does not know": (fp.FdFacts(fp.Kind.REGULAR, 0x12345), "0x12345"),
    "eventfd": (fp.FdFacts(fp.Kind.OTHER, 0x09041934), "anonymous inode"),
    "block device": (fp.FdFacts(fp.Kind.BLOCK, 0x01021994, (8, 0)), "block device"),
    "kvm": (fp.FdFacts(fp.Kind.CHAR, 0x01021994, (10, 232)), "device 10:232"),
    "symlink": (fp.FdFacts(fp.Kind.SYMLINK, 0xEF53), "symbolic link"),
    "unknown": (fp.FdFacts(fp.Kind.OTHER), "no file type"),
}


@pytest.mark.parametrize("name", ALLOWED)
def test_allowed(name: str) -> None:
    assert fp.judge(ALLOWED[name], OWN) is None


@pytest.mark.parametrize("name", REFUSED)
def test_refused(name: str) -> None:
    facts, said = REFUSED[name]
    why = fp.judge(facts, OWN)
    assert why is not None and said in why, why


def test_only_data_filesystems_hold_files_that_pass() -> None:
    """Every kernel filesystem named is refused for a regular file; every data one passes."""
    for fs in fp.KERNEL_FS:
        assert fs not in fp.DATA_FS
        assert fp.judge(fp.FdFacts(fp.Kind.REGULAR, fs), OWN) is not None
    for fs in fp.DATA_FS:
        assert fp.judge(fp.FdFacts(fp.Kind.REGULAR, fs), OWN) is None


def test_no_socket_but_a_pair_or_the_journal_passes() -> None:
    """Every combination of family, type, listening and names: only the two shapes."""
    names = [None, "", fp.JOURNAL_STDOUT, "/x/s", "@a", "rel", "1.2.3.4:5"]
    passed = []
    for family in (fp.AF_UNIX, fp.AF_INET, fp.AF_INET6, 16, 40):
        for kind in (1, 2, 3, 5):
            for listening in (False, True):
                for local in names:
                    for peer in names:
                        sock = fp.SockFacts(family, kind, listening, local, peer, 1)
                        if fp.judge(fp.FdFacts(fp.Kind.SOCKET, sock=sock), OWN) is None:
                            passed.append((family, kind, listening, local, peer))
    assert sorted(passed, key=repr) == sorted(
        [
            (fp.AF_UNIX, k, False, local, peer)
            for k in (1, 5)
            for local in (None, "")
            for peer in ("", fp.JOURNAL_STDOUT)
        ],
        key=repr,
    )


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


def judged(fd: int) -> str | None:
    """FD judged as boxyd would if another process were boxyd (here we are both ends)."""
    return fp.judge(passedfds.inspect(fd), OWN)


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


def test_real_tcp_connections_and_listeners_do_not_pass(fds: list[int]) -> None:
    """A connection to a service on loopback (a database a cron job opened on fd 0)
    is the user's authority as much as a socket of boxyd's."""
    lsn = socket.create_server(("127.0.0.1", 0))
    conn = socket.create_connection(lsn.getsockname())
    accepted, _ = lsn.accept()
    try:
        assert "connected to 127.0.0.1:" in (judged(conn.fileno()) or "")
        assert "network socket" in (judged(accepted.fileno()) or "")
        assert "listening" in (judged(lsn.fileno()) or "")
    finally:
        for s in (conn, accepted, lsn):
            s.close()


def test_real_refused(fds: list[int], tmp_path: Path) -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    dgram_pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    cases = {
        "network socket of the host's connected": udp.detach(),
        "network socket of the host's (": tcp.detach(),
        "network socket": nl.detach(),
        "datagram": dgram_pair[0].detach(),
        "directory": os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY),
        "O_PATH": os.open(tmp_path / ".", os.O_PATH),
        "/proc": os.open("/proc/self/status", os.O_RDONLY),
        "anonymous inode": os.eventfd(0),
        "process descriptor": os.pidfd_open(os.getpid()),
        "namespace": os.open("/proc/self/ns/net", os.O_RDONLY),
    }
    udp_peer = socket.socket(fileno=os.dup(cases["network socket of the host's connected"]))
    udp_peer.connect(("127.0.0.1", 9))  # a connected datagram socket: still refused
    udp_peer.close()
    fds += [*cases.values(), dgram_pair[1].detach()]
    for said, fd in cases.items():
        why = judged(fd)
        if said == "process descriptor" and why is not None and "anonymous inode" in why:
            continue  # a kernel before pidfs (6.9) makes pidfds anonymous inodes
        assert why is not None and said in why, (said, why, passedfds.inspect(fd))


def test_real_message_queue_is_refused(fds: list[int]) -> None:
    """A POSIX message queue of the host's IPC namespace (mq_open's fd: mqueue fs)."""
    import ctypes

    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    name = f"/boxy-test-{os.getpid()}".encode()
    fd = rt.mq_open(name, os.O_RDWR | os.O_CREAT, 0o600, None)
    if fd < 0:
        pytest.fail(f"mq_open: {os.strerror(ctypes.get_errno())}")
    rt.mq_unlink(name)
    hold(fds, fd)
    assert "mqueue" in (judged(fd) or ""), passedfds.inspect(fd)


def test_real_unix_sockets_by_where_they_lead(fds: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "svc.sock")
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
        pair = socket.socketpair()
        try:
            assert "connected to " + path in (judged(client.fileno()) or "")
            assert "bound at " + path in (judged(server.fileno()) or "")
            assert "listening" in (judged(lsn.fileno()) or "")
            assert "'@boxy-test-" in (judged(to_abstract.fileno()) or "")
            assert judged(pair[0].fileno()) is None
        finally:
            for s in (client, server, lsn, abstract, to_abstract, *pair):
                s.close()


def test_check_names_the_first_refused_fd(fds: list[int], tmp_path: Path) -> None:
    null = hold(fds, os.open("/dev/null", os.O_RDWR))
    d = hold(fds, os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
    passedfds.check([null, null, null])
    with pytest.raises(UsageError, match=r"^stdout \(fd 1\) is a directory"):
        passedfds.check([null, d, null])


def test_check_refuses_a_connection_to_a_socket_of_boxyd(fds: list[int]) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "boxyd.sock")
        null = hold(fds, os.open("/dev/null", os.O_RDWR))
        with listener_elsewhere(path):
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)
            try:
                with pytest.raises(UsageError, match=r"^stdin \(fd 0\) is a unix socket connected"):
                    passedfds.check([client.fileno(), null, null])
            finally:
                client.close()


def test_check_refuses_boxyds_own_end(fds: list[int]) -> None:
    """A socketpair whose other end boxyd holds (SO_PEERCRED: boxyd's pid)."""
    a, b = socket.socketpair()
    null = hold(fds, os.open("/dev/null", os.O_RDWR))
    try:
        with pytest.raises(UsageError, match=r"^stderr \(fd 2\) is a socket connected to boxyd"):
            passedfds.check([null, null, a.fileno()])
    finally:
        a.close()
        b.close()
