"""What git on the host would obey in the tree a review's apply would leave
(docs/design.md, "Changes held for review"): the git guard's own discovery
(gitguard/discover.py) run over the upper layer laid on the host's work directory.

A live run's guard judges the tree the payload wrote: a repository it made anywhere
(a bare one: HEAD, objects, refs, config), a hook in the directory the host's
core.hooksPath names, a file the host's config includes. A held run writes only its
upper layer, so the same discovery runs over the merged view: a read-only overlay
(upper over host, by fd) mounted in a user and mount namespace of a forked child,
which dies with them. Every gitdir it finds and every control entry (hooks
directories, included configs, pointers) is a git control place: apply holds what
lands at or beneath one, as it holds anything under a `.git`. Runs in the review
child (daemon/reviewproc.py), never in boxyd's process; what it cannot judge it says,
and the review is refused (fail closed).
"""

from __future__ import annotations

import json
import os
import pwd
import signal

from boxyd.kernel.sys import CLONE_NEWNS, check, libc
from boxyd.plan import reviewtree

PR_SET_PDEATHSIG = 1
OUT_MAX = 64 << 20


def _judge(upper: str, workdir: str, ident: tuple[int, int] | None) -> list[str]:
    """In the forked child: the merged view's git control places (rels)."""
    from boxyd.config import parsedoor
    from boxyd.gitguard import discover, userconfig
    from boxyd.stage2 import mounts, namespaces

    home = pwd.getpwuid(os.getuid()).pw_dir
    user_hooks = userconfig.hooks_path(home)  # the user's own ~/.gitconfig
    namespaces.enter_user_namespace(os.getuid(), os.getgid())
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # opened in the new mount namespace: overlayfs clones only a layer of its own
    ufd = os.open(upper, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    hfd = reviewtree.open_workdir(workdir, ident, os.O_PATH)
    view = mounts.overlay_view([ufd, hfd], "review: the merged view", workdir)
    root = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=view)
    parsedoor.allow_local()  # this process is apart from boxyd (the review child's)
    lay = discover.Walker(
        workdir, root, limit=None, user_hooks=user_hooks, refuse_unjudged=False
    ).run()
    return sorted({g.rel for g in lay.gitdirs} | {c.rel for c in lay.controls})


def _child(w: int, upper: str, workdir: str, ident: tuple[int, int] | None) -> None:
    reply: dict[str, object]
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the budget's kill reaches it
        reply = {"places": _judge(upper, workdir, ident)}
    except BaseException as e:  # noqa: B036 — anything, said rather than raised
        reply = {"error": str(e) or type(e).__name__}
    finally:
        with os.fdopen(w, "w") as f:
            f.write(json.dumps(reply))
        os._exit(0)


def places(upper: str, workdir: str, ident: tuple[int, int] | None = None) -> list[str]:
    """The git control places of the tree apply would leave (WORKDIR, IDENT:
    reviewtree.open_workdir); OSError when they cannot be found (the review is
    refused then)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(w, upper, workdir, ident)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read(OUT_MAX + 1)
    os.waitpid(pid, 0)
    try:
        got = json.loads(out)
    except ValueError:
        got = {"error": "its child gave no answer"}
    if "error" in got or len(out) > OUT_MAX:
        raise OSError(0, f"the git guard could not judge the changes ({got.get('error')})")
    return [str(p) for p in got["places"]]
