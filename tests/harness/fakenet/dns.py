"""The fake internet's authoritative DNS server (dnspython), over UDP and TCP.

Authoritative for boxy.test (plan.RECORDS: CNAME chains and loops, rebinding
answers, a shared CDN address, an HTTPS record with `ech` and address hints, a TXT
too big for UDP, a TTL of 1 s, a wildcard) and for everything under evil.test,
which it answers whatever the name: a DNS tunnel would work if a query got here.
Every query received is logged, one line each, so a test can assert that a name
was never asked for. Any other zone gets REFUSED (this is not a recursive
resolver).

Import note: this module is `fakenet.dns`; `import dns.x` below is dnspython.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from . import plan
from .events import LineLog, Peer, peer_text

IN = dns.rdataclass.IN
MAX_CHAIN = 16  # CNAME hops followed before giving up (loops stop earlier)
TCP_IDLE = 10.0  # seconds a DNS-over-TCP connection may sit idle

Node = dict[int, dns.rrset.RRset]


def _rrset(
    name: dns.name.Name, rdtype: str, ttl: int, texts: list[str], origin: dns.name.Name
) -> dns.rrset.RRset:
    rt = dns.rdatatype.from_text(rdtype)
    rrs = dns.rrset.RRset(name, IN, rt)
    for text in texts:
        rrs.add(dns.rdata.from_text(IN, rt, text, origin=origin, relativize=False), ttl)
    return rrs


class Authority:
    """Answers for plan.ZONE and plan.EVIL_ZONE from the records in plan.RECORDS."""

    def __init__(self, records: dict[str, list[tuple[str, int, str]]] | None = None) -> None:
        self.origin = dns.name.from_text(plan.ZONE)
        self.evil = dns.name.from_text(plan.EVIL_ZONE)
        self.nodes: dict[dns.name.Name, Node] = {}
        for owner, recs in (plan.RECORDS if records is None else records).items():
            name = self.origin if owner == "@" else dns.name.from_text(owner, self.origin)
            node = self.nodes.setdefault(name, {})
            for rdtype, ttl, text in recs:
                rt = dns.rdatatype.from_text(rdtype)
                if rt in node:
                    node[rt].add(
                        dns.rdata.from_text(IN, rt, text, origin=self.origin, relativize=False), ttl
                    )
                else:
                    node[rt] = _rrset(name, rdtype, ttl, [text], self.origin)
        self.soa = {
            self.origin: self.nodes[self.origin][dns.rdatatype.SOA],
            self.evil: _rrset(
                self.evil,
                "SOA",
                300,
                ["ns.boxy.test. hostmaster.boxy.test. 1 300 60 600 5"],
                self.evil,
            ),
        }

    def _zone(self, name: dns.name.Name) -> dns.name.Name | None:
        for apex in self.soa:
            if name.is_subdomain(apex):
                return apex
        return None

    def _node(self, name: dns.name.Name) -> Node | None:
        if name.is_subdomain(self.evil):
            evil = plan.SERVER_BY_NAME["evil"]
            return {
                dns.rdatatype.A: _rrset(name, "A", plan.DEFAULT_TTL, [evil.v4 or ""], self.evil),
                dns.rdatatype.AAAA: _rrset(
                    name, "AAAA", plan.DEFAULT_TTL, [evil.v6 or ""], self.evil
                ),
                dns.rdatatype.TXT: _rrset(name, "TXT", plan.DEFAULT_TTL, ['"received"'], self.evil),
            }
        node = self.nodes.get(name)
        if node is not None:
            return node
        # Wildcard: the nearest "*.<ancestor>" inside the zone, with the owner rewritten.
        parent = name.parent() if len(name) > 1 else None
        while parent is not None and parent.is_subdomain(self.origin):
            wild = self.nodes.get(dns.name.from_text("*", parent))
            if wild is not None:
                return {rt: _copy_rrset(rrs, name) for rt, rrs in wild.items()}
            if parent == self.origin:
                break
            parent = parent.parent()
        return None

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        resp = dns.message.make_response(query)
        if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
            resp.set_rcode(
                dns.rcode.NOTIMP if query.opcode() != dns.opcode.QUERY else dns.rcode.FORMERR
            )
            return resp
        q = query.question[0]
        zone = self._zone(q.name)
        if q.rdclass != IN or zone is None:
            resp.set_rcode(dns.rcode.REFUSED)
            return resp
        resp.flags |= dns.flags.AA
        name, seen = q.name, set()
        for _ in range(MAX_CHAIN):
            node = self._node(name)
            if node is None:
                resp.set_rcode(dns.rcode.NXDOMAIN)
                resp.authority.append(self.soa[zone])
                break
            if q.rdtype == dns.rdatatype.ANY:
                resp.answer.extend(node.values())
                break
            if q.rdtype in node:
                resp.answer.append(node[q.rdtype])
                break
            cname = node.get(dns.rdatatype.CNAME)
            if cname is None:
                resp.authority.append(self.soa[zone])  # NODATA
                break
            resp.answer.append(cname)
            seen.add(name)
            name = cname[0].target
            nz = self._zone(name)
            if nz is None or name in seen:  # out of our zones, or a loop: stop here
                break
            zone = nz
        return resp


def _copy_rrset(rrs: dns.rrset.RRset, owner: dns.name.Name) -> dns.rrset.RRset:
    out = dns.rrset.RRset(owner, rrs.rdclass, rrs.rdtype)
    for rd in rrs:
        out.add(rd, rrs.ttl)
    return out


def sentinel_answer(query: dns.message.Message, who: str) -> dns.message.Message:
    """What a recorder resolver says to anything: A plan.SENTINEL_V4 and a TXT naming
    itself, so a probe can tell who answered."""
    resp = dns.message.make_response(query)
    for q in query.question:
        if q.rdtype in (dns.rdatatype.A, dns.rdatatype.ANY):
            resp.answer.append(_rrset(q.name, "A", 60, [plan.SENTINEL_V4], q.name))
        if q.rdtype in (dns.rdatatype.TXT, dns.rdatatype.ANY):
            resp.answer.append(_rrset(q.name, "TXT", 60, [f'"boxyt recorder {who}"'], q.name))
    return resp


def _truncated(query: dns.message.Message) -> bytes:
    resp = dns.message.make_response(query)
    resp.flags |= dns.flags.AA | dns.flags.TC
    return resp.to_wire()


class Server:
    """Parses, logs and answers one DNS message at a time (thread-safe)."""

    def __init__(
        self, log: LineLog, answer: Callable[[dns.message.Message], dns.message.Message], label: str
    ) -> None:
        self.log = log
        self.answer = answer
        self.label = label

    def respond(self, wire: bytes, transport: str, peer: str) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except Exception as e:  # a malformed query is still a query that got here
            self.log.line(
                f"{time.time():.3f}\t{transport}\t?\t?\t{peer}\t{self.label}\t"
                f"malformed:{type(e).__name__}:{wire[:64].hex()}"
            )
            return None
        for q in query.question or (None,):
            qname = q.name.to_text() if q is not None else "?"
            qtype = dns.rdatatype.to_text(q.rdtype) if q is not None else "?"
            self.log.line(f"{time.time():.3f}\t{transport}\t{qname}\t{qtype}\t{peer}\t{self.label}")
        resp = self.answer(query)
        if transport == "tcp":
            return resp.to_wire(max_size=65535)
        limit = max(512, query.payload) if query.edns >= 0 else 512
        try:
            return resp.to_wire(max_size=limit)
        except dns.exception.TooBig:
            return _truncated(query)

    def on_datagram(self, sock: socket.socket, data: bytes, peer: Peer) -> None:
        out = self.respond(data, "udp", peer_text(peer))
        if out is not None:
            sock.sendto(out, peer)

    def on_stream(self, conn: socket.socket, peer: Peer) -> None:
        conn.settimeout(TCP_IDLE)
        with conn:
            while True:
                head = _recv_exact(conn, 2)
                if head is None:
                    return
                body = _recv_exact(conn, struct.unpack("!H", head)[0])
                if body is None:
                    return
                out = self.respond(body, "tcp", peer_text(peer))
                if out is None:
                    return
                conn.sendall(struct.pack("!H", len(out)) + out)


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    try:
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
    except OSError:
        return None
    return bytes(buf)


def parse_query_log(text: str) -> list[dict[str, str | float]]:
    """The query log's lines as dicts: t, transport, qname, qtype, peer, server."""
    out: list[dict[str, str | float]] = []
    for ln in text.splitlines():
        parts = ln.split("\t")
        if len(parts) < 6:
            continue
        out.append(
            {
                "t": float(parts[0]),
                "transport": parts[1],
                "qname": parts[2],
                "qtype": parts[3],
                "peer": parts[4],
                "server": parts[5],
            }
        )
    return out
