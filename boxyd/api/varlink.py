"""boxyd's varlink server (asyncio): connections, framing, dispatch, replies.

Thin: it knows the wire and nothing about sessions; every call goes to one handler.
The framing and the fd rule are shared with the client (boxy.varlink).

Per connection:
- the peer must run as our uid (SO_PEERCRED), else it is closed before any read;
- every read carries the credentials of the process that wrote it (SO_PASSCRED on the
  listener: the kernel never joins two writers' bytes in one read), and a writer
  that VET refuses (one inside a sandbox of boxyd's: daemon/insiders.py) ends the
  connection before its bytes are decoded: a connection that leaked into a sandbox
  is refused to the payload whoever opened it;
- calls that expect replies run one at a time, in order (varlink replies carry no
  call id, so order is the only way to match them), while oneway calls (Resize,
  Signal) are dispatched at once, concurrently with a Run stream in progress;
- writes are buffered and never block the loop; a peer whose unread replies exceed
  max_write_buffer is dropped; reading pauses while too many calls are pending;
- a malformed message (framing, JSON, fds, not a call) gets one error reply
  (org.varlink.service.InvalidParameter) after the calls before it, and then
  the connection is closed;
- a call of an EXCLUSIVE method (Run, Attach, Watch: they stream a session) owns its
  connection until its last reply: any other message meanwhile, oneway included,
  ends the connection (docs/design.md, "The front door"). A connection that leaked
  into a sandbox is one that streams a Run; it carries nothing else. Such a method
  called oneway ends the connection too (nobody would hear how it went).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib.resources
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from typing import Any, NamedTuple

from boxy import INTERFACE, VERSION
from boxy.errors import InternalError, varlink_error
from boxy.ident import DOCUMENTATION
from boxy.varlink import (
    MAX_MESSAGE,
    SO_PASSPIDFD,
    Decoder,
    ProtocolError,
    Writer,
    close_fds,
    encode,
    peer_credentials,
    recv_with_creds,
)
from boxyd.api import idl

log = logging.getLogger(__name__)

IDL_FILE = INTERFACE + ".varlink"  # shipped in the boxy package
SERVICE = "org.varlink.service"
METHOD_NOT_FOUND = f"{SERVICE}.MethodNotFound"
INTERFACE_NOT_FOUND = f"{SERVICE}.InterfaceNotFound"
INVALID_PARAMETER = f"{SERVICE}.InvalidParameter"
# Sent when a handler raised or returned without a final reply (a daemon bug).
INTERNAL_ERROR = varlink_error(InternalError(""))[0]

# unsent bytes before a peer counts as not reading: any one reply fits (up to the
# largest message) with room to spare; streams wait for the peer (Call.drain)
MAX_WRITE_BUFFER = MAX_MESSAGE + (4 << 20)
DRAIN_LOW = 64 << 10  # Call.drain() returns once no more than this is unsent
MAX_PENDING_CALLS = 64  # queued + running oneway calls before reading pauses


def interface_description() -> str:
    """The IDL text shipped in the package."""
    return importlib.resources.files("boxy").joinpath(IDL_FILE).read_text()


def interface_methods(description: str) -> frozenset[str]:
    """Fully qualified method names declared in DESCRIPTION."""
    iface = idl.parse(description)
    return frozenset(f"{iface.name}.{m}" for m in iface.methods)


# org.varlink.service's own methods, as its IDL declares them
SERVICE_IDL = idl.parse(
    """interface org.varlink.service
method GetInfo() -> (vendor: string, product: string, version: string, url: string,
  interfaces: []string)
method GetInterfaceDescription(interface: string) -> (description: string)
error InterfaceNotFound (interface: string)
error MethodNotFound (method: string)
error MethodNotImplemented (method: string)
error InvalidParameter (parameter: string)
"""
)


def encode_reply(parameters: dict[str, Any], continues: bool = False) -> bytes:
    """One reply, framed; ValueError when it is over the wire's limit."""
    if continues:
        return encode({"parameters": parameters, "continues": True})
    return encode({"parameters": parameters})


class Peer(NamedTuple):
    pid: int
    uid: int
    gid: int


