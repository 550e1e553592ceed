"""The few rtnetlink requests boxy makes, written out by hand: stage 2's (steps 2
and 3) and boxyd's list of this machine's own addresses.

What `ip link/addr/route/rule` would do, in-process (an exec'd `ip` has no
capability under the identity uid map). pyroute2 does the same through an asyncio
loop per request, which cost ~30 ms of every network run; these are a send and a
recv each (the doctor's veth probe uses them too). The socket is bound to the network namespace it was opened in for its
whole life, so one opened in the gateway netns keeps configuring it from the
payload netns. Every kernel refusal is an OSError with its errno.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct

from boxyd.net import netlink
from boxyd.net.netlink import NLM_F_ACK, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attr, attrs

RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE = 24
RTM_NEWRULE = 32
NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x200, 0x400, 0x300

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 4, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
IFA_F_NODAD, IFA_F_TENTATIVE = 0x02, 0x40
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
RTN_UNICAST, RTN_LOCAL = 1, 2
RT_SCOPE_UNIVERSE, RT_SCOPE_HOST = 0, 254
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3
FR_ACT_TO_TBL = 1
FRA_FWMARK, FRA_TABLE = 10, 15

_IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RULE = struct.Struct(
    "=BBBBBBBBI"
)  # family, dst_len, src_len, tos, table, res1, res2, action, flags


def _family(addr: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET


class Rtnl:
    def __init__(self) -> None:
        self.sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        )
        self.sock.bind((0, 0))  # no multicast groups: only our own replies are queued
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    # -- the exchange -----------------------------------------------------------------
    def _request(self, kind: int, body: bytes, flags: int = 0) -> list[tuple[int, bytes]]:
        """Send one request; its replies (type, payload) until the ack or the dump's end."""
        self._seq += 1
        seq = self._seq
        self.sock.send(netlink.message(kind, NLM_F_REQUEST | flags, seq, body))
        replies: list[tuple[int, bytes]] = []
        while True:
            try:
                for mtype, mseq, payload in netlink.messages(self.sock.recv(1 << 16)):
                    if mseq != seq:
                        continue
                    if mtype == NLMSG_ERROR:
                        err = netlink.error(payload)
                        if err:
                            raise OSError(err, os.strerror(err))
                        return replies
                    if mtype == NLMSG_DONE:
                        return replies
                    replies.append((mtype, payload))
                    if not flags & NLM_F_DUMP and not flags & NLM_F_ACK:
                        return replies
            except ValueError as e:
                raise OSError(f"rtnetlink: {e}") from None

    def _change(self, kind: int, body: bytes, create: bool = False) -> None:
        self._request(kind, body, NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if create else 0))

    # -- links --------------------------------------------------------------------------
    def link_up(self, index: int) -> None:
        self._change(RTM_NEWLINK, _IFINFO.pack(0, 0, index, IFF_UP, IFF_UP))

    def veth(
        self, name: str, peer: str, peer_netns_fd: int | None = None, mtu: int | None = None
    ) -> None:
        """`ip link add NAME [mtu MTU] type veth peer PEER [netns FD] [mtu MTU]`."""
        both = attr(IFLA_MTU, struct.pack("=I", mtu)) if mtu is not None else b""
        peer_info = _IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_IFNAME, peer.encode() + b"\0") + both
        if peer_netns_fd is not None:
            peer_info += attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
        info = attr(IFLA_INFO_KIND, b"veth") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_info))
        self._change(
            RTM_NEWLINK,
            _IFINFO.pack(0, 0, 0, 0, 0)
            + attr(IFLA_IFNAME, name.encode() + b"\0")
            + both
            + attr(IFLA_LINKINFO, info),
            create=True,
        )

    def _link(self, index: int = 0, name: str | None = None) -> tuple[int, int]:
        body = _IFINFO.pack(0, 0, index, 0, 0)
        if name is not None:
            body += attr(IFLA_IFNAME, name.encode() + b"\0")
        for mtype, payload in self._request(RTM_GETLINK, body):
            if mtype == RTM_NEWLINK:
                _, _, idx, flags, _ = _IFINFO.unpack_from(payload)
                return idx, flags
        raise OSError(f"rtnetlink: no link {name or index}")

    def link_index(self, name: str) -> int:
        return self._link(name=name)[0]

    def ready(self, index: int) -> bool:
        """Carrier on, and no IPv6 address still tentative (not usable yet)."""
        if not self._link(index)[1] & IFF_LOWER_UP:
            return False
        for mtype, payload in self._request(
            RTM_GETADDR, _IFADDR.pack(socket.AF_INET6, 0, 0, 0, 0), NLM_F_DUMP
        ):
            if mtype != RTM_NEWADDR:
                continue
            _, _, flags, _, idx = _IFADDR.unpack_from(payload)
            extra = attrs(payload[_IFADDR.size :]).get(IFA_FLAGS)
            if extra is not None:
                flags = struct.unpack("=I", extra)[0]
            if idx == index and flags & IFA_F_TENTATIVE:
                return False
        return True

    def local_addresses(self) -> set[str]:
        """Every address on an interface of this network namespace (`ip addr`)."""
        out: set[str] = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            for mtype, payload in self._request(
                RTM_GETADDR, _IFADDR.pack(family, 0, 0, 0, 0), NLM_F_DUMP
            ):
                if mtype != RTM_NEWADDR:
                    continue
                found = attrs(payload[_IFADDR.size :])
                for kind in (IFA_LOCAL, IFA_ADDRESS):
                    if kind in found:
                        out.add(str(ipaddress.ip_address(found[kind])))
        return out

    # -- addresses, routes, rules ------------------------------------------------------
    def address(self, index: int, addr: str, prefixlen: int, flags: int = 0) -> None:
        family = _family(addr)
        packed = ipaddress.ip_address(addr).packed
        self._change(
            RTM_NEWADDR,
            _IFADDR.pack(family, prefixlen, flags & 0xFF, RT_SCOPE_UNIVERSE, index)
            + attr(IFA_LOCAL, packed)
            + attr(IFA_ADDRESS, packed)
            + attr(IFA_FLAGS, struct.pack("=I", flags)),
            create=True,
        )

    def default_route(self, gateway: str, oif: int) -> None:
        """`ip route add default via GATEWAY dev OIF`."""
        family = _family(gateway)
        self._change(
            RTM_NEWROUTE,
            _RTMSG.pack(
                family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0
            )
            + attr(RTA_GATEWAY, ipaddress.ip_address(gateway).packed)
            + attr(RTA_OIF, struct.pack("=I", oif)),
            create=True,
        )

    def local_default_route(self, family: int, table: int, oif: int) -> None:
        """`ip route add local default dev OIF table TABLE` (TPROXY delivery)."""
        self._change(
            RTM_NEWROUTE,
            _RTMSG.pack(family, 0, 0, 0, 0, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, 0)
            + attr(RTA_TABLE, struct.pack("=I", table))
            + attr(RTA_OIF, struct.pack("=I", oif)),
            create=True,
        )

    def fwmark_rule(self, family: int, mark: int, table: int) -> None:
        """`ip rule add fwmark MARK lookup TABLE`."""
        self._change(
            RTM_NEWRULE,
            _RULE.pack(family, 0, 0, 0, 0, 0, 0, FR_ACT_TO_TBL, 0)
            + attr(FRA_FWMARK, struct.pack("=I", mark))
            + attr(FRA_TABLE, struct.pack("=I", table)),
            create=True,
        )


RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x10, 0x100
_ADDRESS = (ipaddress.IPv4Address, ipaddress.IPv6Address)


class LocalAddresses:
    """This machine's own addresses, for boxyd in the host netns: a flow the gateway
    would dial to one of them reaches the host's own services (a dev server bound
    to 0.0.0.0 answers on a public address too), so it is refused like loopback.

    Addresses come and go (DHCP, VPNs). A netlink socket subscribed to address
    changes is checked before every answer: the kernel queues the notification when
    the address changes, so an address added before a flow is always seen (a
    time-based refresh would leave a window open). Re-read only after a change."""

    def __init__(self) -> None:
        self._addrs: frozenset[str] | None = None
        self._monitor: socket.socket | None = None
        self._pending = select.poll()  # the monitor's: is a notification queued?

    def _changed(self) -> bool:
        if self._monitor is None:
            self._monitor = socket.socket(
                socket.AF_NETLINK,
                socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
                socket.NETLINK_ROUTE,
            )
            self._monitor.bind((0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
            self._pending.register(self._monitor, select.POLLIN)
            return True
        # Asked before every flow the gateway dials: one poll, where a recv would
        # allocate its buffer and raise EAGAIN nearly every time (bench/net.py)
        if not self._pending.poll(0):
            return False
        changed = False
        while True:
            try:
                changed |= bool(self._monitor.recv(1 << 16))
            except BlockingIOError:
                return changed
            except OSError:  # ENOBUFS: notifications were lost, so re-read
                changed = True

    def __contains__(self, ip: object) -> bool:
        addr = ip if isinstance(ip, _ADDRESS) else ipaddress.ip_address(str(ip))
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if self._changed() or self._addrs is None:
            rtnl = Rtnl()
            try:
                self._addrs = frozenset(rtnl.local_addresses())
            finally:
                rtnl.close()
        return str(addr) in self._addrs
