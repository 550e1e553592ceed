"""The varlink wire: framing shared by both ends, and boxyctl's synchronous client.

Standard library only and no asyncio: this module is on the client's start-up path
(boxyd's asyncio server, boxyd.api.varlink, imports the framing from here).

Framing: every message is one JSON object followed by a NUL byte on a SOCK_STREAM
unix socket. File descriptors travel as SCM_RIGHTS (as in systemd's varlink).

The fd rule. The kernel never lets one recvmsg read past a segment that carries fds,
and a segment's fds arrive with the first of its bytes that is read. So:

- sender: a message that carries fds is sent by one sendmsg that starts at the
  message's first byte and holds that message only (a short write is completed
  without fds: the rest are bytes of the same message);
- receiver: the fds that arrive with a read belong to the message containing the
  last byte of that read. They wait in a FIFO until that message is complete.

Hence fds sent with one message are never attached to another. Every receive uses
MSG_CMSG_CLOEXEC; truncated control data (MSG_CTRUNC, e.g. more than MAX_FDS fds)
is a protocol error, and every fd received with it is closed.
"""

from __future__ import annotations

# _socket: the socket module's own class and constants, without the enums that
# module builds on import (3 ms of every client start); socket.socket is a subclass,
# so the daemon's sockets pass wherever these functions take one.
import _socket
import errno
import os
import struct

from boxy import wirejson
from boxy.errors import BoxyError, DaemonError, from_wire

TYPE_CHECKING = False  # typing costs the client 4 ms at start-up; annotations only
if TYPE_CHECKING:  # collections is not imported before a run is sent (docs/design.md)
    from collections.abc import Iterator, Sequence
    from typing import Any

MAX_MESSAGE = 16 << 20  # bytes, NUL excluded: an ARG_MAX-sized argv (2 MiB) fits, escaped
MAX_FDS = 8  # per message
RECV_SIZE = 64 * 1024
_FD_SIZE = struct.calcsize("i")  # struct, not array: array imports collections
_ANC_SPACE = _socket.CMSG_SPACE(MAX_FDS * _FD_SIZE)
_UCRED = struct.Struct("3i")
_SCM_CREDENTIALS = 2  # <sys/socket.h>
_SCM_PIDFD = 4  # <asm-generic/socket.h>, Linux 6.5
SO_PASSPIDFD = 76
_CRED_SPACE = _socket.CMSG_SPACE(_UCRED.size) + _socket.CMSG_SPACE(_FD_SIZE)


class ProtocolError(Exception):
    """The peer broke the framing rules; the connection must be dropped. PARSED:
    the complete messages before the bad one (with their fds: the caller's)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.parsed: list[tuple[dict[str, Any], list[int]]] = []


class VarlinkError(BoxyError):
    """An error reply outside boxy's error table (org.varlink.service.*): NAME and
    its PARAMETERS. boxy's own errors arrive as their exceptions (boxy.errors)."""

    def __init__(self, name: str, parameters: dict[str, Any]) -> None:
        self.name = name
        self.params = parameters
        detail = parameters.get("message") or ", ".join(
            f"{k}={v}" for k, v in sorted(parameters.items())
        )
        super().__init__(f"{name}: {detail}" if detail else name)

    def parameters(self) -> dict[str, Any]:
        return self.params


class DaemonUnavailable(DaemonError):
    """connect() failed; ERRNO tells "not running" (ENOENT, ECONNREFUSED) from the rest."""

    def __init__(self, message: str, err: int) -> None:
        super().__init__(message)
        self.errno = err


# one compact encoder for every message (boxy.wirejson: json's own C encoder, reused)
to_json = wirejson.dumps


def encode(message: dict[str, Any]) -> bytes:
    """One framed message. json escapes control characters, so no NUL can occur inside."""
    data = wirejson.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"varlink message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data + b"\0"


