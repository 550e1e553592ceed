"""The DNS proxy's pure decisions: which queries leave, and what of an answer returns."""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import dns.update
import pytest

from boxyd.net.bindings import TTL_CAP, TTL_FLOOR, Address
from boxyd.net.dnsfilter import (
    MAX_CHAIN,
    NOT_ALLOWED,
    Binding,
    decide_query,
    filter_answer,
    refusal_response,
    upstream_query,
)

DENIED = [
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
    )
]
ECH = base64.b64encode(b"\x00\x06secret").decode()


class Policy:
    """A small real policy: an optional allowlist (suffix match) and a range list."""

    def __init__(self, allowed: tuple[str, ...] | None = ("ok.test",)) -> None:
        self.allowed = allowed
        self.asked: list[str] = []

    def name_allowed(self, name: str) -> bool:
        self.asked.append(name)
        if self.allowed is None:
            return True
        return any(name == a or name.endswith("." + a) for a in self.allowed)

    def name_denied(self, name: str) -> bool:
        return False

    def address_denied(self, ip: Address) -> str | None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        for net in DENIED:
            if ip in net:
                return f"in {net}"
        return None


ALLOW = Policy()
PUBLIC = Policy(allowed=None)


def query(
    name: str | dns.name.Name = "www.ok.test", rdtype: str = "A", **kw: Any
) -> dns.message.Message:
    return dns.message.make_query(name, rdtype, **kw)


def upstream(
    q: dns.message.Message,
    *records: tuple[str, int, str, str],
    rcode: dns.rcode.Rcode = dns.rcode.NOERROR,
) -> dns.message.Message:
    """An upstream response to Q with answer RECORDS (name, ttl, type, rdata)."""
    r = dns.message.make_response(upstream_query(q))
    r.set_rcode(rcode)
    for name, ttl, rdtype, rdata in records:
        r.find_rrset(
            r.answer,
            dns.name.from_text(name),
            dns.rdataclass.IN,
            dns.rdatatype.from_text(rdtype),
            create=True,
        ).add(dns.rdata.from_text(dns.rdataclass.IN, dns.rdatatype.from_text(rdtype), rdata), ttl)
    return r


def answers(msg: dns.message.Message) -> list[tuple[str, str, int, str]]:
    return sorted(
        (rr.name.to_text(), dns.rdatatype.to_text(rr.rdtype), rr.ttl, rd.to_text())
        for rr in msg.answer
        for rd in rr
    )


def roundtrip(msg: dns.message.Message) -> dns.message.Message:
    return dns.message.from_wire(msg.to_wire())


# --- decide_query -------------------------------------------------------------------


def test_allowed_name_goes_upstream_and_policy_sees_canonical_name() -> None:
    policy = Policy()
    assert decide_query(query("WWW.Ok.TEST."), policy) is None
    assert policy.asked == ["www.ok.test"]


def test_disallowed_name_is_nxdomain() -> None:
    refusal = decide_query(query("c2.5f3a1.evil.test"), ALLOW)
    assert refusal is not None
    assert refusal.rcode == dns.rcode.NXDOMAIN
    assert refusal.reason == NOT_ALLOWED
    # A suffix trick is not a subdomain.
    assert decide_query(query("notok.test"), ALLOW) is not None


def test_a_refused_name_says_why_in_an_extended_dns_error() -> None:
    """RFC 8914 (issue 34 §3): a client that sent EDNS reads what refused the name and
    the flag that allows it; one that did not gets no OPT it never asked for."""
    import dns.edns

    q = query("c2.evil.test", use_edns=0)
    refusal = decide_query(q, ALLOW)
    assert refusal is not None
    got = roundtrip(refusal_response(q, refusal))
    assert got.rcode() == dns.rcode.NXDOMAIN
    (ede,) = [o for o in got.options if isinstance(o, dns.edns.EDEOption)]
    assert ede.code == dns.edns.EDECode.BLOCKED
    assert ede.text == (
        "boxy: c2.evil.test is not on this sandbox's allowlist; --allow-host c2.evil.test "
        "allows it (a running session: boxyctl allow ID c2.evil.test)"
    )
    plain = query("c2.evil.test")
    refusal = decide_query(plain, ALLOW)
    assert refusal is not None
    assert roundtrip(refusal_response(plain, refusal)).edns == -1