Handler = Callable[["Call"], Awaitable[None]]


class Call:
    """One method call. The handler owns the fds it takes with take_fds(); those
    still in .fds when the handler returns are closed."""

    def __init__(
        self,
        conn: _Connection,
        method: str,
        parameters: dict[str, Any],
        fds: list[int],
        more: bool,
        oneway: bool,
    ) -> None:
        self._conn = conn
        self.method = method
        self.parameters = parameters
        self.fds = fds
        self.more = more
        self.oneway = oneway
        self.peer: Peer = conn.peer
        self.connection_closed: asyncio.Event = conn.closed
        self.done = oneway  # a oneway call never gets a reply

    async def drain(self) -> None:
        """Wait until the peer has read what it was sent, down to DRAIN_LOW bytes (or
        is gone): a streamed call that waits here leaves the loss to the producer's
        own bounded queue instead of growing this connection's buffer."""
        await self._conn.drained.wait()

    def take_fds(self) -> list[int]:
        """Hand every fd of the call to the caller, who must close them."""
        fds, self.fds = self.fds, []
        return fds

    def send_frames(self, frames: list[bytes]) -> None:
        """Send continuing replies already framed by encode_reply(..., continues=True),
        in one write: a stream's batch costs one syscall, and a frame encoded once can
        go to every watcher. Call drain() before each batch."""
        if self.oneway or not frames:
            return
        if self.done:
            raise RuntimeError(f"{self.method}: reply after the final reply")
        if not self.more:
            raise ValueError(f"{self.method}: streamed reply to a call without 'more'")
        self._conn.write(b"".join(frames))

    async def reply(self, parameters: dict[str, Any], continues: bool = False) -> None:
        """Send a reply; continues=True only when the call asked for "more". Replies
        to a closed connection are dropped (watch connection_closed)."""
        if self.oneway:
            return
        if self.done:
            raise RuntimeError(f"{self.method}: reply after the final reply")
        if continues and not self.more:
            raise ValueError(f"{self.method}: streamed reply to a call without 'more'")
        data = encode_reply(parameters, continues)  # over the limit: ValueError, not done
        if not continues:
            self.done = True
        self._conn.write(data)

    async def error(self, name: str, parameters: dict[str, Any]) -> None:
        """Send the error reply NAME; it ends the call."""
        if self.oneway:
            return
        if self.done:
            raise RuntimeError(f"{self.method}: error after the final reply")
        self.done = True
        self._conn.write(encode({"error": name, "parameters": parameters}))


