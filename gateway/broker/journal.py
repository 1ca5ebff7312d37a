"""The journal: the broker's one door to its store.

Every change the broker makes to a queue that outlives the process goes through here, in
the order it happens, and nothing else in the gateway calls the store. Ephemeral topics and
groups (NSQ `#ephemeral`, NATS plain subscriptions) get `NULL_JOURNAL`, which records
nothing, so the queue code never asks "is this stored?".

The broker keeps deadlines and deferrals on Trio's clock (tests drive it with MockClock);
the store keeps wall-clock times, because Trio's clock starts at a random offset in every
run. The conversion happens here, in both directions.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import trio

from gateway.model import Message
from gateway.stores.base import Delivery, GroupRecorder, Key, Store

if TYPE_CHECKING:
    from gateway.broker.group import Group
    from gateway.broker.topic import Topic
    from gateway.stores.redis_reads import Found

# ids are reserved in blocks, so that handing one out costs no store write, and a restart
# starts after the block: an id seen by a client is never handed out again. Reservations
# run a block ahead of use: a message may reach a consumer before its publish is
# committed, so the record that covers its id must have been written before, not with it.
ID_BLOCK = 1 << 16


def to_wall(deliver_at: float) -> float:
    """A broker-clock time (0: now) as wall-clock seconds since the epoch (0: now)."""
    if deliver_at <= 0.0:
        return 0.0
    return deliver_at - trio.current_time() + time.time()


def from_wall(due: float) -> float:
    """A stored wall-clock due time as a broker-clock time (0: due already)."""
    if due <= 0.0:
        return 0.0
    left = due - time.time()
    return trio.current_time() + left if left > 0 else 0.0


class Journal:
    __slots__ = ("ceiling", "reserved", "store")

    def __init__(self, store: Store) -> None:
        self.store = store
        # the last id reserved in the store, and a block below it the point past which
        # the next block is reserved; the broker compares each publish's last id with
        # `ceiling` before calling ids_used (one test instead of a call)
        self.reserved = 0
        self.ceiling = 0

    def opened(self, last_id: int) -> None:
        """The store's last id: the first block is reserved now (the broker commits it
        before it serves), unless the store hands out the ids itself."""
        self.reserved = self.ceiling = last_id
        if not self.store.allocates_ids:
            self._reserve(last_id)

    # -- messages --------------------------------------------------------------

    def put(self, topic: Topic, groups: Sequence[Group], messages: Sequence[Message]) -> None:
        """One publish's messages into `groups` (none: the topic's backlog). Ephemeral
        groups are left out; the body is stored once for all of the others."""
        due = messages[0].deliver_at
        wall = to_wall(due) if due > 0.0 else 0.0
        if len(groups) == 1:  # the common case: the group's own door (a no-op if ephemeral)
            groups[0].recorder.put(messages, wall)
            return
        names = [g.name for g in groups if not g.ephemeral]
        if groups and not names:
            return
        self.store.put(topic.name, names, messages, wall)

    def changed(
        self,
        group: Group,
        message: Message,
        *,
        buried: bool = False,
        priority_was: int | None = None,
        expect: str = "*",
    ) -> None:
        """Attempts (a delivery), priority (then `priority_was` is the old one), delay or
        burial of one message changed. `expect` (a shared store): where the message must
        still be for the change to apply, "f" = claimed by this gateway (claims.py)."""
        self.store.update(
            group.topic.name,
            group.name,
            message,
            to_wall(message.deliver_at),
            buried=buried,
            priority_was=priority_was,
            # a claim exists only in a shared store: its owner alone may still change it
            expect=expect if self.store.shares else "*",
        )

    def recorder(self, group: Group) -> GroupRecorder:
        """The group's door for its deliveries and finishes (see GroupRecorder)."""
        if self.store.shares:
            return _ClaimRecorder(self.store, group.topic.name, group.name)
        return self.store.recorder(group.topic.name, group.name)

    async def kick(self, group: Group, n: int) -> tuple[int, list[Message]]:
        """A shared store's buried (or deferred) messages: up to `n` of them ready again
        now; how many there were, and which when the group is archived."""
        return await self.store.kick(  # type: ignore[attr-defined,no-any-return]
            group.topic.name, group.name, n, messages=group.archive is not None
        )

    def touched(self, group: Group, message: Message, deadline: float) -> None:
        if self.store.shares:
            self.store.touched(group.topic.name, group.name, message, to_wall(deadline))  # type: ignore[attr-defined]

    def removed(self, group: Group, messages: Iterable[Message]) -> None:
        self.store.remove(group.topic.name, group.name, messages)

    def backlog_removed(self, topic: Topic, messages: Iterable[Message]) -> None:
        self.store.remove(topic.name, None, messages)

    def ids_used(self, last_id: int) -> None:
        if last_id > self.ceiling:
            self._reserve(last_id)

    def _reserve(self, last_id: int) -> None:
        # two blocks past the last id used, the next reservation due after one: the ids
        # a publish takes were covered a block of ids earlier
        self.reserved = last_id + 2 * ID_BLOCK
        self.ceiling = last_id + ID_BLOCK
        self.store.reserve_ids(self.reserved)

    async def load(self, group: Group, after: Key, limit: int) -> list[Message]:
        """Page in ready messages a durable store kept on disk, broker clock (due now)."""
        return await self.store.load(group.topic.name, group.name, after, limit)

    # -- reading a shared store (Redis): queue state other gateways changed ----------

    async def find(self, where: Sequence[tuple[str, Sequence[str]]], msg_id: int) -> Found | None:
        """Message `msg_id` in the first (topic, groups) of `where` holding it; wall-clock
        times as the store keeps them (query.py converts)."""
        return await self.store.find(where, msg_id)  # type: ignore[attr-defined,no-any-return]

    async def peek(self, topic: str, group: str, state: str, limit: int) -> list[Found]:
        return await self.store.peek(topic, group, state, limit)  # type: ignore[attr-defined,no-any-return]

    async def claim_id(self, group: Group, msg_id: int, lease: float) -> Message | None:
        """One particular message claimed for a delivery here (beanstalkd reserve-job)."""
        return await self.store.claim_id(group.topic.name, group.name, msg_id, lease)  # type: ignore[attr-defined,no-any-return]

    # -- topics and groups -----------------------------------------------------

    def topic_added(self, topic: Topic) -> None:
        self.store.add_topic(topic.name)

    def topic_dropped(self, topic: Topic) -> None:
        self.store.drop_topic(topic.name)

    def group_added(self, group: Group) -> None:
        self.store.add_group(group.topic.name, group.name)

    def group_dropped(self, group: Group) -> None:
        self.store.drop_group(group.topic.name, group.name)

    def backlog_fanned_out(self, topic: Topic, groups: Sequence[Group]) -> None:
        self.store.fan_out_backlog(topic.name, [g.name for g in groups if not g.ephemeral])

    def cleared(self, topic: Topic, group: Group | None) -> None:
        self.store.clear(topic.name, None if group is None else group.name)

    def paused(self, topic: Topic, group: Group | None, paused: bool) -> None:
        self.store.set_paused(topic.name, None if group is None else group.name, paused)


