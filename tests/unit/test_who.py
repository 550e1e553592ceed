"""Who asked (--ask, boxyd/daemon/who.py over boxyd/net/sockdiag.py): the pure parts
(argv[0] made safe for a terminal, the NSpid line, the sock_diag request and answer)
and the lookup itself on the real kernel, in this process's own network and user
namespaces: a child holding a socket is found by its flow, a lookup over its budget
gives up, and a session's lookups are bounded."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator

import pytest

from boxyd.daemon import who
from boxyd.daemon.asking import Who
from boxyd.net import netlink, sockdiag
from boxyd.net.sockdiag import Flow, SockDiag

# -- pure ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw,shown",
    [
        (b"/usr/bin/python3\0who.py\0", "/usr/bin/python3"),
        (b"node\0", "node"),
        (b"\x1b]52;c;ZXZpbA==\x07curl\0", "?]52;c;ZXZpbA==?curl"),  # OSC 52, BEL
        ("evil\u202etxt.exe".encode() + b"\0", "evil?txt.exe"),  # a bidi override
        ("a\nb\rc\x7fd\x9be".encode() + b"\0", "a?b?c?d?e"),  # C1 CSI (as UTF-8) too
        (b"\xff\xfename\0", "\ufffd\ufffdname"),  # not UTF-8: replaced, not raised
        (b"", "?"),
        (b"\0--flag\0", "?"),
        (b"x" * 5000, "x" * (who.ARGV0_SHOWN - 1) + "…"),
    ],
)
def test_argv0_is_made_safe_for_a_terminal(raw: bytes, shown: str) -> None:
    assert who.argv0(raw) == shown
    assert all(c.isprintable() for c in who.argv0(raw))


def test_the_pid_the_payload_sees_is_nspids_last_field() -> None:
    status = b"Name:\tpython3\nTgid:\t4242\nNSpid:\t4242\t7\nNSpgid:\t4242\t7\n"
    assert who.ns_pid(status) == 7
    assert who.ns_pid(b"Name:\tx\nNSpid:\t99\n") == 99  # not in a pid namespace of its own
    assert who.ns_pid(b"Name:\tNSpid: 5\n") is None  # the name is the payload's: no line start
    assert who.ns_pid(b"Name:\tx\n") is None


def test_the_question_says_who_with_both_pids() -> None:
    assert str(Who(7, "/usr/bin/python3", 4242)) == "pid 7 (/usr/bin/python3, pid 4242 on the host)"
    assert str(Who(7, "node")) == "pid 7 (node)"


def test_a_tcp_lookup_is_the_sockets_own_view_and_udps_the_other_way_round() -> None:
    flow = Flow("tcp", ("10.0.2.15", 40000), ("11.0.0.20", 443))
    (kind, seq, body), *_ = netlink.messages(sockdiag.request(flow, 7))
    assert (kind, seq, len(body)) == (sockdiag.SOCK_DIAG_BY_FAMILY, 7, 56)
    family, proto = body[0], body[1]
    sport, dport = struct.unpack_from("!HH", body, 8)
    src, dst = body[12:16], body[28:32]
    assert (family, proto, sport, dport) == (socket.AF_INET, socket.IPPROTO_TCP, 40000, 443)
    assert (src, dst) == (bytes([10, 0, 2, 15]), bytes([11, 0, 0, 20]))
    udp = Flow("udp", ("fd00::15", 5353), ("fd00::2", 53))
    (_, _, body), *_ = netlink.messages(sockdiag.request(udp, 8))
    assert (body[0], body[1]) == (socket.AF_INET6, socket.IPPROTO_UDP)
    assert struct.unpack_from("!HH", body, 8) == (53, 5353)  # swapped, as udp_dump_one reads
    assert body[12:28] == socket.inet_pton(socket.AF_INET6, "fd00::2")
    with pytest.raises(ValueError):
        sockdiag.request(Flow("udp", ("10.0.2.15", 1), ("fd00::2", 53)), 1)  # mixed families


def test_an_answer_is_read_by_its_sequence_number() -> None:
    tail = struct.pack("=IIIII", 0, 0, 0, 1000, 123456)
    msg = bytes(4) + bytes(48) + tail
    answer = netlink.message(sockdiag.SOCK_DIAG_BY_FAMILY, 0, 5, msg)
    assert sockdiag.parse(answer, 5) == sockdiag.Owner(123456, 1000)
    assert sockdiag.parse(answer, 6) is None  # an older question's answer
    refused = netlink.message(netlink.NLMSG_ERROR, 0, 5, struct.pack("=i", -errno.ENOENT))
    assert sockdiag.parse(refused, 5) == errno.ENOENT
    with pytest.raises(ValueError):
        sockdiag.parse(netlink.message(sockdiag.SOCK_DIAG_BY_FAMILY, 0, 5, msg[:40]), 5)


# -- on the real kernel ----------------------------------------------------------------

HOLDER = """\
import resource, socket, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
extra = [open("/dev/null") for _ in range(int(sys.argv[1]))]  # the socket's fd above them
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("127.0.0.1", 9))
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture
def diag() -> Iterator[SockDiag]:
    d = SockDiag(sockdiag.open_socket())
    yield d
    d.close()


