"""--tailscale: reach this machine's tailnet by MagicDNS name, and nothing more.

It does two things (docs/design.md, "Network", modes): the tailnet's ranges become
address exceptions (boxyd.net.policy), and names under the tailnet's MagicDNS
suffix are resolved by tailscaled's resolver at 100.100.100.100 — which boxyd
reaches from the host, the sandbox never. The suffix is also the sandbox's search
domain, so a bare `nas` resolves as it does everywhere else; an allowed bare name
therefore allows its fully qualified form too. When tailscaled is not running the
ranges still apply, and the user is told that MagicDNS will not work.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

MAGICDNS = ("100.100.100.100", 53)
TIMEOUT = 3.0


def magicdns_suffix(
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    binary: str = "tailscale",
) -> str | None:
    """The tailnet's MagicDNS suffix from a running tailscaled, else None. BINARY: the
    tailscale found outside every payload-writable tree (boxyd/config/hosttools.py resolve)."""
    try:
        r = run(
            [binary, "status", "--json", "--peers=false"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=TIMEOUT,
            text=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    try:
        status = json.loads(r.stdout)
    except ValueError:
        return None
    if not isinstance(status, dict) or status.get("BackendState") != "Running":
        return None
    suffix = status.get("MagicDNSSuffix")
    if not isinstance(suffix, str) or not suffix.strip("."):
        return None
    return suffix.strip(".").lower()


def qualify_hosts(hosts: list[str], suffix: str) -> list[str]:
    """HostSpec strings, plus NAME.SUFFIX for each single-label NAME (same ports)."""
    out = list(hosts)
    for spec in hosts:
        name, sep, rest = spec.partition(":")
        if "/" in name:  # 'nas/udp' cannot occur (udp needs ports) but keep it exact
            continue
        if "." not in name and not name.startswith("*"):
            out.append(f"{name}.{suffix}{sep}{rest}")
    return out
