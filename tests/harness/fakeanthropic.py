"""A fake Anthropic Messages API for a real Claude Code, stdlib only, and the runner that
puts both in a network namespace of their own (tests/harness/claudecode.py starts it).

    fakeanthropic.py serve [--script S.json] [--log L.jsonl] [--port N] [--port-file F]
    fakeanthropic.py run [--script S.json] [--log L.jsonl] [--timeout T] -- CLAUDE ARGV...

`run` must already be inside a fresh network namespace (`unshare --user --map-current-user
--keep-caps --net`, or root's `unshare --net`): it checks that only `lo` exists and nothing
is routed, brings `lo` up, drops the ambient capabilities --keep-caps gave it, serves on
127.0.0.1 (a port the kernel picks) and runs ARGV with ANTHROPIC_BASE_URL pointing there,
then exits with ARGV's status (124 when it ran out of time; ARGV's process group is
killed either way). `serve` is the server alone, for a netns someone else made.

The script (JSON): {"tool_command": "touch x" | null, "text": "final words"}. A conversation
turn that offers the Bash tool gets, when tool_command is set and no tool_result has
come back yet, a tool_use of Bash with that command; every other request gets the text.
Each request is one JSON line in the log: method, path, and what the test may check
(model, stream, the tools offered, whether a tool_result came back and what it said);
--full adds the whole request body.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "claude-sonnet-4-5"
MAX_BODY = 64 << 20  # a request bigger than this is a test bug, not a conversation


class Script:
    def __init__(self, tool_command: str | None = None, text: str = "FAKE-REPLY-DONE") -> None:
        self.tool_command = tool_command
        self.text = text

    @classmethod
    def load(cls, path: str | None) -> Script:
        if not path:
            return cls()
        data = json.loads(Path(path).read_text())
        return cls(data.get("tool_command"), data.get("text", "FAKE-REPLY-DONE"))


def _tool_results(messages: list[Any]) -> list[str]:
    """The text of every tool_result block the client sent back."""
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = "".join(b.get("text", "") for b in inner if isinstance(b, dict))
                out.append(str(inner))
    return out


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in body.get("tools") or [] if isinstance(t, dict)]


def reply_blocks(script: Script, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The content of the reply and its stop_reason."""
    if (
        script.tool_command is not None
        and "Bash" in _tool_names(body)
        and not _tool_results(body.get("messages") or [])
    ):
        block = {
            "type": "tool_use",
            "id": "toolu_" + uuid.uuid4().hex[:24],
            "name": "Bash",
            "input": {"command": script.tool_command, "description": "fake tool call"},
        }
        return [block], "tool_use"
    return [{"type": "text", "text": script.text}], "end_turn"


def _usage(output: int = 5) -> dict[str, int]:
    return {
        "input_tokens": 10,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message(blocks: list[dict[str, Any]], stop: str, model: str) -> dict[str, Any]:
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": _usage(),
    }


