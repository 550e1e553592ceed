"""Refuse exposing a host tree that holds an agent's, bus's or container engine's socket.

A unix socket is reachable through a read-only bind, and Landlock below ABI 9
cannot stop a pathname connect(), so the only safe rule is never to expose a
tree that contains one. Pure: the caller passes the client's environment, and
``check_exposed`` takes the path resolver as a parameter (os.path.realpath by
default) so tests can model symlinks without a filesystem.
"""

from __future__ import annotations

import os
import os.path
import posixpath
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from boxy.errors import UsageError

Sensitive = tuple[str, str]  # (absolute path, why it matters)
Exposed = tuple[str, str]  # (what exposes it, e.g. "--ro" or "workdir"; absolute path)


def _unix_paths_from_dbus(address: str) -> list[str]:
    """The unix:path= entries of a D-Bus address list ('unix:path=/x,guid=…;tcp:…')."""
    out = []
    for entry in address.split(";"):
        transport, _, params = entry.partition(":")
        if transport != "unix":
            continue
        for kv in params.split(","):
            key, _, value = kv.partition("=")
            # abstract= lives in the network namespace, which the sandbox does not share
            if key in ("path", "dir", "tmpdir") and value.startswith("/"):
                out.append(_unescape_dbus(value))
    return out


def _unescape_dbus(value: str) -> str:
    # D-Bus escapes bytes as %XX; a bad escape is kept literally (the check errs wide).
    out, i = [], 0
    while i < len(value):
        if value[i] == "%" and _is_hex(value[i + 1 : i + 3]):
            out.append(chr(int(value[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(c in "0123456789abcdefABCDEF" for c in s)


def sensitive_paths(client_env: Mapping[str, str], home: str, uid: int) -> list[Sensitive]:
    """Every host location that must not be inside an exposed tree, with the reason."""
    runtime = client_env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    if not runtime.startswith("/"):
        runtime = f"/run/user/{uid}"
    gnupg = client_env.get("GNUPGHOME") or posixpath.join(home, ".gnupg")
    # The client's own sockets first: they are what an error should name.
    out: list[Sensitive] = []
    sock = client_env.get("SSH_AUTH_SOCK", "")
    if sock.startswith("/"):
        out.append((sock, "SSH agent socket"))
    if gnupg.startswith("/"):
        out.append((gnupg, "GPG home and agent socket"))
    docker_host = client_env.get("DOCKER_HOST", "")
    if docker_host.startswith("unix://") and docker_host[7:].startswith("/"):
        out.append((docker_host[7:], "Docker socket (DOCKER_HOST)"))
    for path in _unix_paths_from_dbus(client_env.get("DBUS_SESSION_BUS_ADDRESS", "")):
        out.append((path, "D-Bus session bus socket"))
    out += [
        (posixpath.join(runtime, "gnupg"), "GPG agent socket"),
        (posixpath.join(runtime, "bus"), "D-Bus session bus socket"),
        (posixpath.join(runtime, "docker.sock"), "rootless Docker socket"),
        (posixpath.join(runtime, "podman"), "Podman socket"),
        (runtime, "user runtime directory (agent, bus and engine sockets)"),
        ("/var/run/docker.sock", "Docker socket"),
        ("/run/docker.sock", "Docker socket"),
        ("/run/podman", "Podman socket"),
        ("/run", "system runtime directory (system bus, service sockets)"),
        ("/var/run", "system runtime directory (system bus, service sockets)"),
        ("/tmp/.X11-unix", "X11 display sockets"),
        ("/tmp", "the shared /tmp, with other programs' sockets (tmux, ssh-agent, X11)"),
        # the sandbox gets its own of these: the host's would hand over every process's
        # environment and fds (/proc), the kernel's and the devices' controls (/sys, /dev)
        ("/proc", "the host's process table (every process's environment, cmdline and fds)"),
        ("/sys", "the host's kernel and device controls"),
        ("/dev", "the host's devices"),
    ]
    if home.startswith("/") and home != "/":
        # First of all: exposing the home directory itself (or a directory holding it)
        # hands over ~/.ssh, ~/.aws, ~/.kube …, and that is what the user must hear
        out.insert(0, (home, HOME_WHY))
    seen: set[str] = set()
    unique = []
    for path, why in out:
        path = posixpath.normpath(path)
        if path not in seen:
            seen.add(path)
            unique.append((path, why))
    return unique


HOME_WHY = "your home directory, with its keys and credentials"


def _contains(tree: str, path: str) -> bool:
    # "/".rstrip("/") + "/" is "/": the root contains every absolute path
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def check_exposed(
    exposed: Iterable[Exposed],
    sensitive: Iterable[Sensitive],
    *,
    realpath: Callable[[str], str] = os.path.realpath,
    exists: Callable[[str], bool] = os.path.lexists,
) -> None:
    """Raise UsageError when an exposed path equals or contains a sensitive one that
    exists (an error never names a path that is not there).

    Both sides are compared as given and as resolved: /var/run is usually a link
    to /run, and a home directory may be reached through a symlink.
    """
    present = [(path, why, {path, realpath(path)}) for path, why in sensitive if exists(path)]
    for what, path in exposed:
        trees = {posixpath.normpath(path), realpath(path)}
        for spath, why, forms in present:
            if not any(_contains(t, s) for t in trees for s in forms):
                continue
            if why == HOME_WHY:
                verb = "is" if spath in trees else "holds"
                fix = "pass -w ~/project" if what == "workdir" else "expose a project inside it"
                raise UsageError(
                    f"{what} {path}: {verb} your home directory {spath}, whose keys and "
                    f"credentials are never exposed; run in a project directory, or {fix}"
                )
            raise UsageError(f"{what} {path}: exposes {spath} ({why}); expose a narrower path")


def settings_paths(
    client_env: Mapping[str, str], home: str, own_env: Mapping[str, str] | None = None
) -> list[Sensitive]:
    """Where the host keeps what decides how boxy and the tools around it behave: a
    writable tree on any of them, or inside one, would let the payload rewrite its own
    sandbox's rules (trust approvals, the hook's settings, boxyd's units and D-Bus
    activation) or a host program's (Claude Code's user settings, where boxy's hook
    is installed). As the client's environment and boxyd's own (OWN_ENV: its
    state and config directories are the ones boxyd uses) place them, and by default."""
    if not home.startswith("/") or home == "/":
        return []
    out = [
        (posixpath.join(home, ".config"), "your configuration"),
        (posixpath.join(home, ".claude"), "Claude Code's settings, where boxy's hook is"),
    ]
    for env in (client_env, os.environ if own_env is None else own_env, {}):
        out += _xdg_settings(env, home)
    unique: dict[str, str] = {}
    for path, why in out:
        unique.setdefault(posixpath.normpath(path), why)
    return list(unique.items())


def _xdg_settings(env: Mapping[str, str], home: str) -> list[Sensitive]:
    def base(var: str, default: str) -> str:
        value = env.get(var, "")
        return value if value.startswith("/") else posixpath.join(home, default)

    config, state = base("XDG_CONFIG_HOME", ".config"), base("XDG_STATE_HOME", ".local/state")
    data = base("XDG_DATA_HOME", ".local/share")
    return [
        (config, "your configuration: boxy's profiles, trust approvals and hook settings"),
        (posixpath.join(state, "boxy"), "boxy's state: its records, quarantine and notices"),
        (posixpath.join(data, "systemd", "user"), "your systemd user units, boxyd's among them"),
        (posixpath.join(data, "dbus-1"), "your D-Bus services, boxyd's activation among them"),
    ]


def _claude(known: list[tuple[str, str, set[str]]]) -> set[str]:
    return {f for p, _, forms in known if p.endswith("/.claude") for f in forms}


def check_writable(
    writable: Iterable[Exposed],
    settings: Iterable[Sensitive],
    *,
    realpath: Callable[[str], str] = os.path.realpath,
) -> None:
    """Raise UsageError when a writable tree is one of SETTINGS, lies inside one, or
    holds one (settings_paths), compared as given and as resolved."""
    known = [(p, why, {posixpath.normpath(p), realpath(p)}) for p, why in settings]
    for what, path in writable:
        trees = {posixpath.normpath(path), realpath(path)}
        if any(_contains(posixpath.join(s, "projects"), t) for t in trees for s in _claude(known)):
            continue  # Claude Code's transcripts (the claude preset's /resume): no settings
        for spath, why, forms in known:
            if any(_contains(t, s) or _contains(s, t) for t in trees for s in forms):
                raise UsageError(
                    f"{what} {path}: would let the run rewrite {spath} ({why}); "
                    "run in a project directory"
                )


# Bounds on the walk below: a tree too large to check is refused, never passed unchecked.
SOCKET_SCAN_ENTRIES = 200_000
# A directory read within this of its last change is read again next time: timestamps
# are coarse (a change in the same clock tick as the reading leaves its ctime equal).
RACY_NS = 1_000_000_000
MEMO_DIRS = 20_000  # directories remembered across runs (a few MB at most)


@dataclass(frozen=True)
class _Read:
    """What one reading of a directory found: no socket; how many entries; its
    subdirectories (names). Valid while the directory's identity and ctime hold."""

    key: tuple[int, int, int, int]  # st_dev, st_ino, st_ctime_ns, st_mtime_ns
    entries: int
    subdirs: tuple[str, ...]
    complete: bool = True  # False: some entry could not be looked at (never kept)


class SocketMemo:
    """The directories of exposed trees already found free of sockets (boxy's package
    caches come back every run, thousands of them). A socket appears only as a new
    entry, and a new, removed or renamed entry moves its directory's ctime, which no
    one can set: a directory whose identity and ctime are unchanged is not read again.
    Its subdirectories still are each looked at, so the walk stays complete. (A mount
    over a file of an unchanged directory goes unseen: mounting takes privilege over
    boxyd's own mount namespace, which is not what this check is against.)"""

    def __init__(self, clock: Callable[[], int] = time.time_ns, limit: int = MEMO_DIRS) -> None:
        self._clock = clock
        self._limit = limit
        self._dirs: dict[str, _Read] = {}
        self._lock = threading.Lock()
        self.reads = 0  # directories read (not taken from the memo): for the tests

    def get(self, path: str, key: tuple[int, int, int, int]) -> _Read | None:
        with self._lock:
            hit = self._dirs.get(path)
        return hit if hit is not None and hit.key == key else None

    def put(self, path: str, read: _Read, read_at: int) -> None:
        """READ, taken at READ_AT, kept unless the directory changed too close to it."""
        with self._lock:
            self.reads += 1
            if not read.complete or read.key[2] >= read_at - RACY_NS:
                self._dirs.pop(path, None)
                return
            if len(self._dirs) >= self._limit:
                self._dirs.clear()
            self._dirs[path] = read

    def now(self) -> int:
        return self._clock()

    def __len__(self) -> int:
        return len(self._dirs)


MEMO = SocketMemo()


def refuse_sockets(
    label: str, tree: str, *, limit: int = SOCKET_SCAN_ENTRIES, memo: SocketMemo = MEMO
) -> None:
    """Refuse to expose a tree that holds a unix socket (a tmux server, a password
    manager's agent, an IDE's helper …): a socket is reachable through a read-only
    bind, and Landlock below ABI 9 cannot stop a pathname connect(). Walks without
    following symlinks (a symlink to a socket outside the tree does not resolve in
    the sandbox); each directory is looked at, but one unchanged since MEMO last read
    it is not read again. The work directory is not walked: it is the project itself."""
    seen = 0
    stack = [(tree, True)]
    while stack:
        top, follow = stack.pop()
        try:  # the tree itself as scandir takes it; below it, never through a symlink
            st = os.stat(top, follow_symlinks=follow)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        read = memo.get(top, _key(st))
        if read is None:
            read_at = memo.now()
            read = _read_dir(label, tree, top, follow, (limit - seen, limit))
            if read is None:
                continue
            memo.put(top, read, read_at)
        seen += read.entries
        if seen > limit:
            raise _too_large(label, tree, limit)
        stack += [(os.path.join(top, name), False) for name in read.subdirs]


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns)


def _read_dir(label: str, tree: str, top: str, follow: bool, room: tuple[int, int]) -> _Read | None:
    """TOP's entries: UsageError at a socket or past ROOM's first number of them (its
    second: the whole walk's limit, to say); None if it cannot be read at all. Read
    through one descriptor, so what is kept is what that very directory held (the
    tree may be a payload's to rename in)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(top, flags)
    except OSError:
        return None
    try:
        key = _key(os.fstat(fd))
        with os.scandir(fd) as it:
            entries, subdirs, complete = _entries(label, tree, top, it, room)
    except OSError:  # fstat or opendir
        return None
    finally:
        os.close(fd)
    return _Read(key, entries, tuple(subdirs), complete)


def _entries(
    label: str, tree: str, top: str, it: Iterator[os.DirEntry[str]], room: tuple[int, int]
) -> tuple[int, list[str], bool]:
    """(entries, subdirectories, complete): a reading that ended half-way (a file
    system that refuses getdents, an entry gone meanwhile) is used once, never kept."""
    entries, complete = 0, True
    subdirs: list[str] = []
    while True:
        try:
            e = next(it)
        except StopIteration:
            break
        except OSError:
            return entries, subdirs, False
        entries += 1
        if entries > room[0]:
            raise _too_large(label, tree, room[1])
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            complete = False
            continue
        if stat.S_ISSOCK(st.st_mode):
            raise UsageError(
                f"{label} {tree}: holds the unix socket {os.path.join(top, e.name)}, "
                "which the sandbox could connect to; expose a narrower path"
            )
        if stat.S_ISDIR(st.st_mode):
            subdirs.append(e.name)
    return entries, subdirs, complete


def _too_large(label: str, tree: str, limit: int) -> UsageError:
    return UsageError(
        f"{label} {tree}: too large to check for unix sockets (over {limit} "
        "entries); expose a narrower path"
    )
