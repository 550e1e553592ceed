"""What boxy's DNS proxy lets through, as pure functions over dnspython messages.

Two decisions, one each side of the upstream resolver:

- :func:`decide_query` — before anything leaves: malformed or unsupported
  queries, and (allowlist mode) names not allowed, are answered locally. A name
  that is refused is **never sent upstream**, so a payload cannot tunnel data out
  in query names. What does go upstream is :func:`upstream_query`, a fresh query
  carrying only the question (no client EDNS options, no extra records: those
  would be a tunnel too).
- :func:`filter_answer` — before the answer goes back: the upstream response is
  reduced to the CNAME chain from the question name and the records of the
  asked type at its end; addresses in denied ranges are removed (DNS rebinding);
  AAAA is dropped when the host has no IPv6 route (Happy Eyeballs would wait on
  a v6 connect that cannot succeed); HTTPS/SVCB lose ``ech`` and any address hint
  in a denied range; TTLs are clamped (see bindings.clamp_ttl). It returns the
  addresses the caller must bind *before* sending the answer.

Choices, and why:

- CNAME targets need not be allowed: CDNs alias allowed names to names of their
  own. Every returned address is bound to the *question* name — the name policy
  allowed and the one the client will put in its SNI / Host header. The chain
  is bounded (``MAX_CHAIN``); a loop or a longer chain is SERVFAIL.
- When the range filter (or the missing IPv6 route) leaves nothing, the answer is
  an empty NOERROR (NODATA) without an SOA: the name exists, and NXDOMAIN would
  say it has no records of *any* type, which stub resolvers cache for all types
  and which fails the parallel A lookup when it is the AAAA that was emptied.
  Without an SOA the empty answer is not negatively cached either.
- A name with a label outside letters, digits, '-' and '_' is REFUSED in every
  mode: its text form is ambiguous ("a\\.b.example" is the label "a.b" under
  "example", yet ends with ".b.example"), so no name policy can be trusted with it.
- ``ANY`` gets the minimal answer of RFC 8482 §4.2 (one synthesised HINFO
  "RFC8482") and is not forwarded; zone transfers and other meta types are
  REFUSED; opcodes other than QUERY get NOTIMP; more or fewer than one question
  is FORMERR; classes other than IN are REFUSED.
- HTTPS/SVCB address hints are *kept and bound* when they pass the range check
  (they are the name's addresses, published by its own zone, and clients may
  connect to them before their A/AAAA lookup returns); denied hints are removed.
  A record that lists a removed key (``ech``, an emptied hint) as mandatory is
  dropped, since a client must not use it without that key.
- Authority and additional sections are dropped (glue, NS), except the SOA of an
  upstream negative answer, which tells the client how long to cache it.
- Other types (TXT, MX, SRV, …) pass unchanged apart from their TTL; their size
  is bounded by the transport (UDP truncation, TCP's 64 KiB).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import dns.rrset
from dns.rdtypes.svcbbase import IPv4HintParam, IPv6HintParam, ParamKey, SVCBBase

from boxyd.net.bindings import TTL_CAP, TTL_FLOOR, Address, canonical_ip, clamp_ttl

MAX_CHAIN = 16
# EDNS payload boxy advertises, upstream and to clients (the 2020 DNS flag-day
# value: fits any path MTU without fragmentation; bigger answers go over TCP).
EDNS_PAYLOAD = 1232
ANY_TTL = 3600

NOT_ALLOWED = "hostname not on the allowlist"
NOT_A_HOSTNAME = "name has characters other than letters, digits, '-' and '_'"
NO_IPV6_ROUTE = "the host has no IPv6 route"

# Letters, digits, '-' and '_' (service labels such as _443._tcp). Anything else
# would show up escaped in the text policy sees ("a\.b.example" is one label
# "a.b" under "example" yet ends with ".b.example"), so such names are refused.
_HOSTNAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_ADDRESS_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)
_SERVICE_TYPES = (dns.rdatatype.HTTPS, dns.rdatatype.SVCB)


class DnsPolicy(Protocol):
    """The two questions the DNS proxy asks the network policy."""

    def name_allowed(self, name: str) -> bool:
        """May NAME (lower-case, no trailing dot) be resolved? Always True in public mode."""
        ...

    def address_denied(self, ip: Address) -> str | None:
        """Why IP must not be handed out (a denied range), or None when it may."""
        ...

    def name_denied(self, name: str) -> bool:
        """NAME was denied while the session runs: no answer may resolve it."""
        ...


@dataclass(frozen=True)
class Refusal:
    """A query answered locally, never sent upstream."""

    rcode: dns.rcode.Rcode
    reason: str
    answer: tuple[dns.rrset.RRset, ...] = ()
    # RFC 8914's Extended DNS Error, for a client that sent EDNS: what refused the
    # name and the flag that would allow it, readable by the program (issue 34 §3)
    ede: tuple[dns.edns.EDECode, str] | None = None


@dataclass(frozen=True)
class Binding:
    ip: Address
    name: str
    ttl: int


@dataclass(frozen=True)
class Filtered:
    """The answer to send, and what to bind before sending it."""

    response: dns.message.Message
    bind: tuple[Binding, ...] = ()
    # Addresses removed because policy denies their range, with the reason.
    denied: tuple[tuple[str, str], ...] = ()
    # Addresses removed because the host cannot reach IPv6 (not a policy denial).
    unrouted: tuple[str, ...] = ()
    chain: tuple[str, ...] = ()
    ech_stripped: bool = False
    # Why the answer became SERVFAIL (loop, long chain, upstream failure), else None.
    error: str | None = None


def name_text(name: dns.name.Name) -> str:
    """NAME as policy sees it: lower-case, no trailing dot, "" for the root."""
    if name == dns.name.root:
        return ""
    return name.canonicalize().to_text(omit_final_dot=True)


def _is_hostname(name: dns.name.Name) -> bool:
    return all(_HOSTNAME_BYTES.issuperset(label) for label in name.labels)


def decide_query(msg: dns.message.Message, policy: DnsPolicy) -> Refusal | None:
    """None when MSG may be resolved upstream, else how to answer it locally."""
    if msg.opcode() != dns.opcode.QUERY:
        return Refusal(dns.rcode.NOTIMP, f"opcode {dns.opcode.to_text(msg.opcode())} not served")
    if msg.edns > 0:
        return Refusal(dns.rcode.BADVERS, f"EDNS version {msg.edns} not supported")
    if len(msg.question) != 1:
        return Refusal(dns.rcode.FORMERR, f"{len(msg.question)} questions (exactly one is served)")
    question = msg.question[0]
    if question.rdclass != dns.rdataclass.IN:
        cls = dns.rdataclass.to_text(question.rdclass)
        return Refusal(dns.rcode.REFUSED, f"class {cls} not served (only IN)")
    if not _is_hostname(question.name):
        return Refusal(dns.rcode.REFUSED, NOT_A_HOSTNAME)
    # Policy before type checks, so every query for a refused name is logged as such.
    if not policy.name_allowed(name := name_text(question.name)):
        return Refusal(
            dns.rcode.NXDOMAIN, NOT_ALLOWED, ede=(dns.edns.EDECode.BLOCKED, blocked(name))
        )
    rdtype = question.rdtype
    if rdtype == dns.rdatatype.ANY:
        hinfo = dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.HINFO, '"RFC8482" ""')
        rrset = dns.rrset.from_rdata(question.name, ANY_TTL, hinfo)
        return Refusal(dns.rcode.NOERROR, "ANY not forwarded (RFC 8482 minimal answer)", (rrset,))
    if rdtype in (dns.rdatatype.AXFR, dns.rdatatype.IXFR):
        return Refusal(dns.rcode.REFUSED, "zone transfers not served")
    if dns.rdatatype.is_metatype(rdtype):
        return Refusal(dns.rcode.REFUSED, f"query type {dns.rdatatype.to_text(rdtype)} not served")
    return None


def response_for(
    query: dns.message.Message, rcode: dns.rcode.Rcode = dns.rcode.NOERROR
) -> dns.message.Message:
    """An empty response to QUERY (its id, question and EDNS presence) with RCODE."""
    response = dns.message.make_response(query, recursion_available=True, our_payload=EDNS_PAYLOAD)
    response.set_rcode(rcode)
    return response


def blocked(name: str) -> str:
    """The Extended DNS Error's text for NAME refused by the allowlist."""
    return (
        f"boxy: {name} is not on this sandbox's allowlist; --allow-host {name} allows it "
        f"(a running session: boxyctl allow ID {name})"
    )


