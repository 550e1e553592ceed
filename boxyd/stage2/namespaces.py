"""docs/design.md, steps 1 and 5: the user namespace, then the sandbox's other namespaces."""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

from boxy.errors import SetupError
from boxyd.kernel.sys import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    check,
    libc,
    write_small,
)
from boxyd.plan.ops import Outer
from boxyd.stage2 import mounts as m

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

libc.unshare.argtypes = [ctypes.c_int]
libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def _write(path: str, text: str, step: str) -> None:
    try:
        write_small(path, text)
    except OSError as e:
        raise SetupError(f"{step}: {path}: {e.strerror}") from None


def enter_user_namespace(uid: int, gid: int) -> None:
    """Step 1. Needs nothing (unprivileged user namespaces). Gains every capability
    over the new namespace; PID 1 drops them in step 7. The user is mapped to itself,
    never to root: npm and pip behave differently as root, and an exec'd child
    then keeps no capability."""
    check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny", "user namespace")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n", "user namespace")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n", "user namespace")


def enter_sandbox_namespaces(plan: Outer, *, loopback: bool) -> None:
    """Step 5, but for the PID namespace, which PID 1's parent makes (boxyd/stage2/
    zygote.py), and with LOOPBACK --net none's network too (a spare may have made it
    ahead: enter_loopback_netns). Needs CAP_SYS_ADMIN over the new user namespace.
    Mount propagation is made private first: in a user-namespace mount namespace
    shared mounts become slaves, and host mounts made later would otherwise appear
    inside."""
    check(
        libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP),
        "unshare(mount, ipc, uts, cgroup namespaces)",
    )
    m.mount(None, "/", None, m.MS_REC | m.MS_PRIVATE, None, "make / private")
    name = plan.hostname.encode()
    check(libc.sethostname(name, len(name)), "sethostname")
    if loopback:
        enter_loopback_netns()


def enter_loopback_netns() -> None:
    """--net none's network: a network namespace of its own whose only link, lo, is
    up. Needs CAP_SYS_ADMIN and CAP_NET_ADMIN over the user namespace (step 1); a
    spare makes it ahead of its plan (boxyd/stage2/__main__.py, prepare_network)."""
    check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    loopback_up()


def loopback_up() -> None:
    """--net none: an empty network namespace whose lo works (local servers, tests).
    Needs CAP_NET_ADMIN over the new network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            ifr = struct.pack("16sH14x", b"lo", 0)
            flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifr))[1]
            fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        except OSError as e:
            raise SetupError(f"bring up lo: {e.strerror}") from None
