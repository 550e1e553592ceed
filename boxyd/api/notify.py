"""--ask-notify: a question nobody else can answer shown as a desktop notification
(org.freedesktop.Notifications, the Desktop Notifications Specification 1.2) whose
actions are the question's choices. An action invoked is the answer; a notification
the user dismissed is a denial; one that expired, or a bus with no notification
server, leaves the question to its timeout (a server that cannot be called gives up
the question at once: refused, never waited on). The body is escaped: a server may
read it as markup, and argv[0] is the payload's to choose."""

from __future__ import annotations

import contextlib
import html
import logging

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from boxy.errors import UsageError
from boxyd.api.buscall import to_the_bus
from boxyd.daemon.asking import Answer, Question, RemoteQuestions

log = logging.getLogger("boxyd")

NOTIFICATIONS = "org.freedesktop.Notifications"
NOTIFICATIONS_PATH = "/org/freedesktop/Notifications"
DISMISSED = 2  # NotificationClosed's reason: the user dismissed it
LABELS = {
    Answer.ONCE: "Allow once",
    Answer.SESSION: "Allow for this session",
    Answer.PROJECT: "Allow for this project",
    Answer.DENY: "Deny",
}
MATCHES = [
    f"type='signal',interface='{NOTIFICATIONS}',member='ActionInvoked'",
    f"type='signal',interface='{NOTIFICATIONS}',member='NotificationClosed'",
]


class Notifier:
    """The notifications shown for questions, by the id the server gave each."""

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        # id -> its question; the server's unique name: only it speaks for its ids
        self._shown: dict[int, tuple[RemoteQuestions, int]] = {}
        self._server = ""

    async def start(self) -> None:
        for rule in MATCHES:
            await self.bus.call(to_the_bus("AddMatch", rule))
        self.bus.add_message_handler(self._signal)

    async def show(self, questions: RemoteQuestions, q: Question) -> None:
        actions: list[str] = []
        for c in q.choices:
            actions += [c.value, LABELS[c]]
        call = Message(
            destination=NOTIFICATIONS, path=NOTIFICATIONS_PATH, interface=NOTIFICATIONS,
            member="Notify", signature="susssasa{sv}i",
            body=["boxy", 0, "", f"boxy: allow {q.host}?", html.escape(q.text()), actions,
                  {"urgency": Variant("y", 2)}, int(q.timeout * 1000)],
        )  # fmt: skip
        try:
            reply = await self.bus.call(call)
        except Exception as e:  # the bus went
            reply, why = None, str(e)
        if reply is None or reply.message_type != MessageType.METHOD_RETURN:
            log.info("--ask-notify: no notification shown (%s)", reply.body if reply else why)
            questions.give_up(q.number)
            return
        nid = int(reply.body[0])
        self._server = reply.sender or ""
        if q.number not in questions.open:  # answered elsewhere meanwhile
            await self._close(nid)
            return
        self._shown[nid] = (questions, q.number)

    async def ended(self, questions: RemoteQuestions, q: Question) -> None:
        """Q is over (answered here or elsewhere, or timed out): its notification goes."""
        for nid, shown in list(self._shown.items()):
            if shown == (questions, q.number):  # one per question
                del self._shown[nid]
                await self._close(nid)

    async def _close(self, nid: int) -> None:
        with contextlib.suppress(Exception):
            await self.bus.call(
                Message(destination=NOTIFICATIONS, path=NOTIFICATIONS_PATH,
                        interface=NOTIFICATIONS, member="CloseNotification",
                        signature="u", body=[nid])
            )  # fmt: skip

    def _signal(self, msg: Message) -> None:
        if msg.message_type != MessageType.SIGNAL or msg.interface != NOTIFICATIONS:
            return
        if not self._server or msg.sender != self._server:  # another connection's say-so
            return
        if msg.member == "ActionInvoked" and msg.signature == "us":
            nid, choice = msg.body
            shown = self._shown.get(nid)  # closed once the question is over (ended)
        elif msg.member == "NotificationClosed" and msg.signature == "uu":
            nid, reason = msg.body
            shown = self._shown.pop(nid, None)
            if reason != DISMISSED:  # expired: the question's own timeout decides
                return
            choice = Answer.DENY.value
        else:
            return
        if shown is not None:
            with contextlib.suppress(UsageError):  # over already, or not a choice offered
                shown[0].answer(shown[1], choice)
