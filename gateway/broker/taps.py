"""Subject subscriptions that see every message published to the topics they match.

A tap is the model's at-most-once subscription (NATS core): a plain tap gets every
matching message as it is published; a queue of taps (same subject pattern, same queue
name) gets each message once, round robin. Nothing is queued, acknowledged or retried:
a tap that cannot take a message loses it, as a NATS subscriber does. Taps are matched
by subject pattern, so one tap can cover many topics, including ones created later.
"""

from __future__ import annotations

from typing import Protocol

from gateway.model import Message
from gateway.subjects import SubjectIndex


class Tap(Protocol):
    def tap(self, message: Message, publisher: object | None) -> None: ...


class _Queue:
    """The members of one queue group on one subject pattern."""

    __slots__ = ("members", "turn")

    def __init__(self) -> None:
        self.members: list[Tap] = []
        self.turn = 0

    def tap(self, message: Message, publisher: object | None) -> None:
        members = self.members
        self.turn = (self.turn + 1) % len(members)
        members[self.turn].tap(message, publisher)


class Taps:
    def __init__(self) -> None:
        self._index = SubjectIndex()
        self._queues: dict[tuple[str, str], _Queue] = {}

    def __bool__(self) -> bool:
        return bool(self._index)

    def add(self, pattern: str, tap: Tap, queue: str | None = None) -> None:
        if queue is None:
            self._index.add(pattern, tap)
            return
        group = self._queues.get((pattern, queue))
        if group is None:
            group = self._queues[(pattern, queue)] = _Queue()
            self._index.add(pattern, group)
        group.members.append(tap)

    def remove(self, pattern: str, tap: Tap, queue: str | None = None) -> None:
        if queue is None:
            self._index.remove(pattern, tap)
            return
        group = self._queues.get((pattern, queue))
        if group is None or tap not in group.members:
            return
        group.members.remove(tap)
        if not group.members:
            del self._queues[(pattern, queue)]
            self._index.remove(pattern, group)

    def interested(self, subject: str) -> bool:
        return bool(self._index.match(subject))

    def deliver(self, messages: list[Message], publisher: object | None) -> int:
        """Hand each message to every matching tap (one member per queue); how many got one."""
        if not messages:
            return 0
        targets = self._index.match(messages[0].topic)
        for message in messages:
            for target in targets:
                target.tap(message, publisher)
        return len(targets)
