"""docs/design.md, steps 2 and 3: the gateway netns, then the payload netns joined to it by a veth.

Both run in the outer stage 2 after step 1 (the user namespace), which gave it every
capability over that namespace; PID 1 drops them all in step 7, and the outer stage 2
never runs payload code. Links, addresses, routes and rules go through rtnetlink in
this process (an exec'd `ip` would have no capability), nftables through libnftables.

The listener sockets are created in the gateway netns and stay bound to it wherever
their fds travel: step 4 sends them to boxyd, in the host netns, which accepts from them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from boxy.errors import SetupError
from boxyd.kernel.sys import CLONE_NEWNET, check, libc, read_small, write_small
from boxyd.net import nflog, nftset, pcap, sockdiag, udpsock
from boxyd.net import ruleset as rs
from boxyd.net.rtnl import Rtnl
from boxyd.stage2 import nft, protocol

libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]

IFA_F_NODAD = 0x02
LOOPBACK_IFINDEX = 1  # lo is always the first device of a network namespace
ROUTE_TABLE = 100  # TPROXY'd packets (fwmark) are delivered locally through this table
BACKLOG = 4096  # capped by net.core.somaxconn of the gateway netns
# The veth carries nothing but the payload's traffic to the gateway, which ends every
# TCP flow there, so its MTU never reaches a real link: at loopback's size, a bulk
# flow takes ~40x fewer packets through both TCP stacks and the ruleset than at
# 1500 (bulk relayed 0.64-0.69x -> 0.77-0.80x direct, bench/net.py; docs/design.md)
VETH_MTU = 65520
LINK_TIMEOUT = 5.0  # seconds for both ends of the veth to come up

GW = "gateway netns"
PAYLOAD = "payload netns"


@dataclass
class Gateway:
    """What step 2 leaves behind: the listeners step 4 hands to boxyd, and what step 3
    needs to reach back into the gateway netns (closed once the veth is configured)."""

    tcp4: socket.socket
    tcp6: socket.socket
    udp4: socket.socket
    udp6: socket.socket
    dns_udp4: socket.socket
    dns_udp6: socket.socket
    dns_tcp4: socket.socket
    dns_tcp6: socket.socket
    udp_reply4: socket.socket
    udp_reply6: socket.socket
    icmp4: socket.socket
    icmp6: socket.socket
    nflog: socket.socket
    nftset: socket.socket
    netns_fd: int
    rtnl: Rtnl | None = field(default=None, repr=False)
    loaded: str | None = field(default=None, repr=False)  # the ruleset in the gateway netns

    LISTENERS: ClassVar[tuple[str, ...]] = rs.GATEWAY_SOCKETS

    def listeners(self) -> dict[str, socket.socket]:
        """In a fixed order, for SCM_RIGHTS."""
        return {name: getattr(self, name) for name in self.LISTENERS}

    def release_netns(self) -> None:
        """Give up the way back into the gateway netns (end of step 3)."""
        self.loaded = None
        if self.rtnl is not None:
            self.rtnl.close()
            self.rtnl = None
        if self.netns_fd >= 0:
            os.close(self.netns_fd)
            self.netns_fd = -1

    def close(self) -> None:
        """Once step 4 has sent the listeners: stage 2 must not keep them (nor fork PID 1
        with them)."""
        self.release_netns()
        for sock in self.listeners().values():
            sock.close()


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """Turn a kernel refusal into SetupError naming the step."""
    try:
        yield
    except OSError as e:
        raise SetupError(f"{what}: {e.strerror or e}") from None


def _sysctl(name: str, value: int, where: str) -> None:
    """Write a net sysctl of the current network namespace and read it back."""
    path = "/proc/sys/net/" + name
    with _step(f"{where}: sysctl {name}={value}"):
        write_small(path, str(value))
        now = read_small(path).strip()
    if now != str(value):
        raise SetupError(f"{where}: sysctl {name} is {now} after writing {value}")


def _unshare_net(where: str) -> None:
    """Needs CAP_SYS_ADMIN over the user namespace of step 1."""
    check(libc.unshare(CLONE_NEWNET), f"{where}: unshare(CLONE_NEWNET)")


def _rtnl(where: str) -> Rtnl:
    """A route netlink socket bound to the current network namespace for its whole life.
    No multicast groups: nothing but our own replies is queued on it."""
    with _step(f"{where}: netlink socket"):
        return Rtnl()


def _listener(family: socket.AddressFamily, kind: int, port: int) -> socket.socket:
    """A transparent socket on the wildcard address: TPROXY finds it by the packet's
    own destination, which getsockname() (TCP) or IP_ORIGDSTADDR (UDP) then reports.
    IP_TRANSPARENT needs CAP_NET_ADMIN over the gateway netns."""
    v6 = family == socket.AF_INET6
    proto = "tcp" if kind == socket.SOCK_STREAM else "udp"
    with _step(f"{GW}: {proto}{6 if v6 else 4} listener on port {port}"):
        if kind == socket.SOCK_STREAM:
            return udpsock.make_transparent_tcp_listener(family, port, backlog=BACKLOG)
        return udpsock.make_transparent_udp(family, port)


def _reply_sender(family: socket.AddressFamily) -> socket.socket:
    """A send-only raw UDP socket: replies to relayed UDP must come from the original
    destination's address AND port, which IP_PKTINFO cannot set. Needs CAP_NET_RAW
    over the gateway netns (dropped in step 7); the fd needs none to send."""
    with _step(f"{GW}: udp{6 if family == socket.AF_INET6 else 4} reply sender"):
        return udpsock.make_udp_reply_sender(family)


def _gateway_settings(ipr: Rtnl) -> None:
    """Step 2's loopback and sysctls in the gateway netns (CAP_NET_ADMIN over it)."""
    with _step(f"{GW}: bring up lo"):
        ipr.link_up(LOOPBACK_IFINDEX)
    # A new netns copies ip_forward from the host's (docker hosts: 1): set, not assume.
    _sysctl("ipv4/ip_forward", 0, GW)
    _sysctl("ipv6/conf/all/forwarding", 0, GW)
    # Every refusal is an ICMP error the client must see at once; the per-peer
    # rate limit would turn a burst of them into silent drops (a client waiting
    # out its timeout). The host-wide icmp_msgs_per_sec still bounds a flood.
    _sysctl("ipv4/icmp_ratelimit", 0, GW)
    _sysctl("ipv6/icmp/ratelimit", 0, GW)
    # gw0 is born here in step 3 and takes these defaults: no DAD, no RA.
    _sysctl("ipv6/conf/default/accept_dad", 0, GW)
    _sysctl("ipv6/conf/default/accept_ra", 0, GW)


