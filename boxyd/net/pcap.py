"""--pcap: every frame on the sandbox's link, in the classic pcap format.

Stage 2 opens an AF_PACKET socket on the payload netns's eth0 (CAP_NET_RAW there,
before step 7 drops it) and hands it to boxyd; the payload never holds it. Being
below the sandbox's stack, it holds what no other capture can: the ARP and
neighbour exchange, DNS to boxy's resolver, and the SYNs the ruleset refused.
Frames are never truncated (tools cannot tell a snapped payload from a lost one);
the capture stops, with a note, at --pcap-max. The file is opened before the run
starts, so a capture that was asked for and cannot be written fails the run.
"""

from __future__ import annotations

import os
import socket
import struct
import time

LINKTYPE_ETHERNET = 1
SNAPLEN = 262144  # a GSO super-frame on a veth is at most 64 KiB; room to spare
_GLOBAL = struct.Struct("=IHHiIII")
_RECORD = struct.Struct("=IIII")
ETH_P_ALL = 0x0003


def write_header(fd: int) -> None:
    """The global header, into the capture file boxyd opened before the run (hostfile.py)."""
    os.write(fd, _GLOBAL.pack(0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET))


def open_socket(ifname: str) -> socket.socket:
    """Every frame in and out of IFNAME. Needs CAP_NET_RAW over its network namespace."""
    sock = socket.socket(
        socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.htons(ETH_P_ALL)
    )
    try:
        sock.bind((ifname, ETH_P_ALL))
    except BaseException:
        sock.close()
        raise
    return sock


class Writer:
    """Drains the packet socket into the file until the size bound. The fd is the
    session's (hostfile.Outputs), closed with it."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = limit
        self.written = _GLOBAL.size
        self.frames = 0
        self.full = False
        self._buf = bytearray(SNAPLEN)

    def drain(self, sock: socket.socket, budget: int = 64) -> None:
        """Up to BUDGET frames per wake-up, so a flood cannot hold the event loop."""
        for _ in range(budget):
            try:
                n = sock.recv_into(self._buf, SNAPLEN, socket.MSG_TRUNC)
            except (BlockingIOError, InterruptedError):
                return
            if self.full:
                continue  # keep the socket drained; the file has what fitted
            kept = min(n, SNAPLEN)
            if self.written + _RECORD.size + kept > self.limit:
                self.full = True
                continue
            now = time.time()
            record = _RECORD.pack(int(now), int(now % 1 * 1e6), kept, n) + self._buf[:kept]
            os.write(self.fd, record)
            self.written += len(record)
            self.frames += 1