@pytest.mark.parametrize(
    "labels",
    [
        [b"data.www.ok", b"test", b""],  # text "data\.www\.ok.test" ends with ".ok.test"
        [b"x", b"ok\x00", b"test", b""],
        [b"*", b"ok", b"test", b""],
        [b"caf\xc3\xa9", b"ok", b"test", b""],
    ],
)
def test_names_that_are_not_hostnames_are_refused_before_policy(labels: list[bytes]) -> None:
    for policy in (Policy(), Policy(allowed=None)):
        refusal = decide_query(query(dns.name.Name(labels)), policy)
        assert refusal is not None and refusal.rcode == dns.rcode.REFUSED
        assert policy.asked == []


def test_service_labels_are_hostnames() -> None:
    assert decide_query(query("_8443._https.API.ok.test", "SVCB"), ALLOW) is None


def test_public_mode_allows_every_name() -> None:
    assert decide_query(query("c2.5f3a1.evil.test"), PUBLIC) is None


def test_one_question_exactly() -> None:
    two = query()
    two.question.append(query("b.ok.test").question[0])
    none = query()
    none.question = []
    for msg in (two, none):
        refusal = decide_query(msg, ALLOW)
        assert refusal is not None and refusal.rcode == dns.rcode.FORMERR


def test_class_other_than_in_is_refused() -> None:
    refusal = decide_query(query("version.bind", "TXT", rdclass="CH"), PUBLIC)
    assert refusal is not None and refusal.rcode == dns.rcode.REFUSED


@pytest.mark.parametrize("rdtype", ["AXFR", "IXFR", "MAILB", "OPT"])
def test_zone_transfers_and_meta_types_are_refused(rdtype: str) -> None:
    refusal = decide_query(query("ok.test", rdtype), ALLOW)
    assert refusal is not None and refusal.rcode == dns.rcode.REFUSED


def test_any_gets_the_rfc8482_minimal_answer() -> None:
    q = query("www.ok.test", "ANY")
    refusal = decide_query(q, ALLOW)
    assert refusal is not None and refusal.rcode == dns.rcode.NOERROR
    r = roundtrip(refusal_response(q, refusal))
    assert r.id == q.id
    assert [(a[1], a[3]) for a in answers(r)] == [("HINFO", '"RFC8482" ""')]
    # ANY for a refused name is refused as a name first.
    refusal = decide_query(query("x.evil.test", "ANY"), ALLOW)
    assert refusal is not None and refusal.rcode == dns.rcode.NXDOMAIN


@pytest.mark.parametrize("opcode", [dns.opcode.NOTIFY, dns.opcode.STATUS])
def test_other_opcodes_are_not_implemented(opcode: dns.opcode.Opcode) -> None:
    q = query()
    q.set_opcode(opcode)
    refusal = decide_query(dns.message.from_wire(q.to_wire()), ALLOW)
    assert refusal is not None and refusal.rcode == dns.rcode.NOTIMP


def test_dynamic_update_is_not_implemented() -> None:
    update = dns.update.UpdateMessage("ok.test")
    update.add("www", 60, "A", "93.184.216.34")
    msg = dns.message.from_wire(update.to_wire())
    refusal = decide_query(msg, ALLOW)
    assert refusal is not None and refusal.rcode == dns.rcode.NOTIMP
    assert refusal_response(msg, refusal).rcode() == dns.rcode.NOTIMP


def test_unknown_edns_version_is_badvers() -> None:
    q = query(use_edns=1)
    refusal = decide_query(q, ALLOW)
    assert refusal is not None and refusal.rcode == dns.rcode.BADVERS
    assert roundtrip(refusal_response(q, refusal)).rcode() == dns.rcode.BADVERS


def test_upstream_query_carries_only_the_question() -> None:
    q = query(
        "WwW.ok.test",
        "AAAA",
        use_edns=0,
        want_dnssec=True,
        options=[dns.edns.GenericOption(dns.edns.OptionType.make(65001), b"exfiltrated-bytes")],
    )
    q.additional.append(dns.rrset.from_text("data.evil.test.", 1, "IN", "TXT", '"more bytes"'))
    up = upstream_query(q)
    assert up.question[0].name.to_text() == "WwW.ok.test."
    assert up.question[0].rdtype == dns.rdatatype.AAAA
    assert up.options == () and up.additional == []
    assert not up.ednsflags & dns.flags.DO
    assert up.flags & dns.flags.RD
    assert b"exfiltrated" not in up.to_wire()


# --- filter_answer: addresses and TTLs ----------------------------------------------