def close_fds(fds: Sequence[int]) -> None:
    import contextlib  # here: not imported before a run is sent (docs/design.md)

    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Decoder:
    """Splits a byte stream into messages and attaches fds by the rule in the module
    docstring. Any violation raises ProtocolError after closing every fd it held,
    but for those of the messages before the bad one (ProtocolError.parsed)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no NUL
        self._fds: list[int] = []  # fds of the incomplete message at the end of _buf

    def feed(self, data: bytes, fds: Sequence[int] = ()) -> list[tuple[dict[str, Any], list[int]]]:
        fds = list(fds)
        if fds and not data:
            close_fds(fds)
            self.close()
            raise ProtocolError("file descriptors without data")
        buf = self._buf
        buf += data
        out: list[tuple[dict[str, Any], list[int]]] = []
        bad: list[int] = []  # the fds of the message being parsed
        start = 0  # the parsed messages are cut off once, at the end: a read holds many
        try:
            while (end := buf.find(b"\0", self._scanned)) >= 0:
                raw = buf[start:end]
                start = self._scanned = end + 1
                mine, self._fds = self._fds, []
                if start == len(buf) and fds:  # the read ended on this message's NUL
                    mine += fds
                    fds = []
                bad = mine  # registered first, so an error closes them
                out.append((self._parse(raw, mine), mine))
                bad = []
            del buf[:start]
            self._scanned = len(buf)
            self._fds += fds
            fds = []
            if len(buf) > MAX_MESSAGE:
                raise ProtocolError(f"message exceeds {MAX_MESSAGE} bytes")
            if len(self._fds) > MAX_FDS:
                raise ProtocolError(f"more than {MAX_FDS} file descriptors in one message")
        except ProtocolError as e:
            close_fds(fds)
            close_fds(bad)
            e.parsed = out
            self.close()
            raise
        return out

    @staticmethod
    def _parse(raw: bytearray, fds: list[int]) -> dict[str, Any]:
        if len(fds) > MAX_FDS:
            raise ProtocolError(f"more than {MAX_FDS} file descriptors in one message")
        try:  # UTF-8, as varlink says (json.loads on bytes would guess the encoding)
            msg = wirejson.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ProtocolError(f"malformed JSON: {e}") from None
        if not isinstance(msg, dict):
            raise ProtocolError("a message must be a JSON object")
        return msg

    def close(self) -> None:
        """Drop buffered bytes and close the fds of the incomplete message."""
        close_fds(self._fds)
        self._fds = []
        self._buf.clear()
        self._scanned = 0


def recv_with_fds(sock: _socket.socket, size: int = RECV_SIZE) -> tuple[bytes, list[int]]:
    """One recvmsg with MSG_CMSG_CLOEXEC. b"" means EOF. May raise BlockingIOError on
    a non-blocking socket; raises ProtocolError (fds closed) on truncated control data."""
    data, fds, _ = recv_with_creds(sock, size)
    return data, fds


class Writer:
    """Who wrote what one read returned: SCM_CREDENTIALS' pid and uid, and with
    SO_PASSPIDFD a pidfd of that process (the reader's to close; negative: the
    kernel could make none, the writer was gone). A plain class: typing's NamedTuple
    costs the client its import."""

    __slots__ = ("pid", "uid", "pidfd")

    def __init__(self, pid: int, uid: int, pidfd: int | None) -> None:
        self.pid, self.uid, self.pidfd = pid, uid, pidfd


def recv_with_creds(
    sock: _socket.socket, size: int = RECV_SIZE
) -> tuple[bytes, list[int], Writer | None]:
    """recv_with_fds, and who wrote these bytes when SOCK has SO_PASSCRED (None
    otherwise). The kernel never joins the bytes of two writers in one read of a
    socket that has it: the credentials are each byte's."""
    data, anc, flags, _ = sock.recvmsg(size, _ANC_SPACE + _CRED_SPACE, _socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    creds: tuple[int, int, int] | None = None
    pidfd: int | None = None
    for level, kind, payload in anc:
        if level != _socket.SOL_SOCKET:
            continue
        if kind == _socket.SCM_RIGHTS:
            n = len(payload) // _FD_SIZE
            fds += struct.unpack(f"{n}i", payload[: n * _FD_SIZE])
        elif kind == _SCM_CREDENTIALS:
            creds = _UCRED.unpack(payload[: _UCRED.size])
        elif kind == _SCM_PIDFD and len(payload) >= _FD_SIZE:
            (pidfd,) = struct.unpack("i", payload[:_FD_SIZE])
    if flags & _socket.MSG_CTRUNC or len(fds) > MAX_FDS:  # (the room for creds fits more)
        close_fds(fds + ([pidfd] if pidfd is not None and pidfd >= 0 else []))
        raise ProtocolError(f"control data truncated (more than {MAX_FDS} fds?)")
    if creds is None:
        if pidfd is not None and pidfd >= 0:
            os.close(pidfd)
        return data, fds, None
    return data, fds, Writer(creds[0], creds[1], pidfd)


def send_with_fds(sock: _socket.socket, data: bytes, fds: Sequence[int], flags: int = 0) -> int:
    """One sendmsg carrying DATA's first bytes and FDS; returns the bytes sent."""
    if len(fds) > MAX_FDS:
        raise ValueError(f"at most {MAX_FDS} file descriptors per message")
    anc = (
        [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
    )
    return sock.sendmsg([data], anc, flags)


def peer_credentials(sock: _socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer, as recorded by the kernel at connect time."""
    return _UCRED.unpack(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _UCRED.size))


class Client:
    """A blocking varlink connection to boxyd, used from one thread.

    send_oneway() may also run from a signal handler (SIGWINCH, SIGINT) on that same
    thread while stream()/call() is blocked in recv or even in the middle of sending:
    a lock would deadlock there, so sends go through a queue and a "sending" flag.
    A send that interrupts another one only queues its message; the interrupted
    send flushes the queue once its own message is complete, so bytes of two
    messages never interleave. Receiving is never touched by send_oneway().
    """

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._decoder = Decoder()
        self._replies: list[dict[str, Any]] = []  # short queues: lists, not deques
        self._outq: list[tuple[bytes, Sequence[int]]] = []
        self._sending = False

    @classmethod
    def connect(cls, path: str | os.PathLike[str]) -> Client:
        """Connect to PATH (a leading NUL means the abstract namespace) and check that
        the server runs as our own uid (SO_PEERCRED)."""
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # close-on-exec
        try:
            sock.connect(os.fspath(path))
        except OSError as e:
            sock.close()
            raise DaemonUnavailable(
                f"cannot connect to boxyd at {os.fspath(path)!r}: {e.strerror}", e.errno or 0
            ) from None
        _, uid, _ = peer_credentials(sock)
        if uid != os.getuid():
            sock.close()
            raise DaemonError(
                f"refusing the boxyd socket {os.fspath(path)!r}: it is served by uid {uid},"
                f" not by you (uid {os.getuid()})"
            )
        return cls(sock)

    def close(self) -> None:
        self._decoder.close()
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        parameters: dict[str, Any],
        *,
        fds: Sequence[int] = (),
        more: bool = False,
    ) -> dict[str, Any]:
        """Call METHOD and return the parameters of its (first) reply."""
        msg: dict[str, Any] = {"method": method, "parameters": parameters}
        if more:
            msg["more"] = True
        self._send(encode(msg), fds)
        return self._next_reply()[0]

    def stream(
        self, method: str, parameters: dict[str, Any], *, fds: Sequence[int] = (), more: bool = True
    ) -> Iterator[dict[str, Any]]:
        """Call METHOD now, and yield each reply's parameters until one without
        "continues". The call is sent before this returns, not at the first next(): the
        caller can do what it needs for the replies while the server works (boxyctl
        imports the reply types then: docs/design.md, "Processes")."""
        msg: dict[str, Any] = {"method": method, "parameters": parameters}
        if more:
            msg["more"] = True
        self._send(encode(msg), fds)
        return self._stream_replies()

    def _stream_replies(self) -> Iterator[dict[str, Any]]:
        while True:
            params, continues = self._next_reply()
            yield params
            if not continues:
                return

    def send_oneway(self, method: str, parameters: dict[str, Any]) -> bool:
        """Fire-and-forget call; safe from a signal handler (see the class docstring).
        Returns False instead of raising when the connection is gone: the pending
        stream() reports that on its own."""
        try:
            self._send(encode({"method": method, "parameters": parameters, "oneway": True}), ())
        except OSError:
            return False
        return True

    def _send(self, data: bytes, fds: Sequence[int]) -> None:
        self._outq.append((data, fds))
        if self._sending:
            return  # we interrupted a send on this thread: it flushes our message
        while True:
            self._sending = True
            try:
                while self._outq:
                    self._send_now(*self._outq.pop(0))
            finally:
                self._sending = False
            if not self._outq:  # a handler may have queued between the loop and the flag
                return

    def _send_now(self, data: bytes, fds: Sequence[int]) -> None:
        view = memoryview(data)
        if fds:
            view = view[send_with_fds(self._sock, data, fds, _socket.MSG_NOSIGNAL) :]
        if view:  # (the sendmsg with the fds sent it whole, as it mostly does)
            self._sock.sendall(view, _socket.MSG_NOSIGNAL)

    def _next_reply(self) -> tuple[dict[str, Any], bool]:
        while not self._replies:
            try:
                data, fds = recv_with_fds(self._sock)
                if not data:
                    raise DaemonError("boxyd closed the connection")
                for msg, got in self._decoder.feed(data, fds):
                    close_fds(got)  # the daemon sends no fds to clients
                    self._replies.append(msg)
            except ProtocolError as e:
                for _, got in e.parsed:
                    close_fds(got)
                raise DaemonError(f"boxyd broke the varlink protocol: {e}") from None
            except OSError as e:
                if e.errno == errno.EINTR:  # pragma: no cover - Python retries EINTR itself
                    continue
                raise DaemonError(f"lost the connection to boxyd: {e.strerror}") from None
        msg = self._replies.pop(0)
        params = msg.get("parameters", {})
        if not isinstance(params, dict):
            raise DaemonError("boxyd sent a reply whose parameters are not an object")
        if "error" in msg:
            name = str(msg["error"])
            raise from_wire(name, params) or VarlinkError(name, params)
        return params, bool(msg.get("continues", False))