def refusal_response(query: dns.message.Message, refusal: Refusal) -> dns.message.Message:
    response = response_for(query, refusal.rcode)
    response.answer = list(refusal.answer)
    if refusal.ede is not None and query.edns >= 0:  # an option needs the client's OPT
        code, text = refusal.ede
        response.use_edns(0, 0, EDNS_PAYLOAD, options=[dns.edns.EDEOption(code, text)])
    return response


def upstream_query(query: dns.message.Message) -> dns.message.Message:
    """A fresh query for QUERY's question: nothing else of the client's goes upstream."""
    question = query.question[0]
    return dns.message.make_query(
        question.name,
        question.rdtype,
        question.rdclass,
        use_edns=0,
        payload=EDNS_PAYLOAD,
        flags=dns.flags.RD,
    )


def filter_answer(
    query: dns.message.Message,
    response: dns.message.Message,
    policy: DnsPolicy,
    *,
    ipv6: bool,
    ttl_floor: int = TTL_FLOOR,
    ttl_cap: int = TTL_CAP,
) -> Filtered:
    """The client's answer to QUERY built from the upstream RESPONSE (see module doc)."""
    question = query.question[0]
    qname = name_text(question.name)
    rcode = response.rcode()
    if rcode not in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
        return _servfail(query, f"upstream answered {dns.rcode.to_text(rcode)}")

    def ttl(rrset: dns.rrset.RRset) -> int:
        return clamp_ttl(rrset.ttl, ttl_floor, ttl_cap)

    found = _by_name(response)
    links = _cname_chain(question, found)
    if isinstance(links, str):
        return _servfail(query, links)
    out = response_for(query, rcode)
    chain = (qname, *(name_text(link[0].target) for link in links))
    for link in links:
        out.answer.append(_with_ttl(link, ttl(link)))

    current = links[-1][0].target if links else question.name
    final = found.get((current, question.rdtype))
    if final is None:
        # Upstream's own negative answer: its SOA says how long to cache it.
        out.authority = [
            _with_ttl(rr, ttl(rr))
            for rr in response.authority
            if rr.rdtype == dns.rdatatype.SOA and rr.rdclass == dns.rdataclass.IN
        ]
        return Filtered(out, chain=chain)
    kept = _Kept(policy, qname, ttl(final))
    kept_rrset = kept.filter(final, ipv6=ipv6)
    if kept_rrset is not None:
        out.answer.append(kept_rrset)
    return Filtered(
        out, tuple(kept.bind), tuple(kept.denied), tuple(kept.unrouted), chain, kept.ech_stripped
    )


