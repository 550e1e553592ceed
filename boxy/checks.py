"""What `boxyctl doctor` reports, as values both sides read: a Check per line, the
lines as the doctor prints them (render), the JSON document (as_doc), the wire form
(to_wire/from_wire), and probe(), which runs the checks in a process of their own
(`python -m boxyd.daemon.doctor --wire`: a probe forks and enters namespaces, which
boxyd's own process must not). boxyd answers Doctor with it; boxyctl runs it itself
only when boxyd cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TextIO

from boxy.errors import DaemonError

PROBE_BUDGET = 30.0  # seconds the checks may take before the doctor gives up on them


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    hard: bool  # missing → boxy cannot run here, and the doctor exits 1

    def to_wire(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "required": self.hard}

    @classmethod
    def from_wire(cls, d: object) -> Check:
        if not isinstance(d, dict):
            raise DaemonError("doctor: a check that is not an object")
        name, ok, detail, hard = (d.get(k) for k in ("name", "ok", "detail", "required"))
        if not (isinstance(name, str) and isinstance(ok, bool) and isinstance(detail, str)):
            raise DaemonError(f"doctor: a malformed check ({d!r:.200})")
        return cls(name, ok, detail, hard is True)


def color(stream: TextIO) -> bool:
    # Escapes only for a person at a terminal; a pipe gets plain text.
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


RED, RESET = "\x1b[31m", "\x1b[0m"


# What provides each line, said when it is missing.
TO_GET_IT = {
    "writer-pidfd": "Linux 6.5 or later (SO_PASSPIDFD)",
    "landlock": "a kernel with Landlock (5.13+) enabled in its lsm= list",
    "landlock-unix": "a kernel whose Landlock has ABI 9 (unix-socket rights)",
    "seccomp": "a kernel built with seccomp filters (CONFIG_SECCOMP_FILTER)",
    "seccomp-names": "Linux 5.0 or later (SECCOMP_RET_USER_NOTIF)",
    "userns": "unprivileged user namespaces (user.max_user_namespaces > 0; on Debian "
    "kernel.unprivileged_userns_clone=1)",
    "apparmor": "boxy's AppArmor profile, as the line says for this install",
    "nftables": "nf_tables with TPROXY and fib, and Debian's libnftables1",
    "veth": "the veth kernel module",
    "review": "Linux >= 6.13 (overlayfs layers by fd), and user xattrs where boxy keeps its state",
    "network": "the veth and nftables lines above",
    "dns-upstream": "a nameserver in /etc/resolv.conf, or BOXY_UPSTREAM_DNS=HOST[:PORT]",
    "ipv6-route": "an IPv6 default route on the host",
    "git": "git config --global safe.bareRepository explicit (git 2.38 or later)",
    "cgroup2": "systemd.unified_cgroup_hierarchy=1 on the kernel command line, and a user "
    "manager (systemd --user) that delegates memory, pids and cpu",
    "systemd-user": "a login session, or loginctl enable-linger $USER",
    "session-bus": "dbus-user-session, started by the user manager",
}


def render(results: list[Check], color: bool = False) -> list[str]:
    """` + name  ok       required  detail` / ` - name  missing  optional  detail; to
    get it: …`, columns aligned. Required lines are the ones boxy cannot run without."""
    width = max((len(c.name) for c in results), default=0)
    lines = []
    for c in results:
        sign, verdict = ("+", "ok") if c.ok else ("-", "missing")
        need = "required" if c.hard else "optional"
        fix = f"; to get it: {TO_GET_IT[c.name]}" if not c.ok and c.name in TO_GET_IT else ""
        line = f" {sign} {c.name:<{width}}  {verdict:<7}  {need}  {c.detail}{fix}"
        lines.append(f"{RED}{line}{RESET}" if color and not c.ok else line)
    return lines


def as_doc(results: list[Check]) -> dict[str, object]:
    """`doctor --json`: ok (nothing required missing) and every check."""
    return {
        "ok": not any(c.hard and not c.ok for c in results),
        "checks": [
            {
                "name": c.name,
                "ok": c.ok,
                "required": c.hard,
                "detail": c.detail,
                "to_get_it": TO_GET_IT.get(c.name) if not c.ok else None,
            }
            for c in results
        ],
    }


def missing_required(results: list[Check]) -> list[str]:
    return [c.name for c in results if c.hard and not c.ok]


def show(results: list[Check], as_json: bool = False) -> int:
    """The doctor's output (its lines, or its JSON document) and exit status: 1 when a
    required check is missing, said on stderr too."""
    if as_json:
        sys.stdout.write(json.dumps(as_doc(results), indent=2, sort_keys=True) + "\n")
    else:
        for line in render(results, color=color(sys.stdout)):
            print(line)
    sys.stdout.flush()
    blocking = missing_required(results)
    if blocking:
        print(f"boxyctl: boxy cannot run here: {', '.join(blocking)} missing", file=sys.stderr)
        return 1
    return 0


def probe(timeout: float = PROBE_BUDGET) -> list[Check]:
    """Run the checks in a child (`python -m boxyd.daemon.doctor --wire`): the list
    of checks, or DaemonError saying why there is none."""
    try:
        r = subprocess.run(
            [sys.executable, "-m", "boxyd.daemon.doctor", "--wire"],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise DaemonError(f"doctor: the checks did not finish within {timeout:g}s") from None
    except OSError as e:
        raise DaemonError(f"doctor: the checks could not be run: {e.strerror}") from None
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise DaemonError(f"doctor: the checks failed (exit {r.returncode}): {tail}") from None
    if not isinstance(doc, list):
        raise DaemonError("doctor: the checks' output is not a list")
    return [Check.from_wire(d) for d in doc]
