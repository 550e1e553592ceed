"""The pure parts of naming a refused system call (issue 34): the notifying program,
stage 2's name table, PID 1's answer and its bounds, the protocol's two reports and
what boxyd says of them. The kernel's side: tests/escape/test_seccomp_named.py."""

from __future__ import annotations

import errno
import itertools

import pytest

from boxyctl.sessions import event_line
from boxyd.daemon import refusedcalls
from boxyd.plan import seccomp as plan
from boxyd.stage2 import notify, protocol, syscalls

from . import bpfsim as B

NOTIF = "USER_NOTIF"
KILL = "KILL_PROCESS"
EPERM = f"ERRNO({errno.EPERM})"


def _verdict(flt: B.Filter, number: int, *args: int, arch: int = B.AUDIT_ARCH_X86_64) -> str:
    return B.describe(flt(number, *args, arch=arch))


@pytest.mark.parametrize("mode", ["strict", "compat"])
def test_every_refusal_but_the_probes_notifies(mode: plan.Mode) -> None:
    # the same program but that each KILL/EPERM is a notification; ENOSYS and ALLOW kept
    old, new = B.Filter(plan.build_filter(mode)), B.Filter(plan.build_filter(mode, True))
    changed = 0
    for number in range(1024):
        before, after = _verdict(old, number), _verdict(new, number)
        if before in (KILL, EPERM):
            assert after == NOTIF, (number, before, after)
            changed += 1
        else:
            assert after == before, (number, before, after)
    assert changed > 100, changed


@pytest.mark.parametrize(
    ("name", "args", "allowed"),
    [
        ("clone", (0x10000000,), (0x11,)),  # CLONE_NEWUSER; a fork's SIGCHLD
        ("unshare", (0x00020000,), (0x200,)),  # CLONE_NEWNS; CLONE_FS
        ("ioctl", (0, 0x5412), (0, 0x541B)),  # TIOCSTI; FIONREAD
        ("socket", (17, 3, 0), (2, 1, 0)),  # AF_PACKET; a TCP socket
        ("personality", (0x0040000,), (0xFFFFFFFF,)),  # ADDR_NO_RANDOMIZE; the query
    ],
)
def test_argument_refusals_notify_and_the_allowed_cases_do_not(
    name: str, args: tuple[int, ...], allowed: tuple[int, ...]
) -> None:
    flt = B.Filter(plan.build_filter("strict", True))
    number = syscalls.NAMES.index(name)
    assert _verdict(flt, number, *args) == NOTIF
    assert _verdict(flt, number, *allowed) == "ALLOW"
    assert number in plan.errno_calls()  # PID 1 answers EPERM, never a kill


def test_foreign_architectures_and_x32_still_kill() -> None:
    # their numbers name nothing: killed in the filter, recorded by their signal
    flt = B.Filter(plan.build_filter("strict", True))
    assert _verdict(flt, 39 | 0x40000000) == KILL
    assert _verdict(flt, 20, arch=0x40000003) == KILL  # i386
    compat = B.Filter(plan.build_filter("compat", True))
    assert _verdict(compat, 39 | 0x40000000) == EPERM


def test_stage2_names_are_libseccomps() -> None:
    # generated once (boxyd/stage2/syscalls.py): stale if libseccomp learned more
    assert plan.name_table() == syscalls.NAMES
    assert syscalls.name(101) == "ptrace"
    assert syscalls.name(279) == "move_pages"
    assert syscalls.name(len(syscalls.NAMES) + 3) == f"syscall {len(syscalls.NAMES) + 3}"
    assert syscalls.name(-1) == "syscall -1"


def test_errno_calls_are_the_named_refusals_only() -> None:
    got = {syscalls.name(n) for n in plan.errno_calls()}
    assert got == set(plan.EPERM_SYSCALLS) | set(plan.CONDITIONAL)
    assert "move_pages" not in got and "clone3" not in got