class VarlinkServer:
    """Accepts connections on a bound, listening unix socket and hands every call
    of a known method to HANDLER. METHODS defaults to those in the packaged IDL;
    org.varlink.service.GetInfo/GetInterfaceDescription are answered here."""

    def __init__(
        self,
        handler: Handler,
        *,
        methods: Collection[str] | None = None,
        description: str | None = None,
        max_write_buffer: int = MAX_WRITE_BUFFER,
        first: Callable[[Call], tuple[str, dict[str, Any]] | None] | None = None,
        exclusive: Collection[str] = (),
        vet: Callable[[int, int | None], str | None] | None = None,
    ) -> None:
        """FIRST: asked of each call of ours before its parameters are held to the IDL;
        an (error, parameters) it returns is the reply (a client of another build speaks
        another IDL: it should hear that, not which parameter this IDL lacks).
        EXCLUSIVE: methods (fully qualified) whose call owns its connection.
        VET(pid, pidfd or None): why that process may not call (None: it may),
        asked at the connect and of every writer after."""
        self._handler = handler
        self.exclusive = frozenset(exclusive)
        self.vet = vet or (lambda pid, pidfd: None)
        self._first = first
        self._description = description if description is not None else interface_description()
        self._idl = idl.parse(self._description)
        self._methods = (
            frozenset(methods) if methods is not None else interface_methods(self._description)
        )
        self.max_write_buffer = max_write_buffer
        self._conns: set[_Connection] = set()
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = asyncio.Event()

    async def serve(self, sock: socket.socket) -> None:
        """Accept on SOCK until close(); the server owns SOCK from here on."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._sock = sock
        sock.setblocking(False)
        # every accepted connection inherits them: each read names its writer
        _pass_writers(sock)
        loop.add_reader(sock.fileno(), self._accept, loop)
        try:
            await self._stopped.wait()
        finally:
            self.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def stop_accepting(self) -> None:
        """No new connections; those open keep being served (their runs' last replies)."""
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Stop accepting, drop every connection (handlers see connection_closed)."""
        self._stopped.set()
        self.stop_accepting()
        for conn in list(self._conns):
            conn.close("server closing")

    def _accept(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._sock is not None
        try:
            sock, _ = self._sock.accept()  # accept4(SOCK_CLOEXEC)
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # Out of fds: back off instead of spinning on a readable listener.
                log.warning("varlink accept: %s; pausing accepts", e.strerror)
                listener = self._sock
                loop.remove_reader(listener.fileno())
                loop.call_later(0.1, self._resume_accept, loop, listener)
                return
            raise
        try:
            pid, uid, gid = peer_credentials(sock)
        except OSError:
            sock.close()
            return
        if uid != os.geteuid():
            log.warning("varlink: refused a connection from pid %d uid %d", pid, uid)
            sock.close()
            return
        why = self.vet(pid, None)
        if why is not None:
            log.warning("varlink: refused a connection: %s", why)
            sock.close()
            return
        sock.setblocking(False)
        # a connection made before the listener had it (socket activation queues them)
        # did not inherit them: from here on each read names its writer
        _pass_writers(sock)
        conn = _Connection(self, loop, sock, Peer(pid, uid, gid))
        self._conns.add(conn)
        conn.start()

    def _resume_accept(self, loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
        if self._sock is listener:
            loop.add_reader(listener.fileno(), self._accept, loop)

    async def _dispatch(self, call: Call) -> None:
        """Run one call; a handler failure becomes an error reply, fds are cleaned up."""
        try:
            if not await self._valid(call):
                return
            if call.method.startswith(SERVICE + "."):
                await self._service(call)
            else:
                await self._handler(call)
                # a streamed call whose peer went away ends without its last reply
                if not call.done and not call.connection_closed.is_set():
                    log.error("varlink: %s returned without a final reply", call.method)
                    await call.error(INTERNAL_ERROR, {"message": "no reply"})
        except Exception as e:
            log.exception("varlink: %s failed", call.method)
            if not call.done:
                await call.error(INTERNAL_ERROR, {"message": f"{type(e).__name__}: {e}"})
        finally:
            close_fds(call.take_fds())

    async def _valid(self, call: Call) -> bool:
        """The call names a method of ours, with the parameters its IDL declares (each
        of its type); else the error reply varlink gives for it (no handler runs)."""
        iface, _, name = call.method.rpartition(".")
        decl = {SERVICE: SERVICE_IDL, self._idl.name: self._idl}.get(iface)
        if decl is None:
            await call.error(INTERFACE_NOT_FOUND, {"interface": iface})
            return False
        method = decl.methods.get(name)
        if method is None or (decl is self._idl and call.method not in self._methods):
            await call.error(METHOD_NOT_FOUND, {"method": call.method})
            return False
        refused = self._first(call) if self._first is not None and decl is self._idl else None
        if refused is not None:
            await call.error(*refused)
            return False
        bad = idl.check_fields(decl, method.params, call.parameters)
        if bad is not None:
            await call.error(INVALID_PARAMETER, {"parameter": bad})
            return False
        return True

    async def _service(self, call: Call) -> None:
        name = call.method.rpartition(".")[2]
        if name == "GetInfo":
            await call.reply(
                {
                    "vendor": "boxy",
                    "product": "boxyd",
                    "version": VERSION,
                    "url": DOCUMENTATION,
                    "interfaces": [SERVICE, INTERFACE],
                }
            )
        elif name == "GetInterfaceDescription":
            iface = call.parameters.get("interface")
            if iface == INTERFACE:
                await call.reply({"description": self._description})
            else:
                await call.error(INTERFACE_NOT_FOUND, {"interface": iface})
        else:
            await call.error(METHOD_NOT_FOUND, {"method": call.method})

    def _forget(self, conn: _Connection) -> None:
        self._conns.discard(conn)


def _pass_writers(sock: socket.socket) -> None:
    """SO_PASSCRED, and SO_PASSPIDFD where the kernel has it (6.5): every read then
    carries its writer's pid, and a pidfd of that very process."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    with contextlib.suppress(OSError):  # ENOPROTOOPT before 6.5: the pid alone
        sock.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)


