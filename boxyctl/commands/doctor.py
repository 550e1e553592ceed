"""`boxyctl doctor`: print what this machine gives boxy, one aligned line per check.

Imports only the standard library and boxyd.daemon.doctor, so the command starts fast.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from boxyd.daemon.doctor import Check, checks

RED, RESET = "\x1b[31m", "\x1b[0m"


def _color(stream: TextIO) -> bool:
    # Escapes only for a person at a terminal; a pipe gets plain text.
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


# What provides each line, said when it is missing.
TO_GET_IT = {
    "writer-pidfd": "Linux 6.5 or later (SO_PASSPIDFD)",
    "landlock": "a kernel with Landlock (5.13+) enabled in its lsm= list",
    "landlock-unix": "a kernel whose Landlock has ABI 9 (unix-socket rights)",
    "seccomp": "a kernel built with seccomp filters (CONFIG_SECCOMP_FILTER)",
    "userns": "unprivileged user namespaces (user.max_user_namespaces > 0; on Debian "
    "kernel.unprivileged_userns_clone=1)",
    "apparmor": "boxy's AppArmor profile: sudo packaging/install-apparmor.sh .venv/bin/python3",
    "nftables": "nf_tables with TPROXY and fib, and Debian's libnftables1 and python3-nftables",
    "veth": "the veth kernel module",
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


def main(args: dict[str, Any]) -> int:
    """Print the checks; 1 when a hard requirement is missing, else 0."""
    as_json = bool(args.get("json"))
    results = checks()
    if as_json:
        import json

        sys.stdout.write(json.dumps(as_doc(results), indent=2, sort_keys=True) + "\n")
    for line in [] if as_json else render(results, color=_color(sys.stdout)):
        print(line)
    sys.stdout.flush()
    blocking = [c.name for c in results if c.hard and not c.ok]
    if blocking:
        print(f"boxyctl: boxy cannot run here: {', '.join(blocking)} missing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main({}))
