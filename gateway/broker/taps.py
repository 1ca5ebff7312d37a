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

The cluster code hears every change of *local* interest through `watch` (see
`Broker.watch_interest`), so it can announce it (RS+ and RS-); remote taps are never
announced back. A remote tap may need to see every match of one message before it acts (a
route sends one copy per message, naming every queue group it was chosen for): its `tap`
then returns a `Deferred`, told once every tap has seen the message. What a delivery did
is its return value (how many taps took each message), not state left here to read back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gateway.model import Message
from gateway.subjects import SubjectIndex


class Deferred(Protocol):
    def tapped(self, message: Message) -> None:
        """Every tap has seen the message (a route sends its one copy now)."""


class Tap(Protocol):
    """What the broker hands messages to. `remote`, when a class sets it True, marks
    interest held elsewhere (a route's); read only when taps come and go, and for a
    routed message, never per delivery."""

    def tap(self, message: Message, publisher: object | None) -> bool | Deferred | None:
        """Take the message. False when this tap declines it (its own publisher's echo,
        a subject its subscriber may not receive): a queue group then tries another. A
        `Deferred` (a remote tap's route) took it and wants `tapped(message)` once every
        tap has seen it. True or None: taken."""


class Member(Tap, Protocol):
    """A remote queue group member: weighted by the subscribers behind it."""

    weight: int


# (pattern, queue or None, +1 or -1): a local tap came or went
InterestWatch = Callable[[str, str | None, int], None]


class _Queue:
    """The members of one queue group on one subject pattern."""

    __slots__ = ("local", "name", "remotes", "turn")
    remote = False  # (the queue itself is local; its members may not be)

    def __init__(self, name: str) -> None:
        self.name = name
        self.local: list[Tap] = []
        self.remotes: list[Member] = []
        self.turn = 0

    @property
    def members(self) -> int:
        return len(self.local) + len(self.remotes)

    def pick(self, routed: tuple[str, ...] | None) -> Tap | None:
        local = self.local
        remotes = self.remotes
        if routed is not None or not remotes:  # one of the local members
            # none: its last member left during this batch, or a route named another queue
            if not local or (routed is not None and self.name not in routed):
                return None
            self.turn = (self.turn + 1) % len(local)
            return local[self.turn]
        # weighted round robin over local members (weight 1) and routes (their weight)
        total = len(local) + sum([m.weight for m in remotes])
        if total == 0:
            return None  # weight 0 is announced but never chosen
        self.turn = turn = (self.turn + 1) % total
        if turn < len(local):
            return local[turn]
        turn -= len(local)
        for member in remotes:
            weight = member.weight
            if turn < weight:
                return member
            turn -= weight
        return None  # unreachable: turn < total


class Taps:
    def __init__(self) -> None:
        # matched on every publish: plain taps and the _Queue of each queue group
        self._index = SubjectIndex()
        self._queues: dict[tuple[str, str], _Queue] = {}
        self.watch: InterestWatch | None = None  # set through Broker.watch_interest
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
            members: list[Any] = group.remotes if remote else group.local
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
            members: list[Any] = group.remotes if remote else group.local
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
        deliveries were taken, all messages together (0: nobody took any). `routed`: the
        message came from a cluster route, which named these queue groups (see the module
        docstring)."""
        if not messages:
            return 0
        # the index holds taps and _Queues; a tap's class is the caller's, so the one
        # check per target is `is _Queue`, done once per publish, not per message
        targets: list[Any] = self._index.match(messages[0].topic)
        if not targets:
            return 0
        if routed is not None:
            targets = [t for t in targets if not getattr(t, "remote", False)]
        # a tap's answer is True/None (taken), False (declined) or a Deferred: one
        # identity test per delivery when it is True, as a local subscription answers
        deferred: list[Deferred] = []
        reached = 0
        if not self._queues:  # no queue group anywhere: every target is a plain tap
            for message in messages:
                for target in targets:
                    took = target.tap(message, publisher)
                    if took is not True:
                        if took is False:
                            continue
                        if took is not None:
                            deferred.append(took)
                    reached += 1
                if deferred:
                    self._tapped(deferred, message)
            return reached
        # nats-server puts every matching queue subscription of one queue name in one
        # group, whatever its subject: `job.> q` and `job.* q` share each message
        plain: list[Tap] = []
        named: dict[str, list[_Queue]] = {}
        for target in targets:
            if target.__class__ is _Queue:
                named.setdefault(target.name, []).append(target)
            else:
                plain.append(target)
        for message in messages:
            for tap in plain:
                took = tap.tap(message, publisher)
                if took is not True:
                    if took is False:
                        continue
                    if took is not None:
                        deferred.append(took)
                reached += 1
            for queues in named.values():
                if self._one_of(queues, message, publisher, routed, deferred):
                    reached += 1
            if deferred:
                self._tapped(deferred, message)
        return reached

    @staticmethod
    def _tapped(deferred: list[Deferred], message: Message) -> None:
        """Every tap has seen the message. A Deferred is answered once per message by
        its tap (a route matched under several patterns notes the message once)."""
        for waiting in deferred:
            waiting.tapped(message)
        deferred.clear()

    def _one_of(
        self,
        queues: list[_Queue],
        message: Message,
        publisher: object | None,
        routed: tuple[str, ...] | None,
        deferred: list[Deferred],
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
            if member is None:
                continue
            took = member.tap(message, publisher)
            if took is not True:
                if took is False:
                    continue
                if took is not None:
                    deferred.append(took)
            return True
        return False
