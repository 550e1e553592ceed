"""The gateway's ruleset loads where /etc/protocols and /etc/services do not exist
(netbase is not in a minimal Debian, nor in most containers): libnftables resolves
a protocol or service name it does not know itself through those files, and a fresh
Debian 12 with boxy's package refused every networked run over 'ipv6-icmp' (issue 33
§3). Loaded by boxy's own loader (boxyd.stage2.nft.apply) in a network namespace of
its own, with both files hidden behind an empty one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LOAD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from boxyd.net.ruleset import gateway_ruleset
from boxyd.stage2 import nft
assert open("/etc/protocols").read() == "" and open("/etc/services").read() == ""
common = dict(deny_v4=["10.0.0.0/8"], deny_v6=["fc00::/7"], except_v4=[], except_v6=[])
nft.apply(gateway_ruleset(mode="public", **common))
print("public loaded", flush=True)
"""

VARIANTS = {
    "public": "",
    "allowlist": ', tcp_ports=[22, 443], udp_ports=[5353], bound=["11.0.0.7"]',
}


@pytest.mark.parametrize("mode", sorted(VARIANTS))
def test_the_ruleset_needs_no_protocol_or_service_names_from_etc(mode: str) -> None:
    code = LOAD.replace('mode="public", **common)', f'mode="{mode}", **common{VARIANTS[mode]})')
    code = code.replace("public loaded", f"{mode} loaded")
    hide = "mount --bind /dev/null /etc/protocols && mount --bind /dev/null /etc/services"
    proc = subprocess.run(
        ["unshare", "-rmn", "sh", "-c", f'{hide} && exec "$0" -I -c "$1" "$2"',
         sys.executable, code, str(ROOT)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{mode} loaded", proc.stdout + proc.stderr