def _holder(fds: int = 0) -> tuple[subprocess.Popen[str], Flow]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(fds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    port = int(child.stdout.readline())
    return child, Flow("udp", ("127.0.0.1", port), ("127.0.0.1", 9))


def _own_userns() -> who.NsKey:
    return os.readlink("/proc/self/ns/user")


def test_the_process_that_holds_the_flows_socket_is_found(diag: SockDiag) -> None:
    child, flow = _holder()
    try:
        found = who.who_sent(diag, flow, _own_userns())
        assert found == Who(child.pid, sys.executable, child.pid)
        # another namespace's processes are not looked at
        assert who.who_sent(diag, flow, "user:[1]") is None
        # nobody sent from there
        assert (
            who.who_sent(diag, Flow("udp", ("127.0.0.1", 1), ("127.0.0.1", 9)), _own_userns())
            is None
        )
    finally:
        child.communicate("")
    assert who.who_sent(diag, flow, _own_userns()) is None  # gone with its process


def test_a_lookup_past_its_budget_gives_up(diag: SockDiag) -> None:
    child, flow = _holder(fds=900)  # under a user's default limit (1024) too
    try:
        owner = diag.owner(flow)
        assert owner is not None
        walk = who._Walk(10.0, 500, who.MAX_PROCS)  # fewer readlinks than it holds fds
        assert who.holder(owner.inode, _own_userns(), walk) is None
        assert who.who_sent(diag, flow, _own_userns(), budget=0.0) is None
        assert who.who_sent(diag, flow, _own_userns()) == Who(child.pid, sys.executable, child.pid)
    finally:
        child.communicate("")


def test_the_namespace_of_an_nsfs_fd_is_the_one_proc_names() -> None:
    fd = os.open("/proc/self/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert who.namespace(fd) == _own_userns()
    finally:
        os.close(fd)


def test_a_sessions_lookups_are_bounded(diag: SockDiag) -> None:
    """At most WAITING at once (the rest: unknown at once), and BURST in a burst."""
    child, flow = _holder()

    async def main() -> list[Who | None]:
        whos = who.Whos(diag)
        assert await whos.who(flow) is None  # the sandbox's namespace not known yet
        whos.userns = _own_userns()
        together = await asyncio.gather(*(whos.who(flow) for _ in range(20)))
        later = [await whos.who(flow) for _ in range(who.BURST)]
        return [*together, *later]

    try:
        got = asyncio.run(main())
    finally:
        child.communicate("")
    found = Who(child.pid, sys.executable, child.pid)
    assert got[:20].count(found) == who.WAITING and got[:20].count(None) == 20 - who.WAITING
    # the burst's tokens: WAITING taken above, then BURST - WAITING more, then none
    # (a token may come back while they run: RATE a second)
    assert who.BURST - who.WAITING <= got[20:].count(found) <= who.BURST - who.WAITING + 1