def test_address_answer_is_bound_to_the_question_name_with_the_floor_ttl() -> None:
    q = query("WWW.ok.test")
    f = filter_answer(q, upstream(q, ("www.ok.test", 5, "A", "93.184.216.34")), ALLOW, ipv6=True)
    assert f.error is None
    assert answers(f.response) == [("www.ok.test.", "A", TTL_FLOOR, "93.184.216.34")]
    assert f.bind == (Binding(ipaddress.IPv4Address("93.184.216.34"), "www.ok.test", TTL_FLOOR),)
    r = roundtrip(f.response)
    assert r.id == q.id and r.question[0].name.to_text() == "WWW.ok.test."  # 0x20 case kept
    assert r.flags & dns.flags.RA and r.rcode() == dns.rcode.NOERROR


@pytest.mark.parametrize(("ttl", "expected"), [(0, TTL_FLOOR), (300, 300), (10**7, TTL_CAP)])
def test_ttl_is_rewritten_to_match_the_binding(ttl: int, expected: int) -> None:
    q = query()
    f = filter_answer(q, upstream(q, ("www.ok.test", ttl, "A", "93.184.216.34")), ALLOW, ipv6=True)
    assert answers(f.response)[0][2] == expected
    assert f.bind[0].ttl == expected


def test_custom_floor() -> None:
    q = query()
    f = filter_answer(
        q, upstream(q, ("www.ok.test", 5, "A", "93.184.216.34")), ALLOW, ipv6=True, ttl_floor=120
    )
    assert answers(f.response)[0][2] == 120 and f.bind[0].ttl == 120


