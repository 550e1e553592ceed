"""The NFLOG parser: what the ruleset refused, read from headers the sandbox wrote."""

from __future__ import annotations

import ipaddress
import socket
import struct

import pytest

from boxyd.net import nflog
from boxyd.net.netlink import NLMSG_ERROR


def message(packet: bytes, family: int = socket.AF_INET) -> bytes:
    attr = struct.pack("=HH", 4 + len(packet), nflog.NFULA_PAYLOAD) + packet
    attr += b"\0" * (-len(attr) % 4)
    body = struct.pack("=BBH", family, 0, socket.htons(1)) + attr
    kind = (nflog.NFNL_SUBSYS_ULOG << 8) | nflog.NFULNL_MSG_PACKET
    msg = struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body
    return msg + b"\0" * (-len(msg) % 4)


def ipv4(dst: str, proto: int, l4: bytes, frag: int = 0) -> bytes:
    return (
        struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + len(l4),
            0,
            frag,
            64,
            proto,
            0,
            ipaddress.IPv4Address("10.0.2.15").packed,
            ipaddress.IPv4Address(dst).packed,
        )
        + l4
    )


def ipv6(dst: str, proto: int, l4: bytes) -> bytes:
    return (
        struct.pack(
            "!IHBB16s16s",
            6 << 28,
            len(l4),
            proto,
            64,
            ipaddress.IPv6Address("fd00::15").packed,
            ipaddress.IPv6Address(dst).packed,
        )
        + l4
    )


PORTS = struct.pack("!HH", 40000, 80) + b"\0" * 16


def test_tcp_v4_and_udp_v6_and_several_per_read() -> None:
    data = message(ipv4("192.168.1.10", 6, PORTS)) + message(
        ipv6("fd12::1", 17, struct.pack("!HH", 5000, 443)), socket.AF_INET6
    )
    assert nflog.parse(data) == [
        nflog.Refused("tcp", "192.168.1.10", 80),
        nflog.Refused("udp", "fd12::1", 443),
    ]


def test_icmp_and_later_fragments_have_no_port() -> None:
    assert nflog.parse(message(ipv4("169.254.169.254", 1, b"\x08\0\0\0"))) == [
        nflog.Refused("icmp", "169.254.169.254", 0)
    ]
    assert nflog.parse(message(ipv4("192.168.1.10", 17, PORTS, frag=185))) == [
        nflog.Refused("udp", "192.168.1.10", 0)
    ]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0" * 15,
        message(b""),
        message(b"\x45" + b"\0" * 10),
        message(b"\x60" * 20),
        message(b"\x99" * 40),
        struct.pack("=IHHII", 9999, 0, 0, 0, 0),  # a length past the end
        struct.pack("=IHHII", 3, 0, 0, 0, 0),  # a length shorter than the header
    ],
)
def test_garbage_is_skipped_not_raised(data: bytes) -> None:
    assert nflog.parse(data) == []


def test_truncated_transport_header_keeps_the_address() -> None:
    assert nflog.parse(message(ipv4("100.64.1.1", 6, b"\x9c"))) == [
        nflog.Refused("tcp", "100.64.1.1", 0)
    ]


def test_the_ack_is_found_behind_flushed_reports() -> None:
    # unbind flushes the queued reports ahead of its ack, often in the same read
    ack = struct.pack("=IHHII", 36, NLMSG_ERROR, 0, 0, 0) + struct.pack("=i", 0) + b"\0" * 16
    data = message(ipv4("192.168.1.10", 6, PORTS)) + ack
    assert nflog._ack(data) == 0
    assert nflog.parse(data) == [nflog.Refused("tcp", "192.168.1.10", 80)]
    eperm = struct.pack("=IHHII", 36, NLMSG_ERROR, 0, 0, 0) + struct.pack("=i", -1) + b"\0" * 16
    assert nflog._ack(eperm) == 1
    assert nflog._ack(message(ipv4("192.168.1.10", 6, PORTS))) is None
