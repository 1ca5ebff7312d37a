"""A group's queue backend: where its messages wait when they are not in its memory.

A `Group` keeps what it holds in memory (ready, deferred, in flight, buried) and owns its
queue through one `Queue`, chosen by the journal when the group is made:

* `LocalQueue` (here): this gateway alone owns the queue. With a paging store (the durable
  one) it keeps a bounded window of ready messages in memory and pages the rest in from
  disk; otherwise everything is in memory.
* `SharedQueue` (claims.py): a store several gateways share (Redis) keeps the queue; the
  group holds only what it claimed for its consumers.

The memory window: past `window` ready messages, further ready ones stay on disk only
(the store has them already): `spilled` of them, every one at or after `spill_from` in
(priority, id) order and every one in memory before it, so the memory part is always the
most urgent part. The pager task reads the next ones back, in order, when consumers drain
the window below half. A message more urgent than anything on disk stays in memory even
past the window.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.model import Message, Publish
from gateway.stores.base import Key

if TYPE_CHECKING:
    from gateway.broker.group import Consumer, Group

NO_KEY: Key = (-1, -1)
log = logging.getLogger("gateway.broker")


class Queue(abc.ABC):
    """The interface a group owns its queue through: the group calls it where the two
    backends differ and reads its figures; nothing above it asks which store runs. A
    hook one backend does not need does nothing here."""

    # True when other gateways hold part of the queue (a shared store): reads of it
    # (peeks, a message by id) then go to the store
    elsewhere: ClassVar[bool] = False
    # ready messages kept on disk past the memory window (a paging store's)
    spilled = 0
    # the group's messages in a shared store, per state, as last read there
    stored_ready = stored_delayed = stored_buried = 0
    stored_buried_head: Message | None = None

    @abc.abstractmethod
    def admit(self, messages: list[Message]) -> list[Message] | None:
        """New messages, recorded already: those to queue in memory (None: none)."""

    def starving(self) -> None:  # noqa: B027 - a hook, a no-op unless overridden
        """Consumers have room and nothing is ready in memory."""

    @abc.abstractmethod
    def refill(self, waiting: bool) -> None:
        """Ready messages left memory (`waiting`: consumers still have room)."""

    @abc.abstractmethod
    def push_ready(self, msg: Message) -> bool:
        """Ready again (kick, promotion; recorded by the caller): False if it went to disk."""

    @abc.abstractmethod
    def returned(self, msg: Message, delay: float, now: float, priority_was: int | None) -> None:
        """A delivery came back (requeue, timeout, a consumer leaving), to be ready after
        `delay`; recorded here. `priority_was`: the priority last recorded."""

    @abc.abstractmethod
    def buried(self, msg: Message, priority_was: int | None) -> None:
        """A delivery is buried (counted and archived by the group); recorded here."""

    def adopt_spilled(self, spilled: int, spill_from: Key) -> None:  # noqa: B027
        """The topic's backlog came with `spilled` ready messages on disk only, from
        `spill_from` on (a paging store's: LocalQueue)."""

    def withdraw_spilled(self, msg: Message) -> bool:
        """Take back a message just published that went to disk only, past the window (a
        paging store's); False if it is not there."""
        return False

    def detached(self) -> None:  # noqa: B027
        """A consumer left."""

    def emptied(self) -> None:  # noqa: B027
        """The group dropped every message."""

    def closing(self) -> None:  # noqa: B027
        """A clean stop; everything delivered is back in the group."""

    @abc.abstractmethod
    async def kick(self, bound: int) -> int:
        """beanstalkd kick: up to `bound` buried (none buried: deferred) messages ready
        again, oldest first; how many."""

    def kick_stored(self, msg: Message, *, buried: bool) -> None:  # noqa: B027
        """beanstalkd kick-job of a message found in a shared store (query.find)."""

    async def take_stored(self, consumer: Consumer, msg_id: int) -> Message | None:
        """beanstalkd reserve-job of a message found in the store, for `consumer`."""
        return None

    async def spilled_first(self, limit: int) -> list[Message]:
        """The first `limit` ready messages on disk only, past the memory window, in the
        order they leave (a paging store's; every one in memory leaves before them)."""
        return []

    async def delete_stored(self, msg_id: int) -> bool:
        """beanstalkd delete of a message found in the store."""
        return False


class Pager:
    """The broker's page-in task: groups whose memory window runs low, in order."""

    def __init__(self, window: int) -> None:
        self.window = window  # per group; 0: everything in memory, nothing pages
        self._wanted: dict[LocalQueue, None] = {}
        self._event = trio.Event()

    def want(self, queue: LocalQueue) -> None:
        if queue not in self._wanted:
            self._wanted[queue] = None
            self._event.set()

    async def run(self) -> None:
        while True:
            await self._event.wait()
            self._event = trio.Event()
            while self._wanted:
                queue = next(iter(self._wanted))
                del self._wanted[queue]
                await queue.page_in()


def _spill_point(key: Key, top: Key) -> Key:
    """Where a window's disk part starts as `key` spills first: there, but never before
    `top`, the least urgent message kept in memory (a page-in reads everything on disk
    from that point on, and would load a second copy of one in memory)."""
    return max(key, (top[0], top[1] + 1)) if top != NO_KEY else key


def _none_among(ids: set[int], rows: list[Message]) -> bool:
    """Whether none of `ids` can be among `rows` (read in (priority, id) order) without a
    look-up per row: rows of one priority have ascending ids, and what is in flight during
    a page-in of a deep queue was delivered from memory, before the rows read."""
    if not ids or not rows:
        return True
    first, last = rows[0], rows[-1]
    return first.priority == last.priority and (max(ids) < first.id or min(ids) > last.id)


def _past(messages: Sequence[Message], spill_from: Key) -> bool:
    """Whether every message is ready and at or after `spill_from`, checked on the first
    alone where that holds for all: one message, or one publish (Publish: one priority
    and delay, ids ascending)."""
    if len(messages) != 1 and type(messages) is not Publish:
        return False
    first = messages[0]
    return first.deliver_at == 0.0 and (first.priority, first.id) >= spill_from


class BacklogWindow:
    """The memory window of a topic's backlog (what is published while the topic has no
    group) with a paging store: nsqd keeps a topic without a channel in memory up to its
    mem-queue-size too, and the rest in its disk queue. The ready messages past the
    window stay on disk only (recorded already), counted here, every one of them at or
    after `spill_from` in (priority, id) order and every one kept in memory before it,
    which is what a group's page-in reads by once the backlog is handed to the topic's
    first group (`LocalQueue.adopt_spilled`). Deferred messages always stay in memory."""

    __slots__ = ("spill_from", "spilled", "top", "window")

    def __init__(self, window: int) -> None:
        self.window = window  # 0: everything in memory
        self.spilled = 0
        self.spill_from: Key = NO_KEY
        self.top: Key = NO_KEY  # the least urgent ready message kept in memory, at most

    def admit(self, held: int, messages: list[Message]) -> list[Message]:
        """One publish's messages (one priority and delay, ids ascending) for a backlog
        holding `held` in memory: the ones it keeps there."""
        if not self.window:
            return messages
        if not self.spilled and held + len(messages) <= self.window:
            last = messages[-1]  # the least urgent of the publish, if it is ready
            if last.deliver_at == 0.0:
                self.top = max(self.top, (last.priority, last.id))
            return messages
        if self.spilled and _past(messages, self.spill_from):
            self.spilled += len(messages)  # a whole publish after the spill point
            return []
        keep: list[Message] = []
        for msg in messages:
            if msg.deliver_at == 0.0:
                key = (msg.priority, msg.id)
                if not self.spilled:
                    if held + len(keep) < self.window:
                        self.top = max(self.top, key)
                        keep.append(msg)
                        continue
                    self.spill_from = _spill_point(key, self.top)
                if key >= self.spill_from:
                    self.spilled += 1
                    continue
                self.top = max(self.top, key)
            keep.append(msg)
        return keep

    def restored(self, spilled: int, kept: list[Message]) -> None:
        """After a restart: `spilled` ready messages on disk, after the ready ones `kept`."""
        self.spilled = spilled
        ready = [(m.priority, m.id) for m in kept if m.deliver_at == 0.0]
        self.top = max(ready) if ready else NO_KEY
        if spilled:
            self.spill_from = (self.top[0], self.top[1] + 1) if ready else (0, 0)

    def withdraw(self, msg: Message) -> bool:
        """Whether `msg`, just published, is on disk only (it is then counted out)."""
        if not (self.spilled and _past((msg,), self.spill_from)):
            return False
        self.spilled -= 1
        return True

    def handed_over(self) -> tuple[int, Key]:
        """The backlog went to the topic's groups: how many they find on disk, and from
        where (the window starts again empty)."""
        out = (self.spilled, self.spill_from)
        self.spilled = 0
        self.spill_from = self.top = NO_KEY
        return out


class LocalQueue(Queue):
    """This gateway's own queue: memory, with the bounded window of a paging store."""

    def __init__(self, group: Group, pager: Pager) -> None:
        self.group = group
        self.pager = pager
        self.window = pager.window
        self.spilled = 0
        self.spill_from: Key = NO_KEY
        self._paging = False  # a page-in is under way
        self._dropped_min: Key | None = None  # the least key spilled during it
        self._generation = 0  # bumped by emptied(): a page-in that began before is void
        # ids on disk taken out by id (deleted, reserved) while a page-in was reading:
        # that read may still find them (the next one reads after their records)
        self._gone: set[int] = set()

    def admit(self, messages: list[Message]) -> list[Message]:
        if self.window and (self.spilled or len(self.group.ready) + len(messages) > self.window):
            return self._spill(messages)
        return messages

    def _spill(self, messages: list[Message]) -> list[Message]:
        """Leave on disk (already recorded) the ready ones past the window; returns the
        ones to keep in memory. Deferred messages always stay in memory."""
        if self.spilled and _past(messages, self.spill_from):
            # the common case of a deep queue: a whole publish after the spill point
            self.spilled += len(messages)
            key = (messages[0].priority, messages[0].id)
            if self._paging and (self._dropped_min is None or key < self._dropped_min):
                self._dropped_min = key
            return []
        keep: list[Message] = []
        kept_top = NO_KEY  # the least urgent one kept so far (not in `ready` yet)
        for msg in messages:
            if msg.deliver_at == 0.0:
                key = (msg.priority, msg.id)
                if self._spills(key, len(keep), kept_top):
                    continue
                kept_top = max(kept_top, key)
            keep.append(msg)
        return keep

    def _spills(self, key: Key, adding: int, kept_top: Key = NO_KEY) -> bool:
        """Whether a ready message with `key` stays on disk only (and is counted there).
        `adding`, `kept_top`: how many are about to join the ready queue, and the least
        urgent of them."""
        if not self.spilled:
            if len(self.group.ready) + adding < self.window:
                return False
            # The window is full: spill from here, but never before a message in memory
            # (a page-in reads everything on disk from `spill_from` on, and would load a
            # second copy of it).
            top = max(self.group.ready.max_key() or NO_KEY, kept_top)
            self.spill_from = _spill_point(key, top)
        if key < self.spill_from:
            return False  # more urgent than anything on disk: memory, past the window
        self.spilled += 1
        if self._paging and (self._dropped_min is None or key < self._dropped_min):
            self._dropped_min = key
        return True

    def refill(self, waiting: bool) -> None:
        if self.spilled and not self._paging and len(self.group.ready) <= self.window // 2:
            self.pager.want(self)

    def starving(self) -> None:
        # a consumer waits and memory holds nothing ready: whatever emptied it, what is on
        # disk comes in (a safety net; every path that takes messages out refills)
        self.refill(True)

    def push_ready(self, msg: Message) -> bool:
        if self.spilled and self._spills((msg.priority, msg.id), 0):
            return False
        self.group.ready.push(msg)
        return True

    def returned(self, msg: Message, delay: float, now: float, priority_was: int | None) -> None:
        group = self.group
        if delay > 0:
            msg.deliver_at = now + delay
            group.defer(msg)
        else:
            msg.deliver_at = 0.0
            self.push_ready(msg)
        group.journal.changed(group, msg, priority_was=priority_was)

    def buried(self, msg: Message, priority_was: int | None) -> None:
        group = self.group
        group.buried[msg.id] = msg
        group.journal.changed(group, msg, buried=True, priority_was=priority_was)

    def emptied(self) -> None:
        self.spilled = 0
        self._generation += 1

    def adopt_spilled(self, spilled: int, spill_from: Key) -> None:
        """The topic's backlog came to this group with `spilled` ready messages on disk only
        from `spill_from` on (BacklogWindow; the store moved them here with the rest). The
        ready ones in memory that sort after that point leave memory too: a page-in reads
        everything on disk from the spill point on, and would load a second copy."""
        if not spilled:
            return
        if not self.spilled or spill_from < self.spill_from:
            dropped = self.group.ready.drop_from(spill_from)
            self.spilled += dropped
            self.spill_from = spill_from
            if self._paging and (self._dropped_min is None or spill_from < self._dropped_min):
                self._dropped_min = spill_from
        self.spilled += spilled
        self.refill(False)

    def restored(self, spilled: int) -> None:
        """After a restart: `spilled` ready messages were left on disk, after memory's."""
        self.spilled = spilled
        top = self.group.ready.max_key()
        self.spill_from = (top[0], top[1] + 1) if top is not None else NO_KEY

    async def kick(self, bound: int) -> int:
        return self.group.kick(bound)

    # -- one message on disk, by id (beanstalkd peek, stats-job, delete, reserve-job) ------

    async def spilled_message(self, msg_id: int) -> Message | None:
        """Message `msg_id` if it is ready on disk only, past the window, read from the
        store: beanstalkd finds every job by its id, however deep its tube. None when it
        is not there, or a page-in brought it into memory meanwhile (memory answers)."""
        group = self.group
        if not self.spilled:
            return None
        generation = self._generation
        try:
            msg = await group.journal.find_spilled(group.topic.name, group.name, msg_id)
        except StoreUnavailable as exc:
            log.error("topic %s group %s: reading job %d failed: %s", group.topic.name,
                      group.name, msg_id, exc)  # fmt: skip
            return None
        if msg is None or generation != self._generation or group.deleted:
            return None
        if msg_id in self._gone or msg_id in group.in_flight or group.find(msg_id) is not None:
            return None
        return msg

    async def spilled_first(self, limit: int) -> list[Message]:
        group = self.group
        if not self.spilled or limit <= 0:
            return []
        generation = self._generation
        # a message in flight is on disk as ready (its record counts the delivery): read
        # past as many as there are, as a page-in does
        held = len(group.in_flight) + len(self._gone)
        try:
            rows = await group.journal.load(group, self.spill_from, limit + held)
        except StoreUnavailable as exc:
            log.error("topic %s group %s: reading the disk part failed: %s",
                      group.topic.name, group.name, exc)  # fmt: skip
            return []
        if generation != self._generation or group.deleted:
            return []
        busy = self._gone
        return [m for m in rows if m.id not in group.in_flight and m.id not in busy][:limit]

    async def take_stored(self, consumer: Consumer, msg_id: int) -> Message | None:
        msg = await self.spilled_message(msg_id)
        if msg is None:
            return self.group.take_any(consumer, msg_id)  # in memory by now, if anywhere
        if not consumer.attached:
            return None
        self._taken_out(msg_id)
        return self.group.take_claimed(consumer, msg)

    async def delete_stored(self, msg_id: int) -> bool:
        msg = await self.spilled_message(msg_id)
        if msg is None:
            return self.group.delete(msg_id)  # in memory by now, if anywhere
        self._taken_out(msg_id)
        self.group.delete_claimed(msg)
        return True

    def withdraw_spilled(self, msg: Message) -> bool:
        if not (self.spilled and _past((msg,), self.spill_from)):
            return False  # not on disk only: in memory, in flight, or paged in since
        self._taken_out(msg.id)
        self.group.delete_claimed(msg)
        return True

    def _taken_out(self, msg_id: int) -> None:
        """A message on disk only left the spilled ones (deleted, or delivered by id)."""
        self.spilled = max(self.spilled - 1, 0)
        if self._paging:
            self._gone.add(msg_id)

    async def page_in(self) -> None:
        """Load the next ready messages kept on disk into the window (the pager task
        calls this when the window runs low)."""
        group = self.group
        if not self.spilled or self._paging or group.deleted:
            return
        self._paging = True
        self._dropped_min = None
        generation = self._generation
        start = self.spill_from
        # A message in flight is on disk as ready (its record counts the delivery), and
        # may sort after `spill_from` (delivered before spilling began, or less urgent
        # than what spilled): the read may find it, and must not load it again. Those
        # in flight now, and those finished during the read (their removal may not be
        # written yet).
        busy = set(group.in_flight)
        try:
            rows = await group.journal.load(group, start, max(self.window - len(group.ready), 1))
        except StoreUnavailable as exc:
            log.error("topic %s group %s: paging in failed: %s", group.topic.name, group.name, exc)
            return
        finally:
            self._paging = False
        if generation != self._generation or group.deleted:
            return
        dropped = self._dropped_min
        if dropped is not None:
            rows = [m for m in rows if (m.priority, m.id) < dropped]
        # one look-up per message: those in flight at the start or now, and those taken
        # out by id meanwhile
        busy.update(group.in_flight)
        busy |= self._gone
        self._gone = set()
        msgs = rows if _none_among(busy, rows) else [m for m in rows if m.id not in busy]
        if rows:
            last = rows[-1]
            after = (last.priority, last.id + 1)
            self.spill_from = after if dropped is None or after < dropped else dropped
        elif dropped is not None:
            self.spill_from = dropped
        else:
            # the store has none left where some were counted: trust the store
            log.warning(
                "topic %s group %s: %d messages counted on disk were not found",
                group.topic.name,
                group.name,
                self.spilled,
            )
            self.spilled = 0
        ready = group.ready
        if msgs and msgs[0].priority == msgs[-1].priority:
            ready.extend(msgs)  # one priority (read in (priority, id) order): one extend
        else:
            for msg in msgs:
                ready.push(msg)
        self.spilled = max(self.spilled - len(msgs), 0)
        group.pump()
        self.refill(False)
