"""nftables in-process, through libnftables and ctypes.

Stage 2's uid is mapped to itself, so an exec'd `nft` would start with no
capability and fail with EPERM; the library runs with ours. Debian's
`nftables` Python binding does the same, but it lives outside the venv's path.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from typing import Any

from boxy.errors import SetupError

STEP = "gateway netns: nftables"
NFT_CTX_DEFAULT = 0
# libnftables 1.0.6 has no input flags: the JSON output flag is what makes
# nft_run_cmd_from_buffer parse its input as JSON (newer versions still honour it).
NFT_CTX_OUTPUT_JSON = 1 << 4

_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libnftables.so.1")
        except OSError as e:
            raise SetupError(
                f"{STEP}: cannot load libnftables.so.1 ({e}); install the libnftables1 package"
            ) from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.restype = None
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.restype = None
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).restype = ctypes.c_int
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_set_dry_run.restype = None
        lib.nft_ctx_set_dry_run.argtypes = [ctypes.c_void_p, ctypes.c_bool]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        _lib = lib
    return _lib


def preload() -> None:
    """libnftables loaded in the template, once: each networked run's child has it
    (about 1.5 ms of its start otherwise). Raises SetupError when it is missing."""
    _load()


def _run(lib: ctypes.CDLL, text: bytes, dry_run: bool = False) -> str | None:
    """One transaction (TEXT: its JSON); None on success, else libnftables' error text."""
    ctx = lib.nft_ctx_new(NFT_CTX_DEFAULT)
    if not ctx:
        raise SetupError(f"{STEP}: nft_ctx_new failed (out of memory?)")
    try:
        lib.nft_ctx_output_set_flags(ctx, NFT_CTX_OUTPUT_JSON)
        lib.nft_ctx_set_dry_run(ctx, dry_run)
        # Buffered, so nothing is written to stage 2's stdout/stderr and errors come back.
        if lib.nft_ctx_buffer_output(ctx) or lib.nft_ctx_buffer_error(ctx):
            raise SetupError(f"{STEP}: cannot buffer libnftables output")
        if lib.nft_run_cmd_from_buffer(ctx, text) == 0:
            return None
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        # JSON input has no source positions: drop the meaningless "internal:0:0-0: ".
        return " ".join(err.replace("internal:0:0-0: ", "").split()) or "no error text"
    finally:
        lib.nft_ctx_free(ctx)


def _describe(cmd: Any) -> str:
    if not isinstance(cmd, dict) or len(cmd) != 1:
        return repr(cmd)[:200]
    ((kind, body),) = cmd.items()
    if not isinstance(body, dict):
        return str(kind)
    if kind == "rule":
        comment = f" {body['comment']!r}" if body.get("comment") else ""
        return f"rule{comment} in chain {body.get('chain')}"
    return f"{kind} {body.get('name', '')}".strip()


def _first_failing(lib: ctypes.CDLL, ruleset_json: dict[str, Any]) -> str | None:
    """libnftables does not say which JSON command failed: dry-run growing prefixes of
    the batch to find it (failure path only; each dry run is about a millisecond)."""
    cmds = ruleset_json.get("nftables")
    if not isinstance(cmds, list):
        return None
    for n in range(1, len(cmds) + 1):
        if _run(lib, json.dumps({"nftables": cmds[:n]}).encode(), dry_run=True) is not None:
            return f"command {n} of {len(cmds)}, {_describe(cmds[n - 1])}"
    return None


def apply(ruleset_json: dict[str, Any]) -> None:
    """Load ``{"nftables": [...]}`` as ONE transaction: every command or none.

    Needs CAP_NET_ADMIN over the current network namespace (held until step 7).
    Raises SetupError carrying libnftables' own error text and the failing command.
    """
    apply_text(json.dumps(ruleset_json))


def apply_text(text: str) -> None:
    """apply(), the ruleset given as its JSON TEXT (decoded only to say what failed)."""
    lib = _load()
    err = _run(lib, text.encode())
    if err is not None:
        where = _first_failing(lib, json.loads(text))
        raise SetupError(
            f"{STEP}: the ruleset was not loaded: {err}" + (f" (at {where})" if where else "")
        )


def apply_apart(text: str) -> None:
    """apply_text() in a child that then exits, in this process's network namespace
    and with its capabilities. What libnftables allocates to parse and load a ruleset
    (~1.5 MiB of C heap, much of it left dirty after its context is freed) is then
    nobody's: the outer stage 2's memory is what PID 1 inherits for the session's
    whole life (issue #18). Costs one fork of a single-threaded process."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            apply_text(text)
            why = b""
        except SetupError as e:
            why = str(e).encode()
        except BaseException as e:  # a bug, not a refusal: say so
            why = f"{STEP}: internal error: {type(e).__name__}: {e}".encode()
        with contextlib.suppress(OSError):
            os.write(w, why[:4000])
        os._exit(0)
    os.close(w)
    try:
        why_text = os.read(r, 4096).decode(errors="replace")
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if why_text:
        raise SetupError(why_text)
    if status != 0:
        raise SetupError(f"{STEP}: the loader ended with wait status {status}")