def sse_events(msg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """MSG as the stream of events the Messages API sends for it."""
    start = {**msg, "content": [], "stop_reason": None, "usage": _usage(1)}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            empty = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"index": i, "content_block": empty}),
            ("content_block_delta", {"index": i, "delta": delta}),
            ("content_block_stop", {"index": i}),
        ]
    events += [
        (
            "message_delta",
            {
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                "usage": _usage(),
            },
        ),
        ("message_stop", {}),
    ]
    return [(name, {"type": name, **data}) for name, data in events]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK expects
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the JSON log is the record; stderr belongs to the run

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_BODY:
            raise ValueError(f"body of {length} bytes")
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def _json(self, status: int, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("request-id", "req_fake")
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self.server.record({"method": "GET", "path": self.path})
        path = self.path.split("?", 1)[0]
        if path.rstrip("/") == "/v1/models":
            model = {
                "type": "model",
                "id": MODEL,
                "display_name": "Fake",
                "created_at": "2025-01-01T00:00:00Z",
            }
            self._json(
                200, {"data": [model], "has_more": False, "first_id": MODEL, "last_id": MODEL}
            )
        else:
            self._json(
                404, {"type": "error", "error": {"type": "not_found_error", "message": path}}
            )

    def do_HEAD(self) -> None:
        # a connectivity probe (HEAD /api/hello) when nonessential traffic is allowed
        self.server.record({"method": "HEAD", "path": self.path})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self._body()
        path = self.path.split("?", 1)[0]
        messages = body.get("messages") or []
        self.server.record(
            {
                "method": "POST",
                "path": self.path,
                "model": body.get("model"),
                "stream": bool(body.get("stream")),
                "tools": _tool_names(body),
                "tool_results": _tool_results(messages),
                "messages": len(messages),
                "max_tokens": body.get("max_tokens"),
                **({"body": body} if self.server.full else {}),
            }
        )
        if path == "/v1/messages/count_tokens":
            self._json(200, {"input_tokens": 10})
        elif path == "/v1/messages":
            blocks, stop = reply_blocks(self.server.script, body)
            msg = message(blocks, stop, str(body.get("model") or MODEL))
            if body.get("stream"):
                self._stream(msg)
            else:
                self._json(200, msg)
        else:
            self._json(
                404, {"type": "error", "error": {"type": "not_found_error", "message": path}}
            )

    def _stream(self, msg: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("request-id", "req_fake")
        self.send_header("Connection", "close")  # the stream ends with the connection
        self.end_headers()
        for name, data in sse_events(msg):
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], script: Script, log: Path | None, full: bool) -> None:
        super().__init__(addr, Handler)
        self.script = script
        self.log = log
        self.full = full
        self._lock = threading.Lock()

    def record(self, entry: dict[str, Any]) -> None:
        if self.log is None:
            return
        with self._lock, self.log.open("a") as f:
            f.write(json.dumps({"t": round(time.time(), 3), **entry}) + "\n")


def start(script: Script, log: Path | None, port: int = 0, full: bool = False) -> FakeServer:
    server = FakeServer(("127.0.0.1", port), script, log, full)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --- the namespace ---------------------------------------------------------------------

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def assert_isolated() -> None:
    """Only `lo` in this netns and no route in it: nothing here can leave the machine.
    (/sys/class/net would show the netns sysfs was mounted in; these read our own.)"""
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        raise SystemExit(f"fakeanthropic: not an isolated netns: interfaces {names}")
    routes = Path("/proc/self/net/route").read_text().splitlines()[1:]
    routes6 = [
        ln
        for ln in Path("/proc/self/net/ipv6_route").read_text().splitlines()
        if not ln.endswith(" lo")
    ]
    if routes or routes6:
        raise SystemExit(f"fakeanthropic: routes in the netns: {routes + routes6}")


def lo_up() -> None:
    # ioctl rather than `ip`: the harness needs no tool that may not be on PATH
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def drop_ambient_caps() -> None:
    """`unshare --keep-caps` gave us CAP_NET_ADMIN over the netns (for lo_up) as ambient
    capabilities; what we start must hold none, as a plain process of the user."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    status = Path("/proc/self/status").read_text()
    if "CapAmb:\t0000000000000000" not in status:
        raise SystemExit("fakeanthropic: ambient capabilities left after clearing them")


def run(args: argparse.Namespace) -> int:
    assert_isolated()
    lo_up()
    drop_ambient_caps()
    log = Path(args.log) if args.log else None
    server = start(Script.load(args.script), log, full=args.full)
    port = server.server_address[1]
    env = {**os.environ, "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}"}
    # its own process group, so the timeout also ends the hooks and MCP servers it started
    proc = subprocess.Popen(args.argv, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"fakeanthropic: {args.argv[0]} timed out after {args.timeout}s", file=sys.stderr)
        return 124
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fakeanthropic")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "run"):
        s = sub.add_parser(name)
        s.add_argument("--script")
        s.add_argument("--log")
        s.add_argument("--full", action="store_true", help="log whole request bodies")
    serve = sub.choices["serve"]
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--port-file")
    runp = sub.choices["run"]
    runp.add_argument("--timeout", type=float, default=60)
    runp.add_argument("argv", nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "run":
        return run(args)
    server = start(
        Script.load(args.script), Path(args.log) if args.log else None, args.port, args.full
    )
    if args.port_file:
        Path(args.port_file).write_text(f"{server.server_address[1]}\n")
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