def test_pid1_kills_only_an_unlisted_call_in_strict_mode() -> None:
    calls = frozenset(plan.errno_calls())
    ptrace, move_pages = syscalls.NAMES.index("ptrace"), syscalls.NAMES.index("move_pages")
    assert notify.decide(ptrace, "strict", calls) == "errno"
    assert notify.decide(move_pages, "strict", calls) == "kill"
    assert notify.decide(move_pages, "compat", calls) == "errno"
    assert notify.decide(10_000, "strict", calls) == "kill"


def test_tally_bounds_the_rate_and_the_names() -> None:
    now = [100.0]
    tally = notify.Tally(per_second=3, max_names=2, clock=lambda: now[0])
    said = [tally.count("ptrace") for _ in range(5)]
    assert said == [True, True, True, False, False]
    now[0] += 1.0  # a new second: three more
    assert tally.count("add_key") and tally.count("bpf")
    assert tally.counts == {"ptrace": 5, "add_key": 1, notify.OTHER: 1}


def test_the_notification_layout_is_the_kernels() -> None:
    # struct seccomp_notif is 80 bytes, its response 24 (include/uapi/linux/seccomp.h)
    assert notify.NOTIF.size == 80 and notify.RESP.size == 24
    assert (3 << 30) | (80 << 16) | (ord("!") << 8) | 0 == notify.NOTIF_RECV
    assert (3 << 30) | (24 << 16) | (ord("!") << 8) | 1 == notify.NOTIF_SEND
    assert (1 << 30) | (8 << 16) | (ord("!") << 8) | 2 == notify.NOTIF_ID_VALID


def _refused(**kw: object) -> protocol.Refused:
    fields: dict[str, object] = {
        "call": "ptrace",
        "nr": 101,
        "args": (16, 1, 0, 0, 0, (1 << 64) - 1),
        "pid": 12,
        "tgid": 12,
        "comm": "node",
        "argv0": "node",
        "action": "errno",
    }
    return protocol.Refused(**{**fields, **kw})  # type: ignore[arg-type]


def test_refused_round_trips_and_bad_ones_are_refused() -> None:
    msg = _refused()
    line = protocol.encode(msg)
    assert protocol.decode_status(line) == msg
    for bad in (
        {"action": "allow"},
        {"args": (1, 2)},
        {"args": (-1, 0, 0, 0, 0, 0)},
        {"pid": 0},
        {"comm": "x" * 501},
        {"call": "c" * 41},
    ):
        with pytest.raises(protocol.ProtocolError):
            protocol.encode(_refused(**bad))
    with pytest.raises(protocol.ProtocolError):  # a bool is no int in an argument
        protocol.decode_status(line.replace(b"[16,", b"[true,"))
    totals = protocol.Refusals(("ptrace", "bpf"), (2, 1))
    assert protocol.decode_status(protocol.encode(totals)) == totals
    with pytest.raises(protocol.ProtocolError):
        protocol.encode(protocol.Refusals(("ptrace",), (0,)))


def test_a_record_names_the_call_its_arguments_and_the_process() -> None:
    msg = _refused(action="kill", call="move_pages", nr=279, pid=13, comm="python3", argv0="py")
    rec = refusedcalls.record(msg)
    assert rec["call"] == "move_pages" and rec["pid"] == 12 and rec["tid"] == 13
    assert rec["args"] == ["0x10", "0x1", "0x0", "0x0", "0x0", "0xffffffffffffffff"]
    assert rec["reason"] == (
        "seccomp: move_pages(0x10, 0x1, 0x0, 0x0, 0x0, 0xffffffffffffffff) by pid 12 "
        "python3 (py) thread 13: killed"
    )


