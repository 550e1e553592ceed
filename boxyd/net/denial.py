"""What a refused connection hears, once its first record was read: words a program
(and the agent reading its output) can act on, not a bare reset (issue 34 §3). Pure.

- Plaintext HTTP: ``403`` whose body names boxy, what refused it, and the flag or
  command that would allow it; ``Connection: close``. The status line's reason
  phrase says the same in one line: npm and pip print the status line and never the
  body of a 403 ("403 Forbidden - GET url", "403 Client Error: Forbidden for url").
- TLS: a fatal ``access_denied`` alert (RFC 8446 §6.2, description 49) in a record of
  the version a ClientHello's record layer carries; the client's library reports it
  ("tlsv1 alert access denied"). Nothing of a handshake is answered: no certificate,
  so nothing is impersonated.
- Anything else: None (the caller resets it as before).

The host in the hint is the name the client sent (SNI or Host) or the name its
address was bound to; text from the client is cut to a host name's characters, so
the reply carries nothing the payload could shape into a header.
"""

from __future__ import annotations

import re

from boxyd.net.policy import EXPLICIT_PORT_ONLY, PORT, Verdict

TLS_HANDSHAKE = 0x16
ALERT = 21
FATAL = 2
ACCESS_DENIED = 49
_METHODS = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ")
_HOST_CHARS = re.compile(r"[^A-Za-z0-9.:\[\]*-]")
_NOT_VISIBLE = re.compile(r"[^\x20-\x7e]")  # a reason phrase is SP, HTAB and VCHAR only
MAX_HOST = 253
MAX_PHRASE = 400


def reply(first: bytes, v: Verdict, host: str | None, port: int) -> bytes | None:
    """The bytes to send a client refused by V after FIRST (its first record), or None
    when FIRST is neither TLS nor HTTP."""
    if len(first) >= 3 and first[0] == TLS_HANDSHAKE and first[1] == 3:
        return tls_alert(first[2])
    if first.startswith(_METHODS):
        return http_403(v, host, port)
    return None


def tls_alert(minor: int) -> bytes:
    """A fatal access_denied alert in a TLS 1.MINOR record (1.2's for 1.3 clients)."""
    version = bytes([3, min(max(minor, 1), 3)])
    return bytes([ALERT]) + version + b"\x00\x02" + bytes([FATAL, ACCESS_DENIED])


def hint(v: Verdict, host: str | None, port: int) -> str:
    """The flag that would allow it, or what is missing when nothing would."""
    name = clean_host(host)
    if name.count(":") == 1:  # a Host header's port: the flag takes the port apart
        name = name.partition(":")[0]
    if not name:
        return "no host name came with it (a hard-coded address?); allow its name with --allow-host"
    needs_port = v.layer == PORT or EXPLICIT_PORT_ONLY in (v.reason or "")
    spec = f"{name}:{port}" if needs_port else name
    return f"--allow-host {spec} allows it (a running session: boxyctl allow ID {spec})"


def http_403(v: Verdict, host: str | None, port: int) -> bytes:
    why, allow = v.reason or "not allowed", hint(v, host, port)
    data = f"boxy refused this connection: {why}.\n{allow}\n".encode()
    phrase = _NOT_VISIBLE.sub("?", f"Forbidden by boxy: {why}; {allow}")[:MAX_PHRASE]
    head = (
        f"HTTP/1.1 403 {phrase}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\n"
        "Connection: close\r\n"
        "X-Boxy: refused\r\n\r\n"
    )
    return head.encode() + data


def clean_host(host: str | None) -> str:
    """HOST with nothing but a host name's characters (a Host header's port kept)."""
    return _HOST_CHARS.sub("", host or "")[:MAX_HOST]