def _gateway_sockets(
    undo: contextlib.ExitStack, tcp_port: int, udp_port: int, dns_port: int
) -> dict[str, socket.socket]:
    """Step 2's sockets, for boxyd (each closed by UNDO if a later one fails): the
    transparent listeners, the UDP reply and ICMP senders, nflog and the set socket."""
    socks: dict[str, socket.socket] = {}
    for name, kind, port in (
        ("tcp", socket.SOCK_STREAM, tcp_port),
        ("udp", socket.SOCK_DGRAM, udp_port),
        ("dns_udp", socket.SOCK_DGRAM, dns_port),
        ("dns_tcp", socket.SOCK_STREAM, dns_port),
    ):
        for family, v in ((socket.AF_INET, "4"), (socket.AF_INET6, "6")):
            socks[name + v] = undo.enter_context(_listener(family, kind, port))
    socks["udp_reply4"] = undo.enter_context(_reply_sender(socket.AF_INET))
    socks["udp_reply6"] = undo.enter_context(_reply_sender(socket.AF_INET6))
    for family, v in ((socket.AF_INET, "4"), (socket.AF_INET6, "6")):
        # boxyd's "port unreachable" for UDP it refuses (CAP_NET_RAW, dropped in step 7)
        with _step(f"{GW}: icmp{v} sender"):
            socks["icmp" + v] = undo.enter_context(udpsock.make_icmp_sender(family))
    with _step(f"{GW}: nflog group {rs.NFLOG_GROUP} (the ruleset's refusals, for boxyd)"):
        socks["nflog"] = undo.enter_context(nflog.open_socket(rs.NFLOG_GROUP, rs.NFLOG_SNAPLEN))
    with _step(f"{GW}: netlink socket for the bound-address sets (for boxyd)"):
        socks["nftset"] = undo.enter_context(nftset.open_socket())
    return socks


