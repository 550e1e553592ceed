"""--ask (issue 34 §2): a name the allowlist does not hold is asked about, not refused
at once. The session's DNS proxy pauses that lookup (dnsproxy.AskUser) and awaits
``Asking.ask``; the answer widens or narrows the session's policy as `boxyctl allow`
or `deny` would (Network.change), so it is recorded the same way.

Who answers (docs/design.md, "Ask on a denial"): the first Answerer that can answer
now, in the order the session gives them: the client's terminal while one follows the
session (the PTY relay asks there, and the key typed never reaches the payload), then
the bus (a desktop tool that said it answers, or a notification the user opted into).
When none can, nobody answers and the name is refused at once: a run nobody can
answer never waits (the hook's runs, a pipe, -d with nobody watching).

Every question is bounded: TIMEOUT seconds, then refused; at most MAX_OPEN at a time
and MAX_ASKED in a session (a payload that looks up random names gets refusals, not
a stream of prompts); a name refused once is not asked about again.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from boxy.errors import UsageError
from boxy.values import parse_host_name

MAX_OPEN = 4  # questions waiting at once
MAX_ASKED = 32  # questions in a session
MIN_LEFT = 1.0  # seconds a question that waited its turn must still have to be shown


class Answer(enum.Enum):
    ONCE = "once"  # this lookup, and connections to its answer for a few seconds
    SESSION = "session"  # allowed for the rest of the session
    PROJECT = "project"  # the session, and written into .boxy.yaml and approved
    DENY = "deny"  # refused for the rest of the session

    @property
    def allows(self) -> bool:
        return self is not Answer.DENY


# the terminal's keys, in the order the question offers them
KEYS: dict[str, Answer] = {
    "o": Answer.ONCE,
    "s": Answer.SESSION,
    "p": Answer.PROJECT,
    "d": Answer.DENY,
}
_LABELS = {
    Answer.ONCE: "allow [o]nce",
    Answer.SESSION: "for this [s]ession",
    Answer.PROJECT: "for this [p]roject",
    Answer.DENY: "[d]eny",
}


@dataclass(frozen=True)
class Who:
    """The program that asked (boxyd/daemon/who.py): PID as the payload sees it, its
    argv[0] made safe for a terminal, and HOST_PID, the same process from the host."""

    pid: int
    argv0: str
    host_pid: int | None = None

    def __str__(self) -> str:
        host = f", pid {self.host_pid} on the host" if self.host_pid is not None else ""
        return f"pid {self.pid} ({self.argv0}{host})"


@dataclass(frozen=True)
class Question:
    """One question: NUMBER is its id within the session (the bus's Answer names it)."""

    number: int
    host: str
    port: int | None
    who: Who | None
    timeout: float
    choices: tuple[Answer, ...] = tuple(KEYS.values())

    def text(self, left: float | None = None) -> str:
        """The question in one line, for a terminal or a notification; LEFT: the seconds
        it still has, when it waited its turn."""
        what = f"connects to {self.host}:{self.port}" if self.port else f"looks up {self.host}"
        offered = ", ".join(_LABELS[c] for c in self.choices)
        return (
            f"boxy: {self.who or 'an unknown process'} in the sandbox {what}, which is "
            f"not on its allowlist; {offered} ({_seconds(self.timeout, left)})? "
        )


def _seconds(timeout: float, left: float | None) -> str:
    return f"{timeout:g}s" if left is None else f"{left:.0f}s"


class Answerer(Protocol):
    """Where a question can be put: the terminal, the bus. VIA: how the audit log
    names the wire an answer came by."""

    via: str

    def can_answer(self) -> bool:
        """Someone is there to answer now."""
        ...

    def put(self, q: Question) -> asyncio.Future[Answer]:
        """Ask Q; the future is the answer. ValueError: it cannot take Q now."""
        ...

    def end(self, q: Question, answer: Answer | None, line: str) -> None:
        """Q is over: ANSWER (None: unanswered in time), and LINE, what came of it
        (`project`: whether .boxy.yaml was written; "" when nothing is to be said)."""
        ...


# Decide: applies an answer (HOST, the answer, the wire it came by: the answerer's
# `via`); returns the line said where the question was asked (None: nothing to add):
# `project` says whether .boxy.yaml was written
Decide = Callable[[str, Answer, str], Awaitable[str | None]]


class Asking:
    """One session's questions. ANSWERERS: where a question may go now, in order;
    DECIDE: applies an answer to the policy."""

    def __init__(
        self,
        timeout: float,
        answerers: Callable[[], Sequence[Answerer]],
        decide: Decide,
        choices: tuple[Answer, ...] = tuple(KEYS.values()),
    ) -> None:
        self.timeout = timeout
        self.choices = choices
        self._answerers, self._decide = answerers, decide
        self._open: dict[str, asyncio.Future[bool]] = {}
        self._refused: set[str] = set()
        self.asked = 0

    async def ask(self, host: str, port: int | None = None, who: Who | None = None) -> bool:
        """May HOST be looked up (PORT None) or connected to on PORT after all? WHO: the
        program that asked, if known. False at once when nobody can answer."""
        if host in self._refused or not askable(host):
            return False
        if host in self._open:  # its A and AAAA, a retry: one question
            return await asyncio.shield(self._open[host])
        answerer = next((a for a in self._answerers() if a.can_answer()), None)
        if answerer is None or len(self._open) >= MAX_OPEN or self.asked >= MAX_ASKED:
            return False
        self.asked += 1
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._open[host] = done
        q = Question(self.asked, host, port, who, self.timeout, self.choices)
        try:
            allowed = await self._put(answerer, q)
        finally:
            del self._open[host]
        done.set_result(allowed)
        return allowed

    async def _put(self, answerer: Answerer, q: Question) -> bool:
        try:
            typed = answerer.put(q)
        except ValueError:  # the terminal went, or holds another question
            return False
        try:
            await asyncio.wait({typed}, timeout=self.timeout)
        except asyncio.CancelledError:  # the run ends: the question with it, unanswered
            answerer.end(q, None, f"(the run ended: {q.host} refused)")
            raise
        if not typed.done() or typed.cancelled():  # no answer in time, or the client went
            answerer.end(q, None, f"(no answer in {self.timeout:g}s: {q.host} refused)")
            self._refused.add(q.host)
            return False
        answer = typed.result()
        line = await self._decide(q.host, answer, answerer.via)
        answerer.end(q, answer, line or "")
        if answer is Answer.DENY:
            self._refused.add(q.host)
        return answer.allows


def askable(host: str) -> bool:
    """HOST is a name an answer may allow as itself: a DNS name as --allow-host reads
    one. Not an address: a lookup of "203.0.113.7" allowed would let the payload
    connect to that address, hard-coded, when the question only named a lookup."""
    try:
        return parse_host_name(host, what="--ask") == host and "*" not in host
    except UsageError:
        return False


class TerminalQuestions:
    """The client's terminal as an Answerer (PtyRelay.ask: one key, never the payload's).
    A terminal shows one question at a time: the others wait their turn here, in the
    order asked, their time running (each says what is left of it when shown)."""

    via = "terminal"

    def __init__(self, pty: Callable[[], _Pty | None]) -> None:
        self._pty = pty
        self._shown: Question | None = None
        # each waiting question, its answer, since when it waits (None: it never did)
        self._waiting: collections.deque[tuple[Question, asyncio.Future[Answer], float | None]] = (
            collections.deque()
        )

    def can_answer(self) -> bool:
        pty = self._pty()
        return pty is not None and pty.can_ask()

    def put(self, q: Question) -> asyncio.Future[Answer]:
        if self._pty() is None:
            raise ValueError("no terminal")
        out: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append((q, out, time.monotonic() if self._shown else None))
        if self._shown is None:
            self._next()
        return out

    def _next(self) -> None:
        """The next waiting question that is still open, on the terminal."""
        while self._waiting and self._shown is None:
            q, out, since = self._waiting.popleft()
            pty = self._pty()
            if out.done():
                continue
            if pty is None:
                out.cancel()
                continue
            keys = {k: a.value for k, a in KEYS.items() if a in q.choices}
            left = None if since is None else q.timeout - (time.monotonic() - since)
            if left is not None and left < MIN_LEFT:  # no time to read it: refused unseen
                out.cancel()
                continue
            try:
                typed = pty.ask(q.text(left), keys)
            except ValueError:  # the terminal went
                out.cancel()
                continue
            self._shown = q
            typed.add_done_callback(functools.partial(_settle, out))

    def end(self, q: Question, answer: Answer | None, line: str) -> None:
        if q is not self._shown:  # over before its turn came (its time ran out waiting)
            return
        self._shown = None
        pty = self._pty()
        if pty is not None:  # (the payload's output, held while Q was open, flows again)
            pty.end_question(line)
        self._next()


def _settle(out: asyncio.Future[Answer], typed: asyncio.Future[str]) -> None:
    if out.done():
        return
    if typed.cancelled() or typed.exception() is not None:
        out.cancel()
    else:
        out.set_result(Answer(typed.result()))


class _Pty(Protocol):
    def can_ask(self) -> bool: ...
    def ask(self, text: str, keys: dict[str, str]) -> asyncio.Future[str]: ...
    def end_question(self, said: str) -> None: ...


class RemoteQuestions:
    """A session's questions put to clients over a wire (D-Bus: the AskDenied signal,
    the Answer method, a notification). The wire's adapter says when someone there can
    answer (CAN: a client said it answers, or the user opted into notifications) and
    follows PUT and ENDED to say each question and how it ended; without one, nobody
    answers here."""

    via = "D-Bus"

    def __init__(self) -> None:
        self.can: Callable[[], bool] = lambda: False
        self.on_put: list[Callable[[Question], None]] = []
        self.on_end: list[Callable[[Question, Answer | None, str], None]] = []
        self.open: dict[int, tuple[Question, asyncio.Future[Answer]]] = {}

    def can_answer(self) -> bool:
        return self.can()

    def put(self, q: Question) -> asyncio.Future[Answer]:
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.open[q.number] = (q, fut)
        for said in self.on_put:
            said(q)
        return fut

    def answer(self, number: int, choice: str) -> str:
        """A client's answer to question NUMBER (CHOICE: an Answer's value). Returns
        the host; UsageError when no such question is open or CHOICE was not offered."""
        if number not in self.open:
            raise UsageError(f"Answer: no question {number} is open (answered, or timed out)")
        q, fut = self.open[number]
        offered = {c.value: c for c in q.choices}
        if choice not in offered:
            raise UsageError(f"Answer: {choice!r} is not one of {', '.join(offered)}")
        del self.open[number]
        if not fut.done():
            fut.set_result(offered[choice])
        return q.host

    def give_up(self, number: int) -> None:
        """Question NUMBER cannot be put after all (no notification server): refused
        at once, not left to its timeout."""
        got = self.open.get(number)
        if got is not None and not got[1].done():
            got[1].cancel()

    def end(self, q: Question, answer: Answer | None, line: str) -> None:
        got = self.open.pop(q.number, None)
        if got is not None and not got[1].done():
            got[1].cancel()
        for said in self.on_end:
            said(q, answer, line)
