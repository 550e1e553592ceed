"""The plan the daemon compiles and stage 2 applies: plain data, JSON on the wire.

The daemon decides everything (which paths, which rights, which syscalls); stage 2
only carries the plan out, in the order in docs/design.md ("A run, step by step"). Paths:

- ``src`` is a host path. With ``src_base`` set, ``src`` is relative and is resolved
  beneath that host directory with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS):
  the base is a writable tree the payload controls between runs, so nothing under
  it is trusted to be what the daemon saw.
- ``dst`` is a path inside the sandbox. With ``dst_base`` set, ``dst`` is relative
  and is resolved the same way beneath that sandbox directory (it lies inside an
  earlier bind of a writable tree). Without it, ``dst`` is on boxy's own tmpfs and
  its parents are created there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

MountKind = Literal["dir", "file"]


@dataclass(frozen=True)
class Bind:
    """Bind a host path into the sandbox (open_tree(OPEN_TREE_CLONE) + move_mount)."""

    src: str
    dst: str
    ro: bool
    src_base: str | None = None
    dst_base: str | None = None
    optional: bool = False  # a profile entry whose source may be absent
    dev: bool = False  # device nodes (/dev/null …): do not set nodev
    create: bool = False  # --mkdir: create the source directory (no symlink followed)
    noexec: bool = False  # nothing on it can be executed (a tool sandbox's trees)
    # the source is the sandbox's own entry as built so far, not the host's: under
    # --review a pin of the work directory binds the overlay's entry onto itself, so no
    # pin puts the host's tree (writable, for a `self` pin) over the overlay
    in_place: bool = False
    op: str = "bind"


@dataclass(frozen=True)
class Copy:
    """Copy one host file in (read through O_NOFOLLOW fds onto the scratch tmpfs)."""

    src: str
    dst: str
    ro: bool
    op: str = "copy"


@dataclass(frozen=True)
class Symlink:
    dst: str
    target: str
    op: str = "symlink"


@dataclass(frozen=True)
class File:
    """A file boxy writes itself (the minimal /etc). GRAFT: written on the scratch
    tmpfs and bound read-only over the file at DST, which a bind made (the system's
    certificate bundle under the host's /etc/ssl)."""

    dst: str
    content: str
    mode: int = 0o644
    op: str = "file"
    graft: bool = False


@dataclass(frozen=True)
class Dir:
    dst: str
    mode: int = 0o755
    op: str = "dir"


@dataclass(frozen=True)
class Mask:
    """Cover an entry of a writable tree (DST beneath the sandbox directory DST_BASE)
    with boxy's own read-only stand-in: an empty directory, or a file holding CONTENT
    (base64: a scrubbed copy, or nothing). A mount point, so the payload can neither
    read the original through it nor replace it."""

    dst: str
    dst_base: str
    is_dir: bool
    content: str = ""
    op: str = "mask"


@dataclass(frozen=True)
class Overlay:
    """--review: the work directory at DST as an overlay, LOWER (the host's work
    directory, never written) under UPPER (the session's own layer, where every write
    lands) with overlayfs's WORK beside it; all three host paths, UPPER and WORK in
    boxyd's private state directory (docs/design.md, "Changes held for review")."""

    dst: str
    lower: str
    upper: str
    work: str
    op: str = "overlay"


MountOp = Bind | Copy | Symlink | File | Dir | Mask | Overlay


@dataclass(frozen=True)
class LandlockRule:
    path: str  # inside the sandbox
    # a tool sandbox's (boxyd/plan/tools.py): "read" is "ro" without execute (the trees a
    # tool reads), "scratch" is "rw" without execute (its /tmp)
    access: Literal["ro", "rw", "dev", "rox", "dir", "read", "scratch"]


@dataclass(frozen=True)
class NetPlan:
    """The network's part of a plan (daemon/network.py's Network.plan): the gateway
    netns's nftables ruleset (its JSON text, loaded by stage 2 in one transaction),
    in allowlist mode Landlock's TCP connect ports, whether stage 2 also sends an
    AF_PACKET socket on eth0 (--pcap), and the tailnet's search domain (--tailscale)."""

    ruleset: str
    landlock_ports: list[int] | None = None
    pcap: bool = False
    search: str | None = None
    # --secret NAME@HOST: the host's certificate bundle and the session CA's certificate
    # (PEM), which the sandbox trusts (mountplan.trust_ops)
    ca_bundle: str | None = None


@dataclass(frozen=True)
class Plan:
    argv: list[str]
    env: dict[str, str]
    cwd: str  # the payload's working directory, inside the sandbox
    uid: int
    gid: int
    home: str  # inside the sandbox (the scratch tmpfs)
    hostname: str
    scratch_size: int  # bytes, for the one tmpfs behind $HOME, /tmp and /dev/shm
    ops: list[MountOp]
    landlock: list[LandlockRule]
    seccomp_bpf: str  # base64 of the compiled filter
    nproc: int  # RLIMIT_NPROC inside the sandbox's user namespace
    net: str = "none"
    # --net public/allowlist: the gateway netns's nftables ruleset (JSON, loaded by
    # stage 2 in one transaction) and, in allowlist mode, Landlock's TCP connect ports
    # the gateway's ruleset as its JSON text (daemon/network.py builds it once per flags)
    net_ruleset: str | None = None
    landlock_ports: list[int] | None = None
    pcap: bool = False  # stage 2 also sends an AF_PACKET socket on eth0
    # a session terminal: PID 1 makes a PTY in the sandbox's devpts with these
    # settings ({"termios", "winsize"}), puts its slave at stdio positions "fds" and
    # sends the master to boxyd
    pty: dict[str, Any] | None = None
    ctty: bool = False  # stdio is a PTY that becomes the controlling terminal
    landlock_scopes: bool = True
    # filesystem.tmpfs: empty writable directories at these paths, on the scratch
    # tmpfs (so they count against --memory with $HOME and /tmp)
    tmpfs: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # "tools": no payload is executed; PID 1's child, confined like one, serves the
    # tool calls boxyd sends on stdin (boxyd/stage2/toolserver.py)
    serve: str | None = None
    # RLIMIT_AS, for a tool sandbox only: git on a crafted index must not take the
    # machine's memory (a payload's runtimes reserve address space: never for them)
    address_space: int | None = None
    # the kernel's user notification (boxyd/stage2/notify.py): the seccomp mode PID 1
    # answers for (None: the filter has no notification) and the calls it answers
    # with EPERM in strict mode too (plan/seccomp.py's errno_calls)
    seccomp_notify: str | None = None
    seccomp_errno: list[int] = field(default_factory=list)
    # every connect() notified too: PID 1 names those Landlock refuses (a port not in
    # CONNECT_PORTS), the reader (its filter's base64 here) copying their address
    connect_ports: list[int] | None = None
    seccomp_reader: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Shallow: every field is plain data already (asdict's deep copy cost a
        millisecond of every run)."""
        out = dict(self.__dict__)
        out["ops"] = [dict(op.__dict__) for op in self.ops]
        out["landlock"] = [dict(r.__dict__) for r in self.landlock]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        ops: list[MountOp] = []
        for raw in data["ops"]:
            kind = {
                "bind": Bind,
                "copy": Copy,
                "symlink": Symlink,
                "file": File,
                "dir": Dir,
                "mask": Mask,
                "overlay": Overlay,
            }[raw["op"]]
            ops.append(kind(**raw))
        rules = [LandlockRule(**r) for r in data["landlock"]]
        rest = {k: v for k, v in data.items() if k not in ("ops", "landlock")}
        return cls(ops=ops, landlock=rules, **rest)


@dataclass(frozen=True)
class Outer:
    """What the outer stage 2 reads of a plan: steps 1–5 need no more. Every object it
    decodes stays in its memory for the whole session (decoding a whole ~16 KB plan
    touched ~700 KiB in a forked child of the template: issue #18, docs/design.md
    "Memory per session")."""

    uid: int
    gid: int
    hostname: str
    net: str
    # the gateway's ruleset as its JSON text: loaded by a child that exits
    # (boxyd/stage2/nft.py, apply_apart), never decoded here
    net_ruleset: str | None
    pcap: bool
    pty: bool  # a session terminal: PID 1 sends its master back

    @classmethod
    def of(cls, plan: Plan) -> Outer:
        return cls(
            plan.uid,
            plan.gid,
            plan.hostname,
            plan.net,
            plan.net_ruleset,
            plan.pcap,
            plan.pty is not None,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outer:
        return cls(**data)


@dataclass(frozen=True)
class Init:
    """What PID 1 itself reads of a plan; the builder and the payload's process decode
    the rest, and their exec or exit frees what that touched (issue #18)."""

    nproc: int
    address_space: int | None
    ctty: bool
    pty_fds: list[int] | None  # a session terminal: the stdio positions of its slave
    seccomp_bpf: str
    seccomp_notify: str | None = None  # Plan's
    seccomp_errno: list[int] = field(default_factory=list)
    connect_ports: list[int] | None = None

    @classmethod
    def of(cls, plan: Plan) -> Init:
        fds = None if plan.pty is None else [int(i) for i in plan.pty["fds"]]
        return cls(
            plan.nproc,
            plan.address_space,
            plan.ctty,
            fds,
            plan.seccomp_bpf,
            plan.seccomp_notify,
            plan.seccomp_errno,
            plan.connect_ports,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Init:
        return cls(**data)


def to_wire(plan: Plan) -> bytes:
    """The plan as stage 2 reads it: a line for the outer stage 2 (Outer), a line for
    PID 1 (Init), then the plan for the sandbox's setup (without the gateway's
    ruleset, which only the outer loads)."""
    inner = plan.to_json()
    inner["net_ruleset"] = None
    lines = (dict(Outer.of(plan).__dict__), dict(Init.of(plan).__dict__), inner)
    return b"\n".join(json.dumps(x).encode() for x in lines)


def split_wire(data: bytes) -> tuple[bytes, bytes]:
    """The first line (JSON: the outer stage 2's, or PID 1's) and the rest, as they
    came. ValueError without the line."""
    head, sep, rest = data.partition(b"\n")
    if not sep:
        raise ValueError("a part of the plan is missing")
    return head, rest
