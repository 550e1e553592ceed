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
from collections.abc import Callable, Iterable, Iterator, Mapping

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


# Bounds on the walk below: a tree too large to check is refused, never passed unchecked.
SOCKET_SCAN_ENTRIES = 200_000


def refuse_sockets(label: str, tree: str, *, limit: int = SOCKET_SCAN_ENTRIES) -> None:
    """Refuse to expose a tree that holds a unix socket (a tmux server, a password
    manager's agent, an IDE's helper …): a socket is reachable through a read-only
    bind, and Landlock below ABI 9 cannot stop a pathname connect(). Walks without
    following symlinks (a symlink to a socket outside the tree does not resolve in
    the sandbox). The work directory is not walked: it is the project itself."""
    seen = 0
    stack = [tree]
    while stack:
        top = stack.pop()
        try:
            it = os.scandir(top)
        except OSError:
            continue
        with it:
            for e in _entries(it):
                seen += 1
                if seen > limit:
                    raise UsageError(
                        f"{label} {tree}: too large to check for unix sockets (over {limit} "
                        "entries); expose a narrower path"
                    )
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    raise UsageError(
                        f"{label} {tree}: holds the unix socket {e.path}, which the sandbox "
                        "could connect to; expose a narrower path"
                    )
                if stat.S_ISDIR(st.st_mode):
                    stack.append(e.path)


def _entries(it: Iterator[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
    """A directory's entries, ending quietly when reading it fails half-way (a file
    system that refuses getdents, a directory removed meanwhile)."""
    while True:
        try:
            e = next(it)
        except (StopIteration, OSError):
            return
        yield e
