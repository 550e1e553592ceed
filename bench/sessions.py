#!/usr/bin/env python3
"""Scale: N concurrent detached sessions (default 200), each `sleep` under
`--net none`. Reports boxyd's resident memory with all of them running, the
proportional set size per session (every process of a session: its outer stage 2,
PID 1 and the payload; PSS, because they are forked from one template and share
most pages, which RSS would count once per process), and how the last starts
compare with the first (the median of the last ten `run -d` against the median of
the first ten, measured in the same run).

Targets (issue #18): boxyd ≤ 40 MB RSS with 200 sessions, ≤ 2 MB PSS per session,
the 200th start within 1.5× of the first. PID 1 of a sandbox is not dumpable, so
only root can read its memory: run as root with `--user NAME` (boxyctl then runs as
NAME, in NAME's home; bench/all.py does this), e.g. `sudo .venv/bin/python
bench/sessions.py --user boxytest [-n 200] [--json]`. Run as the user instead, the
per-session figure misses PID 1 and says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import Figure, at_most, emit  # noqa: E402

BIN = Path(sys.executable).parent
WINDOW = 10  # starts in each median: the first ones, the last ones
AS: list[str] = []  # runuser and a clean environment, with --user


def as_user(name: str) -> list[str]:
    import pwd

    pw = pwd.getpwnam(name)
    env = {
        "HOME": pw.pw_dir, "USER": name, "LOGNAME": name, "LANG": "C.UTF-8",
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "XDG_RUNTIME_DIR": f"/run/user/{pw.pw_uid}",
    }  # fmt: skip
    return ["runuser", "-u", name, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]


def ctl(*args: str) -> str:
    return subprocess.run(
        [*AS, str(BIN / "boxyctl"), *args], check=True, capture_output=True, text=True
    ).stdout


UNREADABLE: list[int] = []  # processes whose memory we may not read (not dumpable)


def _status_kib(pid: int, field: str, name: str = "status") -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except PermissionError:
        UNREADABLE.append(pid)
    except OSError:  # gone meanwhile
        pass
    return 0


INIT = "boxy-init"  # a sandbox's PID 1 (boxyd/stage2/pid1.py: INIT_NAME)


def rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS:")


def pss_kib(pid: int) -> int:
    return _status_kib(pid, "Pss:", "smaps_rollup")


def dirty_kib(pid: int) -> int:
    """Pages only PID holds that it (or the process it shares them with) wrote: what a
    forked process costs on its own."""
    return _status_kib(pid, "Private_Dirty:", "smaps_rollup")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def subtree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


def daemon_pid() -> int:
    words = ctl("daemon", "status").split()
    return int(words[words.index("pid") + 1])


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def sessions_pss_kib(boxyd: int) -> tuple[int, int, str]:
    """(how many sessions run, the PSS of all their processes, their mean Private_Dirty
    by kind: outer stage 2, PID 1, payload). A session is a child of the stage-2
    template that is a sandbox's PID 1 ("boxy-init": its outer stage 2 handed it over
    and exited), or, in a tree before that, an outer stage 2 whose child it is; the
    template's spares (no run yet) are no session's."""
    templates = [
        k for k in children(boxyd) if "boxyd.stage2" in Path(f"/proc/{k}/cmdline").read_text()
    ]
    roots: list[tuple[int | None, list[int]]] = []  # (outer stage 2, its PID 1s)
    for t in templates:
        for c in children(t):
            if _comm(c) == INIT:
                roots.append((None, [c]))
            elif pid1s := [p for p in children(c) if _comm(p) == INIT]:
                roots.append((c, pid1s))
    pss = 0
    kinds: list[list[int]] = [[], [], []]
    for outer, pid1s in roots:
        pss += sum(pss_kib(p) for p1 in pid1s for p in subtree(p1))
        if outer is not None:
            pss += pss_kib(outer)
            kinds[0].append(dirty_kib(outer))
        kinds[1] += [dirty_kib(p) for p in pid1s]
        kinds[2] += [dirty_kib(g) for p in pid1s for g in children(p)]
    mean = [sum(k) / len(k) / 1024 if k else 0.0 for k in kinds]
    dirty = "Private_Dirty outer {:.2f}, PID 1 {:.2f}, payload {:.2f} MiB".format(*mean)
    return len(roots), pss, dirty


def start_all(n: int) -> tuple[list[str], list[float]]:
    ids, times = [], []
    for _ in range(n):
        t = time.perf_counter()
        ids.append(ctl("run", "-d", "--net", "none", "--", "sleep", "900").strip())
        times.append(time.perf_counter() - t)
    return ids, times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    ap.add_argument("--user", help="as root: run boxyctl as this user, in ~/boxy-bench")
    a = ap.parse_args()
    if a.user:
        AS[:] = as_user(a.user)
        import pwd

        pw = pwd.getpwnam(a.user)
        wd = Path(pw.pw_dir) / "boxy-bench"  # a project directory (never the home itself)
        wd.mkdir(exist_ok=True)
        os.chown(wd, pw.pw_uid, pw.pw_gid)
        os.chdir(wd)
    say = (lambda s: print(s, file=sys.stderr)) if a.json else print
    ctl("daemon", "restart", "--force")
    ctl("run", "--net", "none", "--", "true")  # the template is up
    time.sleep(1)
    boxyd = daemon_pid()
    idle = rss_kib(boxyd)
    ids, times = start_all(a.n)
    try:
        running = [ln for ln in ctl("ps").splitlines()[1:] if ln.split()[0] in ids]
        if len(running) != a.n:
            sys.exit(f"only {len(running)} of {a.n} sessions are running")
        time.sleep(1)
        rss = rss_kib(boxyd)
        counted, pss, dirty = sessions_pss_kib(boxyd)
    finally:
        for sid in ids:
            subprocess.run([*AS, str(BIN / "boxyctl"), "stop", "-k", sid], capture_output=True)
    first, last = statistics.median(times[:WINDOW]), statistics.median(times[-WINDOW:])
    if UNREADABLE:
        say(f"{len(UNREADABLE)} processes (PID 1 of each sandbox) not readable: run as root --user")
    per_session = pss / max(counted, 1) / 1024
    say(
        f"{a.n} sessions: boxyd RSS {idle / 1024:.1f} MiB idle, {rss / 1024:.1f} MiB with "
        f"them running; {counted} sessions' processes {pss / 1024:.1f} MiB PSS "
        f"({per_session:.2f} MiB each; {dirty}); start {first * 1000:.0f} ms (first {WINDOW}) "
        f"→ {last * 1000:.0f} ms (last {WINDOW})"
    )
    figures = [
        Figure("sessions", f"boxyd RSS, {a.n} sessions", rss / 1024, "MiB", None,
               "≤ 40 MB", rss * 1024 <= 40e6),
        Figure("sessions", "PSS per session" + (" (PID 1 unread)" if UNREADABLE else ""),
               per_session, "MiB", None, "≤ 2 MB", per_session * (1 << 20) <= 2e6),
        Figure("sessions", f"start #{a.n} against #1", last * 1000, "ms",
               *at_most(last / first, 1.5)),
    ]  # fmt: skip
    emit(figures, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
