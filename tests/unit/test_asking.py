"""--ask's questions (boxyd/daemon/asking.py, issue 34 §2), with a terminal played by
the test."""

from __future__ import annotations

import asyncio

from boxyd.daemon import asking
from boxyd.daemon.asking import Answer, Asking
from boxyd.daemon.seam import Caller


class Terminal:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.ended: list[str] = []
        self.futures: list[asyncio.Future[str]] = []
        self.decided: list[tuple[str, Answer, str]] = []

    def prompt(self, text: str, keys: dict[str, str]) -> asyncio.Future[str]:
        self.asked.append(text)
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    def end(self, said: str) -> None:
        self.ended.append(said)
        for f in self.futures:
            if not f.done():
                f.cancel()

    def decide(self, host: str, answer: Answer, caller: Caller) -> None:
        self.decided.append((host, answer, caller.via))


def asker(t: Terminal, *, here: bool = True, timeout: float = 5) -> Asking:
    return Asking(timeout, lambda: t.prompt if here else None, t.end, t.decide)


async def test_an_answer_for_the_session_allows_and_is_decided_once_for_every_lookup() -> None:
    t = Terminal()
    a = asker(t)
    lookups = [asyncio.ensure_future(a.ask("api.example")) for _ in range(3)]  # A, AAAA, retry
    await asyncio.sleep(0)
    assert len(t.asked) == 1 and "api.example" in t.asked[0] and "[s]ession" in t.asked[0]
    t.futures[0].set_result("session")
    assert await asyncio.gather(*lookups) == [True, True, True]
    assert t.decided == [("api.example", Answer.SESSION, "terminal")]


async def test_deny_refuses_and_is_not_asked_again() -> None:
    t = Terminal()
    a = asker(t)
    first = asyncio.ensure_future(a.ask("c2.example"))
    await asyncio.sleep(0)
    t.futures[0].set_result("deny")
    assert await first is False
    assert await a.ask("c2.example") is False and len(t.asked) == 1
    assert t.decided == [("c2.example", Answer.DENY, "terminal")]


async def test_nobody_to_answer_refuses_at_once() -> None:
    t = Terminal()
    assert await asyncio.wait_for(asker(t, here=False).ask("api.example"), 1) is False
    assert t.asked == [] and t.decided == []


async def test_no_answer_in_time_refuses_says_so_and_changes_no_policy() -> None:
    t = Terminal()
    a = asker(t, timeout=0.05)
    assert await a.ask("api.example") is False
    assert t.ended == ["(no answer in 0.05s: api.example refused)"] and t.decided == []
    assert await a.ask("api.example") is False and len(t.asked) == 1


async def test_questions_are_bounded() -> None:
    t = Terminal()
    a = asker(t)
    open_ = [asyncio.ensure_future(a.ask(f"n{i}.example")) for i in range(asking.MAX_OPEN + 2)]
    await asyncio.sleep(0)
    assert len(t.asked) == asking.MAX_OPEN  # the rest refused at once
    assert [f.result() for f in open_[asking.MAX_OPEN :]] == [False, False]
    for f in t.futures:
        f.set_result("deny")
    await asyncio.gather(*open_)
    a.asked = asking.MAX_ASKED
    assert await a.ask("late.example") is False and len(t.asked) == asking.MAX_OPEN


async def test_the_question_names_the_program_the_host_and_the_port() -> None:
    t = Terminal()
    a = asker(t)
    who = asking.Who(7, "/usr/bin/python3", 4242)
    lookup = asyncio.ensure_future(a.ask("api.example", who=who))
    connect = asyncio.ensure_future(a.ask("cdn.example", 443, asking.Who(9, "node")))
    unknown = asyncio.ensure_future(a.ask("c2.example", 80))
    await asyncio.sleep(0)
    assert t.asked[0].startswith(
        "boxy: pid 7 (/usr/bin/python3, pid 4242 on the host) in the sandbox looks up "
        "api.example, which is not on its allowlist"
    ), t.asked[0]
    assert t.asked[1].startswith("boxy: pid 9 (node) in the sandbox connects to cdn.example:443,")
    assert t.asked[2].startswith(
        "boxy: an unknown process in the sandbox connects to c2.example:80"
    )
    for f in t.futures:
        f.set_result("deny")
    assert list(await asyncio.gather(lookup, connect, unknown)) == [False, False, False]
