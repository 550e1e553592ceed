"""The gateway's bound-address sets, kept from outside the sandbox's user namespace.

This file is also the script the unprivileged test user runs (``python -I
test_nftset.py ROOT``). Its parent plays boxyd: no capability at all, in the user
namespace it was started in. Its child plays stage 2: it maps its uid to itself in
a new user namespace, makes a network namespace, loads the allowlist ruleset there,
opens the netlink socket (boxyd.net.nftset.open_socket) and hands it over as stage 2
does, then lists the sets on request. The parent adds, refreshes and fails to add
elements through that socket. No packet is sent anywhere.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from tests.conftest import User

ROOT = Path(__file__).resolve().parents[2]
A4, A6 = ipaddress.ip_address("11.0.0.60"), ipaddress.ip_address("2a0b:4000::60")


def _sets() -> dict[str, list[dict[str, Any]]]:
    """The bound sets' elements as libnftables lists them (the child, in the netns)."""
    from boxyd.stage2 import nft

    lib = nft._load()
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    ctx = lib.nft_ctx_new(nft.NFT_CTX_DEFAULT)
    try:
        lib.nft_ctx_output_set_flags(ctx, nft.NFT_CTX_OUTPUT_JSON)
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        if lib.nft_run_cmd_from_buffer(ctx, b"list table inet boxy"):
            return {"error": []}
        listing = json.loads(lib.nft_ctx_get_output_buffer(ctx))
    finally:
        lib.nft_ctx_free(ctx)
    return {
        o["set"]["name"]: [
            e["elem"] if isinstance(e, dict) else {"val": e} for e in o["set"].get("elem", [])
        ]
        for o in listing["nftables"]
        if "set" in o and o["set"]["name"].startswith("bound")
    }


def stage2(ctl: socket.socket) -> None:
    from boxyd.kernel.sys import CLONE_NEWNET, check, libc
    from boxyd.net import nftset, ruleset
    from boxyd.stage2 import namespaces, nft

    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    nft.apply(
        ruleset.gateway_ruleset(
            mode="allowlist",
            deny_v4=["10.0.0.0/8"],
            deny_v6=[],
            except_v4=[],
            except_v6=[],
            bound=["192.0.2.7"],
        )
    )
    sock = nftset.open_socket()
    socket.send_fds(ctl, [b"nftset"], [sock.fileno()])
    sock.close()
    while ctl.recv(16):
        ctl.sendall(json.dumps(_sets()).encode() + b"\n")
    os._exit(0)


def boxyd(root: str) -> dict[str, Any]:
    from boxyd.net import nftset, ruleset

    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        try:
            stage2(b)
        finally:
            os._exit(1)
    b.close()
    with open("/proc/self/status") as f:
        caps = [ln.split()[1] for ln in f if ln.startswith("CapEff:")][0]
    report: dict[str, Any] = {"boxyd_caps": caps}
    _, fds, _, _ = socket.recv_fds(a, 16, 1)
    sock = socket.socket(fileno=fds[0])
    sock.setblocking(False)  # as boxyd's gateway holds it

    def listing() -> dict[str, Any]:
        a.sendall(b"list")
        return cast(dict[str, Any], json.loads(a.makefile().readline()))

    clock = [1000.0]
    errors: list[str] = []
    pub = nftset.Publisher(
        nftset.BoundSet(sock, ruleset.TABLE, ruleset.BOUND_SETS),
        on_error=errors.append,
        now=lambda: clock[0],
    )
    report["published"] = [pub.publish(A4, 65.0), pub.publish(A6, 65.0)]
    report["after_add"] = listing()
    report["shorter"] = pub.publish(A4, 10.0)  # nothing sent: it would shorten the element
    clock[0] += 60.0
    pub.refresh([A4])  # held, 5 s left: extended to nftset.REFRESH
    report["after_refresh"] = listing()
    missing = nftset.Publisher(
        nftset.BoundSet(sock, ruleset.TABLE, ("nosuch4", "nosuch6")), on_error=errors.append
    )
    report["missing_set"] = missing.publish(A4, 60.0)
    report["errors"] = errors
    a.close()
    os.waitpid(pid, 0)
    return report


@pytest.fixture(scope="module")
def report(user: User) -> dict[str, Any]:
    proc = user.run(
        [sys.executable, "-I", str(Path(__file__).resolve()), str(ROOT)], timeout=60, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return cast(dict[str, Any], json.loads(proc.stdout.decode().splitlines()[-1]))


def _elem(listing: dict[str, Any], name: str, val: str) -> dict[str, Any]:
    (e,) = [e for e in listing[name] if e["val"] == val]
    return cast(dict[str, Any], e)


def test_boxyd_without_capabilities_adds_elements_through_stage_2s_socket(
    report: dict[str, Any],
) -> None:
    assert report["boxyd_caps"] == "0000000000000000"
    assert report["published"] == [True, True]
    for name, val in (("bound4", str(A4)), ("bound6", str(A6))):
        e = _elem(report["after_add"], name, val)
        assert e["timeout"] == 65 and 63 <= e["expires"] <= 65, e
    assert _elem(report["after_add"], "bound4", "192.0.2.7") == {"val": "192.0.2.7"}  # static


def test_a_held_address_is_refreshed_and_never_shortened(report: dict[str, Any]) -> None:
    assert report["shorter"] is True
    e = _elem(report["after_refresh"], "bound4", str(A4))
    assert e["timeout"] == 30 and e["expires"] >= 28, e  # nftset.REFRESH
    assert _elem(report["after_refresh"], "bound6", str(A6))["timeout"] == 65  # not held


def test_a_failed_add_is_reported_with_the_kernels_errno(report: dict[str, Any]) -> None:
    assert report["missing_set"] is False
    assert report["errors"] == [
        "[Errno 2] nft set boxy nosuch4/nosuch6: add elements: No such file or directory"
    ]


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])
    print(json.dumps(boxyd(sys.argv[1])))
    sys.stdout.flush()
    os._exit(0)
