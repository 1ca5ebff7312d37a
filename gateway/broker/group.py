"""A group: one named subscription on a topic (NSQ channel, beanstalkd tube workers,
NATS queue group). Each message put to the group goes to exactly one of its consumers.

Everything here is synchronous and never awaits: a publish, a delivery and an ack are a
few dict and deque operations on the caller's task. Deliveries are handed to a consumer's
sink, which only queues bytes and wakes its connection's writer.
"""

from __future__ import annotations

import time
from collections import deque
from heapq import heapify, heappop, heappush
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING

import trio

from gateway.archive import events
from gateway.broker.deadlines import Deadlines
from gateway.broker.journal import NULL_JOURNAL
from gateway.broker.members import Consumer, InFlight, Outcome, Sink
from gateway.broker.ready import ReadyQueue
from gateway.broker.stats import ACKNOWLEDGED, BURIED, DELIVERED, FOLD_AT, REQUEUED, TIMED_OUT
from gateway.model import Message

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.broker.topic import Topic

_INF = float("inf")

__all__ = ["Consumer", "Group", "InFlight", "Outcome", "Sink"]

# the outcomes as plain module constants: an enum member looked up on its class costs
# four times a global on every acknowledgement
_OK, _NOT_IN_FLIGHT, _NOT_OWNER = Outcome.OK, Outcome.NOT_IN_FLIGHT, Outcome.NOT_OWNER


_DEADLINE = attrgetter("deadline")


