"""Listeners on the hosts a sandbox must never reach: they log what got there.

nftables counters (set up by the topology) are the authoritative "did any packet
arrive"; these listeners add the connection-level record: a TCP connect that
completed, the first bytes sent, a UDP datagram. A recorder marked `dns` also
answers DNS with a sentinel (plan.SENTINEL_V4), so the probe itself can tell that
it talked to the wrong resolver.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from .dns import Server as DnsServer
from .events import LineLog, Peer, peer_text

FIRST_BYTES_WAIT = 1.0  # seconds to wait for a client's first bytes before closing


@dataclass(frozen=True)
class Spot:
    """One listening address of a recorder."""

    recorder: str
    addr: str
    port: int


def on_tcp(
    conn: socket.socket, peer: Peer, spot: Spot, log: LineLog, dns: DnsServer | None
) -> None:
    log.event(
        kind="tcp", recorder=spot.recorder, addr=spot.addr, port=spot.port, peer=peer_text(peer)
    )
    if dns is not None and spot.port == 53:
        dns.on_stream(conn, peer)
        return
    with conn:
        conn.settimeout(FIRST_BYTES_WAIT)
        try:
            first = conn.recv(256)
        except OSError:
            return
        if first:
            log.event(
                kind="tcp-data",
                recorder=spot.recorder,
                addr=spot.addr,
                port=spot.port,
                peer=peer_text(peer),
                first=first.hex(),
            )


def on_udp(
    sock: socket.socket, data: bytes, peer: Peer, spot: Spot, log: LineLog, dns: DnsServer | None
) -> None:
    log.event(
        kind="udp",
        recorder=spot.recorder,
        addr=spot.addr,
        port=spot.port,
        peer=peer_text(peer),
        size=len(data),
        first=data[:64].hex(),
    )
    if dns is not None and spot.port == 53:
        dns.on_datagram(sock, data, peer)