def test_rebinding_answers_are_removed_and_nothing_left_is_nodata() -> None:
    q = query("rebind.ok.test")
    up = upstream(
        q,
        *[("rebind.ok.test", 60, "A", a) for a in ("192.168.1.1", "127.0.0.1", "169.254.169.254")],
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert f.response.rcode() == dns.rcode.NOERROR
    assert f.response.answer == [] and f.response.authority == []
    assert f.bind == ()
    assert sorted(a for a, _ in f.denied) == ["127.0.0.1", "169.254.169.254", "192.168.1.1"]
    assert all(reason for _, reason in f.denied)


def test_mixed_answer_keeps_only_public_addresses() -> None:
    q = query("mixed.ok.test")
    up = upstream(
        q, ("mixed.ok.test", 60, "A", "10.1.2.3"), ("mixed.ok.test", 60, "A", "93.184.216.34")
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert answers(f.response) == [("mixed.ok.test.", "A", 60, "93.184.216.34")]
    assert [str(b.ip) for b in f.bind] == ["93.184.216.34"]
    assert [a for a, _ in f.denied] == ["10.1.2.3"]


def test_rebinding_filter_applies_in_public_mode() -> None:
    q = query("anything.example")
    f = filter_answer(
        q, upstream(q, ("anything.example", 60, "A", "192.168.1.1")), PUBLIC, ipv6=True
    )
    assert f.response.answer == [] and f.denied


def test_aaaa_dropped_without_ipv6_route() -> None:
    q = query("v6.ok.test", "AAAA")
    up = upstream(q, ("v6.ok.test", 60, "AAAA", "2606:4700::1"))
    f = filter_answer(q, up, ALLOW, ipv6=False)
    assert f.response.rcode() == dns.rcode.NOERROR and f.response.answer == []
    assert f.bind == () and f.unrouted == ("2606:4700::1",) and f.denied == ()
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert answers(f.response) == [("v6.ok.test.", "AAAA", 60, "2606:4700::1")]
    assert [str(b.ip) for b in f.bind] == ["2606:4700::1"]


def test_aaaa_in_denied_ranges_and_v4_mapped() -> None:
    q = query("v6.ok.test", "AAAA")
    up = upstream(
        q,
        *[
            ("v6.ok.test", 60, "AAAA", a)
            for a in ("fd00::1", "::ffff:192.168.1.1", "::ffff:93.184.216.34", "::1")
        ],
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert answers(f.response) == [("v6.ok.test.", "AAAA", 60, "::ffff:93.184.216.34")]
    # A v4-mapped answer reaches the v4 host: it is bound as that address.
    assert f.bind == (Binding(ipaddress.IPv4Address("93.184.216.34"), "v6.ok.test", 60),)
    assert len(f.denied) == 3


# --- filter_answer: CNAME chains ------------------------------------------------------


def test_cname_chain_is_followed_and_bound_to_the_question_name() -> None:
    q = query("www.ok.test")
    up = upstream(
        q,
        ("www.ok.test", 300, "CNAME", "edge.cdn.example."),
        ("edge.cdn.example", 10, "CNAME", "e1.cdn.example."),
        ("e1.cdn.example", 20, "A", "93.184.216.34"),
        ("unrelated.example", 20, "A", "93.184.216.99"),
    )
    up.authority.append(dns.rrset.from_text("cdn.example.", 60, "IN", "NS", "ns.cdn.example."))
    up.additional.append(dns.rrset.from_text("ns.cdn.example.", 60, "IN", "A", "93.184.216.98"))
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert f.chain == ("www.ok.test", "edge.cdn.example", "e1.cdn.example")
    assert answers(f.response) == [
        ("e1.cdn.example.", "A", 60, "93.184.216.34"),
        ("edge.cdn.example.", "CNAME", 60, "e1.cdn.example."),
        ("www.ok.test.", "CNAME", 300, "edge.cdn.example."),
    ]
    assert f.response.authority == [] and f.response.additional == []
    assert f.bind == (Binding(ipaddress.IPv4Address("93.184.216.34"), "www.ok.test", 60),)


def test_chain_at_the_limit_passes_and_one_longer_is_servfail() -> None:
    def chain(n: int) -> tuple[dns.message.Message, dns.message.Message]:
        q = query("h0.ok.test")
        records = [(f"h{i}.ok.test", 60, "CNAME", f"h{i + 1}.ok.test.") for i in range(n)]
        records.append((f"h{n}.ok.test", 60, "A", "93.184.216.34"))
        return q, upstream(q, *records)

    f = filter_answer(*chain(MAX_CHAIN), ALLOW, ipv6=True)
    assert f.error is None and len(f.chain) == MAX_CHAIN + 1 and f.bind
    f = filter_answer(*chain(MAX_CHAIN + 1), ALLOW, ipv6=True)
    assert f.response.rcode() == dns.rcode.SERVFAIL and f.bind == ()
    assert "longer than" in (f.error or "")


@pytest.mark.parametrize(
    "records",
    [
        [("loop.ok.test", 60, "CNAME", "loop.ok.test.")],
        [("loop.ok.test", 60, "CNAME", "b.ok.test."), ("b.ok.test", 60, "CNAME", "LOOP.ok.test.")],
    ],
)
def test_cname_loop_is_servfail(records: list[tuple[str, int, str, str]]) -> None:
    q = query("loop.ok.test")
    f = filter_answer(q, upstream(q, *records), ALLOW, ipv6=True)
    assert f.response.rcode() == dns.rcode.SERVFAIL
    assert f.response.answer == [] and f.bind == ()
    assert "loop" in (f.error or "")


def test_cname_question_is_not_chased() -> None:
    q = query("www.ok.test", "CNAME")
    up = upstream(
        q,
        ("www.ok.test", 60, "CNAME", "e1.cdn.example."),
        ("e1.cdn.example", 60, "A", "93.184.216.34"),
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert answers(f.response) == [("www.ok.test.", "CNAME", 60, "e1.cdn.example.")]
    assert f.bind == ()


def test_chain_to_rebinding_target_is_filtered() -> None:
    q = query("www.ok.test")
    up = upstream(
        q,
        ("www.ok.test", 60, "CNAME", "evil.example."),
        ("evil.example", 60, "A", "169.254.169.254"),
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert answers(f.response) == [("www.ok.test.", "CNAME", 60, "evil.example.")]
    assert f.bind == () and f.denied[0][0] == "169.254.169.254"


# --- filter_answer: HTTPS / SVCB --------------------------------------------------------


def test_https_ech_stripped_and_hints_filtered_and_bound() -> None:
    q = query("svc.ok.test", "HTTPS")
    up = upstream(
        q,
        (
            "svc.ok.test",
            30,
            "HTTPS",
            f"1 . alpn=h2,h3 ipv4hint=93.184.216.34,192.168.1.1 ech={ECH} "
            "ipv6hint=2606:4700::1,fd00::1",
        ),
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert f.ech_stripped
    (rr,) = roundtrip(f.response).answer
    (rd,) = rr
    assert rr.ttl == TTL_FLOOR
    text = rd.to_text()
    assert "ech" not in text and "192.168.1.1" not in text and "fd00::1" not in text
    assert 'ipv4hint="93.184.216.34"' in text and 'ipv6hint="2606:4700::1"' in text
    assert 'alpn="h2,h3"' in text
    assert sorted(str(b.ip) for b in f.bind) == ["2606:4700::1", "93.184.216.34"]
    assert all(b.name == "svc.ok.test" for b in f.bind)
    assert sorted(a for a, _ in f.denied) == ["192.168.1.1", "fd00::1"]


def test_https_hints_without_ipv6_and_all_denied() -> None:
    q = query("svc.ok.test", "HTTPS")
    up = upstream(
        q, ("svc.ok.test", 300, "HTTPS", "1 . alpn=h2 ipv4hint=10.0.0.1 ipv6hint=2606:4700::1")
    )
    f = filter_answer(q, up, ALLOW, ipv6=False)
    (rr,) = f.response.answer
    assert next(iter(rr)).to_text() == '1 . alpn="h2"'
    assert f.bind == () and f.unrouted == ("2606:4700::1",) and f.denied[0][0] == "10.0.0.1"


def test_svcb_record_with_mandatory_ech_is_dropped() -> None:
    q = query("_8443._foo.api.ok.test", "SVCB")
    up = upstream(
        q,
        ("_8443._foo.api.ok.test", 60, "SVCB", f"1 svc.example. mandatory=ech ech={ECH}"),
        ("_8443._foo.api.ok.test", 60, "SVCB", f"2 svc2.example. port=8443 ech={ECH}"),
    )
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert f.ech_stripped
    assert [a[3] for a in answers(roundtrip(f.response))] == ['2 svc2.example. port="8443"']


def test_https_alias_mode_passes() -> None:
    q = query("ok.test", "HTTPS")
    f = filter_answer(
        q, upstream(q, ("ok.test", 3600, "HTTPS", "0 www.ok.test.")), ALLOW, ipv6=True
    )
    assert answers(f.response) == [("ok.test.", "HTTPS", 3600, "0 www.ok.test.")]
    assert not f.ech_stripped


# --- filter_answer: other types and rcodes ----------------------------------------------


def test_txt_passes_through_with_ttl_floor() -> None:
    q = query("ok.test", "TXT")
    big = " ".join(f'"{"x" * 255}"' for _ in range(12))
    f = filter_answer(q, upstream(q, ("ok.test", 1, "TXT", big)), ALLOW, ipv6=True)
    ((name, rdtype, ttl, text),) = answers(f.response)
    assert (rdtype, ttl) == ("TXT", TTL_FLOOR) and text.count("x") == 255 * 12
    assert f.bind == ()


def test_signatures_and_other_classes_are_dropped() -> None:
    q = query()
    up = upstream(q, ("www.ok.test", 60, "A", "93.184.216.34"))
    up.answer.append(
        dns.rrset.from_text(
            "www.ok.test.",
            60,
            "IN",
            "RRSIG",
            "A 13 3 60 20300101000000 20200101000000 12345 ok.test. AAAA",
        )
    )
    up.answer.append(dns.rrset.from_text("www.ok.test.", 60, "CH", "A", "ok.test. 1"))
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert answers(f.response) == [("www.ok.test.", "A", 60, "93.184.216.34")]


def test_upstream_nxdomain_keeps_its_soa() -> None:
    q = query("gone.ok.test")
    up = upstream(q, rcode=dns.rcode.NXDOMAIN)
    up.authority.append(
        dns.rrset.from_text(
            "ok.test.", 5, "IN", "SOA", "ns.ok.test. admin.ok.test. 1 7200 900 1209600 300"
        )
    )
    up.authority.append(dns.rrset.from_text("ok.test.", 5, "IN", "NS", "ns.ok.test."))
    f = filter_answer(q, up, ALLOW, ipv6=True)
    r = roundtrip(f.response)
    assert r.rcode() == dns.rcode.NXDOMAIN
    assert [(dns.rdatatype.to_text(rr.rdtype), rr.ttl) for rr in r.authority] == [
        ("SOA", TTL_FLOOR)
    ]


@pytest.mark.parametrize("rcode", [dns.rcode.SERVFAIL, dns.rcode.REFUSED, dns.rcode.FORMERR])
def test_upstream_failure_is_servfail(rcode: dns.rcode.Rcode) -> None:
    q = query()
    up = upstream(q, ("www.ok.test", 60, "A", "93.184.216.34"), rcode=rcode)
    f = filter_answer(q, up, ALLOW, ipv6=True)
    assert f.response.rcode() == dns.rcode.SERVFAIL and f.bind == () and f.error


def test_client_edns_is_answered_with_edns() -> None:
    q = query(use_edns=0, payload=4096)
    f = filter_answer(q, upstream(q, ("www.ok.test", 60, "A", "93.184.216.34")), ALLOW, ipv6=True)
    assert roundtrip(f.response).edns == 0
    q = query(use_edns=False)
    f = filter_answer(q, upstream(q, ("www.ok.test", 60, "A", "93.184.216.34")), ALLOW, ipv6=True)
    assert roundtrip(f.response).edns == -1
