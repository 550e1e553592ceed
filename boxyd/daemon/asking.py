"""--ask (issue 34 §2): a name the allowlist does not hold is asked about, not refused
at once. The session's DNS proxy pauses that lookup (dnsproxy.AskUser) and awaits
``Asking.ask``; the answer widens or narrows the session's policy as `boxyctl allow`
or `deny` would (Network.change), so it is recorded the same way.

Who answers: the client's terminal when one follows the session (the PTY relay asks
there, and the key typed never reaches the payload); otherwise nobody, and the name
is refused at once: a run nobody can answer never waits (the hook's runs, a pipe).
Every question is bounded: TIMEOUT seconds, then refused; at most MAX_OPEN at a time
and MAX_ASKED in a session (a payload that looks up random names gets refusals, not
a stream of prompts); a name refused once is not asked about again.
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Callable
from dataclasses import dataclass

from boxyd.daemon.seam import Caller

MAX_OPEN = 4  # questions waiting at once
MAX_ASKED = 32  # questions in a session


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


class Answer(enum.Enum):
    SESSION = "session"  # allowed for the rest of the session
    DENY = "deny"  # refused for the rest of the session


KEYS = {"s": Answer.SESSION.value, "d": Answer.DENY.value}
Prompt = Callable[[str, dict[str, str]], "asyncio.Future[str]"]


class Asking:
    """One session's questions. PROMPT: the terminal's ask (None: nobody can answer
    now), asked anew for each question; END: closes an unanswered prompt's line;
    DECIDE: applies an answer to the policy (HOST, the answer, who gave it)."""

    def __init__(
        self,
        timeout: float,
        prompt: Callable[[], Prompt | None],
        end: Callable[[str], None],
        decide: Callable[[str, Answer, Caller], None],
    ) -> None:
        self.timeout = timeout
        self._prompt, self._end, self._decide = prompt, end, decide
        self._open: dict[str, asyncio.Future[bool]] = {}
        self._refused: set[str] = set()
        self.asked = 0

    async def ask(self, host: str, port: int | None = None, who: Who | None = None) -> bool:
        """May HOST be looked up (PORT None) or connected to on PORT after all? WHO: the
        program that asked, if known. False at once when nobody can answer."""
        if host in self._refused:
            return False
        if host in self._open:  # its A and AAAA, a retry: one question
            return await asyncio.shield(self._open[host])
        prompt = self._prompt()
        if prompt is None or len(self._open) >= MAX_OPEN or self.asked >= MAX_ASKED:
            return False
        self.asked += 1
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._open[host] = done
        try:
            allowed = await self._put(prompt, host, port, who)
        finally:
            del self._open[host]
        done.set_result(allowed)
        return allowed

    async def _put(self, prompt: Prompt, host: str, port: int | None, who: Who | None) -> bool:
        what = f"looks up {host}" if port is None else f"connects to {host}:{port}"
        text = (
            f"boxy: {who or 'an unknown process'} in the sandbox {what}, "
            "which is not on its allowlist; "
            f"allow it for this [s]ession, or [d]eny ({self.timeout:g}s)? "
        )
        try:
            typed = prompt(text, KEYS)
        except ValueError:  # the terminal went, or holds another question
            return False
        await asyncio.wait({typed}, timeout=self.timeout)
        if not typed.done() or typed.cancelled():  # no answer in time, or the client went
            self._end(f"(no answer in {self.timeout:g}s: {host} refused)")
            self._refused.add(host)
            return False
        answer = Answer(typed.result())
        self._decide(host, answer, Caller(os.getuid(), None, "terminal"))
        if answer is Answer.DENY:
            self._refused.add(host)
        return answer is Answer.SESSION