def test_the_end_line_counts_by_name_and_names_the_killed() -> None:
    calls = refusedcalls.RefusedCalls()
    for m in (_refused(), _refused(), _refused(call="add_key", nr=248)):
        calls.add(m)
    calls.add(
        _refused(
            call="move_pages", nr=279, action="kill", tgid=40, pid=40, comm="sh", argv0="/bin/sh"
        )
    )
    assert calls.lines() == [
        "refused system calls: ptrace ×2, add_key ×1, move_pages ×1 (killed pid 40 sh)"
    ]
    assert calls.first_kill() == "move_pages"
    # PID 1's totals win: they count the refusals past its report rate
    calls.ended(protocol.Refusals(("ptrace", "add_key", "move_pages"), (900, 1, 1)))
    assert calls.lines()[0].startswith("refused system calls: ptrace ×900, add_key ×1")


def test_boxyd_bounds_what_pid1_says() -> None:
    calls = refusedcalls.RefusedCalls()
    names = (f"syscall {n}" for n in itertools.count(1000))
    for _ in range(refusedcalls.MAX_NAMES + 5):
        calls.add(_refused(call=next(names), action="kill", pid=7, tgid=7))
    assert len(calls.counts) == refusedcalls.MAX_NAMES + 1
    assert calls.counts[refusedcalls.OTHER] == 5
    assert len(calls.kills) == refusedcalls.MAX_KILLS
    assert f"{calls.killed - refusedcalls.MAX_KILLS} more processes killed" in calls.lines()[1]
    said = [calls.notice() for _ in range(refusedcalls.MAX_NOTICES + 2)]
    assert said.count(False) == 2
    assert calls.lines()[-1] == "-v: 2 more refused calls not shown"


def test_connect_notifies_only_when_asked() -> None:
    connect = syscalls.NAMES.index("connect")
    assert _verdict(B.Filter(plan.build_filter("strict", True)), connect, 3) == "ALLOW"
    assert _verdict(B.Filter(plan.build_filter("strict", True, True)), connect, 3) == NOTIF


def test_the_readers_filter_allows_its_calls_and_refuses_the_rest() -> None:
    flt = B.Filter(plan.reader_filter())
    for name in plan.READER_CALLS:
        assert _verdict(flt, syscalls.NAMES.index(name)) == "ALLOW", name
    for name in ("connect", "socket", "execve", "ptrace", "clone", "kill", "ioctl"):
        assert _verdict(flt, syscalls.NAMES.index(name)) == EPERM, name
    assert _verdict(flt, 39 | 0x40000000) == KILL


def test_sockaddr_reads_both_families_and_nothing_else() -> None:
    v4 = (2).to_bytes(2, "little") + (8081).to_bytes(2, "big") + bytes([11, 0, 0, 10]) + bytes(8)
    assert notify.sockaddr(v4) == ("11.0.0.10", 8081)
    v6 = (10).to_bytes(2, "little") + (443).to_bytes(2, "big") + bytes(4)
    v6 += bytes(15) + b"\x01" + bytes(4)
    assert notify.sockaddr(v6) == ("::1", 443)
    assert notify.sockaddr(v4[:7]) is None and notify.sockaddr(v6[:23]) is None
    assert notify.sockaddr((1).to_bytes(2, "little") + b"/tmp/x\0") is None  # AF_UNIX


def test_landlock_refuses_tcp_to_a_port_not_granted_only() -> None:
    ports = frozenset({53, 443})
    tcp, udp = (1, 6), (2, 17)
    assert notify.landlock_refuses(notify.Connect(*tcp, "11.0.0.10", 8081), ports)
    assert not notify.landlock_refuses(notify.Connect(*tcp, "11.0.0.10", 443), ports)
    assert not notify.landlock_refuses(notify.Connect(*udp, "11.0.0.10", 8081), ports)
    assert not notify.landlock_refuses(notify.Connect(*tcp, None, 0), ports)  # AF_UNIX


def test_watch_shows_a_refused_call_by_its_name() -> None:
    rec = {"t": 10.5, "session": "s", "layer": "seccomp"}
    rec |= refusedcalls.record(_refused(action="kill", call="move_pages", nr=279))
    line = event_line({"kind": "audit", "t": 10.5, "record": rec}, start=10.0, color=True)
    assert "seccomp  kill    move_pages" in line, line
    assert "by pid 12 node: killed" in line and line.startswith("\x1b[31m"), line