def enter_gateway_netns(
    ruleset: str | None,
    *,
    tcp_port: int = rs.TCP_PORT,
    udp_port: int = rs.UDP_PORT,
    dns_port: int = rs.DNS_PORT,
    mark: int = rs.MARK,
) -> Gateway:
    """Step 2. Needs CAP_SYS_ADMIN (unshare) and CAP_NET_ADMIN (nftables, routing,
    sysctls, IP_TRANSPARENT) over step 1's user namespace; step 7 drops them.

    The ports and mark must be those ``ruleset`` was built with (else TPROXY finds no
    listener and the traffic is dropped: closed, not open). RULESET None: a network
    prepared ahead, whose ruleset comes with the plan (apply_ruleset), before the
    payload netns holds anything that could send; or, for a network prepared ahead,
    the last networked run's, which the plan's must then be (apply_ruleset).
    """
    _unshare_net(GW)
    with contextlib.ExitStack() as undo:  # on any failure, close what was opened
        with _step(f"{GW}: open /proc/self/ns/net"):
            netns_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        undo.callback(os.close, netns_fd)
        ipr = _rtnl(GW)
        undo.callback(ipr.close)
        _gateway_settings(ipr)
        if ruleset is not None:
            nft.apply_apart(ruleset)
        for family in (socket.AF_INET, socket.AF_INET6):
            with _step(f"{GW}: policy routing (fwmark {mark} -> table {ROUTE_TABLE})"):
                ipr.local_default_route(family, ROUTE_TABLE, LOOPBACK_IFINDEX)
                ipr.fwmark_rule(family, mark, ROUTE_TABLE)
        socks = _gateway_sockets(undo, tcp_port, udp_port, dns_port)
        gw = Gateway(**socks, netns_fd=netns_fd, rtnl=ipr, loaded=ruleset)
        undo.pop_all()  # success: the Gateway owns all of it now
    return gw


def _link_index(ipr: Rtnl, name: str, where: str) -> int:
    with _step(f"{where}: find {name} after creating the veth"):
        return ipr.link_index(name)


def _address(ipr: Rtnl, index: int, addr: str, prefixlen: int, where: str, flags: int = 0) -> None:
    with _step(f"{where}: address {addr}/{prefixlen}"):
        ipr.address(index, addr, prefixlen, flags)