def _by_name(response: dns.message.Message) -> dict[tuple[dns.name.Name, int], dns.rrset.RRset]:
    """RESPONSE's IN answers, one RRset per (name, type)."""
    found: dict[tuple[dns.name.Name, int], dns.rrset.RRset] = {}
    for rrset in response.answer:
        if rrset.rdclass != dns.rdataclass.IN or rrset.rdtype == dns.rdatatype.RRSIG:
            continue  # no DO bit was sent, and records the filter removes would break them
        key = (rrset.name, rrset.rdtype)
        if key in found:
            found[key] = found[key].union(rrset)
        else:
            found[key] = rrset
    return found


def _cname_chain(
    question: dns.rrset.RRset, found: dict[tuple[dns.name.Name, int], dns.rrset.RRset]
) -> list[dns.rrset.RRset] | str:
    """The CNAMEs from the question name on (a CNAME question is not chased), or why
    the answer is refused (too long, a loop)."""
    links: list[dns.rrset.RRset] = []
    current = question.name
    seen = {current}
    while question.rdtype != dns.rdatatype.CNAME:
        cname = found.get((current, dns.rdatatype.CNAME))
        if cname is None:
            break
        if len(links) >= MAX_CHAIN:
            return f"CNAME chain from {name_text(question.name)} longer than {MAX_CHAIN}"
        target = next(iter(cname)).target  # dnspython keeps one CNAME per name (singleton)
        links.append(cname)
        if target in seen:
            return f"CNAME loop at {name_text(target)}"
        seen.add(target)
        current = target
    return links