class _Connection:
    def __init__(
        self,
        server: VarlinkServer,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        peer: Peer,
    ) -> None:
        self._server = server
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self.peer = peer
        self.closed = asyncio.Event()
        self.drained = asyncio.Event()  # set while at most DRAIN_LOW bytes wait to be sent
        self.drained.set()
        self._decoder = Decoder()
        self._wbuf = bytearray()
        self._writing = False
        self._reading = False
        self._refusing = False  # a malformed message came: only its error reply is left
        self._queue: deque[Call] = deque()  # calls that expect replies, in order
        self._worker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # running oneway calls
        self._owner: Call | None = None  # an exclusive call not yet answered in full

    def start(self) -> None:
        self._set_reading(True)

    # reading

    def _set_reading(self, on: bool) -> None:
        if self.closed.is_set() or on == self._reading or (on and self._refusing):
            return
        self._reading = on
        if on:
            self._loop.add_reader(self._fd, self._on_readable)
        else:
            self._loop.remove_reader(self._fd)

    def _pending(self) -> int:
        return len(self._queue) + len(self._tasks) + (self._worker is not None)

    def _on_readable(self) -> None:
        try:
            data, fds, writer = recv_with_creds(self._sock)
        except (BlockingIOError, InterruptedError):
            return
        except ProtocolError as e:
            self._refuse(str(e))
            return
        except OSError as e:
            self.close(e.strerror or str(e))
            return
        if not data:
            self.close(None)
            return
        refused = self._writer_refused(writer)
        if refused is not None:
            close_fds(fds)
            self.close(refused)
            return
        if self._owned():  # nothing else may come while a stream owns us: not even read
            close_fds(fds)
            self.close(f"a message on a connection that {self._owner_says()}")
            return
        try:
            messages = self._decoder.feed(data, fds)
        except ProtocolError as e:  # the calls before the bad message are still answered
            self._submit_all(e.parsed)
            self._refuse(str(e))
            return
        self._submit_all(messages)
        if self._pending() >= MAX_PENDING_CALLS:
            self._set_reading(False)  # back-pressure: resumed as calls finish

    def _writer_refused(self, writer: Writer | None) -> str | None:
        """Why the writer of a read may not call, or None. No pid: bytes written
        before boxyd accepted the connection (before any sandbox could hold it), or by
        a process in no pid namespace of ours (so in no sandbox of ours): the
        connecting peer's, checked at the accept. Its pidfd (closed here) makes the
        answer that very process's, not a later one's with the same pid."""
        if writer is None:
            return None
        try:
            if writer.pid == 0:
                return None
            if writer.uid != os.geteuid():
                return f"a message written by pid {writer.pid} of uid {writer.uid}"
            if writer.pidfd is not None and writer.pidfd < 0:
                return f"pid {writer.pid} was gone before it could be looked at"
            return self._server.vet(writer.pid, writer.pidfd)
        finally:
            if writer.pidfd is not None and writer.pidfd >= 0:
                os.close(writer.pidfd)

    def _submit_all(self, messages: list[tuple[dict[str, Any], list[int]]]) -> None:
        for i, (msg, msg_fds) in enumerate(messages):
            call = None if self._owned() else self._make_call(msg, msg_fds)
            if call is None:
                if self._owned():  # read in the same chunk as the call that owns us
                    close_fds(msg_fds)
                    self.close(f"a call on a connection that {self._owner_says()}")
                for _, rest in messages[i + 1 :]:
                    close_fds(rest)
                return
            self._submit(call)

    def _owned(self) -> bool:
        """An exclusive call holds this connection (until its last reply)."""
        if self._owner is not None and self._owner.done:
            self._owner = None
        return self._owner is not None

    def _owner_says(self) -> str:
        return f"streams {self._owner.method if self._owner else 'a call'}"

    def _make_call(self, msg: dict[str, Any], fds: list[int]) -> Call | None:
        method = msg.get("method")
        params = msg.get("parameters", {})
        more = msg.get("more", False)
        oneway = msg.get("oneway", False)
        if (
            not isinstance(method, str)
            or not isinstance(params, dict)
            or not isinstance(more, bool)
            or not isinstance(oneway, bool)
            or (more and oneway)
            or msg.get("upgrade")
        ):
            close_fds(fds)
            self._refuse("not a varlink call")
            return None
        call = Call(self, method, params, fds, more, oneway)
        if method in self._server.exclusive:
            if oneway:  # a stream nobody hears: what a payload would send
                close_fds(fds)
                self.close(f"{method} called oneway")
                return None
            self._owner = call
        return call

    def _refuse(self, reason: str) -> None:
        """A malformed message: no more reading; once the calls before it are
        answered (replies carry no call id: order is all), one error reply naming
        what was wrong, then the connection is closed. The daemon goes on."""
        self._set_reading(False)
        self._refusing = True
        self._loop.create_task(self._refuse_after_pending(reason))

    async def _refuse_after_pending(self, reason: str) -> None:
        while self._pending() and not self.closed.is_set():
            await asyncio.sleep(0.01)
        self.write(
            encode(
                {
                    "error": INVALID_PARAMETER,
                    "parameters": {"parameter": "message", "message": reason[:200]},
                }
            )
        )
        deadline = self._loop.time() + 5
        while self._wbuf and not self.closed.is_set() and self._loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.close(reason)

    def _submit(self, call: Call) -> None:
        if call.oneway:
            task = self._loop.create_task(self._server._dispatch(call))
            self._tasks.add(task)
            task.add_done_callback(self._oneway_done)
        else:
            self._queue.append(call)
            if self._worker is None:
                self._worker = self._loop.create_task(self._work())

    def _oneway_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._maybe_resume()

    def _maybe_resume(self) -> None:
        if self._pending() < MAX_PENDING_CALLS // 2:
            self._set_reading(True)

    async def _work(self) -> None:
        try:
            while self._queue and not self.closed.is_set():
                await self._server._dispatch(self._queue.popleft())
                self._maybe_resume()
        finally:
            self._worker = None
            self._maybe_resume()

    # writing

    def write(self, data: bytes) -> None:
        """Queue DATA; never blocks. Dropped silently once the connection is closed."""
        if self.closed.is_set():
            return
        if not self._wbuf:
            try:
                sent = self._sock.send(data, socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as e:
                self.close(e.strerror or str(e))
                return
            data = data[sent:]
            if not data:
                return
        self._wbuf += data
        if len(self._wbuf) > DRAIN_LOW:
            self.drained.clear()
        if len(self._wbuf) > self._server.max_write_buffer:
            self.close(f"peer is not reading ({len(self._wbuf)} bytes unsent)")
            return
        if not self._writing:
            self._writing = True
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        try:
            sent = self._sock.send(self._wbuf, socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self.close(e.strerror or str(e))
            return
        del self._wbuf[:sent]
        if len(self._wbuf) <= DRAIN_LOW:
            self.drained.set()
        if not self._wbuf:
            self._writing = False
            self._loop.remove_writer(self._fd)

    # teardown

    def close(self, reason: str | None) -> None:
        """Drop the connection; running handlers keep going and see `closed`."""
        if self.closed.is_set():
            return
        if reason:
            log.info("varlink: dropping connection of pid %d: %s", self.peer.pid, reason)
        if self._reading:
            self._loop.remove_reader(self._fd)
        if self._writing:
            self._loop.remove_writer(self._fd)
        self._reading = self._writing = False
        self.closed.set()
        self.drained.set()  # nobody waits on a dead peer
        self._sock.close()
        self._wbuf.clear()
        self._decoder.close()
        while self._queue:  # calls not started yet: nobody will answer them
            close_fds(self._queue.popleft().take_fds())
        self._server._forget(self)
