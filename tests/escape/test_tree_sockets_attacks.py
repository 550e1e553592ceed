"""Attacks on the work tree's socket cover (issue 31 §5) its own tests do not cover: a
host server that starts listening in the tree DURING the session in a way the live
guard's sweep never looks at (found by an attack on the class). The payload connects
in a loop for the whole session. The live cover has a window, as every live cover has
(README: the sweep 0.1 s after a directory's new entry, the look at /proc/net/unix
every 0.25 s): ESCAPED means the host server stayed reachable past WINDOW seconds
from its first reply, or at the end."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Boxy, User
from tests.escape.conftest import HOST_PY, boxy_argv, spawn, stop, wait_for, write_payload

pytestmark = pytest.mark.sandbox

CONNECT = r"""
paths = sys.argv[1].split(",")
open("READY", "w").close()
t0 = time.time(); deadline = t0 + float(sys.argv[2])
first, last, end = {}, {}, {}
while time.time() < deadline:
    for p in paths:
        s = socket.socket(socket.AF_UNIX); s.settimeout(1)
        try:
            s.connect(p)
            if b"HELLO-FROM-HOST" in s.recv(64):
                first.setdefault(p, time.time()); last[p] = time.time(); end[p] = "REPLY"
        except OSError as e:
            end[p] = ename(e)
        finally:
            s.close()
    time.sleep(0.01)
WINDOW = 2.0  # several times the idle figure (0.05-0.45 s here): CI machines are loaded
for p in paths:
    span = f"{first.get(p, t0)-t0:.2f}s..{last.get(p, t0)-t0:.2f}s; at the end: {end.get(p)}"
    if end.get(p) == "REPLY" or last.get(p, 0) - first.get(p, 0) > WINDOW:
        escaped("connect-" + p, span)
    else:
        tried("connect-" + p, span)
"""

SERVER = r"""
import os, socket, sys, time
mode, path, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_UNIX)
if mode == "mkdir-bind":      # a server making its runtime directory, then listening in it
    os.makedirs(os.path.dirname(path), exist_ok=True); s.bind(path)
elif mode == "rename-in":     # bound under a temporary name, renamed into place
    s.bind(tmp); os.rename(tmp, path)
elif mode == "dir-moved-in":  # its directory prepared elsewhere, then moved into the tree
    os.makedirs(tmp); s.bind(os.path.join(tmp, os.path.basename(path)))
    os.rename(tmp, os.path.dirname(path))
else:                         # plain: bound in place (directories made first if need be)
    os.makedirs(os.path.dirname(path), exist_ok=True); s.bind(path)
s.listen(16); s.settimeout(20)
end = time.time() + 20
while time.time() < end:
    try:
        c, _ = s.accept()
    except OSError:
        break
    try:
        c.sendall(b"HELLO-FROM-HOST\n")
    except OSError:
        pass
    c.close()
"""

# name -> (server mode, path in the tree, needs a repository)
CASES = {
    "plain-watched-dir": ("plain", "sub/x.sock", False),  # the sweep's 0.1 s window only
    "mkdir-then-bind": ("mkdir-bind", "run/x.sock", False),
    "rename-in": ("rename-in", "sub/x.sock", False),
    "dir-moved-in": ("dir-moved-in", "run2/x.sock", False),
    "node_modules": ("plain", "node_modules/.cache/nx/d.sock", False),
    "gitdir-top": ("plain", ".git/x.sock", True),  # git_event short-circuits the sweep
    "gitdir-objects": ("plain", ".git/objects/x.sock", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_host_socket_made_during_the_session(
    boxy: Boxy, user: User, workdir: Path, case: str
) -> None:
    mode, rel, repo = CASES[case]
    (workdir / "sub").mkdir()
    (workdir / "node_modules").mkdir()
    for d in ("sub", "node_modules"):
        user.chown(workdir / d)
    if repo:
        user.run(["git", "init", "-q"], cwd=workdir)
    tmp = str(user.home / f".boxy-sock-tmp-{workdir.name}")
    text = _session(boxy, user, CONNECT, rel, "4", [mode, str(workdir / rel), tmp])
    assert "ESCAPED" not in text, text
    assert f"TRIED connect-{rel} " in text, text  # it really looked


def _session(
    boxy: Boxy, user: User, payload: str, paths: str, seconds: str, server_args: list[str]
) -> str:
    """PAYLOAD run on PATHS for SECONDS, a host SERVER started once it looks; what it
    printed, and its errors."""
    write_payload(boxy, payload)
    proc = spawn(
        user,
        boxy_argv(cmd=["python3", "payload.py", paths, seconds]),
        cwd=boxy.workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    server = None
    try:
        wait_for(lambda: (boxy.workdir / "READY").exists(), 30, "the session")
        time.sleep(0.5)  # the guard watches
        server = spawn(user, [HOST_PY, "-c", SERVER, *server_args])
        out, err = proc.communicate(timeout=60)
        print(out.decode())
        return out.decode() + err.decode()
    finally:
        stop(proc)
        if server is not None:
            stop(server)


# a second attack round (issue 31): a hard link to the host's socket made in the moment
# before its stand-in, under a name of the payload's; connect() through the link went
# on for the rest of the run. Every name of the socket is covered, as the first is.
LINKER = r"""
import threading
def _link(src=sys.argv[1].split(",")[0], dst=sys.argv[1].split(",")[1]):
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        try:
            os.link(src, dst)
            tried("linked", f"{time.time():.3f}")
            return
        except OSError:
            pass
threading.Thread(target=_link, daemon=True).start()
"""


def test_a_hard_link_made_in_the_window_is_covered_too(
    boxy: Boxy, user: User, workdir: Path
) -> None:
    for d in ("sub", "node_modules"):  # the link where nothing is watched
        (workdir / d).mkdir()
        user.chown(workdir / d)
    server = ["plain", str(workdir / "sub/x.sock"), ""]
    text = _session(boxy, user, LINKER + CONNECT, "sub/x.sock,node_modules/.hl", "5", server)
    assert "TRIED linked " in text, text  # the link was made
    assert "ESCAPED" not in text, text
