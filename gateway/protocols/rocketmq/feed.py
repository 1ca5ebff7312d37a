"""A RocketMQ consumer group's queues and offsets over the gateway's acknowledgement model.

RocketMQ consumers pull by (queue, offset) and acknowledge by committing an offset;
the broker's groups deliver messages and take acknowledgements one by one. A `GroupFeed`
joins the two for one (topic, consumer group): it is a single consumer of the broker's
group, with a window of `window` messages, and every message the group hands it is
appended to one of the topic's queues at that queue's next offset. A pull from an offset
reads the log; committing offset X finishes, in the broker group, every entry below X in
that queue (notes 9). Nothing is acknowledged before a commit passes it, so a restarted
or rebalanced consumer that pulls again from the committed offset gets the same messages.

Offsets are assigned when the group hands a message over, not when it is published: a
delayed, requeued or kicked message takes the next offset when it becomes deliverable.
Each queue's offsets start at the wall-clock time in microseconds when its log was made,
so an offset a client remembers from before a gateway restart is always below the new
log's and never acknowledges a message it has not seen (it is moved to the log's start).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Final

import trio

from gateway.broker import Consumer, Group, query
from gateway.clients import ClientInfo
from gateway.model import Message
from gateway.protocols.rocketmq.mapping import (
    EVERYTHING,
    Subscription,
    encode_pulled,
    tag_of,
)

# In flight until a commit passes it: the feed's deliveries never time out. A message
# with its own ttr (a beanstalkd put) has its deadline pushed out on arrival.
NO_TIMEOUT: Final = math.inf
# PullMessageProcessor: a pull answer carries at most this many body bytes (the
# MessageStoreConfig maxTransferBytesOnMessageInMemory default); at least one message.
MAX_PULL_BYTES: Final = 256 * 1024


class Entry:
    __slots__ = ("message", "offset", "tag")

    def __init__(self, offset: int, message: Message) -> None:
        self.offset = offset
        self.message = message
        self.tag = tag_of(message)


class QueueLog:
    """One queue of one group: entries with consecutive offsets, the oldest first."""

    __slots__ = ("entries", "next_offset", "wake")

    def __init__(self, base: int) -> None:
        self.entries: deque[Entry] = deque()
        self.next_offset = base
        self.wake = trio.Event()  # set (and replaced) when an entry is appended

    @property
    def min_offset(self) -> int:
        return self.entries[0].offset if self.entries else self.next_offset

    def offset_at(self, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        ns = timestamp_ms * 1_000_000
        for entry in self.entries:
            if entry.message.timestamp >= ns:
                return entry.offset
        return self.next_offset


class PullResult:
    __slots__ = ("count", "next_offset", "records", "status")

    def __init__(self, status: str, next_offset: int, records: list[bytes] | None = None) -> None:
        self.status = status  # found | none | retry | moved
        self.next_offset = next_offset
        self.records = records or []
        self.count = len(self.records)


def _offset_base() -> int:
    return time.time_ns() // 1000


class GroupFeed:
    """The broker sink of one (topic, RocketMQ consumer group)."""

    protocol = "rocketmq"  # the metrics label of its deliveries

    def __init__(
        self,
        group: Group,
        topic: str,
        queue_count: int,
        window: int,
        store: tuple[str, int],
        queue_of: Callable[[Message], int],
    ) -> None:
        self.group = group
        self.topic = topic
        self.name = group.name
        self.store = store  # the advertised address written into records
        self.queue_of = queue_of
        self.subscription: Subscription = EVERYTHING
        base = _offset_base()
        self.queues = [QueueLog(base) for _ in range(queue_count)]
        self.index: dict[int, Entry] = {}  # message id -> entry, for CONSUMER_SEND_MSG_BACK
        # Messages committed lately, still found by CONSUMER_SEND_MSG_BACK: a client whose
        # handler is still failing a message may find that another client committed past
        # it (a rebalance moved the queue), and a Java broker finds it in its commit log
        # whatever the offsets say. At most `window` of them.
        self.recent: OrderedDict[int, Message] = OrderedDict()
        self._recent_max = window
        self.remote = ""  # what the admin page shows as the consumer's address
        self.created = int(time.time())  # /stats' connect_ts: the feed is the consumer
        self.consumer: Consumer = group.attach(self, NO_TIMEOUT)
        self.consumer.set_ready(window)

    @property
    def closed(self) -> bool:
        return self.group.deleted or not self.consumer.attached

    # -- the broker's side --------------------------------------------------------------------

    def client_info(self) -> ClientInfo:
        """What /stats shows of this consumer group's feed."""
        return ClientInfo.worker(self.remote, self.protocol, self.created)

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        if message.ttr:
            self.group.touch(consumer, message.id, NO_TIMEOUT, NO_TIMEOUT)
        if message.id in self.index:
            return True  # handed over again (a timeout): it is still in its queue
        if not self.subscription.matches(tag_of(message)):
            return False  # the group does not subscribe to its tag: finished at once
        queues = self.queues
        log = queues[self.queue_of(message) % len(queues)]
        entry = Entry(log.next_offset, message)
        log.next_offset += 1
        log.entries.append(entry)
        self.index[message.id] = entry
        log.wake.set()
        log.wake = trio.Event()
        return True

    # -- the consumers' side ------------------------------------------------------------------

    def commit(self, queue_id: int, offset: int) -> int:
        """Acknowledge every entry of the queue below `offset`; how many were."""
        if not 0 <= queue_id < len(self.queues):
            return 0
        log = self.queues[queue_id]
        entries = log.entries
        if offset > log.next_offset:
            return 0  # from another life of the log: nothing of ours is below it
        finish = self.group.finish
        consumer = self.consumer
        index = self.index
        done = 0
        recent = self.recent
        while entries and entries[0].offset < offset:
            entry = entries.popleft()
            msg = entry.message
            index.pop(msg.id, None)
            finish(consumer, msg.id, pump=False)
            recent[msg.id] = msg
            done += 1
        if done:
            while len(recent) > self._recent_max:
                recent.popitem(last=False)
            self.group.pump()
        return done

    def pull(
        self,
        queue_id: int,
        offset: int,
        max_count: int,
        subscription: Subscription,
        max_bytes: int = MAX_PULL_BYTES,
    ) -> PullResult:
        log = self.queues[queue_id]
        low = log.min_offset
        high = log.next_offset
        if offset < low or offset > high:
            # below: acknowledged already; above: an offset from before a restart. Either
            # way the consumer goes on from the oldest entry not acknowledged.
            return PullResult("moved", low)
        if offset == high:
            return PullResult("none", offset)
        entries = log.entries
        position = offset - low
        end = len(entries)
        records: list[bytes] = []
        size = 0
        consumer = self.consumer
        while position < end and len(records) < max_count:
            entry = entries[position]
            position += 1
            if not subscription.matches(entry.tag):
                continue
            if query.deadline(self.group, entry.message.id, consumer) is None:
                continue  # the group dropped it meanwhile (an operator emptied it)
            body = len(entry.message.body)
            if records and size + body > max_bytes:
                position -= 1
                break
            size += body
            records.append(
                encode_pulled(entry.message, self.topic, queue_id, entry.offset, self.store)
            )
        next_offset = low + position
        if not records:
            return PullResult("retry", next_offset)
        return PullResult("found", next_offset, records)

    def find(self, msg_id: int) -> Message | None:
        entry = self.index.get(msg_id)
        return entry.message if entry is not None else self.recent.get(msg_id)

    def close(self) -> None:
        """The feed goes (its group was deleted, or the gateway stops). Held pulls wake."""
        self.group.detach(self.consumer, requeue=False)
        for log in self.queues:
            log.wake.set()
