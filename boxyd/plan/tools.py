"""The tools boxyd runs over trees the payload could write, and the sandbox they run in.

git (the guard's second opinion), npm and pip (their registry settings) read files
the payload may have written: a planted ``uploadpack`` with a promisor remote makes
even ``git ls-files`` run a command, a venv's ``bin/npm`` is the payload's own
program. So none of them runs on the host (docs/design.md, "Tools boxyd runs"):

- a tool is found only in PATH directories outside every payload-writable tree
  (and so is the file a symlink there resolves to); never by a bare name;
- it runs inside a sandbox of boxyd's own, built like a payload's (namespaces,
  no capabilities, Landlock, seccomp) with no network at all, the trees it reads
  bound read-only and not executable, the system's read-only trees and the tool's
  own installation the only places anything can be executed from, and a deadline.

This module is the policy half: the typed call and answer, resolution and the
sandbox's plan. boxyd.daemon.toolbox carries a plan out through stage 2.
"""

from __future__ import annotations

import os
import pwd

from boxyd.config.hosttools import Exposure
from boxyd.plan.mountplan import DEV_RULES, HOSTNAME, etc_files, system_ops
from boxyd.plan.ops import Bind, Dir, LandlockRule, MountOp, Plan

SCRATCH_SIZE = 64 << 20  # its /tmp; a tool that needs more is not one boxyd should run
NPROC = 64  # git runs a few helpers; a fork bomb planted for it stops here
ADDRESS_SPACE = 4 << 30  # per process: git on a crafted index stops here, not at the machine's


def plan(
    exposure: Exposure, *, seccomp_bpf: str, uid: int | None = None, gid: int | None = None
) -> Plan:
    """The tool sandbox: no network, the system trees, EXPOSURE; execute rights only on
    the system trees and EXECUTE. Its PID 1 serves tool calls instead of a payload."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    sys_ops, sys_rules = system_ops()
    ops: list[MountOp] = [Dir("/etc"), *etc_files(uid, gid, user, exposure.home, "none"), *sys_ops]
    rules = [
        LandlockRule("/", "dir"),
        *sys_rules,
        LandlockRule("/proc", "read"),
        *(LandlockRule(d, "dev") for d in DEV_RULES),
        LandlockRule("/tmp", "scratch"),
        LandlockRule(exposure.home, "read"),
    ]
    for tree in exposure.execute:
        ops.append(Bind(src=tree, dst=tree, ro=True, optional=True))
        rules.append(LandlockRule(tree, "ro"))
    for tree in exposure.read:
        ops.append(Bind(src=tree, dst=tree, ro=True, noexec=True))
        rules.append(LandlockRule(tree, "read"))
    for path in exposure.files:
        # beneath its directory without following a symlink: the file may be the payload's
        parent, name = os.path.split(path)
        if not os.path.isdir(parent):
            continue  # an optional bind needs its directory; without it there is no file
        ops.append(Bind(src=name, dst=path, ro=True, src_base=parent, optional=True, noexec=True))
    return Plan(
        argv=["boxy-tools"],
        env={},
        cwd="/",
        uid=uid,
        gid=gid,
        home=exposure.home,
        hostname=HOSTNAME,
        scratch_size=SCRATCH_SIZE,
        ops=ops,
        landlock=rules,
        seccomp_bpf=seccomp_bpf,
        nproc=NPROC,
        net="none",
        serve="tools",
        address_space=ADDRESS_SPACE,
    )