class _ClaimRecorder(GroupRecorder):
    """A shared store's: a delivery keeps the claim of this gateway until its deadline."""

    __slots__ = ()

    def delivered(self, message: Message, deadline: float) -> None:
        self.store.claimed(self.topic, self.group, message, to_wall(deadline))  # type: ignore[attr-defined]


class _NullRecorder(GroupRecorder):
    __slots__ = ()

    def put(self, messages: Sequence[Message], due: float) -> None:
        pass

    def delivered(self, message: Message, deadline: float) -> None:
        pass

    def delivered_all(self, deliveries: Iterable[Delivery]) -> None:
        pass

    def finished(self, message: Message) -> None:
        pass


_NULL_RECORDER = _NullRecorder(None, "", "")  # type: ignore[arg-type]


class _NullJournal(Journal):
    """For ephemeral topics and groups: records nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]

    def put(self, topic: Topic, groups: Sequence[Group], messages: Sequence[Message]) -> None:
        pass

    def changed(
        self,
        group: Group,
        message: Message,
        *,
        buried: bool = False,
        priority_was: int | None = None,
        expect: str = "*",
    ) -> None:
        pass

    def recorder(self, group: Group) -> GroupRecorder:
        return _NULL_RECORDER

    def touched(self, group: Group, message: Message, deadline: float) -> None:
        pass

    def removed(self, group: Group, messages: Iterable[Message]) -> None:
        pass

    def backlog_removed(self, topic: Topic, messages: Iterable[Message]) -> None:
        pass

    def ids_used(self, last_id: int) -> None:
        pass

    async def load(self, group: Group, after: Key, limit: int) -> list[Message]:
        return []

    def topic_added(self, topic: Topic) -> None:
        pass

    def topic_dropped(self, topic: Topic) -> None:
        pass

    def group_added(self, group: Group) -> None:
        pass

    def group_dropped(self, group: Group) -> None:
        pass

    def backlog_fanned_out(self, topic: Topic, groups: Sequence[Group]) -> None:
        pass

    def cleared(self, topic: Topic, group: Group | None) -> None:
        pass

    def paused(self, topic: Topic, group: Group | None, paused: bool) -> None:
        pass


NULL_JOURNAL: Journal = _NullJournal()
