"""What the host's own network looks like to boxyd: its resolvers and whether it has
IPv6 at all. Standard library only (the doctor reports the same facts)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

Upstream = tuple[str, int]
UPSTREAM_ENV = "BOXY_UPSTREAM_DNS"  # "ip[:port],…": the daemon's resolvers (tests)


def upstream_servers(value: str | None) -> list[tuple[str, int]] | None:
    """BOXY_UPSTREAM_DNS, or None for the host's resolv.conf."""
    if not value:
        return None
    out: list[tuple[str, int]] = []
    for item in value.split(","):
        item = item.strip()
        host, port = item, 53
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else 53
        elif item.count(":") == 1:
            host, _, p = item.partition(":")
            port = int(p)
        out.append((host, port))
    return out


def resolv_conf_nameservers(path: str | Path = "/etc/resolv.conf") -> list[Upstream]:
    """The ``nameserver`` lines of PATH, as (address, 53)."""
    servers: list[Upstream] = []
    for line in Path(path).read_text(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != "nameserver":
            continue
        try:
            ipaddress.ip_address(fields[1].split("%", 1)[0])
        except ValueError:
            continue
        servers.append((fields[1], 53))
    return servers


def host_has_ipv6_route(route_table: str | None = None) -> bool:
    """Whether the host has a usable IPv6 default route (/proc/net/ipv6_route format).

    Without one, AAAA answers are dropped: a client given only unreachable v6
    addresses next to working v4 ones stalls in Happy Eyeballs."""
    if route_table is None:
        try:
            route_table = Path("/proc/net/ipv6_route").read_text()
        except OSError:
            return False  # IPv6 disabled in this kernel
    rtf_up, rtf_reject = 0x0001, 0x0200
    for line in route_table.splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        dest, plen, flags, dev = fields[0], fields[1], int(fields[8], 16), fields[9]
        if (
            int(dest, 16) == 0
            and int(plen, 16) == 0
            and dev != "lo"
            and flags & rtf_up
            and not flags & rtf_reject
        ):
            return True
    return False
