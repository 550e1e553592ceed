"""--ask's questions (boxyd/daemon/asking.py, issue 34 §2), with an answerer played by
the test."""

from __future__ import annotations

import asyncio

from boxyd.daemon import asking
from boxyd.daemon.asking import Answer, Asking, Question, Who


class Terminal:
    via = "terminal"

    def __init__(self, here: bool = True) -> None:
        self.here = here
        self.asked: list[Question] = []
        self.ended: list[str] = []
        self.told: list[str] = []
        self.futures: list[asyncio.Future[Answer]] = []
        self.decided: list[tuple[str, Answer, str]] = []

    def can_answer(self) -> bool:
        return self.here

    def put(self, q: Question) -> asyncio.Future[Answer]:
        self.asked.append(q)
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    def end(self, q: Question, answer: Answer | None, line: str) -> None:
        if answer is None:
            self.ended.append(line)
            for f in self.futures:
                if not f.done():
                    f.cancel()
        elif line:
            self.told.append(line)

    async def decide(self, host: str, answer: Answer, via: str) -> str | None:
        self.decided.append((host, answer, via))
        return "written" if answer is Answer.PROJECT else None


def asker(t: Terminal, *others: Terminal, timeout: float = 5) -> Asking:
    return Asking(timeout, lambda: [t, *others], t.decide)


async def test_an_answer_for_the_session_allows_and_is_decided_once_for_every_lookup() -> None:
    t = Terminal()
    a = asker(t)
    lookups = [asyncio.ensure_future(a.ask("api.example")) for _ in range(3)]  # A, AAAA, retry
    await asyncio.sleep(0)
    assert len(t.asked) == 1 and t.asked[0].host == "api.example"
    t.futures[0].set_result(Answer.SESSION)
    assert await asyncio.gather(*lookups) == [True, True, True]
    assert t.decided == [("api.example", Answer.SESSION, "terminal")]


async def test_once_and_project_allow_and_project_says_what_came_of_it() -> None:
    t = Terminal()
    a = asker(t)
    for answer in (Answer.ONCE, Answer.PROJECT):
        looked = asyncio.ensure_future(a.ask(f"{answer.value}.example"))
        await asyncio.sleep(0)
        t.futures[-1].set_result(answer)
        assert await looked is True
    assert t.told == ["written"]
    # `once` is not a refusal: asked about again (the network forgets it, not Asking)
    again = asyncio.ensure_future(a.ask("once.example"))
    await asyncio.sleep(0)
    assert len(t.asked) == 3
    t.futures[-1].set_result(Answer.DENY)
    assert await again is False


async def test_deny_refuses_and_is_not_asked_again() -> None:
    t = Terminal()
    a = asker(t)
    first = asyncio.ensure_future(a.ask("c2.example"))
    await asyncio.sleep(0)
    t.futures[0].set_result(Answer.DENY)
    assert await first is False
    assert await a.ask("c2.example") is False and len(t.asked) == 1
    assert t.decided == [("c2.example", Answer.DENY, "terminal")]


async def test_nobody_to_answer_refuses_at_once() -> None:
    t = Terminal(here=False)
    assert await asyncio.wait_for(asker(t).ask("api.example"), 1) is False
    assert t.asked == [] and t.decided == []


async def test_the_first_answerer_that_can_answer_is_asked() -> None:
    away, bus = Terminal(here=False), Terminal()
    a = asker(away, bus)
    looked = asyncio.ensure_future(a.ask("api.example", 443, Who(77, "node")))
    await asyncio.sleep(0)
    assert away.asked == [] and len(bus.asked) == 1
    q = bus.asked[0]
    assert (q.number, q.host, q.port, q.who) == (1, "api.example", 443, Who(77, "node"))
    bus.futures[0].set_result(Answer.SESSION)
    assert await looked is True


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
        f.set_result(Answer.DENY)
    await asyncio.gather(*open_)
    a.asked = asking.MAX_ASKED
    assert await a.ask("late.example") is False and len(t.asked) == asking.MAX_OPEN


def test_the_question_names_the_program_the_host_and_the_choices() -> None:
    q = Question(3, "api.example", None, Who(7, "/usr/bin/python3", 4242), 60)
    assert q.text() == (
        "boxy: pid 7 (/usr/bin/python3, pid 4242 on the host) in the sandbox looks up "
        "api.example, which is not on its allowlist; "
        "allow [o]nce, for this [s]ession, for this [p]roject, [d]eny (60s)? "
    )
    q = Question(4, "cdn.example", 443, Who(9, "node"), 5, (Answer.ONCE, Answer.DENY))
    assert q.text() == (
        "boxy: pid 9 (node) in the sandbox connects to cdn.example:443, which is not on "
        "its allowlist; allow [o]nce, [d]eny (5s)? "
    )
    q = Question(5, "c2.example", 80, None, 5)
    assert q.text().startswith("boxy: an unknown process in the sandbox connects to c2.example:80")


class OneAtATime:
    """A terminal as PtyRelay is one: a second question while one is shown is refused."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.ended: list[str] = []
        self.typed: asyncio.Future[str] | None = None

    def can_ask(self) -> bool:
        return True

    def ask(self, text: str, keys: dict[str, str]) -> asyncio.Future[str]:
        if self.typed is not None:
            raise ValueError("the terminal holds another question")
        self.shown.append(text)
        self.typed = asyncio.get_running_loop().create_future()
        return self.typed

    def end_question(self, said: str) -> None:
        self.ended.append(said)
        self.typed = None

    def answer(self, value: str) -> None:
        assert self.typed is not None
        self.typed.set_result(value)


async def test_the_terminal_shows_one_question_at_a_time_and_the_others_wait_their_turn() -> None:
    pty = OneAtATime()
    terminal = asking.TerminalQuestions(lambda: pty)
    decided: list[tuple[str, Answer]] = []

    async def decide(host: str, answer: Answer, via: str) -> str | None:
        decided.append((host, answer))
        return None

    a = Asking(30, lambda: [terminal], decide)
    lookups = [asyncio.ensure_future(a.ask(f"n{i}.example")) for i in range(3)]
    await asyncio.sleep(0)
    assert len(pty.shown) == 1 and "n0.example" in pty.shown[0]  # none refused at once
    for i, value in enumerate(["session", "deny", "once"]):
        assert f"n{i}.example" in pty.shown[i] and "(30s)?" in pty.shown[i]
        pty.answer(value)
        await asyncio.sleep(0.01)
    assert await asyncio.gather(*lookups) == [True, False, True]
    assert decided == [("n0.example", Answer.SESSION), ("n1.example", Answer.DENY),
                       ("n2.example", Answer.ONCE)]  # fmt: skip


async def test_a_question_whose_time_ran_out_while_waiting_is_never_shown() -> None:
    pty = OneAtATime()
    terminal = asking.TerminalQuestions(lambda: pty)

    async def decide(host: str, answer: Answer, via: str) -> str | None:
        return None

    a = Asking(0.2, lambda: [terminal], decide)
    first = asyncio.ensure_future(a.ask("first.example"))
    await asyncio.sleep(0)
    late = asyncio.ensure_future(a.ask("late.example"))
    assert await late is False and await first is False  # both timed out
    assert len(pty.shown) == 1 and pty.ended == ["(no answer in 0.2s: first.example refused)"]