class _Kept:
    """The final RRset's records the policy keeps, and what it removed on the way."""

    def __init__(self, policy: DnsPolicy, qname: str, ttl: int) -> None:
        self.policy, self.qname, self.ttl = policy, qname, ttl
        self.bind: list[Binding] = []
        self.denied: list[tuple[str, str]] = []
        self.unrouted: list[str] = []
        self.ech_stripped = False

    def allowed(self, addresses: Iterable[str]) -> list[str]:
        kept = []
        for text in addresses:
            ip = ipaddress.ip_address(text)
            reason = self.policy.address_denied(ip)
            if reason is None:
                kept.append(text)
                self.bind.append(Binding(canonical_ip(ip), self.qname, self.ttl))
            else:
                self.denied.append((text, reason))
        return kept

    def filter(self, final: dns.rrset.RRset, *, ipv6: bool) -> dns.rrset.RRset | None:
        if final.rdtype == dns.rdatatype.AAAA and not ipv6:
            self.unrouted.extend(rd.address for rd in final)
            return None
        if final.rdtype in _ADDRESS_TYPES:
            keep = set(self.allowed(rd.address for rd in final))
            return _rebuild(final, self.ttl, [rd for rd in final if rd.address in keep])
        if final.rdtype in _SERVICE_TYPES:
            rdatas = []
            for rd in final:
                new, stripped = _filter_service(rd, self.allowed, self.unrouted, ipv6=ipv6)
                self.ech_stripped |= stripped
                if new is not None:
                    rdatas.append(new)
            return _rebuild(final, self.ttl, rdatas)
        return _with_ttl(final, self.ttl)


def _filter_service(
    rd: SVCBBase, allowed: Callable[[Iterable[str]], list[str]], unrouted: list[str], *, ipv6: bool
) -> tuple[SVCBBase | None, bool]:
    """RD (HTTPS/SVCB) without ech and without hints that may not be used, or None
    when it must go; and whether it carried ech."""
    params = dict(rd.params)
    removed: set[int] = set()
    had_ech = ParamKey.ECH in params
    if had_ech:
        del params[ParamKey.ECH]
        removed.add(ParamKey.ECH)
    for key, cls, routed in (
        (ParamKey.IPV4HINT, IPv4HintParam, True),
        (ParamKey.IPV6HINT, IPv6HintParam, ipv6),
    ):
        hint = params.get(key)
        if hint is None:
            continue
        if routed:
            kept = allowed(hint.addresses)
        else:
            unrouted.extend(hint.addresses)
            kept = []
        if kept:
            params[key] = cls(kept)
        else:
            del params[key]
            removed.add(key)
    mandatory = params.get(ParamKey.MANDATORY)
    if mandatory is not None and removed.intersection(mandatory.keys):
        return None, had_ech
    return cast(SVCBBase, rd.replace(params=params)), had_ech


def _rebuild(
    rrset: dns.rrset.RRset, ttl: int, rdatas: Sequence[dns.rdata.Rdata]
) -> dns.rrset.RRset | None:
    if not rdatas:
        return None
    return dns.rrset.from_rdata_list(rrset.name, ttl, rdatas)


def _with_ttl(rrset: dns.rrset.RRset, ttl: int) -> dns.rrset.RRset:
    copy: dns.rrset.RRset = rrset.copy()
    copy.ttl = ttl
    return copy


def _servfail(query: dns.message.Message, why: str) -> Filtered:
    return Filtered(response_for(query, dns.rcode.SERVFAIL), error=why)