def _wait_ready(links: list[tuple[Rtnl, int, str]]) -> None:
    """Carrier and addrconf follow the link state asynchronously (linkwatch): poll,
    starting at 100 µs, backing off to 10 ms."""
    deadline = time.monotonic() + LINK_TIMEOUT
    delay = 0.0001
    pending = list(links)
    while pending:
        with _step(f"{PAYLOAD}: wait for the veth"):
            pending = [(ipr, i, n) for ipr, i, n in pending if not ipr.ready(i)]
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(n for _, _, n in pending)
            raise SetupError(f"{PAYLOAD}: {names} not up after {LINK_TIMEOUT:.0f} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def enter_payload_netns(gw: Gateway, *, keep_gateway: bool = False) -> None:
    """Step 3. Needs CAP_SYS_ADMIN (unshare) and CAP_NET_ADMIN over both network
    namespaces (a veth end moved into the gateway netns, addresses, routes); step 7
    drops them. On return this process is in the payload netns and no longer holds
    anything that reaches the gateway netns but the listeners (with KEEP_GATEWAY, and
    the way back into it until apply_ruleset)."""
    if gw.rtnl is None or gw.netns_fd < 0:
        raise SetupError(f"{PAYLOAD}: the gateway netns was already released")
    _unshare_net(PAYLOAD)
    ipr = _rtnl(PAYLOAD)
    try:
        with _step(f"{PAYLOAD}: bring up lo"):
            ipr.link_up(LOOPBACK_IFINDEX)
        with _step(f"{PAYLOAD}: create veth {rs.PAYLOAD_IF} <-> {rs.GATEWAY_IF}"):
            ipr.veth(rs.PAYLOAD_IF, rs.GATEWAY_IF, gw.netns_fd, VETH_MTU)
        eth0 = _link_index(ipr, rs.PAYLOAD_IF, PAYLOAD)
        # Before the link is up: no router advertisement may configure it, no DAD delay.
        _sysctl(f"ipv6/conf/{rs.PAYLOAD_IF}/accept_ra", 0, PAYLOAD)
        _sysctl(f"ipv6/conf/{rs.PAYLOAD_IF}/accept_dad", 0, PAYLOAD)
        _address(ipr, eth0, rs.SANDBOX_V4, 24, PAYLOAD)
        _address(ipr, eth0, rs.SANDBOX_V6, 64, PAYLOAD, IFA_F_NODAD)
        with _step(f"{PAYLOAD}: bring up {rs.PAYLOAD_IF}"):
            ipr.link_up(eth0)

        gw0 = _link_index(gw.rtnl, rs.GATEWAY_IF, GW)
        _address(gw.rtnl, gw0, rs.GATEWAY_V4, 24, GW)
        _address(gw.rtnl, gw0, rs.GATEWAY_V6, 64, GW, IFA_F_NODAD)
        with _step(f"{GW}: bring up {rs.GATEWAY_IF}"):
            gw.rtnl.link_up(gw0)

        for via in (rs.GATEWAY_V4, rs.GATEWAY_V6):
            with _step(f"{PAYLOAD}: default route via {via}"):
                ipr.default_route(via, eth0)
        _wait_ready([(ipr, eth0, rs.PAYLOAD_IF), (gw.rtnl, gw0, rs.GATEWAY_IF)])
    finally:
        ipr.close()
    if not keep_gateway:
        gw.release_netns()


def apply_ruleset(gw: Gateway, ruleset: str) -> None:
    """Step 2's ruleset, for a network made ahead of the plan: into the gateway netns,
    load it, and back into the payload netns; then the way back is given up as at the
    end of step 3. A ruleset loaded ahead (the last run's) must be this very text,
    and is not loaded again: loading another over it would merge into its sets (and
    replacing the table waits out RCU grace periods: 7-30 ms). Needs CAP_SYS_ADMIN
    (setns) and CAP_NET_ADMIN over both (step 7 drops them)."""
    if gw.netns_fd < 0:
        raise SetupError(f"{GW}: the gateway netns was already released")
    if gw.loaded is not None:  # loading over it would add to its sets: never
        same, gw.loaded = gw.loaded == ruleset, None
        if not same:
            raise SetupError(f"{GW}: the ruleset loaded ahead is not the plan's")
        gw.release_netns()
        return
    with _step(f"{PAYLOAD}: open /proc/self/ns/net"):
        back = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        check(libc.setns(gw.netns_fd, CLONE_NEWNET), f"{GW}: setns")
        try:
            nft.apply_apart(ruleset)
        finally:  # a refused ruleset ends the run; it must not end it in the wrong netns
            check(libc.setns(back, CLONE_NEWNET), f"{PAYLOAD}: setns back")
    finally:
        os.close(back)
    gw.release_netns()


def open_capture_socket() -> socket.socket:
    """--pcap, end of step 3: an AF_PACKET socket on eth0 for boxyd's capture. Needs
    CAP_NET_RAW over the payload netns (dropped in step 7); sent in step 4 and never
    kept by stage 2 or PID 1."""
    with _step(f"{PAYLOAD}: packet capture on {rs.PAYLOAD_IF}"):
        return pcap.open_socket(rs.PAYLOAD_IF)


def open_sockdiag_socket() -> socket.socket:
    """End of step 3: a NETLINK_SOCK_DIAG socket in the payload netns, through which
    boxyd finds the payload's socket that sent a flow it asks about (--ask names the
    program: boxyd/net/sockdiag.py). Needs nothing; sent in step 4, kept by nobody here."""
    with _step(f"{PAYLOAD}: sock_diag socket (for boxyd)"):
        return sockdiag.open_socket()


def send_listeners(
    ctl: socket.socket, gw: Gateway, extra: dict[str, socket.socket] | None = None
) -> None:
    """Step 4. Needs nothing. One message, Listeners(names) (boxyd/stage2/protocol.py), carrying the
    gateway's sockets (and EXTRA's, e.g. the capture socket) in that order (boxyd
    receives with MSG_CMSG_CLOEXEC), then stage 2 closes its copies: neither it nor
    PID 1, which it forks next, keeps one."""
    socks = {**gw.listeners(), **(extra or {})}
    names = list(socks)
    try:
        with _step("send the gateway's listeners to boxyd"):
            protocol.send(ctl, protocol.Listeners(tuple(names)), [socks[n].fileno() for n in names])
    finally:
        gw.close()
        for sock in (extra or {}).values():
            sock.close()