class Group:
    def __init__(
        self, topic: Topic, name: str, *, ephemeral: bool = False, max_attempts: int = 0
    ) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = ephemeral
        self.max_attempts = max_attempts  # 0: retry for ever; else bury past this many attempts
        self.paused = False
        self.pause_until = 0.0  # a timed pause (beanstalkd pause-tube); 0: none
        self.pause_length = 0  # seconds the current timed pause was set for
        self.deleted = False
        self.ready = ReadyQueue()
        self._now = topic.broker.now  # Trio's clock (see Broker.now)
        self.journal = NULL_JOURNAL if ephemeral else topic.journal
        self.deferred: list[tuple[float, int, Message]] = []  # heap by deliver_at
        self.in_flight: dict[int, InFlight] = {}
        self.buried: dict[int, Message] = {}  # insertion order = burial order, kick takes oldest
        self.consumers: list[Consumer] = []
        self._waiting: deque[Consumer] = deque()  # consumers with room, round-robin
        self._deadlines = Deadlines()
        self.next_wake = _INF  # earliest time the broker's timer will call on_timer
        self.archive = topic.archive  # the topic's archive recorder, or None
        # the journal's door for this group's deliveries and finishes (names bound once)
        self.recorder = self.journal.recorder(self)
        # where messages wait outside memory, chosen by the journal (queues.py)
        self.queue = self.journal.queue(self)
        # counters, the same for every protocol that touches this group
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.by_protocol: dict[str, list[int]] = {}  # consumer protocol -> stats.COUNTS

    # -- putting messages in -------------------------------------------------

    def put(self, messages: list[Message], *, fresh: bool = False) -> None:
        """New messages (already recorded in the store by the topic). `fresh`: one
        publish, so one priority and one deliver_at, ids ascending."""
        self.message_count += len(messages)
        admitted = self.queue.admit(messages)
        if admitted is None:
            return
        messages = admitted
        if fresh and messages and messages[0].deliver_at == 0.0:
            self.ready.extend(messages)
            if not self._waiting:  # no one to deliver to: nothing else to do
                return
        else:
            now = trio.current_time()
            ready = self.ready
            for msg in messages:
                if msg.deliver_at > now:
                    self.defer(msg)
                else:
                    msg.deliver_at = 0.0
                    ready.push(msg)
        self._dispatch()

    def defer(self, msg: Message) -> None:
        """Into the deferred heap until its deliver_at (broker clock)."""
        heappush(self.deferred, (msg.deliver_at, msg.id, msg))
        if msg.deliver_at < self.next_wake:
            self.topic.broker.schedule(self, msg.deliver_at)

    # -- consumers -------------------------------------------------------------

    # Deliveries and acknowledgements are counted once, per consumer protocol (the hot
    # paths bump one list item); the group's totals are summed when someone asks.
    @property
    def finish_count(self) -> int:
        return sum(counts[ACKNOWLEDGED] for counts in self.by_protocol.values())

    def attach(self, sink: Sink, timeout: float) -> Consumer:
        consumer = Consumer(self, sink, timeout)
        self.consumers.append(consumer)
        return consumer

    def detach(self, consumer: Consumer, *, requeue: bool) -> None:
        """A consumer leaves. With `requeue` its in-flight messages are ready again at once
        (beanstalkd); without, they stay in flight until their deadline (nsqd)."""
        if not consumer.attached:
            return
        consumer.attached = False
        self.consumers.remove(consumer)
        if requeue:
            self.return_in_flight(consumer)
        self.queue.detached()
        if self.ephemeral and not self.consumers:
            self.topic.delete_group(self.name)

    def _offer(self, consumer: Consumer) -> None:
        if consumer.attached and not consumer.waiting and consumer.in_flight < consumer.ready:
            consumer.waiting = True
            self._waiting.append(consumer)
            self._dispatch()

    def _dispatch(self) -> None:
        waiting = self._waiting
        ready = self.ready
        if self.paused or not waiting or not ready.size:
            if waiting and not self.paused:
                self.queue.starving()
            return
        now = self._now()
        if self.pause_until:
            if now < self.pause_until:
                return
            self.pause_until = 0.0
            self.pause_length = 0
        # Alone, a consumer takes all its window has room for in one go. Several take
        # turns, each an equal share of what is ready as one run: delivered together (a
        # third fewer instructions per message), and finished as runs of consecutive ids,
        # which a shared store records as one range, not message by message.
        share = max(1, ready.size // len(waiting))
        while waiting and ready.size:
            c = waiting[0]
            if c.in_flight >= c.ready or not c.attached:
                waiting.popleft()
                c.waiting = False
                continue
            n = c.ready - c.in_flight
            if len(waiting) > 1:
                n = min(n, share)
            if n > 1:
                self._deliver_all(c, ready.pop_many(n), now)
            else:
                self._deliver(c, ready.pop(), now)
            if c.in_flight >= c.ready:  # its window is full: it waits no more
                waiting.popleft()
                c.waiting = False
            elif len(waiting) > 1:
                waiting.rotate(-1)
        self.queue.refill(bool(waiting))

    @property
    def consumers_wait(self) -> bool:
        """Some consumer has room for more."""
        return bool(self._waiting)

    def _deliver(self, c: Consumer, msg: Message, now: float) -> None:
        msg.attempts += 1
        deadline = now + (msg.ttr or c.timeout)
        entry = InFlight(msg, c, deadline, now)
        self.in_flight[msg.id] = entry
        c.in_flight += 1
        self._deadlines.add(entry)
        if deadline < self.next_wake:
            self.topic.broker.schedule(self, deadline)
        self.recorder.delivered(entry)
        if self.archive is not None:
            self.archive.record(events.DELIVERED, msg, self.name, c.sink)
        c.counts[DELIVERED] += 1
        if not c.sink.deliver(msg, c):
            self._finish(entry)

    def _deliver_all(self, c: Consumer, msgs: list[Message], now: float) -> None:
        """`_deliver` for several messages to one consumer (a window refilled after a
        batch of FINs): in flight, then recorded once for the batch (deadlines, store,
        counts), then handed to the sink, so that a message the sink refuses (finished at
        once) is never recorded after its finish. About a third fewer instructions per
        message than one `_deliver` each; for a single message it costs about 2,000 more
        (callgrind), so single deliveries keep their own path."""
        in_flight = self.in_flight
        timeout = c.timeout
        entries = []
        for msg in msgs:
            msg.attempts += 1
            entry = InFlight(msg, c, now + (msg.ttr or timeout), now)
            in_flight[msg.id] = entry
            entries.append(entry)
        c.in_flight += len(entries)
        self._deadlines.add_all(entries)
        soonest = entries[0].deadline if len(entries) == 1 else min(map(_DEADLINE, entries))
        if soonest < self.next_wake:
            self.topic.broker.schedule(self, soonest)
        self.recorder.delivered_all(entries)
        c.counts[DELIVERED] += len(entries)
        archive = self.archive
        deliver = c.sink.deliver
        for entry in entries:
            if not c.attached:
                break  # the sink let the consumer go: what it held is dealt with
            if archive is not None:
                archive.record(events.DELIVERED, entry.message, self.name, c.sink)
            if not deliver(entry.message, c):
                self._finish(entry)

    def take(self, consumer: Consumer) -> Message | None:
        """Hand the most urgent ready message to `consumer` at once, whatever its window:
        the pull path (beanstalkd reserve picks across tubes itself)."""
        if not self.ready:
            return None
        msg = self.ready.pop()
        self._deliver(consumer, msg, self._now())
        self.queue.refill(False)
        return msg

    def take_any(self, consumer: Consumer, msg_id: int) -> Message | None:
        """Deliver one particular message that is ready, deferred or buried (beanstalkd
        reserve-job), whatever its state's queue and whatever the pause."""
        msg = self._unqueue(msg_id)
        return None if msg is None else self.take_claimed(consumer, msg)

    # -- acknowledgements ------------------------------------------------------

    def _owned(self, consumer: Consumer | None, msg_id: int) -> InFlight | Outcome:
        entry = self.in_flight.get(msg_id)
        if entry is None:
            return _NOT_IN_FLIGHT
        if consumer is not None and entry.consumer is not consumer:
            return _NOT_OWNER
        return entry

    def finish(self, consumer: Consumer | None, msg_id: int, *, pump: bool = True) -> Outcome:
        """Acknowledge (NSQ FIN, beanstalkd delete of a reserved job): `finish_many` of one.

        `pump=False` leaves the freed slot unfilled until `pump()`: a session applying a
        batch of acknowledgements refills the window once, not once per message."""
        refused = self.finish_many(consumer, (msg_id,))
        if refused:
            return refused[0][1]
        if pump:
            self._dispatch()
        return _OK

    def finish_many(
        self, consumer: Consumer | None, msg_ids: Sequence[int | None]
    ) -> list[tuple[int, Outcome]]:
        """Acknowledge a consumer's batch (NSQ FINs read together; None: an id that could
        not be read), recorded in the store as one batch, the freed slots left for
        `pump()`. Returns the refused ones: (position, outcome). The hot path of every
        consumer: _owned, _finish and _release_slot in one."""
        refused: list[tuple[int, Outcome]] = []
        done: list[Message] = []
        in_flight = self.in_flight
        archive = self.archive
        deadlines = self._deadlines
        for k, msg_id in enumerate(msg_ids):
            entry = in_flight.pop(msg_id, None) if msg_id is not None else None
            if entry is None:
                refused.append((k, _NOT_IN_FLIGHT))
                continue
            c = entry.consumer
            if consumer is not None and c is not consumer:
                in_flight[msg_id] = entry  # type: ignore[index]
                refused.append((k, _NOT_OWNER))
                continue
            c.counts[ACKNOWLEDGED] += 1
            msg = entry.message
            samples = c.latency_samples
            samples.append(time.time_ns() - msg.timestamp)
            if len(samples) >= FOLD_AT:
                c.latency.fold()
            done.append(msg)
            if archive is not None:
                archive.record(events.ACKNOWLEDGED, msg, self.name, c.sink)
            deadlines.finished(entry, in_flight)
            c.in_flight -= 1
            if c.attached and not c.waiting and c.in_flight < c.ready:
                c.waiting = True
                self._waiting.append(c)
        if done:
            self.recorder.finished_all(done)
        return refused

    def pump(self) -> None:
        """Deliver to every consumer with room (after acknowledgements made with pump=False)."""
        self._dispatch()

    def _finish(self, entry: InFlight) -> None:
        msg = entry.message
        del self.in_flight[msg.id]
        entry.consumer.counts[ACKNOWLEDGED] += 1
        self.recorder.finished_all((msg,))
        if self.archive is not None:
            self.archive.record(events.ACKNOWLEDGED, msg, self.name, entry.consumer.sink)
        self._release_slot(entry)

    def _release_slot(self, entry: InFlight) -> None:
        # finished deliveries leave stale deadline entries behind; drop them before they
        # pile up (at 10^5 acks a second they would be millions per msg_timeout)
        self._deadlines.finished(entry, self.in_flight)
        c = entry.consumer
        c.in_flight -= 1
        if c.attached and not c.waiting and c.in_flight < c.ready:
            c.waiting = True
            self._waiting.append(c)

    def requeue(
        self,
        consumer: Consumer | None,
        msg_id: int,
        delay: float,
        priority: int | None = None,
        *,
        pump: bool = True,
    ) -> Outcome:
        """Give a message back (NSQ REQ, beanstalkd release) to be retried after `delay` s."""
        entry = self._owned(consumer, msg_id)
        if not isinstance(entry, InFlight):
            return entry
        msg = entry.message
        del self.in_flight[msg.id]
        self.requeue_count += 1
        entry.consumer.counts[REQUEUED] += 1
        if self.archive is not None:
            self.archive.record(events.REQUEUED, msg, self.name, entry.consumer.sink)
        stats = msg.job_stats()
        stats.releases += 1
        stats.delay = int(delay)
        was = msg.priority
        if priority is not None:
            msg.priority = priority
        self._return(msg, delay, trio.current_time(), was)
        self._release_slot(entry)
        if pump:
            self._dispatch()
        return _OK

    def touch(
        self, consumer: Consumer | None, msg_id: int, extend: float | None, cap: float
    ) -> Outcome:
        """Push the deadline to now + extend, never past delivery + cap (NSQ
        max_msg_timeout). `extend` None: the message's own ttr, else the consumer's
        timeout (beanstalkd's touch)."""
        entry = self._owned(consumer, msg_id)
        if not isinstance(entry, InFlight):
            return entry
        now = trio.current_time()
        if extend is None:
            extend = entry.message.ttr or entry.consumer.timeout
        entry.deadline = min(now + extend, entry.delivered_at + cap)
        self.recorder.touched(entry.message, entry.deadline)
        self._deadlines.add(entry)
        if entry.deadline < self.next_wake:
            self.topic.broker.schedule(self, entry.deadline)
        return _OK

    def bury(self, consumer: Consumer | None, msg_id: int, priority: int | None = None) -> Outcome:
        entry = self._owned(consumer, msg_id)
        if not isinstance(entry, InFlight):
            return entry
        del self.in_flight[msg_id]
        was = entry.message.priority
        if priority is not None:
            entry.message.priority = priority
        entry.consumer.counts[BURIED] += 1
        self._bury(entry.message, was, entry.consumer.sink)
        self._release_slot(entry)
        self._dispatch()
        return _OK

    # `sink`: the consumer's that buried it (none when past max_attempts)
    def _bury(self, msg: Message, priority_was: int | None = None, sink: object = None) -> None:
        msg.deliver_at = 0.0
        msg.job_stats().buries += 1
        if self.archive is not None:
            self.archive.record(events.BURIED, msg, self.name, sink)
        self.queue.buried(msg, priority_was)

    def _return(
        self, msg: Message, delay: float, now: float, priority_was: int | None = None
    ) -> None:
        """Back to ready or deferred after a requeue or timeout; past max_attempts, buried.
        `priority_was`: the priority last recorded, when a release changed it."""
        if self.max_attempts and msg.attempts >= self.max_attempts:
            self._bury(msg, priority_was)
            return
        self.queue.returned(msg, delay, now, priority_was)

    # -- timers ----------------------------------------------------------------

    def on_timer(self, now: float) -> None:
        """Called by the broker's timer task: expire deadlines, promote deferred messages."""
        self.next_wake = _INF
        if self.deleted:
            return
        deadlines = self._deadlines
        in_flight = self.in_flight
        for deadline, entry in deadlines.pop_due(now):
            msg = entry.message
            if in_flight.get(msg.id) is not entry or entry.deadline != deadline:
                continue  # finished, requeued or touched since
            del in_flight[msg.id]
            self.timeout_count += 1
            self.topic.broker.timeout_count += 1
            entry.consumer.counts[TIMED_OUT] += 1
            msg.job_stats().timeouts += 1
            if self.archive is not None:
                self.archive.record(events.TIMED_OUT, msg, self.name, entry.consumer.sink)
            self._return(msg, 0.0, now)
            c = entry.consumer
            c.in_flight -= 1
            if c.attached and not c.waiting and c.in_flight < c.ready:
                c.waiting = True
                self._waiting.append(c)
        deadlines.trim(in_flight)
        deferred = self.deferred
        while deferred and deferred[0][0] <= now:
            msg = heappop(deferred)[2]
            msg.deliver_at = 0.0
            if not self.queue.push_ready(msg):
                # on disk only now: its record must say "ready now" to be paged in again
                self.journal.changed(self, msg)
        self._dispatch()
        # a timed pause that ended (the dispatch clears it only when it has work to do)
        # is no wake-up any more: scheduled again at a past time, the timer would loop
        if self.pause_until and self.pause_until <= now:
            self.pause_until = 0.0
            self.pause_length = 0
        nxt = min(
            deadlines.next_due(),
            deferred[0][0] if deferred else _INF,
            self.pause_until or _INF,
        )
        if nxt < _INF:
            self.topic.broker.schedule(self, nxt)

    # -- dead letters and administration ---------------------------------------
    #    (beanstalkd's kick/peek/delete/pause-tube, nsqd's channel empty and pause, the
    #    admin page)

    def close(self) -> None:
        """The group is deleted: its consumers get nothing more; its counters are kept."""
        if self.deleted:
            return
        self.deleted = True
        self.topic.broker.retire(self)
        self.topic.broker.names_changed(self.topic.name, self.name, False)
        # its messages went with it, those in flight too: a late release, bury or touch
        # finds none (NOT_FOUND), and nothing more is recorded for the group
        self.in_flight.clear()
        for c in self.consumers:
            c.attached = False
            # its consumers hear of it, wherever the delete came from (here, or another
            # gateway sharing the store): nsqd closes the clients of a deleted channel
            closed = getattr(c.sink, "group_closed", None)
            if closed is not None:
                closed()
        self.consumers.clear()
        self._waiting.clear()

    def return_in_flight(self, consumer: Consumer | None = None) -> None:
        """Everything `consumer` holds (None: every delivery, a clean stop) is ready again
        at once, counting no requeue or timeout (beanstalkd, when a connection closes)."""
        if consumer is not None and not consumer.in_flight:
            return
        in_flight = self.in_flight
        owned = [e for e in in_flight.values() if consumer is None or e.consumer is consumer]
        now = trio.current_time()
        for entry in owned:
            del in_flight[entry.message.id]
            entry.consumer.in_flight -= 1
            self._return(entry.message, 0.0, now)
        self._deadlines.trim(in_flight)
        self._dispatch()

    def _unqueue(
        self, msg_id: int, states: tuple[str, ...] = ("ready", "delayed", "buried")
    ) -> Message | None:
        """Take a message that is not in flight out of its queue, if it is in one of
        `states`."""
        found = self.find(msg_id)
        if found is None or found[0] not in states:
            return None
        state, msg = found
        if state == "buried":
            del self.buried[msg_id]
        elif state == "delayed":
            deferred = self.deferred
            deferred.remove(next(entry for entry in deferred if entry[1] == msg_id))
            heapify(deferred)
        else:
            self.ready.remove(msg)
            # out of the memory window as a delivery takes one: what waits on disk past
            # it comes in (a tube emptied by delete of one ready job after another)
            self.queue.refill(False)
        return msg

    # -- dead letters ----------------------------------------------------------

    def bury_ready(self, msg_id: int) -> bool:
        """Bury a message that waits here (ready or deferred) with no delivery: a dead
        letter published to be buried (RocketMQ's %DLQ%). False when it is not here."""
        msg = self._unqueue(msg_id)
        if msg is not None:
            self._bury(msg)
        return msg is not None

    def kick(self, bound: int) -> int:
        """beanstalkd kick: buried messages back to ready, oldest first; if none is buried,
        deferred ones are made ready now. Returns how many were kicked."""
        if self.buried:
            kicked = [self.buried.pop(i) for i in list(islice(self.buried, max(bound, 0)))]
        else:
            kicked = [heappop(self.deferred)[2] for _ in range(min(bound, len(self.deferred)))]
        for msg in kicked:
            self._ready_now(msg)
        self._dispatch()
        return len(kicked)

    def kick_message(self, msg_id: int) -> bool:
        msg = self._unqueue(msg_id, ("buried", "delayed"))
        if msg is not None:
            self._ready_now(msg)
            self._dispatch()
        return msg is not None

    def kick_stored(self, msg: Message, *, buried: bool) -> None:
        """A buried (or deferred) message as found in a shared store (query.find): ready
        again there, for any gateway, if it is still buried (deferred) there."""
        self.queue.kick_stored(msg, buried=buried)

    def take_claimed(self, consumer: Consumer, msg: Message) -> Message:
        """Deliver a message claimed from a shared store for this consumer alone
        (beanstalkd reserve-job of a message Redis kept), whatever the window."""
        msg.deliver_at = 0.0
        self._deliver(consumer, msg, trio.current_time())
        return msg

    def _ready_now(self, msg: Message) -> None:
        """A kick: buried or deferred to ready now."""
        msg.job_stats().kicks += 1
        msg.deliver_at = 0.0
        self.queue.push_ready(msg)
        self.journal.changed(self, msg)
        if self.archive is not None:
            self.archive.record(events.KICKED, msg, self.name)

    # -- administration ------------------------------------------------------

    def find(self, msg_id: int) -> tuple[str, Message] | None:
        """Where a message is: 'reserved', 'ready', 'delayed' or 'buried' (O(n) but in-flight)."""
        entry = self.in_flight.get(msg_id)
        if entry is not None:
            return "reserved", entry.message
        msg = self.buried.get(msg_id)
        if msg is not None:
            return "buried", msg
        for _, i, msg in self.deferred:
            if i == msg_id:
                return "delayed", msg
        for msg in self.ready:
            if msg.id == msg_id:
                return "ready", msg
        return None

    def delete(self, msg_id: int) -> bool:
        """Remove a message that is not in flight (beanstalkd delete of ready/delayed/buried)."""
        msg = self._unqueue(msg_id)
        if msg is not None:
            self.delete_claimed(msg)
        return msg is not None

    def delete_claimed(self, msg: Message) -> None:
        """Remove a message that is in no queue here: one just unqueued, or one claimed from
        a shared store to be deleted (a job another gateway deferred or buried)."""
        self.journal.removed(self.topic, self, (msg,))
        if self.archive is not None:
            self.archive.record(events.DELETED, msg, self.name)

    def empty(self) -> None:
        """Drop every message: ready, deferred, buried and in flight (as nsqd's channel empty
        does: FIN of a message that was in flight then fails)."""
        self.ready.clear()
        self.deferred.clear()
        self.buried.clear()
        self.in_flight.clear()
        self._deadlines.clear()
        self.queue.emptied()
        for c in self.consumers:
            c.in_flight = 0
            self._offer(c)
        self.journal.cleared(self.topic, self)

    def pause_for(self, seconds: int) -> None:
        """A timed pause (beanstalkd pause-tube); 0 ends a pause at once."""
        self.pause_until = trio.current_time() + seconds if seconds > 0 else 0.0
        self.pause_length = max(seconds, 0)
        if seconds <= 0:
            self._dispatch()
        elif self.pause_until < self.next_wake:
            self.topic.broker.schedule(self, self.pause_until)

    def is_paused(self, now: float) -> bool:
        return self.paused or (self.pause_until > now)

    def pause(self) -> None:
        self.paused = True
        self.journal.paused(self.topic, self, True)

    def unpause(self) -> None:
        self.paused = False
        self.journal.paused(self.topic, self, False)
        self._dispatch()

    # -- views -----------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self.ready) + self.queue.spilled + self.queue.stored_ready
