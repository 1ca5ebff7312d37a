"""A group's queue in a shared store (Redis): several gateways serve one queue.

With a store several gateways share, Redis is the authority for every stored group: the
group's `SharedQueue` keeps only what this gateway claimed, and the broker-wide `Claims`
claims for it. When its consumers have room, the claimer takes up to that
many of the most urgent ready messages from Redis in one atomic step (they are then
claimed by this gateway, with a deadline), puts them in the group's ready queue and lets
the group dispatch them as usual. A delivery moves the claim's deadline to the consumer's
(msg_timeout, TTR, TOUCH); a finish removes the message; a requeue, timeout or bury gives
it back to Redis, where any gateway may claim it. Claims whose deadline passes (a gateway
that died) are made ready again by the next claim of any gateway, attempts counted.

A gateway learns that there is something to claim from the publishes it makes itself,
from Redis pub/sub notifications of the others' (so an idle consumer on B gets a message
published on A within a round trip), and, for deferred messages and expiring claims, from
the next due time each claim returns. The registry (topics, groups, pause) and the
shared counts are refreshed every `REFRESH` seconds, so /stats and /lookup show the same
queues and depths on every gateway.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Iterable
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING

import trio

from gateway.archive import events
from gateway.broker.errors import StoreUnavailable
from gateway.broker.queues import Queue

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.broker.group import Consumer, Group
    from gateway.broker.journal import SharedJournal
    from gateway.broker.members import InFlight
    from gateway.broker.topic import Topic
    from gateway.model import Message

log = logging.getLogger("gateway.broker")
_PRIORITY = attrgetter("priority")

CLAIM_LEASE = 60.0  # seconds, for consumers that name no timeout
# The longest a claim lasts: a delivery with no deadline (a RocketMQ pull, in flight until
# its offset is committed) is claimed this long, RocketMQ's own consumeTimeout; Redis needs
# a finite time, after which another gateway may deliver it if this one died holding it.
MAX_LEASE = 15 * 60.0
CLAIM_BATCH = 512  # at most this many messages per claim (one round trip)
# A claim lasts this much longer than its consumers' timeout, so that a delivery made
# within that time after the claim is covered by it: its deadline needs no write of its
# own (a message per delivery otherwise, most of Redis's time for an NSQ consumer, whose
# every delivery has the claim's timeout). A gateway that dies holding it loses the
# message to the others this much later.
LEASE_SLACK = 1.0
REFRESH = 1.0  # seconds between registry and count refreshes; also the idle re-check
_RETRY = 0.5


class SharedQueue(Queue):
    """A stored group's queue when the store is shared: the store keeps it, the group
    holds what this gateway claimed (ready until delivered, at once) and delivered."""

    elsewhere = True

    def __init__(self, group: Group, claims: Claims, journal: SharedJournal) -> None:
        self.group = group
        self.claims = claims
        self.journal = journal
        # the group's messages in the store, as the last refresh read them
        self.stored_ready = self.stored_delayed = self.stored_buried = 0
        self.stored_buried_head: Message | None = None
        # while a claim's messages are handed out (they are, at once, or go back): when
        # that claim ends (broker clock); None otherwise
        self._claim_ends: float | None = None

    def hand_out(self, msgs: list[Message], ends: float) -> None:
        """A claim's messages (in (priority, id) order) into the ready queue, one extend
        per priority (a deque's extend in C), then dispatched to the consumers with room;
        the claim ends at `ends`."""
        group = self.group
        for _, same in groupby(msgs, _PRIORITY):
            group.ready.extend(list(same))
        self._claim_ends = ends
        try:
            group.pump()
        finally:
            self._claim_ends = None

    def uncovered(self, entries: Iterable[InFlight]) -> list[InFlight]:
        """The deliveries among `entries` whose claim does not already last until their
        deadline, ending at most 2 x LEASE_SLACK after it: the others need no write (Redis
        keeps the claim's end as the message's deadline). A claimed message is delivered
        in the claimer's own dispatch, or given back, so only a delivery made during that
        dispatch (`_claim_ends` set) can be covered."""
        ends = self._claim_ends
        if ends is None:
            return list(entries)
        starts = ends - 2 * LEASE_SLACK
        return [e for e in entries if not starts <= e.deadline <= ends]

    def admit(self, messages: list[Message]) -> None:
        # recorded in the store, which every gateway claims from
        if self.group.consumers_wait:
            self.claims.fed(self.group)

    def starving(self) -> None:
        self.claims.want(self.group)

    def refill(self, waiting: bool) -> None:
        if waiting:
            self.claims.want(self.group)

    def push_ready(self, msg: Message) -> bool:
        self.group.ready.push(msg)
        return True

    def returned(self, msg: Message, delay: float, now: float, priority_was: int | None) -> None:
        # back to the store, for whichever gateway claims it next
        msg.deliver_at = now + delay if delay > 0 else 0.0
        self.journal.changed(self.group, msg, priority_was=priority_was, expect="f")

    def buried(self, msg: Message, priority_was: int | None) -> None:
        # buried in the store (if still claimed here): any gateway kicks it
        self.stored_buried += 1
        self.journal.changed(self.group, msg, buried=True, priority_was=priority_was, expect="f")

    def detached(self) -> None:
        if not any(c.attached for c in self.group.consumers):
            self.closing()  # claimed for consumers that left: any gateway may have them now

    def closing(self) -> None:
        self.give_back(self.group.ready.clear())

    def give_back(self, msgs: list[Message]) -> None:
        """Claimed messages not delivered: ready in the store again, for any gateway."""
        for m in msgs:
            self.journal.changed(self.group, m, expect="f")

    async def kick(self, bound: int) -> int:
        """Kicked in the store, whichever gateway buried or deferred them."""
        group = self.group
        kicked, which = await self.journal.kick(group, bound)
        if group.archive is not None:
            for msg in which:
                group.archive.record(events.KICKED, msg, group.name)
        self.stored_buried_head = None
        # the shared counts as they now are, until the next refresh reads them
        if self.stored_buried:
            self.stored_buried = max(0, self.stored_buried - kicked)
        else:
            self.stored_delayed = max(0, self.stored_delayed - kicked)
        return kicked

    def kick_stored(self, msg: Message, *, buried: bool) -> None:
        """Ready again in the store, for any gateway, if it is still buried (deferred)
        there."""
        group = self.group
        msg.deliver_at = 0.0
        self.journal.changed(group, msg, expect="b" if buried else "d")
        if group.archive is not None:
            group.archive.record(events.KICKED, msg, group.name)
        if buried:
            self.stored_buried = max(0, self.stored_buried - 1)
            self.stored_buried_head = None
        else:
            self.stored_delayed = max(0, self.stored_delayed - 1)

    async def take_stored(self, consumer: Consumer, msg_id: int) -> Message | None:
        """Claimed from the store for `consumer` alone (beanstalkd reserve-job of a job
        another gateway deferred or buried, or nobody claimed yet), whatever the window."""
        group = self.group
        msg = await self.journal.claim_id(group, msg_id, consumer.timeout or CLAIM_LEASE)
        if msg is None:
            return None
        if group.deleted or not consumer.attached:
            self.give_back([msg])
            return None
        return group.take_claimed(consumer, msg)

    async def delete_stored(self, msg_id: int) -> bool:
        """The claim makes the removal atomic: a gateway that claims it first keeps it,
        and this one then finds nothing. Committed by the next flush."""
        msg = await self.journal.claim_id(self.group, msg_id, CLAIM_LEASE)
        if msg is None:
            return False
        self.group.delete_claimed(msg)
        return True


class Claims:
    """The broker-wide claimer: claims for the groups whose consumers have room, and
    refreshes the registry and the shared counts."""

    def __init__(self, broker: Broker, journal: SharedJournal) -> None:
        self.broker = broker
        self.journal = journal
        self._wanted: dict[Group, None] = {}
        # groups whose last claim found Redis without a ready message for them, with no
        # sign of a new one since: room alone (a FIN, a RDY) does not send a claim for
        # them, so an idle consumer costs no round trip per acknowledgement
        self._drained: weakref.WeakSet[Group] = weakref.WeakSet()
        self._event = trio.Event()
        self._wake_at = math.inf  # broker clock: the earliest due time a claim reported

    # -- asking for claims -----------------------------------------------------

    def want(self, group: Group) -> None:
        """A group's consumers may have room: claim for it soon, unless Redis had nothing
        for it at the last claim and nothing was published, requeued or kicked since."""
        if group not in self._wanted and group not in self._drained:
            self._wanted[group] = None
            self._event.set()

    def fed(self, group: Group) -> None:
        """Redis may have ready messages for `group` (a publish, a notification)."""
        self._drained.discard(group)
        self.want(group)

    def notified(self, topic: str) -> None:
        """Another gateway (or this one) made messages of `topic` ready."""
        t = self.broker.topics.get(topic)
        if t is None:
            return
        for group in t.groups.values():
            if group.consumers and not group.ephemeral:
                self.fed(group)

    @staticmethod
    def room(group: Group) -> int:
        free = sum(
            c.ready - c.in_flight for c in group.consumers if c.attached and c.ready > c.in_flight
        )
        return free - len(group.ready)

    # -- the claimer -----------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._refresher)
            await self._claimer()

    async def _claimer(self) -> None:
        while True:
            with trio.move_on_at(min(self._wake_at, trio.current_time() + REFRESH)):
                await self._event.wait()
            self._event = trio.Event()
            if trio.current_time() >= self._wake_at or not self._wanted:
                # a due time came, or the idle re-check: every group with room
                self._wake_at = math.inf
                self._drained.clear()
                for t in list(self.broker.topics.values()):
                    for g in t.groups.values():
                        if g.consumers and isinstance(g.queue, SharedQueue):
                            self._wanted.setdefault(g, None)
            while self._wanted:
                group = next(iter(self._wanted))
                del self._wanted[group]
                try:
                    await self._claim(group)
                except StoreUnavailable as exc:
                    if self.journal.failed is None:  # else the store has said so already
                        log.warning("%s: claiming failed: %s", self.journal.where, exc)
                    await trio.sleep(_RETRY)
                    self._wanted.setdefault(group, None)

    async def _claim(self, group: Group) -> None:
        if group.deleted or group.paused or group.topic.paused:
            return
        n = min(self.room(group), CLAIM_BATCH)
        if n <= 0:
            return
        # until delivered (at once), a claim lasts as long as a delivery would
        lease = max((c.timeout for c in group.consumers), default=0.0) or CLAIM_LEASE
        lease = min(lease, MAX_LEASE) + LEASE_SLACK  # MAX_LEASE: RocketMQ's pulls have none
        start = trio.current_time()
        msgs, due = await self.journal.claim(group, n, lease)
        if due is not None:
            self._wake_at = min(self._wake_at, due + 0.001)
        if len(msgs) < n and group not in self._wanted:
            self._drained.add(group)  # nothing more now; a notification says when
        if not msgs:
            return
        queue = group.queue
        assert isinstance(queue, SharedQueue)
        if group.deleted:
            queue.give_back(msgs)
            return
        queue.hand_out(msgs, start + lease)
        if group.ready:
            # The room went while the claim was on the wire (RDY lowered, a reserve
            # timed out): what no consumer took goes back to Redis now. Kept here, it
            # would be delivered after its claim ran out, when another gateway may
            # deliver it too.
            queue.give_back(group.ready.clear())
            return
        if len(msgs) == n:
            self.want(group)  # there may be more, and room for them

    # -- the shared registry and counts ----------------------------------------

    async def _refresher(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # a lost connection shows as the store's health
                log.debug("%s: refresh: %s", self.journal.where, exc)
            await trio.sleep(REFRESH)

    async def adopt(self, name: str) -> None:
        """Topic `name` as the registry has it now, with its groups and pause states: one
        another gateway made a moment ago is made here at once rather than at the next
        refresh (a client told OK there may act on it here straight away)."""
        entry = await self.journal.registered(name)
        if entry is None:
            return
        await self.read_counts([self._as_registered(name, *entry)])

    def _as_registered(self, name: str, paused: bool, groups: dict[str, bool]) -> Topic:
        """Topic `name` here with its groups and pause states as the registry has them.
        Made here, not recorded: written back, a name another gateway deleted during the
        read would come back."""
        t = self.broker.topic(name, record=False)
        assert t is not None
        t.paused = paused
        for gname, g_paused in groups.items():
            g = t.group(gname, record=False)
            assert g is not None
            g.paused = g_paused
        return t

    async def refresh(self) -> None:
        """Make local the topics and groups other gateways created (and drop those they
        deleted), take their pause state, and read every stored group's counts."""
        broker = self.broker
        # What is here now is recorded once the flush returns: whatever of it the registry
        # read after lacks was deleted by another gateway (even one made here and deleted
        # there within one refresh). What is made here during the read is not in `here`.
        here = {
            name: {g for g, group in t.groups.items() if not group.ephemeral}
            for name, t in broker.topics.items()
            if not t.ephemeral
        }
        registry = await self.journal.registry()  # after a flush
        for name, (paused, groups) in registry.items():
            t = self._as_registered(name, paused, groups)
            for gone in here.get(name, set()) - set(groups):
                if gone in t.groups:
                    t.groups.pop(gone).close()
        gone = [name for name in here if name not in registry]
        held = await self.journal.holding(gone) if gone else set()
        for name in gone:
            t = broker.topics.get(name)
            if t is None:
                continue
            if name in held:
                # Deleted on another gateway, and published to here since (before this
                # one knew): as in nsqd, the publish makes the topic anew. Its groups
                # went with the delete; its new messages wait in its backlog.
                for group in list(t.groups):
                    t.groups.pop(group).close()
                self.journal.topic_added(t)
                continue
            broker.delete_topic(name, record=False)
        await self.read_counts(list(broker.topics.values()))

    async def read_counts(self, topics: list[Topic]) -> None:
        """Read the counts of `topics`' stored groups (and backlogs) from the store now."""
        stored = [
            (t, [q for g in t.groups.values() if isinstance(q := g.queue, SharedQueue)])
            for t in topics
            if not t.ephemeral
        ]
        counts = await self.journal.counts(
            [(t.name, ["", *(q.group.name for q in queues)]) for t, queues in stored]
        )
        for (t, queues), (backlog, *per_group) in zip(stored, counts, strict=True):
            t.stored_backlog = backlog[0] + backlog[1]
            t.stored_backlog_delayed = backlog[1]
            for q, (ready, deferred, _claimed, buried, head) in zip(queues, per_group, strict=True):
                q.stored_ready, q.stored_delayed = ready, deferred
                q.stored_buried, q.stored_buried_head = buried, head
                g = q.group
                g.message_count = ready + deferred + len(g.ready)
                if ready and g.consumers:
                    self.fed(g)  # a notification lost on the way: claim anyway
