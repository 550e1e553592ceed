"""PID 1 answers the payload's refused system calls, and names them (docs/design.md,
"Syscalls"; issue 34).

Where the kernel has SECCOMP_RET_USER_NOTIF, boxyd compiles every EPERM refusal and
every unlisted call as a user notification (boxyd/plan/seccomp.py), the payload's
process installs the filter with a listener and hands the listener to PID 1, which
is outside that filter. A thread of PID 1's reads each notification, names the call
and the process from /proc, and answers: EPERM, or in strict mode for an unlisted
call a SIGKILL to the whole process first (seccomp's own kill took the process: so
does this one). Nothing is ever let through: the only answer sent is an error.

A listener that is closed fails every pending and later notification with ENOSYS
(the kernel's seccomp_notify_detach, seccomp_do_user_notification), but it also frees
the chain's one listener: the payload may then load a filter of its own with a
listener (SECCOMP_FILTER_FLAG_NEW_LISTENER, EBUSY while ours is open), whose
USER_NOTIF wins the tie with ours (the newest filter's does) and whose CONTINUE runs
any call ours refuses. So this listener is never closed while a process of the
payload can still run: a notifier that fails leaves it open and PID 1 kills every
process of the sandbox (pid1.py's quietly), and PID 1 kills them all before it exits.

Standard library only (stage 2 does not import libseccomp): the ioctls through
fcntl, the structs through struct.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from boxyd.kernel import sys as ksys
from boxyd.stage2 import seccomp, syscalls

# include/uapi/linux/seccomp.h: _IOWR('!', 0, struct seccomp_notif), _IOWR('!', 1,
# struct seccomp_notif_resp), _IOW('!', 2, __u64)
NOTIF_RECV = 0xC0502100
NOTIF_SEND = 0xC0182101
NOTIF_ID_VALID = 0x40082102
# struct seccomp_notif { u64 id; u32 pid; u32 flags; struct seccomp_data { int nr;
# u32 arch; u64 instruction_pointer; u64 args[6]; } }; the response { u64 id; s64 val;
# s32 error; u32 flags; }
NOTIF = struct.Struct("=QIIiIQ6Q")
RESP = struct.Struct("=QqiI")
PIDFD_THREAD = os.O_EXCL  # pidfd_open of a thread, not only a group leader (6.9)
USER_NOTIF_FLAG_CONTINUE = 1  # the call runs as if no filter had asked (connect only)
CONNECT = 42  # x86_64
SYS_PIDFD_GETFD = 438
# the reader's protocol: (pid, fd, address, length) in; (type, protocol, family) and
# the bytes out; type -1 when the socket could not be looked at
ASK = struct.Struct("=IiQI")
TOLD = struct.Struct("=iii")
MAX_SOCKADDR = 128
READER_WAIT = 0.25  # seconds PID 1 waits for the reader before letting the call go

REPORTS_PER_SECOND = 20  # named one by one to boxyd; past it, only counted
MAX_NAMES = 64  # distinct calls counted by name; past it, under OTHER
OTHER = "other calls"
MAX_COMM = 64  # bytes of argv[0] kept (comm is at most 15)


@dataclass(frozen=True)
class Notification:
    id: int
    pid: int  # the calling thread, in the sandbox's PID namespace
    nr: int
    args: tuple[int, ...]


@dataclass(frozen=True)
class Caller:
    """Who made the call: its process (thread group), comm and argv[0]."""

    tgid: int
    comm: str
    argv0: str


@dataclass(frozen=True)
class Connect:
    """What the reader saw of a connect(): the socket's type and protocol, and the
    address and port it asked for (address None when not AF_INET/AF_INET6)."""

    type: int
    proto: int
    addr: str | None
    port: int


def sockaddr(data: bytes) -> tuple[str, int] | None:
    """(address, port) of a struct sockaddr_in or sockaddr_in6 (the port is big-endian);
    None for any other family or a short one."""
    if len(data) >= 8 and int.from_bytes(data[:2], "little") == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, data[4:8]), int.from_bytes(data[2:4], "big")
    if len(data) >= 24 and int.from_bytes(data[:2], "little") == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, data[8:24]), int.from_bytes(data[2:4], "big")
    return None


def landlock_refuses(seen: Connect, ports: frozenset[int]) -> bool:
    """Landlock's TCP-connect rule refuses it: a TCP socket, an inet address, a port
    not granted (Landlock looks at TCP only: UDP is the ruleset's to refuse)."""
    tcp = seen.type == socket.SOCK_STREAM and seen.proto == socket.IPPROTO_TCP
    return tcp and seen.addr is not None and seen.port not in ports


def decide(nr: int, mode: str, errno_calls: frozenset[int]) -> str:
    """ "kill" or "errno": strict mode kills an unlisted call, like the filter without
    notification did; a call refused by name or on its arguments gets EPERM."""
    return "kill" if mode == "strict" and nr not in errno_calls else "errno"


class Tally:
    """Refusals counted by name (at most MAX_NAMES names), and a rate: at most
    PER_SECOND a second are reported one by one. Pure but for CLOCK."""

    def __init__(
        self,
        per_second: int = REPORTS_PER_SECOND,
        max_names: int = MAX_NAMES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counts: dict[str, int] = {}
        self._per_second, self._max_names, self._clock = per_second, max_names, clock
        self._window, self._sent = 0.0, 0

    def count(self, name: str) -> bool:
        """One refusal of NAME; whether it is reported one by one."""
        if name not in self.counts and len(self.counts) >= self._max_names:
            name = OTHER
        self.counts[name] = self.counts.get(name, 0) + 1
        now = self._clock()
        if now - self._window >= 1.0:
            self._window, self._sent = now, 0
        self._sent += 1
        return self._sent <= self._per_second


# -- the kernel's side, each step needing only the listener (or /proc, read-only)
def receive(listener: int) -> Notification:
    """The next notification; blocks. The buffer must be zeroed (EINVAL otherwise)."""
    buf = bytearray(NOTIF.size)
    fcntl.ioctl(listener, NOTIF_RECV, buf, True)
    ident, pid, _flags, nr, _arch, _ip, *args = NOTIF.unpack(buf)
    return Notification(ident, pid, nr, tuple(args))


def answer(listener: int, ident: int, error: int) -> None:
    """The call fails with ERROR (an errno); ENOENT: its caller is gone already."""
    with contextlib.suppress(FileNotFoundError):
        fcntl.ioctl(listener, NOTIF_SEND, bytearray(RESP.pack(ident, 0, -error, 0)), True)


def still_waiting(listener: int, ident: int) -> bool:
    """The caller is still in the call (so its pid still names it)."""
    try:
        fcntl.ioctl(listener, NOTIF_ID_VALID, bytearray(struct.pack("=Q", ident)), True)
    except OSError:
        return False
    return True


def _read(path: str, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def caller(pid: int) -> Caller:
    """The thread PID's process, from the sandbox's /proc (Landlock grants PID 1 read
    access to it for this). What the payload wrote is only cut and decoded here."""
    tgid, comm = pid, ""
    for line in _read(f"/proc/{pid}/status", 4096).split(b"\n")[:16]:
        key, _, value = line.partition(b":\t")
        if key == b"Name":
            comm = value.decode(errors="replace")[:MAX_COMM]
        elif key == b"Tgid" and value.strip().isdigit():
            tgid = int(value)
    argv0 = _read(f"/proc/{tgid}/cmdline", MAX_COMM).split(b"\0")[0]
    return Caller(tgid, comm, argv0.decode(errors="replace")[:MAX_COMM])


def kill(listener: int, note: Notification, tgid: int) -> bool:
    """SIGKILL to the calling process, through a pidfd taken while the call still
    waits (checked after), so no other process can have its pid by then."""
    try:
        pidfd = os.pidfd_open(note.pid, PIDFD_THREAD)
    except OSError:  # before 6.9: the group leader's pidfd
        try:
            pidfd = os.pidfd_open(tgid)
        except OSError:
            return False
    try:
        if not still_waiting(listener, note.id):
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


# -- the reader: a process of the payload's own Landlock domain (so it may read its
# memory: Landlock lets a domain ptrace only itself and what is nested in it, and PID
# 1's domain is neither), under a filter of its own (plan/seccomp.py's reader_filter)
def fork_reader(bpf: bytes) -> socket.socket:
    """The reader, forked twice by the payload's process once Landlock is applied and
    before its seccomp filter: PID 1 adopts it (the payload never waits for it). Our
    end of its socket, for PID 1."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            if os.fork() == 0:
                ours.close()
                reader(theirs, bpf)
        finally:
            os._exit(0)
    theirs.close()
    os.waitpid(pid, 0)
    return ours


def reader(sock: socket.socket, bpf: bytes) -> None:
    """A session of its own (no terminal signal reaches it), no fd but its socket, its
    filter; then each ask answered until PID 1's end closes. Needs /proc (the payload's
    own Landlock rules grant reading it) and its own domain's ptrace access."""
    os.setsid()
    keep = sock.fileno()
    os.closerange(0, keep)
    os.closerange(keep + 1, 1 << 20)
    seccomp.load(bpf)
    while ask := sock.recv(ASK.size):
        pid, fd, address, length = ASK.unpack(ask)
        sock.send(look(pid, fd, address, min(length, MAX_SOCKADDR)))


def look(pid: int, fd: int, address: int, length: int) -> bytes:
    """The socket FD of thread PID (type, protocol, family) and LENGTH bytes at ADDRESS
    of its memory; type -1 and no bytes when either cannot be had."""
    kind = socket_kind(pid, fd)
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return TOLD.pack(-1, 0, 0)
    try:
        data = os.pread(mem, length, address)
    except (OSError, OverflowError):  # OverflowError: past off_t, a kernel address
        data = b""
    finally:
        os.close(mem)
    return TOLD.pack(*kind) + data


def socket_kind(pid: int, fd: int) -> tuple[int, int, int]:
    """(SO_TYPE, SO_PROTOCOL, SO_DOMAIN) of the caller's socket, through a copy of it."""
    try:
        pidfd = os.pidfd_open(pid, PIDFD_THREAD)
    except OSError:  # before 6.9: a group leader's only
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return -1, 0, 0
    try:
        zero = ctypes.c_uint(0)
        copy = ksys.syscall(SYS_PIDFD_GETFD, ctypes.c_int(pidfd), ctypes.c_int(fd), zero)
    finally:
        os.close(pidfd)
    if copy < 0:
        return -1, 0, 0
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=copy)
    try:
        return tuple(  # type: ignore[return-value]
            sock.getsockopt(socket.SOL_SOCKET, o)
            for o in (socket.SO_TYPE, socket.SO_PROTOCOL, socket.SO_DOMAIN)
        )
    except OSError:
        return -1, 0, 0
    finally:
        sock.close()


def ask_reader(sock: socket.socket, note: Notification) -> Connect | None:
    """What the reader saw of connect(NOTE); None when it could not look. OSError: the
    reader is gone, or said nothing in time (a timeout: its late answer would be
    taken for the next one's, so the caller asks it no more)."""
    fd, address, length = note.args[0] & 0x7FFFFFFF, note.args[1], note.args[2]
    sock.send(ASK.pack(note.pid, fd, address, min(length, MAX_SOCKADDR)))
    told = sock.recv(TOLD.size + MAX_SOCKADDR)
    if len(told) < TOLD.size or TOLD.unpack_from(told)[0] < 0:
        return None
    kind, proto, _family = TOLD.unpack_from(told)
    got = sockaddr(told[TOLD.size :])
    return Connect(kind, proto, *(got or (None, 0)))


def let_through(listener: int, ident: int) -> None:
    """The call runs as the kernel would have run it without this filter: Landlock
    then decides. Only for connect(), which the policy allows."""
    with contextlib.suppress(FileNotFoundError):
        resp = RESP.pack(ident, 0, 0, USER_NOTIF_FLAG_CONTINUE)
        fcntl.ioctl(listener, NOTIF_SEND, bytearray(resp), True)


Report = Callable[[Notification, Caller, str], None]
PortReport = Callable[[Notification, Caller, Connect], None]


class Notifier:
    """The loop of PID 1's thread: every notification answered, the kills recorded
    (KILLED: the processes, for PID 1's report of the payload's end)."""

    def __init__(
        self, listener: int, mode: str, errno_calls: frozenset[int], report: Report
    ) -> None:
        self.listener, self.mode, self.errno_calls = listener, mode, errno_calls
        self.report = report
        self.tally = Tally()
        self.killed: set[int] = set()
        # connect() named too: the reader, Landlock's ports, where to say a refusal
        self.reader: socket.socket | None = None
        self.ports: frozenset[int] = frozenset()
        self.port_report: PortReport | None = None
        self.ports_tally = Tally()

    def name_ports(self, reader: socket.socket, ports: frozenset[int], say: PortReport) -> None:
        reader.settimeout(READER_WAIT)
        self.reader, self.ports, self.port_report = reader, ports, say

    def serve(self) -> None:
        """Until the listener fails, which raises: the listener is left open (closed,
        it would free the payload to take one of its own: the module's docstring), and
        the calls left wait, killable, for the caller to end the sandbox."""
        while True:
            try:
                note = receive(self.listener)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT):  # ENOENT: its caller died
                    continue
                raise
            self.handle(note)

    def handle(self, note: Notification) -> None:
        """Name the call, kill or not, answer EPERM (a killed caller never returns)."""
        if note.nr == CONNECT:  # allowed by the policy: notified only to be named
            self.connect(note)
            return
        name = syscalls.name(note.nr)
        action = decide(note.nr, self.mode, self.errno_calls)
        named = self.tally.count(name)
        if action == "kill":
            who = caller(note.pid)
            if named:  # before the kill: the record comes before the end
                self.report(note, who, action)
            # marked before the kill: PID 1's main thread reaps the process and judges its
            # end (ended: SIGSYS) the moment the SIGKILL lands, and read 137 when this came
            # after (CI run 25)
            marked = who.tgid not in self.killed
            self.killed.add(who.tgid)
            if not kill(self.listener, note, who.tgid) and marked:
                self.killed.discard(who.tgid)
        elif named:
            who = caller(note.pid)
            if not still_waiting(self.listener, note.id):  # gone: its pid may be another's
                who = Caller(note.pid, "?", "?")
            # reported before the answer: answered, the caller may exit at once, and PID
            # 1's end could reach boxyd before this record (its -v line then missing);
            # answered even when the report fails
            try:
                self.report(note, who, action)
            finally:
                answer(self.listener, note.id, errno.EPERM)
            return
        answer(self.listener, note.id, errno.EPERM)

    def connect(self, note: Notification) -> None:
        """A connect(): its address read while the call waits (another thread of the
        caller may change it after: that only makes the report wrong, Landlock decides
        on what the kernel reads), then let through; one Landlock refuses, said."""
        seen = None
        try:
            seen = ask_reader(self.reader, note) if self.reader is not None else None
        except OSError:  # gone, or stopped by the payload (its own domain): ask no more
            assert self.reader is not None
            self.reader.close()
            self.reader = None
        # reported before the call goes on (as a refusal is: handle), while the caller
        # still waits: its end cannot come first; let through even when the report fails
        try:
            if seen is None or self.port_report is None:
                return
            if landlock_refuses(seen, self.ports) and self.ports_tally.count(
                f"{seen.addr}:{seen.port}"
            ):
                self.port_report(note, caller(note.pid), seen)
        finally:
            let_through(self.listener, note.id)
