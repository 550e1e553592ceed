"""What the test internet holds: names, addresses, ports, recorders (pure data, no I/O).

The topology builder, the servers and the tests all read this one table, so an
address is written down exactly once.

"Public" servers live in 11.0.0.0/8 and 2a0b:4000::/32: globally routable space in
no IANA special-purpose registry, so boxy treats them like any internet host. They
exist only inside the fake-internet netns, which has no route anywhere else. The
denied ranges (documentation, benchmarking, private, ...) are used only for the
recorder hosts and counters that must never see a packet.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

ZONE = "boxy.test."  # RFC 2606 .test: can never collide with a real name
EVIL_ZONE = "evil.test."  # answers anything: a tunnelling attempt would succeed if it got here

# The link between the host netns (where boxyd runs) and the fake internet.
HOST_IF = "bxt-up"  # host side
NET_IF = "bxt-dn"  # fake-internet side
HOST_V4, ROUTER_V4, LINK_V4_LEN = "192.168.77.2", "192.168.77.1", 24
HOST_V6, ROUTER_V6, LINK_V6_LEN = "fd77::2", "fd77::1", 64

RESOLVER_V4, RESOLVER_V6 = "11.0.0.53", "2a0b:4000::53"

PUBLIC_NETS = ("11.0.0.0/8", "2a0b:4000::/32")

# Every public server address listens on all of these.
HTTP_PORTS = (80, 8080)
HTTPS_PORTS = (443, 8443)
BANNER_PORT = 2222  # server-first protocol (an SSH-like banner line on accept)
UDP_ECHO_PORTS = (443, 9998, 9999)  # 443: QUIC-shaped traffic must be refused by boxy

BIG_SIZE = 64 << 20  # /big
DEFAULT_TTL = 60
SHORT_TTL = 1  # short.boxy.test, for TTL-floor tests
TXT_STRINGS, TXT_STRING_LEN = 32, 250  # ~8 KB of TXT: over any UDP size, forces TCP


@dataclass(frozen=True)
class Server:
    """A public host: HTTP, HTTPS, banner and UDP echo on each of its addresses."""

    name: str  # reported in every response body
    v4: str | None
    v6: str | None

    @property
    def addrs(self) -> tuple[str, ...]:
        return tuple(a for a in (self.v4, self.v6) if a)


SERVERS: tuple[Server, ...] = (
    Server("www", "11.0.0.10", "2a0b:4000::10"),
    Server("v4only", "11.0.0.11", None),
    Server("aaaaonly", None, "2a0b:4000::12"),  # a v6 host with no v4 address at all
    Server("cdn", "11.0.0.20", "2a0b:4000::20"),  # shared by cdn-a and cdn-b
    Server("redirect", "11.0.0.30", "2a0b:4000::30"),  # every request: 302 to www
    Server("big", "11.0.0.40", "2a0b:4000::40"),
    Server("udp", "11.0.0.50", "2a0b:4000::50"),
    Server("other", "11.0.0.60", "2a0b:4000::60"),  # a second host, to be left off allowlists
    Server("evil", "11.0.0.66", "2a0b:4000::66"),  # every name under evil.test
    Server("short", "11.0.0.70", "2a0b:4000::70"),  # TTL 1
    Server("svc", "11.0.0.80", "2a0b:4000::80"),  # has an HTTPS (type 65) record
    Server("svc-hint", "11.0.0.81", "2a0b:4000::81"),  # only in svc's address hints
    Server("wild", "11.0.0.90", "2a0b:4000::90"),  # *.wild.boxy.test
)
SERVER_BY_NAME = {s.name: s for s in SERVERS}

# Addresses used only inside DNS answers (rebinding) and recorders.
LAN_HOST = "192.168.1.10"
LAN_RESOLVER = "192.168.1.1"
METADATA_V4, METADATA_V6 = "169.254.169.254", "fd00:ec2::254"
CGNAT_HOST = "100.64.1.1"
QUAD100_V4, QUAD100_V6 = "100.100.100.100", "fd7a:115c:a1e0::53"  # tailscaled's own addresses
ULA_HOST = "fd12::1"
NAT64_LAN = "64:ff9b::c0a8:10a"  # 192.168.1.10 behind the NAT64 well-known prefix
SIXTOFOUR_LAN = "2002:c0a8:10a::1"  # 192.168.1.10 as 6to4
TEREDO_LAN = "2001:0:4136:e378:8000:63bf:3f57:fef5"  # client 192.168.1.10 (bits inverted)
MAPPED_LAN = "::ffff:192.168.1.10"  # unroutable: only ever an answer, never a recorder
SENTINEL_V4 = "192.0.2.99"  # what the recorder resolvers answer: proof they were asked
# the one token the test registry (fakenet/registry.py) takes: a test's --secret value
REGISTRY_TOKEN = "npm_q7Lx2Vd9Rk4Tz1Hc8Wn5Bm3Jf6Gy0Ps2Ue4K"


def _ech_config_list() -> str:
    """A well-formed but made-up ECHConfigList (RFC 9849): boxy must strip it."""
    public_name = b"boxy.test"
    contents = (
        bytes([7])
        + (0x0020).to_bytes(2, "big")  # config_id, KEM X25519
        + (32).to_bytes(2, "big")
        + bytes(range(32))  # public key
        + (4).to_bytes(2, "big")
        + bytes([0, 1, 0, 1])  # HKDF-SHA256, AES-128-GCM
        + bytes([0, len(public_name)])
        + public_name  # max name length, public name
        + (0).to_bytes(2, "big")
    )  # no extensions
    config = (0xFE0D).to_bytes(2, "big") + len(contents).to_bytes(2, "big") + contents
    return base64.b64encode(len(config).to_bytes(2, "big") + config).decode()


ECH_B64 = _ech_config_list()


def _addr_records(server: Server, ttl: int = DEFAULT_TTL) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    if server.v4:
        out.append(("A", ttl, server.v4))
    if server.v6:
        out.append(("AAAA", ttl, server.v6))
    return out


def _txt_rdata() -> str:
    return " ".join(f'"{i:03d}' + "x" * (TXT_STRING_LEN - 3) + '"' for i in range(TXT_STRINGS))


_S = SERVER_BY_NAME

# Owner name relative to ZONE ("@" is the apex) -> [(type, ttl, rdata text)].
RECORDS: dict[str, list[tuple[str, int, str]]] = {
    "@": [
        ("SOA", 300, "ns.boxy.test. hostmaster.boxy.test. 1 300 60 600 5"),
        ("NS", 300, "ns.boxy.test."),
    ],
    "ns": [("A", 300, RESOLVER_V4), ("AAAA", 300, RESOLVER_V6)],
    "www": _addr_records(_S["www"]),
    "v4only": _addr_records(_S["v4only"]),
    "aaaaonly": _addr_records(_S["aaaaonly"]),
    "cname": [("CNAME", DEFAULT_TTL, "cname2.boxy.test.")],
    "cname2": [("CNAME", DEFAULT_TTL, "www.boxy.test.")],
    "loop": [("CNAME", DEFAULT_TTL, "loop2.boxy.test.")],
    "loop2": [("CNAME", DEFAULT_TTL, "loop.boxy.test.")],
    "cdn-a": _addr_records(_S["cdn"]),
    "cdn-b": _addr_records(_S["cdn"]),
    "redirect": _addr_records(_S["redirect"]),
    "big": _addr_records(_S["big"]),
    "udp": _addr_records(_S["udp"]),
    "other": _addr_records(_S["other"]),
    "short": _addr_records(_S["short"], SHORT_TTL),
    "svc": [
        *_addr_records(_S["svc"]),
        (
            "HTTPS",
            DEFAULT_TTL,
            f'1 . alpn="http/1.1" ech="{ECH_B64}" ipv4hint="{_S["svc-hint"].v4}" '
            f'ipv6hint="{_S["svc-hint"].v6}"',
        ),
    ],
    "svc-rebind": [
        *_addr_records(_S["svc"]),
        ("HTTPS", DEFAULT_TTL, f'1 . alpn="http/1.1" ipv4hint="{LAN_HOST}" ipv6hint="{ULA_HOST}"'),
    ],
    "txt": [("TXT", DEFAULT_TTL, _txt_rdata())],
    "*.wild": _addr_records(_S["wild"]),
    # Rebinding: allowed names whose answers point somewhere a sandbox must not go.
    "rebind-lan": [("A", DEFAULT_TTL, LAN_HOST)],
    "rebind-lo": [("A", DEFAULT_TTL, "127.0.0.1"), ("AAAA", DEFAULT_TTL, "::1")],
    "rebind-meta": [("A", DEFAULT_TTL, METADATA_V4), ("AAAA", DEFAULT_TTL, METADATA_V6)],
    "rebind-mixed": [
        ("A", DEFAULT_TTL, _S["www"].v4 or ""),
        ("A", DEFAULT_TTL, LAN_HOST),
        ("AAAA", DEFAULT_TTL, _S["www"].v6 or ""),
        ("AAAA", DEFAULT_TTL, ULA_HOST),
    ],
    "rebind-cgnat": [("A", DEFAULT_TTL, CGNAT_HOST)],
    "rebind-ula": [("AAAA", DEFAULT_TTL, ULA_HOST)],
    "rebind-nat64": [("AAAA", DEFAULT_TTL, NAT64_LAN)],
    "rebind-6to4": [("AAAA", DEFAULT_TTL, SIXTOFOUR_LAN)],
    "rebind-teredo": [("AAAA", DEFAULT_TTL, TEREDO_LAN)],
    "rebind-mapped": [("AAAA", DEFAULT_TTL, MAPPED_LAN)],
    "rebind-cname": [("CNAME", DEFAULT_TTL, "rebind-lan.boxy.test.")],
}

# Certificates the test CA issues: label -> DNS names. SNI picks the certificate, so
# the shared CDN address presents cdn-a's or cdn-b's depending on the name asked for.
_CDN_NAMES = ("cdn-a", "cdn-b")
CERTS: dict[str, tuple[str, ...]] = {
    "main": (
        *(f"{n}.{ZONE[:-1]}" for n in RECORDS if n != "@" and n not in _CDN_NAMES),
        "boxy.test",
        "evil.test",
        "*.evil.test",
    ),
    "cdn-a": ("cdn-a.boxy.test",),
    "cdn-b": ("cdn-b.boxy.test",),
}
# The main certificate also names every public address, for TLS by IP literal.
CERT_IPS: tuple[str, ...] = tuple(a for s in SERVERS for a in s.addrs)


@dataclass(frozen=True)
class Recorder:
    """A host that must never be reached. Every packet to it is counted by nftables;
    its listeners also log each connection and datagram."""

    name: str
    where: str  # "net" (the fake internet) or "host" (the netns boxyd runs in)
    addrs: tuple[str, ...]
    tcp: tuple[int, ...]
    udp: tuple[int, ...] = ()
    dns: bool = False  # answers DNS on port 53 with SENTINEL_V4, so a probe sees who answered

    @property
    def counter(self) -> str:
        return "rec_" + self.name


# What a port scan of a LAN host would find open; every fake-internet recorder has them.
_TCP = (22, 53, 80, 443, 445, 8080)
_UDP = (53, 123, 443, 9999)
RECORDERS: tuple[Recorder, ...] = (
    Recorder("lan", "net", (LAN_HOST,), _TCP, _UDP),
    Recorder("lan_resolver", "net", (LAN_RESOLVER,), _TCP, _UDP, dns=True),
    Recorder("public_resolver", "net", ("8.8.8.8", "2001:4860:4860::8888"), _TCP, _UDP, dns=True),
    Recorder("router", "net", (ROUTER_V4, ROUTER_V6), _TCP, _UDP, dns=True),
    Recorder("metadata", "net", (METADATA_V4, METADATA_V6), _TCP, _UDP),
    Recorder("cgnat", "net", (CGNAT_HOST,), _TCP, _UDP),
    Recorder("tailnet", "net", ("100.101.102.103", "fd7a:115c:a1e0::1"), _TCP, _UDP),
    # Tailscale's own services (MagicDNS, web client, peer API): never the sandbox's.
    Recorder("quad100", "net", (QUAD100_V4, QUAD100_V6), _TCP, _UDP),
    Recorder("ula", "net", (ULA_HOST,), _TCP, _UDP),
    Recorder("nat64", "net", (NAT64_LAN,), _TCP, _UDP),
    Recorder("sixtofour", "net", (SIXTOFOUR_LAN,), _TCP, _UDP),
    Recorder("teredo", "net", (TEREDO_LAN,), _TCP, _UDP),
    Recorder(
        "doc", "net", ("192.0.2.10", "198.51.100.10", "203.0.113.10", "2001:db8::10"), _TCP, _UDP
    ),
    Recorder("bench", "net", ("198.18.0.10",), _TCP, _UDP),
    # In the host netns: its loopback services and its own interface address.
    Recorder("host_loopback", "host", ("127.0.0.1", "::1"), (22, 80, 631, 8080), (9999,)),
    Recorder("host_resolver", "host", ("127.0.0.53",), (53,), (53,), dns=True),
    Recorder("host_ifaddr", "host", (HOST_V4, HOST_V6), (22, 80, 8080), (9999,)),
)
RECORDER_BY_NAME = {r.name: r for r in RECORDERS}

# Special-purpose ranges counted in the fake internet: any packet from the host into
# one of them is an escape (boxy's own upstream dials come from the host netns).
RANGES: tuple[str, ...] = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "3fff::/20",
    "5f00::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
)


def range_counter(cidr: str) -> str:
    """The nftables counter name for a range in RANGES."""
    return "range_" + re.sub(r"[^0-9a-zA-Z]", "_", cidr)


def fqdn(label: str) -> str:
    """'www' -> 'www.boxy.test' (no trailing dot, as tools take it)."""
    return f"{label}.{ZONE[:-1]}"
