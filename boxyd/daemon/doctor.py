"""What this machine's kernel and session give boxy, probed rather than guessed.

Every check asks the kernel directly (a syscall, a namespace made in a forked
child, a file the kernel writes), never a version number. `checks()` is what
`boxyctl doctor` prints; `facts()` is the same knowledge as data, so that tests
skip honestly ("no memory controller here") for the very reason the doctor gives.

Run as a program (`python -m boxyd.daemon.doctor`): the lines `boxyctl doctor`
prints; with --wire, the checks as JSON (boxy.checks.probe: boxyd's Doctor, and the
client's when boxyd cannot be reached). A probe forks and enters namespaces: never
in boxyd's own process.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable
from typing import cast

from boxy import fdwait
from boxy.checks import Check, show
from boxyd.kernel.sys import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
)

Facts = dict[str, object]
Probe = Callable[[Facts], list[Check]]


# landlock_create_ruleset is 444 on every architecture (new syscalls share one table).
SYS_landlock_create_ruleset = 444
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
# What boxy uses from each ABI, so the doctor can say what this one lacks.
LANDLOCK_FEATURES: tuple[tuple[int, str], ...] = (
    (2, "refer"),
    (3, "truncate"),
    (4, "TCP port rules"),
    (5, "ioctl_dev"),
    (6, "abstract-socket/signal scoping"),
    (9, "unix-socket rights"),
)
LANDLOCK_UNIX_ABI = 9

SYS_seccomp = 317  # x86_64; elsewhere the seccomp load probe is skipped
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_RET_ALLOW = 0x7FFF0000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

CGROUP_CONTROLLERS = ("memory", "pids", "cpu")
CGROUP_COSTS = {
    "memory": "--memory is reported, not enforced",
    "pids": "--pids falls back to RLIMIT_NPROC",
    "cpu": "--cpus is reported",
}

NOBODY = 65534  # root probes what an unprivileged user would get
PROBE_TIMEOUT = 2.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _StepFailed(Exception):
    """A probe step failed; the message names the step and the errno."""


def _errno_text(err: int) -> str:
    return f"{os.strerror(err)} ({errno.errorcode.get(err, err)})"


def _check_ret(ret: int, step: str) -> int:
    if ret == -1:
        raise _StepFailed(f"{step}: {_errno_text(ctypes.get_errno())}")
    return ret


def _write(path: str, data: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(data)
    except OSError as e:
        raise _StepFailed(f"write {path}: {_errno_text(e.errno or 0)}") from None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _prctl(option: int, arg: int) -> int:
    # Variadic: every argument must be a full unsigned long.
    zero = ctypes.c_ulong(0)
    return int(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), zero, zero, zero))


def _unshare(flags: int, step: str) -> None:
    _check_ret(_libc.unshare(ctypes.c_int(flags)), step)


# ---- forked probes ----------------------------------------------------------------


def _in_initial_userns() -> bool:
    return (_read("/proc/self/uid_map") or "").split() == ["0", "0", "4294967295"]


def _probing_as() -> int:
    """The uid the namespace probes run as (root in the host namespace probes as nobody)."""
    return NOBODY if os.geteuid() == 0 and _in_initial_userns() else os.geteuid()


def _become_probe_user() -> None:
    if _probing_as() == os.geteuid():
        return
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    # setuid made us non-dumpable, which makes /proc/self/uid_map root's: undo that.
    _prctl(PR_SET_DUMPABLE, 1)


def _enter_userns() -> None:
    """unshare(CLONE_NEWUSER) and map our own uid/gid to themselves, as stage 2 does."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER, "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _in_child(probe: Callable[[], str]) -> tuple[bool, str]:
    """Run PROBE in a forked child so its namespaces die with it: (ok, detail or why)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's code
        status, msg = 1, "probe failed"
        try:
            os.close(r)
            _become_probe_user()
            msg = probe()
            status = 0
        except _StepFailed as e:
            msg = str(e)
        except BaseException as e:  # noqa: B036 — anything, reported rather than raised
            msg = f"{type(e).__name__}: {e}"
        finally:
            try:
                os.write(w, json.dumps(str(msg)[:2000]).encode())
            finally:
                os._exit(status)
    os.close(w)
    out, timed_out = b"", False
    deadline = time.monotonic() + PROBE_TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not fdwait.readable(r, left):
                os.kill(pid, signal.SIGKILL)  # a hung probe must not hang the doctor
                timed_out = True
                break
            chunk = os.read(r, 8192)
            if not chunk:
                break
            out += chunk
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return False, f"probe gave no answer within {PROBE_TIMEOUT:g} s"
    if os.WIFSIGNALED(status):
        return False, f"probe died of {signal.Signals(os.WTERMSIG(status)).name}"
    try:
        detail = json.loads(out)
    except ValueError:
        detail = "probe gave no answer"
    return os.WEXITSTATUS(status) == 0, str(detail)


# ---- kernel -------------------------------------------------------------------------


def _kernel(f: Facts) -> list[Check]:
    release = os.uname().release
    f["kernel"] = release
    return [Check("kernel", True, release, hard=False)]


# ---- landlock -----------------------------------------------------------------------


def landlock_abi() -> tuple[int | None, str]:
    """(ABI, "") from the kernel, or (None, why Landlock is unavailable)."""
    ret = _libc.syscall(
        ctypes.c_long(SYS_landlock_create_ruleset),
        None,
        ctypes.c_long(0),
        ctypes.c_long(LANDLOCK_CREATE_RULESET_VERSION),
    )
    if ret >= 1:
        return int(ret), ""
    err = ctypes.get_errno()
    why = {
        errno.ENOSYS: "kernel built without Landlock",
        errno.EOPNOTSUPP: "Landlock is off (add landlock to the lsm= boot parameter)",
    }.get(err, _errno_text(err))
    return None, why


def _landlock(f: Facts) -> list[Check]:
    abi, why = landlock_abi()
    f["landlock_abi"] = abi
    if abi is None:
        return [
            Check("landlock", False, f"{why}: no filesystem confinement", hard=True),
            Check("landlock-unix", False, "no Landlock at all", hard=False),
        ]
    lacks = [(n, what) for n, what in LANDLOCK_FEATURES if abi < n]
    if len(lacks) == 1:
        n, what = lacks[0]
        detail = f"ABI {abi} (no {what}: those need ABI {n})"
    elif lacks:
        detail = f"ABI {abi} (no " + "; no ".join(f"{w} (ABI {n})" for n, w in lacks) + ")"
    else:
        detail = f"ABI {abi}"
    if abi >= LANDLOCK_UNIX_ABI:
        unix = Check("landlock-unix", True, "pathname unix-socket connect() is confined", False)
    else:
        unix = Check(
            "landlock-unix",
            False,
            f"ABI {abi} < {LANDLOCK_UNIX_ABI}: a connect() to a pathname unix socket inside an "
            "exposed tree is not stopped by Landlock; boxy refuses to expose trees holding "
            "the agent/GPG/Docker sockets instead",
            hard=False,
        )
    return [Check("landlock", True, detail, hard=True), unix]


# ---- seccomp ------------------------------------------------------------------------


def _load_allow_filter() -> str:
    """Install a one-instruction RET_ALLOW filter: proves filters load here."""
    _check_ret(_prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
    insn = struct.pack("=HBBI", 0x06, 0, 0, SECCOMP_RET_ALLOW)  # BPF_RET|BPF_K
    buf = ctypes.create_string_buffer(insn, len(insn))
    prog = struct.pack("=HxxxxxxQ", 1, ctypes.addressof(buf))
    pbuf = ctypes.create_string_buffer(prog, len(prog))
    _check_ret(
        _libc.syscall(
            ctypes.c_long(SYS_seccomp),
            ctypes.c_long(SECCOMP_SET_MODE_FILTER),
            ctypes.c_long(0),
            pbuf,
        ),
        "seccomp(SECCOMP_SET_MODE_FILTER)",
    )
    return "filter loaded"


def _seccomp(f: Facts) -> list[Check]:
    loads = _seccomp_loads(f)
    return [*loads, _naming(cast(list[str], f["seccomp_actions"]))]


def _seccomp_loads(f: Facts) -> list[Check]:
    avail = _read("/proc/sys/kernel/seccomp/actions_avail")
    actions = avail.split() if avail else []
    f["seccomp_actions"] = actions
    f["seccomp_user_notif"] = "user_notif" in actions
    if avail is None:
        f["seccomp"] = False
        return [
            Check(
                "seccomp",
                False,
                "no /proc/sys/kernel/seccomp/actions_avail: kernel without seccomp filters",
                hard=True,
            )
        ]
    needed = [a for a in ("kill_process", "errno", "allow") if a not in actions]
    ok, why = True, ""
    if not needed and os.uname().machine == "x86_64":
        ok, why = _in_child(_load_allow_filter)
    f["seccomp"] = ok and not needed
    detail = " ".join(actions)
    if needed:
        return [Check("seccomp", False, f"{detail} (lacks {', '.join(needed)})", hard=True)]
    if not ok:
        return [Check("seccomp", False, f"{detail}; loading a filter failed: {why}", hard=True)]
    return [Check("seccomp", True, detail, hard=True)]


def _naming(actions: list[str]) -> Check:
    """Whether a refused system call can be named (boxyd/stage2/notify.py)."""
    if "user_notif" in actions:
        return Check(
            "seccomp-names",
            True,
            "user_notif: every refused system call is named (call, arguments, process)",
            hard=False,
        )
    return Check(
        "seccomp-names",
        False,
        "no user_notif: this kernel cannot tell which system call seccomp refused; "
        "a kill is recorded by its signal (SIGSYS) alone",
        hard=False,
    )


# ---- user namespaces ----------------------------------------------------------------


def _userns_probe() -> str:
    _enter_userns()
    _unshare(
        CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP,
        "unshare(NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS|NEWCGROUP)",
    )
    # Stage 2's first mount: a restricted userns (Ubuntu's AppArmor) fails here.
    _check_ret(
        _libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None),
        "mount(/, MS_REC|MS_PRIVATE)",
    )
    pid = os.fork()
    if pid == 0:
        os._exit(0 if os.getpid() == 1 else 3)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise _StepFailed("first child of the new PID namespace is not PID 1")
    return "ok"


def _userns(f: Facts) -> list[Check]:
    limit = _read("/proc/sys/user/max_user_namespaces")
    f["max_user_namespaces"] = int(limit) if limit is not None else None
    ok, why = _in_child(_userns_probe)
    f["userns"] = ok
    who = _probing_as()
    suffix = f"; max_user_namespaces {limit}" if limit is not None else ""
    if who != os.geteuid():
        suffix += f"; probed as uid {who}"
    if ok:
        return [
            Check("userns", True, f"unprivileged user+mount+pid+net namespaces{suffix}", hard=True)
        ]
    clone = _read("/proc/sys/kernel/unprivileged_userns_clone")
    if clone == "0":
        suffix += "; kernel.unprivileged_userns_clone is 0"
    return [Check("userns", False, f"{why}{suffix}", hard=True)]


# ---- overlayfs (--review) -------------------------------------------------------------


def _overlay_mount(base: str) -> str:
    """In a fresh user+mount namespace: an overlay of BASE/lower under BASE/upper, each
    layer by fd as stage 2 mounts it (stage2/mounts.overlay), a file removed through
    it must leave a whiteout (a 0:0 device) in the upper layer."""
    from boxyd.stage2 import mounts

    _enter_userns()
    _unshare(CLONE_NEWNS, "unshare(CLONE_NEWNS)")
    _check_ret(
        _libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None),
        "mount(/, MS_REC|MS_PRIVATE)",
    )
    fds = [os.open(f"{base}/{d}", os.O_PATH | os.O_DIRECTORY) for d in ("lower", "upper", "work")]
    try:
        tree = mounts.overlay(fds[0], fds[1], fds[2], "overlay", base)
    except OSError as e:
        raise _StepFailed(f"mount overlay: {e.strerror or e}") from None
    except Exception as e:  # SetupError: the message names the step and errno
        raise _StepFailed(str(e)) from None
    target = os.open(f"{base}/mnt", os.O_PATH | os.O_DIRECTORY)
    mounts.move_mount_to_fd(tree, target, "overlay", base)
    os.unlink(f"{base}/mnt/old")
    st = os.lstat(f"{base}/upper/old")
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != 0:
        raise _StepFailed("a removal through the overlay left no whiteout")
    return "ok"


def _overlay_probe() -> str:
    """A scratch directory in boxy's state directory (the upper layer's filesystem must
    keep user xattrs; a temporary one for a probe user without one), the mount in a
    child."""
    import tempfile

    from boxy.errors import BoxyError
    from boxyd.daemon import review

    try:
        base = str(review.root())
    except BoxyError:  # no state directory of its own (root probing as nobody)
        base = tempfile.gettempdir()
    d = tempfile.mkdtemp(prefix=".probe-", dir=base)
    try:
        for sub in ("lower", "upper", "work", "mnt"):
            os.mkdir(f"{d}/{sub}", 0o700)
        os.close(os.open(f"{d}/lower/old", os.O_WRONLY | os.O_CREAT, 0o600))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # its namespaces end with it; the scratch directory is removed after
            os.close(r)
            why = "ok"
            try:
                _overlay_mount(d)
            except BaseException as e:  # noqa: B036 — anything, said rather than raised
                why = str(e) or type(e).__name__
            os.write(w, why.encode()[:1000])
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            why = f.read(1000).decode(errors="replace")
        os.waitpid(pid, 0)
        if why != "ok":
            raise _StepFailed(why or "the overlay probe died")
        return "ok"
    finally:
        work = f"{d}/work/work"
        if os.path.isdir(work):
            os.chmod(work, 0o700)
        shutil.rmtree(d, ignore_errors=True)


def overlay() -> tuple[bool, str]:
    """--review's overlay: (works, what or why); a forked child (never boxyd's process)."""
    return _in_child(_overlay_probe)


def _overlay(f: Facts) -> list[Check]:
    ok, why = overlay()
    f["overlay"] = ok
    if ok:
        return [Check("review", True, "--review: unprivileged overlayfs, layers by fd", hard=False)]
    return [
        Check(
            "review",
            False,
            f"{why}: --review is refused here (it needs an overlay mounted in a user "
            "namespace, its layers given by fd)",
            hard=False,
        )
    ]


# ---- AppArmor -----------------------------------------------------------------------

APPARMOR_SYSCTL = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
APPARMOR_FS = "/sys/kernel/security/apparmor"


def apparmor_profile_loaded(name: str = "boxy") -> bool | None:
    """Whether profile NAME is loaded; None when this user cannot read the policy."""
    listing = _read(f"{APPARMOR_FS}/profiles")
    if listing is not None:  # "name (mode)" per line; root only on most kernels
        return any(line.rsplit(" (", 1)[0] == name for line in listing.splitlines())
    try:  # the per-profile directories are world-readable
        entries = os.listdir(f"{APPARMOR_FS}/policy/profiles")
    except OSError:
        return None
    return any(_read(f"{APPARMOR_FS}/policy/profiles/{e}/name") == name for e in entries)


def _apparmor(f: Facts) -> list[Check]:
    restrict = _read(APPARMOR_SYSCTL)
    f["apparmor_restricts_userns"] = restrict == "1"
    f["apparmor_boxy_profile"] = None
    if restrict is None:
        return [Check("apparmor", True, "not restricting user namespaces", hard=True)]
    if restrict != "1":
        return [
            Check("apparmor", True, f"apparmor_restrict_unprivileged_userns={restrict}", hard=True)
        ]
    loaded = apparmor_profile_loaded()
    f["apparmor_boxy_profile"] = loaded
    if loaded:
        return [
            Check(
                "apparmor", True, "restricting user namespaces; boxy's profile is loaded", hard=True
            )
        ]
    state = "not loaded" if loaded is False else "cannot be checked as this user"
    return [
        Check(
            "apparmor",
            False,
            f"restricting user namespaces and boxy's profile is {state}: {apparmor_fix()}",
            hard=True,
        )
    ]


PACKAGE_PREFIX = "/usr/lib/boxy"  # the Debian package's venv (debian/rules)


def apparmor_fix(
    prefix: str | None = None, base_prefix: str | None = None, executable: str | None = None
) -> str:
    """How this installation gets boxy's profile. It attaches to the resolved path of
    stage 2's interpreter, so only an interpreter of boxy's own (a venv's copy) can
    carry it: a pipx venv's is the system's (a link), as is one outside any venv, and
    every Python program would share its profile."""
    prefix = os.path.realpath(prefix or sys.prefix)
    base_prefix = os.path.realpath(base_prefix or sys.base_prefix)
    executable = executable or sys.executable
    real = os.path.realpath(executable)
    if prefix == PACKAGE_PREFIX:
        return "the boxy package's postinst loads it (with apparmor_parser): sudo dpkg-reconfigure boxy"
    if prefix == base_prefix or not real.startswith(prefix + os.sep):
        return (
            f"this install's interpreter is {real}, the system's (a pipx venv links it): a "
            "profile for it would give every Python program user namespaces, so this install "
            "cannot have one; install the Debian package (`make deb`) or run from a checkout "
            "(`make setup`)"
        )
    return f"run `make setup` (installs packaging/apparmor/boxy for {executable})"


# ---- nftables -----------------------------------------------------------------------


def _nft_probe() -> str:
    """Load the gateway's own ruleset (TPROXY, fib, sets, NFLOG reporting) in a new
    netns of a new user namespace, and bind its NFLOG group: what stage 2 does."""
    from boxy.errors import SetupError
    from boxyd.net import nflog, ruleset
    from boxyd.stage2 import nft

    probe = ruleset.gateway_ruleset(
        mode="allowlist",
        deny_v4=["10.0.0.0/8"],
        deny_v6=["fc00::/7"],
        except_v4=[],
        except_v6=[],
        tcp_ports=[443],
        udp_ports=[],
    )
    _enter_userns()
    _unshare(CLONE_NEWNET, "unshare(CLONE_NEWNET)")
    try:
        nft.apply(probe)
    except SetupError as e:
        raise _StepFailed(str(e)) from None
    try:
        nflog.open_socket(ruleset.NFLOG_GROUP, ruleset.NFLOG_SNAPLEN).close()
    except OSError as e:
        raise _StepFailed(f"nflog (refusal reports): {e.strerror or e}") from None
    return "ok"


def _nftables(f: Facts) -> list[Check]:
    ok, why = _in_child(_nft_probe)
    f["nftables_tproxy"] = ok
    if ok:
        return [
            Check(
                "nftables",
                True,
                "the gateway's ruleset (TPROXY, fib, NFLOG) loads in an unprivileged netns",
                hard=False,
            )
        ]
    return [
        Check(
            "nftables",
            False,
            f"{why} (--net public/allowlist need it; --net none works)",
            hard=False,
        )
    ]


# ---- veth ---------------------------------------------------------------------------


def _veth_probe() -> str:
    from boxyd.net.rtnl import Rtnl

    _enter_userns()
    _unshare(CLONE_NEWNET, "unshare(CLONE_NEWNET)")
    rtnl = Rtnl()
    try:
        rtnl.veth("bxprobe0", "bxprobe1")
        for name in ("bxprobe0", "bxprobe1"):  # both ends exist, not just an ack
            rtnl.link_index(name)
    except OSError as e:
        raise _StepFailed(f"RTM_NEWLINK veth: {e.strerror or e}") from None
    finally:
        rtnl.close()
    return "ok"


def _veth(f: Facts) -> list[Check]:
    ok, why = _in_child(_veth_probe)
    f["veth"] = ok
    if ok:
        return [Check("veth", True, "veth pair in an unprivileged netns", hard=False)]
    return [
        Check(
            "veth", False, f"{why} (--net public/allowlist need it; --net none works)", hard=False
        )
    ]


def _network_path(f: Facts) -> list[Check]:
    """The path --net public and allowlist take, named part by part from the two probes
    before (each made in an unprivileged netns, as stage 2 makes them)."""
    parts = (
        ("veth", "a veth pair to the gateway's netns (rtnetlink)"),
        ("nftables_tproxy", "its ruleset with TPROXY, fib and sets (nfnetlink), refusals "
         "reported by NFLOG"),
    )  # fmt: skip
    missing = [what for fact, what in parts if not f.get(fact)]
    if not missing:
        path = "; ".join(what for _, what in parts)
        return [Check("network", True, f"--net public/allowlist: {path}", hard=False)]
    return [
        Check(
            "network",
            False,
            f"--net public/allowlist are refused here: no {'; no '.join(missing)}; "
            "--net none works",
            hard=False,
        )
    ]


# ---- cgroup v2 ----------------------------------------------------------------------


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_mounts() -> list[tuple[str, str, str]]:
    """(fstype, mount point, root within the hierarchy) of every cgroup mount."""
    out = []
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if rfields and rfields[0] in ("cgroup", "cgroup2"):
            out.append((rfields[0], _unescape(fields[4]), _unescape(fields[3])))
    return out


def _cgroup_state() -> Facts:
    mounts = cgroup_mounts()
    v2 = {mp: root for kind, mp, root in mounts if kind == "cgroup2"}
    has_v1 = any(kind == "cgroup" for kind, _, _ in mounts)
    mount = next(
        (p for p in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified") if p in v2), next(iter(v2), None)
    )
    mode = "legacy" if mount is None else ("hybrid" if has_v1 else "unified")
    state: Facts = {
        "cgroup_mode": mode,
        "cgroup2_path": None,
        "cgroup_controllers": [],
        "cgroup_writable": False,
    }
    if mount is None:
        return state
    rel = next(
        (ln[3:] for ln in (_read("/proc/self/cgroup") or "").splitlines() if ln.startswith("0::")),
        None,
    )
    if rel is None:
        state["cgroup2_path"] = mount
        return state
    root = v2[mount]
    if root != "/" and (rel == root or rel.startswith(root + "/")):
        rel = rel[len(root) :] or "/"  # a mount of a subtree: path relative to it
    path = os.path.normpath(mount + "/" + rel.lstrip("/"))
    state["cgroup2_path"] = path
    state["cgroup_controllers"] = (_read(f"{path}/cgroup.controllers") or "").split()
    state["cgroup_writable"] = os.access(path, os.W_OK) and os.access(
        f"{path}/cgroup.procs", os.W_OK
    )
    return state


def _cgroup2(f: Facts) -> list[Check]:
    state = _cgroup_state()
    f.update(state)
    have = set(cast(list[str], state["cgroup_controllers"]))
    for c in CGROUP_CONTROLLERS:
        f[f"{c}_controller"] = c in have
    if state["cgroup2_path"] is None:
        costs = "; ".join(CGROUP_COSTS.values())
        return [Check("cgroup2", False, f"legacy: no cgroup v2 hierarchy: {costs}", hard=False)]
    listed = "[" + " ".join(sorted(have)) + "]"
    where = f"{state['cgroup_mode']}: v2 at {state['cgroup2_path']} {listed}"
    writable = "writable" if state["cgroup_writable"] else f"not writable by uid {os.geteuid()}"
    missing = [c for c in CGROUP_CONTROLLERS if c not in have]
    if not missing:
        return [Check("cgroup2", True, f"{where}, {writable}", hard=False)]
    costs = "; ".join(CGROUP_COSTS[c] for c in missing)
    return [
        Check(
            "cgroup2", False, f"{where} has no {'/'.join(missing)} controller: {costs}", hard=False
        )
    ]


# ---- user manager and session bus ---------------------------------------------------


def _socket_answers(path: str) -> bool:
    """A unix socket at PATH that accepts a connection (a stale file does not)."""
    try:
        if not path.startswith("\0") and not stat.S_ISSOCK(os.stat(path).st_mode):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            s.connect(path)
        return True
    except OSError:
        return False


def _runtime_dir() -> str | None:
    d = os.environ.get("XDG_RUNTIME_DIR")
    return d if d and os.path.isabs(d) else None


def _systemd_user(f: Facts) -> list[Check]:
    run = _runtime_dir()
    ok, how = False, "XDG_RUNTIME_DIR unset"
    if run and not shutil.which("systemctl"):
        how = "systemd is not installed"
    if run and _socket_answers(f"{run}/systemd/private"):
        ok, how = True, f"{run}/systemd/private"
    elif run and shutil.which("systemctl"):
        import subprocess  # only on this path: the doctor starts fast otherwise

        try:
            p = subprocess.run(
                ["systemctl", "--user", "is-system-running"],
                capture_output=True,
                text=True,
                timeout=0.5,
                check=False,
            )
            state = p.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            state = ""
        ok = state in ("initializing", "starting", "running", "degraded", "maintenance", "stopping")
        how = f"systemctl --user: {state}" if ok else "no user manager answers"
    f["systemd_user"] = ok
    if ok:
        return [Check("systemd-user", True, f"running ({how})", hard=False)]
    return [
        Check(
            "systemd-user",
            False,
            f"not running ({how}): boxyctl starts boxyd itself; transient scopes unavailable",
            hard=False,
        )
    ]


def session_bus() -> str | None:
    """The session bus address that answers, or None."""
    for addr in filter(None, os.environ.get("DBUS_SESSION_BUS_ADDRESS", "").split(";")):
        transport, _, params = addr.partition(":")
        kv = dict(p.partition("=")[::2] for p in params.split(",") if "=" in p)
        if transport != "unix":
            return addr  # not a local socket: never dialled from here
        if "path" in kv and _socket_answers(kv["path"]):
            return kv["path"]
        if "abstract" in kv and _socket_answers("\0" + kv["abstract"]):
            return addr
    run = _runtime_dir()
    if run and _socket_answers(f"{run}/bus"):
        return f"{run}/bus"
    return None


def _session_bus(f: Facts) -> list[Check]:
    bus = session_bus()
    f["session_bus"] = bus is not None
    if bus:
        return [Check("session-bus", True, bus, hard=False)]
    return [
        Check("session-bus", False, "none: the D-Bus API is off, varlink still works", hard=False)
    ]


def _host_network(f: Facts) -> list[Check]:
    """What the gateway's DNS proxy will use: the host's resolvers and its IPv6."""
    from boxyd.net import hostnet

    try:
        servers = (
            hostnet.upstream_servers(os.environ.get(hostnet.UPSTREAM_ENV))
            or hostnet.resolv_conf_nameservers()
        )
    except (OSError, ValueError) as e:
        servers, why = [], str(e)
    else:
        why = "no nameserver in /etc/resolv.conf"
    f["dns_upstreams"] = upstreams = [f"{h}:{p}" for h, p in servers]
    f["ipv6_route"] = v6 = hostnet.host_has_ipv6_route()
    out = [
        Check("dns-upstream", True, ", ".join(upstreams), hard=False)
        if servers
        else Check(
            "dns-upstream", False, f"{why}: --net public/allowlist resolve nothing", hard=False
        )
    ]
    out.append(
        Check(
            "ipv6-route",
            v6,
            "default route present"
            if v6
            else "none: AAAA answers are dropped so clients use IPv4 at once",
            hard=False,
        )
    )
    return out


def _git(f: Facts) -> list[Check]:
    """The host-side layer against a directory that merely looks like a bare repository
    (git >= 2.38): with safe.bareRepository=explicit git refuses to use one it finds."""
    import subprocess

    from boxyd.config.hosttools import resolve

    try:
        here = [d for d in [os.getcwd()] if d != "/"]  # "/" is nobody's project
    except OSError:  # a removed cwd holds nothing to avoid
        here = []
    # never a git from a PATH entry in the current tree, and never run inside it
    git = resolve("git", os.environ.get("PATH", os.defpath), here)
    if git is None:
        f["git_safe_bare"] = None
        return [
            Check(
                "git",
                False,
                "not installed: the git guard's check with the host's git "
                "cannot run (runs refuse nothing; install git)",
                hard=False,
            )
        ]
    try:
        r = subprocess.run(
            [git, "config", "--global", "--get", "safe.bareRepository"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
            check=False,
            cwd="/",
        )
        value = r.stdout.strip().lower()
    except (OSError, subprocess.TimeoutExpired):
        value = ""
    f["git_safe_bare"] = value or None
    if value == "explicit":
        return [
            Check(
                "git",
                True,
                "safe.bareRepository=explicit: implicit bare repositories are "
                "refused on the host too",
                hard=False,
            )
        ]
    return [
        Check(
            "git",
            False,
            f"safe.bareRepository={value or 'all (unset)'}: a payload can make "
            "a directory look like a bare repository; boxy's git guard quarantines it, and "
            "`git config --global safe.bareRepository explicit` closes it on the host too",
            hard=False,
        )
    ]


def _writer_pidfd(f: Facts) -> list[Check]:
    """SO_PASSPIDFD (Linux 6.5): boxyd's check of who writes on its socket is then
    that very process's, not that of a later one given its pid (docs/design.md, "The
    front door")."""
    from boxy.varlink import SO_PASSPIDFD

    a, b = socket.socketpair()
    try:
        b.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)
        ok = True
    except OSError:
        ok = False
    finally:
        a.close()
        b.close()
    f["writer_pidfd"] = ok
    if ok:
        return [Check("writer-pidfd", True, "each caller of boxyd named by a pidfd", hard=False)]
    why = "each caller of boxyd named by its pid alone: a pid reused in that moment passes"
    return [Check("writer-pidfd", False, f"SO_PASSPIDFD missing (Linux < 6.5): {why}", False)]


PROBES: tuple[Probe, ...] = (
    _kernel,
    _writer_pidfd,
    _landlock,
    _seccomp,
    _userns,
    _apparmor,
    _nftables,
    _veth,
    _overlay,
    _network_path,
    _host_network,
    _git,
    _cgroup2,
    _systemd_user,
    _session_bus,
)


def _run() -> tuple[list[Check], Facts]:
    f: Facts = {}
    out: list[Check] = []
    for probe in PROBES:
        out += probe(f)
    return out, f


def checks() -> list[Check]:
    """One Check per line of `boxyctl doctor`, in order."""
    return _run()[0]


def facts() -> Facts:
    """The same probes as data: landlock_abi, userns, memory_controller, pids_controller,
    cpu_controller, cgroup2_path, cgroup_controllers, nftables_tproxy, veth, ..."""
    return _run()[1]


def main(argv: list[str]) -> int:
    if argv == ["--overlay"]:  # boxyd's check before a --review run
        ok, why = overlay()
        print(json.dumps({"ok": ok, "why": why}))
        return 0
    results = checks()
    if argv == ["--wire"]:
        print(json.dumps([c.to_wire() for c in results]))
        return 0
    return show(results)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
