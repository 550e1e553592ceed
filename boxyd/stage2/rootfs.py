"""docs/design.md, step 6: build the sandbox's root filesystem on a tmpfs and pivot into it.

Runs in PID 1's builder child (boxyd/stage2/pid1.py), inside the new user, mount
and PID namespaces, holding CAP_SYS_ADMIN over them (it exits with them). The
host's tree is reachable under /oldroot only until ``enter`` detaches it.
"""

from __future__ import annotations

import base64
import errno
import os

from boxy.errors import SetupError
from boxyd.kernel import openat
from boxyd.kernel.sys import write_small
from boxyd.plan.ops import Bind, Copy, Dir, File, Mask, Overlay, Plan, Symlink
from boxyd.stage2 import mounts as m

BASE = "/tmp"  # staging mount point in our private mount namespace only
OLD = "/oldroot"  # the host, while the sandbox is assembled
NEW = "/newroot"
SCRATCH = "/scratch"

# The procfs recon surface: files shadowed by /dev/null, directories by an empty
# read-only tmpfs (what runc and bubblewrap-based tools mask, plus symbol tables).
PROC_MASK_FILES = (
    "kcore",
    "kallsyms",
    "keys",
    "key-users",
    "sysrq-trigger",
    "timer_list",
    "sched_debug",
    "kmsg",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "latency_stats",
    "timer_stats",
    "config.gz",
    "vmallocinfo",
    "slabinfo",
    "iomem",
    "ioports",
    "modules",
    "pagetypeinfo",
    "buddyinfo",
    "zoneinfo",
    "mtrr",
    "dma",
    "softirqs",
    "interrupts",
    "lockdep",
    "lock_stat",
)
PROC_MASK_DIRS = ("acpi", "scsi", "irq", "bus", "driver", "fs", "tty", "sys/kernel/debug")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


def staging() -> None:
    """Mount a tmpfs as a staging root and pivot into it, keeping the host at /oldroot.
    Needs: CAP_SYS_ADMIN in the mount namespace (dropped in step 7)."""
    m.mount("tmpfs", BASE, "tmpfs", m.MS_NOSUID | m.MS_NODEV, "mode=0755,size=64k", "staging tmpfs")
    for d in (OLD, NEW, SCRATCH):
        os.mkdir(BASE + d, 0o755)
    m.pivot_root(BASE, BASE + OLD)
    os.chdir("/")


def root_tmpfs() -> None:
    m.mount("tmpfs", NEW, "tmpfs", m.MS_NOSUID | m.MS_NODEV, "mode=0755,size=8m", "root tmpfs")


def scratch(plan: Plan) -> None:
    """One tmpfs behind $HOME, /tmp and /dev/shm, sized from --memory: three separate
    ones would together allow three times the budget."""
    m.mount(
        "tmpfs",
        SCRATCH,
        "tmpfs",
        m.MS_NOSUID | m.MS_NODEV,
        f"mode=0755,size={plan.scratch_size}",
        "scratch tmpfs",
    )
    os.mkdir(SCRATCH + "/home", 0o700)
    for d in ("tmp", "shm"):
        os.mkdir(f"{SCRATCH}/{d}")
        os.chmod(f"{SCRATCH}/{d}", 0o1777)
    os.mkdir(SCRATCH + "/copies", 0o700)
    os.mkdir(SCRATCH + "/masks", 0o700)  # credentials' stand-ins: seen only where grafted
    _bind_scratch("home", plan.home)
    _bind_scratch("tmp", "/tmp")
    for i, dst in enumerate(plan.tmpfs):  # the profile's filesystem.tmpfs
        os.mkdir(f"{SCRATCH}/tmpfs{i}", 0o700)
        _bind_scratch(f"tmpfs{i}", dst)


def _graft(src_fd: int, target_fd: int, attrs: int | None, step: str, path: str) -> None:
    """Clone the mount tree at SRC_FD, optionally set ATTRS on all of it, and move it
    onto TARGET_FD: fds end to end, so no path is resolved twice."""
    tree = m.open_tree_clone(src_fd, step, path)
    try:
        if attrs is not None:
            m.set_attr(tree, attrs, step, path, recursive=True)
        m.move_mount_to_fd(tree, target_fd, step, path)
    finally:
        os.close(tree)


