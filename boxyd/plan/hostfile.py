"""Files boxyd writes on the host for a run (--audit-log, --net-log, --pcap), opened so
that the payload cannot choose what they are.

boxyd runs unsandboxed as the user, and these paths often lie in the work directory,
which the payload owns between runs and during concurrent ones. So each is opened once,
before the payload starts, and written through that descriptor afterwards — never
reopened by name. On the way to it:

- inside a tree a payload can write (this run's or a live session's), no component
  may be a symlink: ``logs -> ~/.ssh`` would make boxyd write where the payload
  chose. Above such a tree, symlinks are the user's own layout and are followed;
- the file is opened O_NONBLOCK|O_NOFOLLOW: a FIFO planted at the path must not
  freeze the daemon (with no reader, a non-blocking open for writing fails with
  ENXIO), and a symlink there is refused;
- it must be a regular file with one link (a hard link to another of the user's
  files would have boxyd append to that file), and it is truncated only after
  that check.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from boxy.errors import UsageError

_STEP = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # symlinks followed above the hostile trees, as the kernel allows


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _parent(flag: str, path: str, hostile: set[tuple[int, int]]) -> int:
    """An O_PATH fd of PATH's directory, resolved one component at a time."""
    todo = [c for c in os.path.dirname(path).split("/") if c]
    fd = os.open("/", _STEP | os.O_DIRECTORY)
    inside = False
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if inside:
                    raise UsageError(
                        f"{flag} {path}: {name} is a symlink inside a tree the sandbox "
                        "can write (refused: it could point anywhere)"
                    )
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _STEP | os.O_DIRECTORY)
                todo[:0] = [c for c in target.split("/") if c]
                continue
            if inside and name == "..":  # only a followed symlink's target can hold one
                raise UsageError(
                    f"{flag} {path}: goes through '..' inside a tree the sandbox can "
                    "write (refused)"
                )
            nfd = os.open(name, _STEP | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            inside = inside or (st.st_dev, st.st_ino) in hostile
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_output(flag: str, path: str, hostile_roots: Iterable[str], *, truncate: bool) -> int:
    """The write descriptor for PATH (absolute), created 0600 if absent; appends unless
    TRUNCATE. Raises UsageError with one line naming FLAG and the path."""
    hostile = {i for r in hostile_roots if (i := _identity(r)) is not None}
    name = os.path.basename(path)
    try:
        pfd = _parent(flag, path, hostile)
        try:
            fd = os.open(
                name,
                os.O_WRONLY
                | os.O_CREAT
                | os.O_NONBLOCK
                | os.O_NOFOLLOW
                | os.O_CLOEXEC
                | (0 if truncate else os.O_APPEND),
                0o600,
                dir_fd=pfd,
            )
        finally:
            os.close(pfd)
    except OSError as e:
        why = {
            errno.ELOOP: "is a symlink (refused)",
            errno.ENXIO: "is a FIFO or socket (refused: not a regular file)",
        }.get(e.errno or 0, e.strerror or str(e))
        raise UsageError(f"{flag} {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{flag} {path}: not a regular file (refused)")
        if st.st_nlink > 1:
            raise UsageError(
                f"{flag} {path}: has {st.st_nlink} hard links (refused: boxyd would "
                "write into the other name too)"
            )
        os.set_blocking(fd, True)  # a regular file: writes complete
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass
class Outputs:
    """A run's host-side files, open before its payload starts; the session owns them."""

    audit: int | None = None
    net_log: int | None = None
    pcap: int | None = None

    def close(self) -> None:
        for name in ("audit", "net_log", "pcap"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)


def open_outputs(
    audit: str | None, net_log: str | None, pcap: str | None, hostile_roots: Iterable[str]
) -> Outputs:
    """Blocking (an open on a network filesystem can take its time): off the event loop."""
    roots = list(hostile_roots)
    out = Outputs()
    try:
        if audit:
            out.audit = open_output("--audit-log", audit, roots, truncate=False)
        if net_log:
            out.net_log = open_output("--net-log", net_log, roots, truncate=False)
        if pcap:
            out.pcap = open_output("--pcap", pcap, roots, truncate=True)
    except BaseException:
        out.close()
        raise
    return out


def replaced(fd: int) -> bool:
    """The file was unlinked while we held it (the payload removed or replaced it): what
    was written is in no file anyone can open."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True
