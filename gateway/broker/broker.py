"""The broker: topics, groups and the one timer task behind every deadline and deferral.

Protocol-agnostic by rule: nothing here imports a protocol. Sessions call it directly from
their own tasks; every call is synchronous except `flush()`, the store's commit point, and
the few calls that may have to ask a shared store (kick, reserve-job, delete by id). The
store is reached through the journal only.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.broker.group import Consumer, Group
from gateway.broker.journal import NULL_JOURNAL, from_wall, journal_for
from gateway.broker.pass_end import PassEnd
from gateway.broker.queues import LocalQueue
from gateway.broker.stats import Histogram
from gateway.broker.taps import InterestWatch, Tap, Taps
from gateway.broker.topic import Topic
from gateway.model import DEFAULT_PRIORITY, Message, Publish

if TYPE_CHECKING:
    from gateway.archive.writer import Archive
    from gateway.stores.base import Store

log = logging.getLogger("gateway.broker")

# the per-group memory window of a paging (durable) store, unless configured
DEFAULT_WINDOW = 10_000
RETIRED_MAX = 1000  # deleted groups (and topics) whose counters are kept by name
_PROTOCOLS_KEPT = 4096  # origins whose protocol is remembered (one per connection)

# Told of every topic and group made or deleted: (topic, group or None for the topic
# itself, True when made / False when deleted).
NamesWatch = Callable[[str, str | None, bool], None]

# what a publish did: the messages made, and how many deliveries subject subscriptions
# (taps) took. A plain tuple: made once per publish, on every protocol's hot path.
Published = tuple[list[Message], int]


class Broker:
    def __init__(
        self,
        store: Store,
        *,
        max_attempts: int = 0,
        memory_window: int = DEFAULT_WINDOW,
        archive: Archive | None = None,
    ) -> None:
        # the message archive (gateway/archive), or None: each topic takes its recorder
        self.archive = archive
        # the one owner of every store call (topics and groups hold it, or a null one)
        self.journal = journal_for(self, store, memory_window)
        # what topics and groups record their messages through (NULL_JOURNAL: nowhere, as
        # ephemeral ones do, when the store keeps nothing anyone reads back)
        self.messages_journal = NULL_JOURNAL if self.journal.forgets else self.journal
        # Trio's clock, as a bound method once the broker runs (open()): trio.current_time()
        # looks the clock up through three calls, on every delivery
        self.now: Callable[[], float] = trio.current_time
        self._allocates_ids = self.journal.allocates_ids  # a store's constant
        # the stored groups' queues' broker-wide task: the pager of a paging store's
        # memory windows, or the claimer of a shared store (made by the journal, once)
        self.queues = self.journal.backend
        # the records whose replies wait for their commit, counted (Owed): a session
        # compares `owed.count` before and after a command
        self.owed = self.journal.owed
        # where a commit settles with one write to the OS, the connections' commits of a
        # pass share that write, made as the pass ends (pass_end.py); None: each settles
        # by itself (nothing to write, or it waits for a disk or a server)
        self.pass_end = PassEnd(self.journal.flush_now) if self.journal.writes_on_loop else None
        self.max_attempts = max_attempts
        self.topics: dict[str, Topic] = {}
        self.last_id = 0
        self.published_count = 0  # messages created since start (beanstalkd total-jobs)
        self.timeout_count = 0  # in-flight deadlines that expired, all groups
        self._timers: list[tuple[float, int, Group]] = []
        self._timer_seq = itertools.count()
        self._timer_changed = trio.Event()
        self.started_at = time.time()
        self.taps = Taps()  # subject subscriptions (NATS), matched on every publish
        # Told when a topic gets its first group (True) or loses its last (False): a NATS
        # cluster route announces interest in exactly the topics that keep messages.
        # Set through watch_interest.
        self.on_groups: Callable[[str, bool], None] | None = None
        # Told of every topic and group made or deleted (watch_names): an nsqlookupd
        # registration announces exactly these names.
        self._names_watches: list[NamesWatch] = []
        # for metrics: messages published per protocol to no kept topic (a NATS publish
        # only subscribers see; the rest is counted per topic, see published_by), and the
        # publish -> acknowledgement latency per consumer protocol
        self.published_untopiced: dict[str, int] = {}
        # each publisher's protocol by its origin ("<protocol> <peer>", one string per
        # connection): a lookup instead of a split on every publish
        self._protocols: dict[str, str] = {}
        self.ack_latency: dict[str, Histogram] = {}
        # Counters of deleted groups and topics, kept so that a Prometheus counter never
        # goes back or disappears while the process runs (a beanstalkd tube is deleted
        # when its last worker leaves, and may come back). At most RETIRED_MAX series by
        # name; the rest are summed under ("", "").
        self.retired_counts: dict[tuple[str, str], dict[str, list[int]]] = {}
        self.retired_published: dict[str, dict[str, int]] = {}

    # -- life cycle ------------------------------------------------------------

    async def open(self) -> None:
        """Load what the store recorded: topics, groups and their messages. Messages that
        were in flight are ready again (their recorded attempts count that delivery)."""
        self.now = trio.lowlevel.current_clock().current_time
        state = await self.journal.open()  # the ids' first reservation committed
        self.last_id = state.last_id
        for st in state.topics.values():
            topic = self.topics[st.name] = Topic(self, st.name)
            topic.paused = st.paused
            for msg in st.backlog:
                msg.deliver_at = from_wall(msg.deliver_at)
            topic.backlog = list(st.backlog)
            topic.window.restored(st.spilled, topic.backlog)
            for sg in st.groups.values():
                group = topic.groups[sg.name] = Group(
                    topic, sg.name, max_attempts=self.max_attempts
                )
                group.paused = sg.paused
                now = self.now()
                for msg in sg.ready:
                    if msg.deliver_at > 0.0:
                        # Deferred; one due already waits for the timer's first pass,
                        # which promotes it as any other: past the window, to disk
                        # (recorded ready now). Pushed here, it could sort after every
                        # spilled one and move `spill_from` past them all.
                        msg.deliver_at = from_wall(msg.deliver_at) or now
                        group.defer(msg)
                    else:
                        group.ready.push(msg)
                if sg.spilled:  # a paging store's: its queues are local
                    assert isinstance(group.queue, LocalQueue)
                    group.queue.restored(sg.spilled)
                for msg in sg.buried:
                    msg.deliver_at = 0.0
                    group.buried[msg.id] = msg
                group.message_count = len(group.ready) + sg.spilled + len(group.deferred)
            if topic.groups and self.on_groups is not None:
                self.on_groups(topic.name, True)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The store's committer, the pager (or the claimer), the timer task, and the end of
        each pass of the scheduler that writes the commits of many connections at once."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.journal.run)
            nursery.start_soon(self.queues.run)
            pass_end = self.pass_end
            if pass_end is not None:
                pass_end.start()
            try:
                await self._run_timers(task_status)
            finally:
                if pass_end is not None:
                    pass_end.stop()

    async def _run_timers(self, task_status: trio.TaskStatus[None]) -> None:
        """Wakes at the earliest deadline or deferral any group asked for."""
        task_status.started()
        timers = self._timers
        while True:
            now = trio.current_time()
            # what is due now, taken first: a wake-up asked for during these calls waits
            # for the next pass, after a checkpoint, even one asked for at a past time
            due = []
            while timers and timers[0][0] <= now:
                due.append(heapq.heappop(timers))
            for when, _, group in due:
                if group.next_wake == when:
                    group.on_timer(now)
            wake_at = timers[0][0] if timers else math.inf
            with trio.move_on_at(wake_at):
                await self._timer_changed.wait()
            self._timer_changed = trio.Event()

    def schedule(self, group: Group, when: float) -> None:
        """Ask for `group.on_timer` at `when` (only ever moves a group's wake-up earlier)."""
        group.next_wake = when
        timers = self._timers
        if not timers or when < timers[0][0]:
            self._timer_changed.set()
        heapq.heappush(timers, (when, next(self._timer_seq), group))

    def burn_id(self) -> None:
        """Use up an id without a message (beanstalkd: a put that ends EXPECTED_CRLF)."""
        if self._allocates_ids:
            self.last_id = self.journal.take_ids(1)
            return
        self.last_id += 1
        self.journal.ids_used(self.last_id)

    async def flush(self) -> None:
        """The group-commit point: returns once every change so far is stored; raises
        StoreUnavailable when the store cannot write (the publish must then be refused)."""
        await self.journal.flush()

    @property
    def flush_waits(self) -> bool:
        """Whether `flush` usually waits (Store.flush_waits)."""
        return self.journal.flush_waits

    def flush_now(self) -> bool:
        """`flush` where the store needs no wait: True once every change so far is
        stored; False when `flush` must be awaited. Raises StoreUnavailable as it does."""
        return self.journal.flush_now()

    async def kick(self, group: Group, bound: int) -> int:
        """beanstalkd kick: buried messages back to ready, oldest first, or, none buried,
        deferred ones; how many. A shared store's are kicked there, whichever gateway
        buried or deferred them."""
        return await group.queue.kick(bound)

    async def take_stored(self, group: Group, consumer: Consumer, msg_id: int) -> Message | None:
        """Deliver to `consumer` one particular message a shared store keeps (beanstalkd
        reserve-job); None when it is held elsewhere or gone, or the store is not shared."""
        return await group.queue.take_stored(consumer, msg_id)

    async def delete_stored(self, group: Group, msg_id: int) -> bool:
        """Remove one particular message a shared store keeps and no gateway holds
        (beanstalkd delete); False when it is held elsewhere or gone, or not shared."""
        return await group.queue.delete_stored(msg_id)

    def withdraw(self, messages: Sequence[Message]) -> int:
        """Take back published messages whose commit failed and which nobody was told were
        stored (a link hands them back to the server it took them from): removed wherever
        they wait, in the topic's backlog or its groups, ready, deferred or buried, in
        memory or on disk past a memory window (Topic.withdraw). A copy a consumer holds
        already stays with it. Recorded as deletes, after the publish: a store that
        recovers commits both. How many copies were removed."""
        removed = 0
        for msg in messages:
            topic = self.topics.get(msg.topic)
            if topic is not None:
                removed += topic.withdraw(msg)
        return removed

    @property
    def store_failed(self) -> StoreUnavailable | None:
        return self.journal.failed

    async def close(self) -> None:
        """Clean stop: whatever is in flight is ready again, everything is flushed."""
        ready = deferred = buried = 0
        for topic in self.topics.values():
            ready += len(topic.backlog)
            for group in topic.groups.values():
                if group.ephemeral:
                    continue
                group.return_in_flight()
                group.queue.closing()
                ready += len(group.ready) + group.queue.spilled
                deferred += len(group.deferred)
                buried += len(group.buried)
        try:
            await self.journal.close()
        except StoreUnavailable as exc:
            log.error("stopping: %s", exc)
            raise
        if self.journal.durable:
            log.info(
                "stopped: %d messages kept in %s (%d ready, %d deferred, %d buried)",
                ready + deferred + buried,
                self.journal.where,
                ready,
                deferred,
                buried,
            )

    @property
    def published_by(self) -> dict[str, int]:
        """Messages published per protocol, topic or not, deleted topics included."""
        total = dict(self.published_untopiced)
        for counts in (
            *(t.published_by for t in self.topics.values()),
            *self.retired_published.values(),
        ):
            for protocol, n in counts.items():
                total[protocol] = total.get(protocol, 0) + n
        return total

    # -- topics and groups -----------------------------------------------------

    def topic(
        self, name: str, *, create: bool = True, ephemeral: bool = False, record: bool = True
    ) -> Topic | None:
        """`record=False`: made by another gateway sharing the store (claims.py)."""
        topic = self.topics.get(name)
        if topic is None and create:
            topic = self.topics[name] = Topic(self, name, ephemeral=ephemeral)
            if record:
                topic.journal.topic_added(topic)
            self.names_changed(name, None, True)
        return topic

    async def existing_topic(self, name: str, group: str | None = None) -> Topic | None:
        """Topic `name` if it exists, and has group `group` if one is named: here, or in a
        store shared with other gateways, where another gateway may have made it a moment
        ago (read from the store now, not at the next refresh: read-your-writes across
        gateways). None if it exists nowhere; the group may still be missing."""
        topic = self.topics.get(name)
        if topic is None or (group is not None and group not in topic.groups):
            await self.journal.adopt(name)
            topic = self.topics.get(name)
        return topic

    async def fresh_counts(self, topic: Topic) -> None:
        """With a store shared by several gateways, read `topic`'s counts from it now (a
        stats-tube right after a put on another gateway counts the job, as beanstalkd's
        would); otherwise the counts are this broker's own, always current."""
        await self.journal.read_counts(topic)

    def group(
        self, topic: str, name: str, *, ephemeral_topic: bool = False, ephemeral: bool = False
    ) -> Group:
        t = self.topic(topic, ephemeral=ephemeral_topic)
        assert t is not None
        g = t.group(name, ephemeral=ephemeral)
        assert g is not None
        return g

    def retire(self, group: Group) -> None:
        """A group is deleted: keep its counters (see `retired_counts`)."""
        key = (group.topic.name, group.name)
        if key not in self.retired_counts and len(self.retired_counts) >= RETIRED_MAX:
            key = ("", "")
        kept = self.retired_counts.setdefault(key, {})
        for protocol, counts in group.by_protocol.items():
            total = kept.setdefault(protocol, [0] * len(counts))
            for i, n in enumerate(counts):
                total[i] += n

    def delete_topic(self, name: str, *, record: bool = True) -> bool:
        """`record=False`: deleted by another gateway sharing the store (claims.py)."""
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        topic.deleted = True
        if topic.published_by:
            key = name if len(self.retired_published) < RETIRED_MAX else ""
            kept = self.retired_published.setdefault(key, {})
            for protocol, n in topic.published_by.items():
                kept[protocol] = kept.get(protocol, 0) + n
        if topic.groups and self.on_groups is not None:
            self.on_groups(name, False)
        for group in topic.groups.values():
            group.close()
        topic.groups.clear()
        if record:
            topic.journal.topic_dropped(topic)
        self.names_changed(name, None, False)
        return True

    # -- subject subscriptions (taps) ------------------------------------------

    def subscribe(self, pattern: str, tap: Tap, queue: str | None = None) -> None:
        """A tap sees every message published to a topic `pattern` matches (see taps.py);
        with `queue`, one member of that queue group does."""
        self.taps.add(pattern, tap, queue)

    def unsubscribe(self, pattern: str, tap: Tap, queue: str | None = None) -> None:
        self.taps.remove(pattern, tap, queue)

    def watch_interest(
        self, on_taps: InterestWatch, on_groups: Callable[[str, bool], None]
    ) -> None:
        """Hear every change of local interest: a local tap coming or going (`on_taps`,
        not a remote one), a topic getting its first group or losing its last
        (`on_groups`). A NATS cluster announces exactly this interest to its routes."""
        self.taps.watch = on_taps
        self.on_groups = on_groups

    def watch_names(self, watch: NamesWatch) -> None:
        """Hear of every topic and group made or deleted from now on, whoever did it (any
        protocol, an operator, another gateway sharing the store); a topic's groups are
        told deleted before the topic. What exists already is read through `query`.
        Called synchronously, in the caller's task: a watch only notes the change."""
        self._names_watches.append(watch)

    def names_changed(self, topic: str, group: str | None, made: bool) -> None:
        """A topic (group None) or a group was made or deleted (Topic, Group)."""
        for watch in self._names_watches:
            watch(topic, group, made)

    # -- publishing ------------------------------------------------------------

    def publish(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        delay: float = 0.0,
        priority: int = DEFAULT_PRIORITY,
        ttr: float = 0.0,
        headers: list[tuple[str, str]] | None = None,
        reply_to: str | None = None,
        origin: str = "",
        ephemeral: bool = False,
        create: bool = True,
        publisher: object | None = None,
        header_block: bytes | None = None,
        routed: tuple[str, ...] | None = None,
    ) -> Published:
        """Create messages, queue them in the topic's groups and hand them to the taps that
        match; the messages, and how many deliveries the taps took (0: no subscriber took
        any; a NATS request then gets no responders). Await `flush()` before
        acknowledging them. With `create=False` a topic that
        does not exist is not made (a NATS publish nobody asked for is not kept).
        `routed`: the messages came from a NATS cluster route, which named these queue
        groups; they reach local taps only (see taps.py). Raises StoreUnavailable, creating
        nothing, while the store cannot write and the messages would be stored (traffic
        to subscribers only, NATS at most once, goes on)."""
        # the hot path of every protocol: one dict lookup for the topic, one Message per
        # body, the counters, then the topic; nothing per message beyond the Message
        failed = self.journal.failed
        t = self.topics.get(topic)
        if t is None:
            if failed is not None and create and not ephemeral:
                raise failed
            t = self.topic(topic, ephemeral=ephemeral, create=create)
        elif failed is not None and not t.ephemeral:
            raise failed
        n = len(bodies)
        ts = time.time_ns()
        deliver_at = trio.current_time() + delay if delay > 0 else 0.0
        if self._allocates_ids:  # unique across the gateways sharing the store
            first = self.journal.take_ids(n)
            self.last_id = first + n - 1
        else:
            first = self.last_id + 1
            self.last_id = last = self.last_id + n
            journal = self.journal
            if last > journal.ceiling:
                journal.ids_used(last)
        self.published_count += n
        protocol = self._protocols.get(origin)
        if protocol is None:
            if len(self._protocols) >= _PROTOCOLS_KEPT:
                self._protocols.clear()
            protocol = self._protocols[origin] = origin.split(" ", 1)[0] or "other"
        # positional arguments: this runs once per message on the publish hot path
        if n == 1:
            msgs = [
                Message(first, topic, bodies[0], ts, headers, 0, priority, deliver_at, ttr,
                        reply_to, origin)
            ]  # fmt: skip
        else:
            # marked as one publish: a store packs them as one batch without checking
            msgs = Publish(
                [
                    Message(i, topic, body, ts, headers, 0, priority, deliver_at, ttr,
                            reply_to, origin)
                    for i, body in enumerate(bodies, first)
                ],
                bodies,
            )  # fmt: skip
        if delay > 0:
            for m in msgs:
                m.job_stats().delay = int(delay)
        if header_block is not None:
            for m in msgs:
                m.header_block = header_block
        by = self.published_untopiced if t is None else t.published_by
        by[protocol] = by.get(protocol, 0) + n
        if t is not None:
            t.put(msgs, bodies)
        if self.taps:
            return msgs, self.taps.deliver(msgs, publisher, routed)
        return msgs, 0
