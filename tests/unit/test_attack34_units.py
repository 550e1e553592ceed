"""Attack 34, unit level: the Claude Code hook's widening guard, a DNS answer in flight
across a `boxyctl deny`, a denied address, and the words of a refusal. Each test fails
(says ESCAPED) only when the attack got through."""

from __future__ import annotations

import asyncio

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from boxyctl import hookpolicy as hp
from boxyd.net import denial
from boxyd.net.dnsproxy import DnsProxy, DnsSession
from boxyd.net.policy import SNI, NetPolicy, Verdict

# Plain bash forms that run `boxyctl allow ID HOST` on the host (checked with bash:
# brace expansion, a redirection before the subcommand, a glob naming the program or,
# with a file named `allow` in the directory, the subcommand).
BYPASSES = [
    "boxyctl {allow,} 9f3 a.example",
    "boxyctl 2>&1 allow 9f3 a.example",
    "boxyctl >/dev/null allow 9f3 a.example",
    "boxyctl </dev/null trust",
    "/usr/local/bin/boxyct? allow 9f3 a.example",
    "/usr/local/bin/boxyct[l] allow 9f3 a.example",
    "touch allow && boxyctl [a]llow 9f3 a.example",
    "boxyctl al?ow 9f3 a.example",
]


@pytest.mark.parametrize("line", BYPASSES)
def test_hook_asks_about_every_plain_form_of_allow(line: str) -> None:
    asked = hp.widens(line) is not None
    boxed = hp.decide(line, hp.HookConfig()) is not None
    assert asked or boxed, f"ESCAPED hook: {line!r} runs on the host without an ask"


def test_hook_still_passes_lines_that_widen_nothing() -> None:
    for line in ("boxyctl deny 9f3 a.example", "boxyctl 2>&1 show 9f3", "ls {a,b}"):
        assert hp.widens(line) is None, line


def _allowlist(*hosts: str) -> NetPolicy:
    return NetPolicy.from_spec("allowlist", hosts, (), (), False)


def test_a_denied_address_is_not_reached_through_a_name_bound_to_it() -> None:
    after = _allowlist("cdn-a.example").narrowed(["93.184.216.20"])
    v = after.tcp_connect("93.184.216.20", 443, ["cdn-a.example"])
    w = after.tcp_name("93.184.216.20", 443, "cdn-a.example", ["cdn-a.example"])
    assert not v.allow and not w.allow, "ESCAPED address: deny of an address bound by a name"


def test_a_literal_denied_in_its_mapped_form_is_denied() -> None:
    after = _allowlist("93.184.216.7").narrowed(["::ffff:93.184.216.7"])
    assert not after.tcp_connect("93.184.216.7", 443, []).allow, "ESCAPED mapped literal"


def _answer(query: dns.message.Message, *records: tuple[str, str, str]) -> dns.message.Message:
    response = dns.message.make_response(query)
    for name, rdtype, text in records:
        response.answer.append(dns.rrset.from_text(name, 60, "IN", rdtype, text))
    return response


def _proxy(records: tuple[tuple[str, str, str], ...], during: asyncio.Event | None) -> DnsProxy:
    proxy = DnsProxy([("127.0.0.1", 53)], ipv6=False)

    async def resolve(q: dns.message.Message, servers: object = None) -> dns.message.Message:
        if during is not None:
            await during.wait()
        return _answer(q, *records)

    proxy._resolve = resolve  # type: ignore[method-assign]
    return proxy


def test_an_answer_in_flight_during_a_deny_is_not_handed_out() -> None:
    async def attack() -> tuple[int, int]:
        before = _allowlist("api.example")
        session = DnsSession(policy=before)
        upstream_asked = asyncio.Event()
        proxy = _proxy((("api.example.", "A", "93.184.216.34"),), upstream_asked)
        wire = dns.message.make_query("api.example", "A").to_wire()
        task = asyncio.create_task(proxy.answer(wire, tcp=False, session=session))
        await asyncio.sleep(0)  # the query is with upstream now
        session.policy = before.narrowed(["api.example"])  # Gateway.set_policy's two steps
        session.cache.clear()
        upstream_asked.set()
        first = dns.message.from_wire(await task or b"")
        again = await proxy.answer(wire, tcp=False, session=session)  # from the cache?
        return first.rcode(), dns.message.from_wire(again or b"").rcode()

    first, again = asyncio.run(attack())
    assert first != dns.rcode.NOERROR, "ESCAPED dns: answered for a name denied meanwhile"
    assert again != dns.rcode.NOERROR, "ESCAPED dns: the answer was cached after the deny"


def _rcode(policy: NetPolicy, target: str) -> int:
    """The rcode of alias.example's A, upstream answering a CNAME to TARGET (93.184.216.10)."""

    async def resolve() -> int:
        chain = (("alias.example.", "CNAME", f"{target}."), (f"{target}.", "A", "93.184.216.10"))
        wire = dns.message.make_query("alias.example", "A").to_wire()
        got = await _proxy(chain, None).answer(wire, tcp=False, session=DnsSession(policy=policy))
        return dns.message.from_wire(got or b"").rcode()

    return asyncio.run(resolve())


def test_a_cname_chain_through_a_denied_name_does_not_resolve_it() -> None:
    policy = _allowlist("alias.example", "www.example").narrowed(["www.example"])
    assert _rcode(policy, "www.example") != dns.rcode.NOERROR, (
        "ESCAPED cname: the denied name resolved"
    )


def test_an_unlisted_cname_target_still_resolves() -> None:
    assert _rcode(_allowlist("alias.example"), "edge.cdn.example") == dns.rcode.NOERROR


@pytest.mark.parametrize(
    "host",
    [
        "a\r\nSet-Cookie: x=1",
        "a\nX-Evil: 1",
        "evil.example\x00:80",
        "x" * 100_000,
        "<script>alert(1)</script>",
        "[::1]:80\r\n\r\nHTTP/1.1 200 OK",
    ],
)
def test_a_refusal_carries_no_header_the_payload_shaped(host: str) -> None:
    reason = Verdict(False, SNI, "Host names it: hostname not on the allowlist")
    said = denial.reply(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", reason, host, 80)
    assert said is not None
    head, _, body = said.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 403 Forbidden by boxy: ") and len(lines) == 5, (
        "ESCAPED header injection"
    )
    assert len(body) < 1024, "ESCAPED a huge Host echoed whole"
    assert b"\r" not in body and b"\n\n" not in body.rstrip(b"\n"), "ESCAPED body shaped"
