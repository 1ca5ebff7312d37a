"""Subject subscriptions that see every message published to the topics they match.

A tap is the model's at-most-once subscription (NATS core): a plain tap gets every
matching message as it is published; a queue of taps (same subject pattern, same queue
name) gets each message once, and so do all matching queues of one name together (as
nats-server groups queue subscriptions by name). Nothing is queued, acknowledged or
retried: a tap that cannot take a message loses it, as a NATS subscriber does. Taps are
matched by subject pattern, so one tap can cover many topics, including ones created
later.

Local and remote taps. A tap whose class sets `remote = True` stands for interest held
somewhere else (a NATS cluster route: the subjects a real nats-server asked for). Three
rules follow from how a NATS cluster routes, and the broker keeps them here so that no
protocol has to:

* A message that arrived from a route (`routed` is not None in `deliver`) goes to local
  taps only, never to a remote one: routes never relay, each server routes to every peer
  itself (docs/protocols/nats-route.md §10).
* Such a message reaches a local queue group only when the route named that queue
  (`RMSG ... | workers`): the cluster already chose this gateway as the member that gets
  it. A routed message with no queue names reaches no local queue member.
* A locally published message picks one member per queue group across local members and
  remote ones, each remote member counting with the weight its route announced (how many
  subscribers sit behind it), as nats-server picks among its local members and routes.

`watch` hears every change of *local* interest, so the cluster code can announce it (RS+
and RS-); remote taps are never announced back. `deferred` lets a remote tap see every
match of one message before it acts: a route must send one copy per message, naming every
queue group it was chosen for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.model import Message
from gateway.subjects import SubjectIndex


class Tap(Protocol):
    def tap(self, message: Message, publisher: object | None) -> bool | None:
        """Take the message; False when this tap declines it (its own publisher's echo,
        a subject its subscriber may not receive): a queue group then tries another."""


class DeferredTap(Protocol):
    def tapped(self, message: Message) -> None: ...


# (pattern, queue or None, +1 or -1): a local tap came or went
InterestWatch = Callable[[str, str | None, int], None]


class _Queue:
    """The members of one queue group on one subject pattern."""

    __slots__ = ("local", "name", "remotes", "turn")
    remote = False  # (the queue itself is local; its members may not be)

    def __init__(self, name: str) -> None:
        self.name = name
        self.local: list[Tap] = []
        self.remotes: list[Tap] = []  # each with a `weight`
        self.turn = 0

    @property
    def members(self) -> int:
        return len(self.local) + len(self.remotes)

    def pick(self, routed: tuple[str, ...] | None) -> Tap | None:
        local = self.local
        if routed is not None:
            if not local or self.name not in routed:
                return None
            self.turn = (self.turn + 1) % len(local)
            return local[self.turn]
        remotes = self.remotes
        if not remotes:
            if not local:  # its last member left during this batch
                return None
            self.turn = (self.turn + 1) % len(local)
            return local[self.turn]
        # weighted round robin over local members (weight 1) and routes (their weight)
        total = len(local) + sum([m.weight for m in remotes])  # type: ignore[attr-defined]
        if total == 0:
            return None  # weight 0 is announced but never chosen
        self.turn = turn = (self.turn + 1) % total
        if turn < len(local):
            return local[turn]
        turn -= len(local)
        for member in remotes:
            weight: int = member.weight  # type: ignore[attr-defined]
            if turn < weight:
                return member
            turn -= weight
        return None  # unreachable: turn < total


class Taps:
    def __init__(self) -> None:
        self._index = SubjectIndex()
        self._queues: dict[tuple[str, str], _Queue] = {}
        self.watch: InterestWatch | None = None
        self.deferred: list[DeferredTap] = []
        # deliveries made by the last deliver() (a publisher that asked for no-responders
        # sets it to 0 before publishing: nothing took it, 503)
        self.reached = 0
        self._spin = 0  # which of several queues of one name is tried first

    def __bool__(self) -> bool:
        # asked on every publish: one frame, not two (bool() of the index calls its __len__)
        return self._index.count != 0

    def add(self, pattern: str, tap: Tap, queue: str | None = None) -> None:
        remote = getattr(tap, "remote", False)
        if queue is None:
            self._index.add(pattern, tap)
        else:
            group = self._queues.get((pattern, queue))
            if group is None:
                group = self._queues[(pattern, queue)] = _Queue(queue)
                self._index.add(pattern, group)
            members = group.remotes if remote else group.local
            if tap in members:
                return
            members.append(tap)
        if not remote and self.watch is not None:
            self.watch(pattern, queue, 1)

    def remove(self, pattern: str, tap: Tap, queue: str | None = None) -> None:
        remote = getattr(tap, "remote", False)
        if queue is None:
            if not self._index.remove(pattern, tap):
                return
        else:
            group = self._queues.get((pattern, queue))
            if group is None:
                return
            members = group.remotes if remote else group.local
            if tap not in members:
                return
            members.remove(tap)
            if not group.local and not group.remotes:
                del self._queues[(pattern, queue)]
                self._index.remove(pattern, group)
        if not remote and self.watch is not None:
            self.watch(pattern, queue, -1)

    def interested(self, subject: str) -> bool:
        return bool(self._index.match(subject))

    def deliver(
        self,
        messages: list[Message],
        publisher: object | None,
        routed: tuple[str, ...] | None = None,
    ) -> int:
        """Hand each message to every matching tap (one member per queue); how many
        targets matched. `routed`: the message came from a cluster route, which named
        these queue groups (see the module docstring)."""
        if not messages:
            return 0
        targets = self._index.match(messages[0].topic)
        if not targets:
            return 0
        if routed is not None:
            targets = [t for t in targets if not getattr(t, "remote", False)]
        deferred = self.deferred
        if not self._queues:  # no queue group anywhere: every target is a plain tap
            declined = 0
            for message in messages:
                for target in targets:
                    if target.tap(message, publisher) is False:  # type: ignore[attr-defined]
                        declined += 1
                if deferred:
                    for waiting in deferred:
                        waiting.tapped(message)
                    deferred.clear()
            self.reached += len(targets) * len(messages) - declined
            return len(targets)
        # nats-server puts every matching queue subscription of one queue name in one
        # group, whatever its subject: `job.> q` and `job.* q` share each message
        plain: list[Tap] = []
        named: dict[str, list[_Queue]] = {}
        for target in targets:
            if target.__class__ is _Queue:
                named.setdefault(target.name, []).append(target)  # type: ignore[attr-defined]
            else:
                plain.append(target)  # type: ignore[arg-type]
        for message in messages:
            for tap in plain:
                if tap.tap(message, publisher) is not False:
                    self.reached += 1
            for queues in named.values():
                if self._one_of(queues, message, publisher, routed):
                    self.reached += 1
            if deferred:
                for waiting in deferred:
                    waiting.tapped(message)
                deferred.clear()
        return len(targets)

    def _one_of(
        self,
        queues: list[_Queue],
        message: Message,
        publisher: object | None,
        routed: tuple[str, ...] | None,
    ) -> bool:
        """One member of a queue group takes the message: round robin over its members
        (across the subscriptions of its name), the next one when a member declines it,
        as nats-server goes on until a delivery succeeds."""
        n = len(queues)
        tries = sum([q.members for q in queues])
        start = self._spin
        if n > 1:
            self._spin += 1
        for i in range(tries):
            member = queues[(start + i) % n].pick(routed)
            if member is not None and member.tap(message, publisher) is not False:
                return True
        return False