def _bind_scratch(sub: str, dst: str) -> None:
    target = _target_on_tmpfs(dst, is_dir=True, step=f"scratch {sub}")
    src = os.open(f"{SCRATCH}/{sub}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _graft(src, target, None, "scratch " + sub, dst)
    finally:
        os.close(src)
        os.close(target)


def dev() -> None:
    """A minimal /dev: the host's harmless nodes bound in, a private devpts instance,
    /dev/shm on the scratch tmpfs. No host terminal is reachable: /dev/tty names the
    sandbox's own controlling terminal (boxy's PTY) or fails with ENXIO."""
    os.mkdir(NEW + "/dev", 0o755)
    for node in DEV_NODES:
        apply_bind(Bind(src=f"/dev/{node}", dst=f"/dev/{node}", ro=False, dev=True))
    os.mkdir(NEW + "/dev/pts", 0o755)
    m.mount(
        "devpts",
        NEW + "/dev/pts",
        "devpts",
        m.MS_NOSUID | m.MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
        "devpts",
    )
    os.symlink("pts/ptmx", NEW + "/dev/ptmx")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{NEW}/dev/{name}")
    os.symlink("/proc/self/fd", NEW + "/dev/fd")
    os.mkdir(NEW + "/dev/shm")
    _bind_scratch("shm", "/dev/shm")


def proc() -> None:
    """A procfs instance for the sandbox's PID namespace (only its own processes)."""
    os.mkdir(NEW + "/proc", 0o555)
    m.mount("proc", NEW + "/proc", "proc", m.MS_NOSUID | m.MS_NODEV | m.MS_NOEXEC, None, "procfs")


def sysctl(name: str, value: str) -> None:
    """Write a sysctl of the sandbox's own user namespace (e.g. user.max_user_namespaces=0).
    Needs: CAP_SYS_RESOURCE/ADMIN over that namespace, held until step 7."""
    path = f"{NEW}/proc/sys/{name.replace('.', '/')}"
    try:
        write_small(path, value)
    except OSError as e:
        raise SetupError(f"sysctl {name}={value}: {e.strerror}") from None


def mask_proc() -> None:
    null = os.open(OLD + "/dev/null", os.O_PATH | os.O_CLOEXEC)
    try:
        for name in PROC_MASK_FILES:
            path = f"{NEW}/proc/{name}"
            if not os.path.lexists(path):
                continue
            tfd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _graft(null, tfd, None, "mask /proc", path)
            finally:
                os.close(tfd)
    finally:
        os.close(null)
    for name in PROC_MASK_DIRS:
        path = f"{NEW}/proc/{name}"
        if os.path.isdir(path):
            m.mount(
                "tmpfs",
                path,
                "tmpfs",
                m.MS_RDONLY | m.MS_NOSUID | m.MS_NODEV | m.MS_NOEXEC,
                "mode=0555,size=0",
                "mask /proc",
            )
    # /proc/sys read-only (bound onto itself): sysctls were written above, before this.
    sysfd = os.open(NEW + "/proc/sys", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        ro = m.MOUNT_ATTR_RDONLY | m.MOUNT_ATTR_NOSUID | m.MOUNT_ATTR_NODEV
        _graft(sysfd, sysfd, ro, "/proc/sys read-only", "/proc/sys")
    finally:
        os.close(sysfd)


def apply_ops(plan: Plan) -> None:
    for op in plan.ops:
        if isinstance(op, Bind):
            apply_bind(op)
        elif isinstance(op, Copy):
            apply_copy(op, plan)
        elif isinstance(op, Symlink):
            _parent_on_tmpfs(op.dst, step="symlink")
            os.symlink(op.target, NEW + op.dst)
        elif isinstance(op, File) and op.graft:
            apply_graft(op)
        elif isinstance(op, File):
            _parent_on_tmpfs(op.dst, step="file")
            fd = os.open(
                NEW + op.dst,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                op.mode,
            )
            with os.fdopen(fd, "w") as f:
                f.write(op.content)
        elif isinstance(op, Dir):
            os.close(openat.walk_create(_new_fd(), op.dst, leaf="dir", step="mkdir", mode=op.mode))
        elif isinstance(op, Mask):
            apply_mask(op)
        elif isinstance(op, Overlay):
            apply_overlay(op)


def _new_fd() -> int:
    return os.open(NEW, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _parent_on_tmpfs(dst: str, step: str) -> None:
    parent = os.path.dirname(dst.rstrip("/")) or "/"
    root = _new_fd()
    try:
        os.close(openat.walk_create(root, parent, leaf="dir", step=step))
    finally:
        os.close(root)


def _target_on_tmpfs(dst: str, *, is_dir: bool, step: str) -> int:
    root = _new_fd()
    try:
        return openat.walk_create(root, dst, leaf="dir" if is_dir else "file", step=step)
    finally:
        os.close(root)


def _open_source(b: Bind) -> int | None:
    """Open a bind's source. Under a writable tree (src_base) the path is resolved with
    openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS): the payload controls that tree."""
    step = f"bind {b.dst}"
    base_path = (NEW if b.in_place else OLD) + (b.src_base or "/")
    base = os.open(base_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if b.create:  # --mkdir: create what is missing, never through a symlink
            return openat.walk_create(base, b.src, leaf="dir", step=step)
        if b.src_base is not None:
            if b.optional and not os.path.lexists(f"{base_path}/{b.src}"):
                return None
            return openat.openat2(base, b.src, os.O_PATH, step)
        # a host path the user named: its symlinks are followed as on the host (a
        # profile's ~/.local/bin/claude lands on the versioned binary it points to)
        fd = openat.open_in_root(base, b.src.lstrip("/"), os.O_PATH)
        if fd >= 0:
            return fd
        if -fd == errno.ENOENT:
            if b.optional:
                return None
            raise SetupError(f"{step}: {b.src}: no such file or directory")
        raise SetupError(f"{step}: {b.src}: {os.strerror(-fd)}")
    finally:
        os.close(base)


def _open_target(b: Bind, is_dir: bool) -> int:
    step = f"bind {b.dst}"
    if b.dst_base is not None:
        base = os.open(NEW + b.dst_base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = openat.openat2(base, b.dst, os.O_PATH, step)
        finally:
            os.close(base)
        if m.is_dir_fd(fd) != is_dir:
            os.close(fd)
            raise SetupError(f"{step}: source and target differ in type (refused)")
        return fd
    return _target_on_tmpfs(b.dst, is_dir=is_dir, step=step)


def apply_bind(b: Bind) -> None:
    """Clone the source mount tree from an fd and move it onto the target fd, so no
    path is resolved twice (nothing can be swapped between check and mount)."""
    step = f"bind {b.dst_base + '/' if b.dst_base else ''}{b.dst}"
    src = _open_source(b)
    if src is None:
        return
    try:
        attrs = (
            m.MOUNT_ATTR_NOSUID
            | (0 if b.dev else m.MOUNT_ATTR_NODEV)
            | (m.MOUNT_ATTR_RDONLY if b.ro else 0)
            | (m.MOUNT_ATTR_NOEXEC if b.noexec else 0)
        )
        target = _open_target(b, m.is_dir_fd(src))
        try:
            _graft(src, target, attrs, step, b.dst)
        finally:
            os.close(target)
    finally:
        os.close(src)


def apply_overlay(o: Overlay) -> None:
    """--review: the work directory as an overlay whose upper layer is the session's.
    The lower is the host's path as the user named it (as a workdir bind opens it);
    the upper and work directories are boxyd's own (its state directory, 0700).
    Needs: CAP_SYS_ADMIN over the sandbox's user namespace (the builder's, step 6)."""
    step = f"overlay {o.dst}"
    fds: list[int] = []
    old = os.open(OLD, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for host in (o.lower, o.upper, o.work):
            fd = openat.open_in_root(old, host.lstrip("/"), os.O_PATH | os.O_DIRECTORY)
            if fd < 0:
                raise SetupError(f"{step}: {host}: {os.strerror(-fd)}")
            fds.append(fd)
        tree = m.overlay(fds[0], fds[1], fds[2], step, o.dst)
        fds.append(tree)
        target = _target_on_tmpfs(o.dst, is_dir=True, step=step)
        fds.append(target)
        m.move_mount_to_fd(tree, target, step, o.dst)
    finally:
        for fd in [old, *fds]:
            os.close(fd)


_copies = 0


def apply_copy(c: Copy, plan: Plan) -> None:
    """Copy one host file onto the scratch tmpfs (read through an O_NOFOLLOW fd) and
    bind it at its destination, read-only for --copy-ro."""
    global _copies
    step = f"copy {c.dst}"
    try:
        sfd = os.open(OLD + c.src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise SetupError(f"{step}: {c.src}: {e.strerror}") from None
    _copies += 1
    tmp = f"{SCRATCH}/copies/{_copies}"
    try:
        st = os.fstat(sfd)
        if not (st.st_mode & 0o170000 == 0o100000):
            raise SetupError(f"{step}: {c.src}: not a regular file")
        dfd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, st.st_mode & 0o700 | 0o600
        )
        try:
            while chunk := os.read(sfd, 1 << 16):
                os.write(dfd, chunk)
        except OSError as e:
            raise SetupError(
                f"{step}: {e.strerror} (is the scratch tmpfs, --memory, large enough?)"
            ) from None
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    _bind_local(tmp, c.dst, c.ro, step)


def apply_graft(f: File) -> None:
    """A file boxy writes (on the scratch tmpfs) bound read-only over one a bind put
    at F.dst: the file there must exist (the plan checked the host has it)."""
    global _copies
    _copies += 1
    tmp = f"{SCRATCH}/copies/{_copies}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, f.mode)
    with os.fdopen(fd, "w") as out:
        out.write(f.content)
    _bind_local(tmp, f.dst, True, f"graft {f.dst}")


_masks = 0


def apply_mask(mk: Mask) -> None:
    """A credential's stand-in (made on the scratch tmpfs, where nothing in the sandbox
    sees it) grafted read-only over the entry, resolved beneath its writable tree with
    openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)."""
    global _masks
    step = f"cover {mk.dst_base}/{mk.dst}"
    _masks += 1
    stand_in = f"{SCRATCH}/masks/{_masks}"
    if mk.is_dir:
        os.mkdir(stand_in, 0o555)
    else:
        fd = os.open(stand_in, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(mk.content))
    src = os.open(stand_in, os.O_PATH | os.O_CLOEXEC)
    try:
        base = os.open(NEW + mk.dst_base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            target = openat.openat2(base, mk.dst, os.O_PATH, step)
        finally:
            os.close(base)
        try:
            if m.is_dir_fd(target) != mk.is_dir:
                raise SetupError(f"{step}: changed type since it was found (refused)")
            _graft(
                src,
                target,
                m.MOUNT_ATTR_RDONLY | m.MOUNT_ATTR_NOSUID | m.MOUNT_ATTR_NODEV,
                step,
                mk.dst,
            )
        finally:
            os.close(target)
    finally:
        os.close(src)


def _bind_local(src: str, dst: str, ro: bool, step: str) -> None:
    sfd = os.open(src, os.O_PATH | os.O_CLOEXEC)
    try:
        attrs = m.MOUNT_ATTR_NOSUID | m.MOUNT_ATTR_NODEV | (m.MOUNT_ATTR_RDONLY if ro else 0)
        target = _target_on_tmpfs(dst, is_dir=False, step=step)
        try:
            _graft(sfd, target, attrs, step, dst)
        finally:
            os.close(target)
    finally:
        os.close(sfd)


def seal_and_enter(cwd: str) -> None:
    """Make the root tmpfs read-only and pivot into it, detaching the host and the
    staging tree (pivot_root(".", ".") + lazy unmount leaves no /oldroot behind)."""
    rfd = _new_fd()
    m.set_attr(
        rfd,
        m.MOUNT_ATTR_RDONLY | m.MOUNT_ATTR_NOSUID | m.MOUNT_ATTR_NODEV,
        "root read-only",
        "/",
        recursive=False,
    )
    os.close(rfd)
    os.chdir(NEW)
    m.pivot_root(".", ".")
    m.umount_detach(".", "detach host")
    os.chdir("/")
    try:
        os.chdir(cwd)
    except OSError as e:
        raise SetupError(f"chdir {cwd}: {e.strerror}") from None
