"""The DNS proxy's parsers of what the payload sends and what upstream answers, fuzzed
(seeded, bounded in CPU time; tests/unit/parserfuzz.py): a mutated query is either
refused by dnspython's parser (the proxy answers FORMERR) or decided and answered;
a mutated upstream answer is filtered or fails with the errors the proxy catches
(ValueError, DNSException: SERVFAIL). Nothing else may come out of either."""

from __future__ import annotations

import contextlib

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rrset

from boxyd.net.bindings import TTL_CAP, TTL_FLOOR
from boxyd.net.dnsfilter import decide_query, filter_answer, refusal_response, response_for
from tests.unit.parserfuzz import mutations
from tests.unit.test_net_dnsfilter import ALLOW, ECH, PUBLIC

NAMES = ("www.ok.test", "evil.example", "a.b.ok.test")
TYPES = ("A", "AAAA", "HTTPS", "TXT", "CNAME", "ANY", "SVCB", "MX")


def _queries() -> list[bytes]:
    return [
        dns.message.make_query(n, t, use_edns=e).to_wire()
        for n in NAMES
        for t in TYPES
        for e in (False, 0)
    ]


def _answers() -> list[tuple[bytes, dns.message.Message]]:
    out: list[tuple[bytes, dns.message.Message]] = []
    for name in NAMES:
        for rdtype, rdatas in (
            ("A", ["93.184.216.34", "10.0.0.1"]),
            ("AAAA", ["2001:db8::1", "::1"]),
            ("HTTPS", [f'1 . alpn="h2" ipv4hint="93.184.216.34" ech="{ECH}"']),
            ("CNAME", ["other.ok.test."]),
        ):
            q = dns.message.make_query(name, rdtype)
            r = dns.message.make_response(q)
            r.answer.append(dns.rrset.from_text_list(name + ".", 300, "IN", rdtype, rdatas))
            out.append((r.to_wire(), q))
    return out


TOKENS = (b"\xc0\x0c", b"\x00", b"\xff", b"\x3f" + b"a" * 63, b"\x00\x01\x00\x01", b"\xc0")


# Inputs each test must have taken through the code under test, not only through
# dnspython's refusal (a fuzz run that decided nothing proves nothing): far below what
# the seeded inputs give in the time (about 3 % of the mutated queries parse, a quarter
# of the answers), above what a mutator that broke every input would.
DECIDED_MIN = {"queries": 10, "answers": 50}


def test_mutated_queries_are_decided_or_formerr() -> None:
    decided = 0
    for wire in mutations(_queries(), TOKENS, seed=53):
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # noqa: BLE001 — the proxy answers FORMERR to anything it raises
            continue
        if query.flags & dns.flags.QR:
            continue  # a response: the proxy sends nothing back
        decided += 1
        for policy in (ALLOW, PUBLIC):
            refusal = decide_query(query, policy)
            reply = (
                refusal_response(query, refusal)
                if refusal is not None
                else response_for(query, dns.rcode.NOERROR)
            )
            with contextlib.suppress(dns.exception.TooBig):  # the proxy sends SERVFAIL then
                reply.to_wire(max_size=65535)
    assert decided >= DECIDED_MIN["queries"], f"only {decided} mutated queries were decided"


def test_mutated_upstream_answers_are_filtered_or_servfail() -> None:
    seeds = _answers()
    queries = {w: q for w, q in seeds}
    filtered_count = 0
    for i, wire in enumerate(mutations([w for w, _ in seeds], TOKENS, seed=54)):
        query = list(queries.values())[i % len(queries)]
        try:
            answer = dns.message.from_wire(wire, ignore_trailing=True)
        except Exception:  # noqa: BLE001 — dnspython's own parser refused it: no answer
            continue
        for policy in (ALLOW, PUBLIC):
            try:
                filtered = filter_answer(
                    query, answer, policy, ipv6=bool(i % 2), ttl_floor=TTL_FLOOR, ttl_cap=TTL_CAP
                )
            except (ValueError, dns.exception.DNSException):
                continue  # caught by the proxy: SERVFAIL
            assert filtered.response is not None
            filtered_count += 1
    assert filtered_count >= DECIDED_MIN["answers"], f"only {filtered_count} answers filtered"
