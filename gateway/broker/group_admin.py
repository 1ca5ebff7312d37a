"""A group's dead letters and administration: kick, find, delete, empty, pause.

Mixed into Group (group.py holds the delivery path); these are the calls beanstalkd's
kick/peek/delete/pause-tube, nsqd's channel empty and pause, and the admin page make.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop
from typing import TYPE_CHECKING

import trio

from gateway.archive import events
from gateway.model import Message

if TYPE_CHECKING:
    from gateway.archive.writer import Recorder
    from gateway.broker.deadlines import Deadlines
    from gateway.broker.group import Consumer, InFlight
    from gateway.broker.journal import Journal
    from gateway.broker.ready import ReadyQueue
    from gateway.broker.topic import Topic


class GroupAdmin:
    """The group's own attributes and calls this part uses (set in Group)."""

    topic: Topic
    name: str
    journal: Journal
    archive: Recorder | None
    ready: ReadyQueue
    deferred: list[tuple[float, int, Message]]
    in_flight: dict[int, InFlight]
    buried: dict[int, Message]
    consumers: list[Consumer]
    paused: bool
    pause_until: float
    pause_length: int
    next_wake: float
    kick_count: int
    spilled: int
    shared: bool
    remote_buried: int
    remote_deferred: int
    remote_buried_head: Message | None
    _generation: int
    _deadlines: Deadlines
    _waiting: deque[Consumer]
    deleted: bool

    def _dispatch(self) -> None:  # pragma: no cover - Group's
        raise NotImplementedError

    def _offer(self, consumer: Consumer) -> None:  # pragma: no cover - Group's
        raise NotImplementedError

    def _deliver(self, c: Consumer, msg: Message, now: float) -> None:  # pragma: no cover
        raise NotImplementedError  # Group's

    def _push_ready(self, msg: Message) -> None:  # pragma: no cover - MemoryWindow's
        raise NotImplementedError

    def _return(
        self, msg: Message, delay: float, now: float, priority_was: int | None = None
    ) -> None:  # pragma: no cover - Group's
        raise NotImplementedError

    def _bury(
        self, msg: Message, priority_was: int | None = None, sink: object = None
    ) -> None:  # pragma: no cover - Group's
        raise NotImplementedError

    def close(self) -> None:
        """The group is deleted: its consumers get nothing more; its counters are kept."""
        if self.deleted:
            return
        self.deleted = True
        self.topic.broker.retire(self)
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

    def return_in_flight(self, consumer: Consumer) -> None:
        """Everything `consumer` holds is ready again at once, counting no requeue or
        timeout (beanstalkd, when a connection closes)."""
        if not consumer.in_flight:
            return
        owned = [e for e in self.in_flight.values() if e.consumer is consumer]
        now = trio.current_time()
        for entry in owned:
            del self.in_flight[entry.message.id]
            self._return(entry.message, 0.0, now)
        consumer.in_flight = 0
        self._deadlines.trim(self.in_flight)
        self._dispatch()

    def return_all_in_flight(self) -> None:
        """A clean stop: every delivery is ready again (as a consumer leaving beanstalkd
        would), counting no requeue or timeout."""
        for consumer in {entry.consumer for entry in self.in_flight.values()}:
            self.return_in_flight(consumer)

    def _unqueue(self, msg_id: int) -> Message | None:
        """Take a message that is not in flight out of its queue (ready, deferred, buried)."""
        found = self.find(msg_id)
        if found is None or found[0] == "reserved":
            return None
        state, msg = found
        if state == "buried":
            del self.buried[msg_id]
        elif state == "delayed":
            self.deferred = [e for e in self.deferred if e[1] != msg_id]
            heapify(self.deferred)
        else:
            self.ready.remove(msg)
        return msg

    # -- dead letters ----------------------------------------------------------

    def bury_ready(self, msg_id: int) -> bool:
        """Bury a message that waits here (ready or deferred) with no delivery: a dead
        letter published to be buried (RocketMQ's %DLQ%). False when it is not here."""
        msg = self._unqueue(msg_id)
        if msg is None:
            return False
        self._bury(msg)
        return True

    def kick(self, bound: int) -> int:
        """beanstalkd kick: buried messages back to ready, oldest first; if none is buried,
        deferred ones are made ready now. Returns how many were kicked."""
        kicked = 0
        if self.buried:
            while self.buried and kicked < bound:
                msg_id = next(iter(self.buried))
                self._kick_buried(self.buried.pop(msg_id))
                kicked += 1
        else:
            while self.deferred and kicked < bound:
                msg = heappop(self.deferred)[2]
                self._ready_now(msg)
                kicked += 1
        self._dispatch()
        return kicked

    def kick_message(self, msg_id: int) -> bool:
        msg = self.buried.pop(msg_id, None)
        if msg is not None:
            self._kick_buried(msg)
        else:
            for i, entry in enumerate(self.deferred):
                if entry[1] == msg_id:
                    self.deferred[i] = self.deferred[-1]
                    self.deferred.pop()
                    heapify(self.deferred)
                    self._ready_now(entry[2])
                    break
            else:
                return False
        self._dispatch()
        return True

    def kick_stored(self, msg: Message, *, buried: bool) -> None:
        """A shared store's buried (or deferred) message, as found there (query.find):
        ready again in Redis, for any gateway, if it is still buried (deferred) there."""
        self.kick_count += 1
        msg.deliver_at = 0.0
        self.journal.changed(self, msg, expect="b" if buried else "d")
        if self.archive is not None:
            self.archive.record(events.KICKED, msg, self.name)
        if buried:
            self.remote_buried = max(0, self.remote_buried - 1)
            self.remote_buried_head = None
        else:
            self.remote_deferred = max(0, self.remote_deferred - 1)

    def take_claimed(self, consumer: Consumer, msg: Message) -> Message:
        """Deliver a message claimed from a shared store for this consumer alone
        (beanstalkd reserve-job of a message Redis kept), whatever the window."""
        msg.deliver_at = 0.0
        self._deliver(consumer, msg, trio.current_time())
        return msg

    def _kick_buried(self, msg: Message) -> None:
        self._ready_now(msg)

    def _ready_now(self, msg: Message) -> None:
        """A kick: buried or deferred to ready now."""
        self.kick_count += 1
        msg.job_stats().kicks += 1
        msg.deliver_at = 0.0
        self._push_ready(msg)
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
        if msg is None:
            return False
        self.delete_claimed(msg)
        return True

    def delete_claimed(self, msg: Message) -> None:
        """Remove a message that is in no queue here: one just unqueued, or one claimed from
        a shared store to be deleted (a job another gateway deferred or buried)."""
        self.journal.removed(self, (msg,))
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
        self.spilled = 0
        self._generation += 1
        for c in self.consumers:
            c.in_flight = 0
            self._offer(c)
        self.journal.cleared(self.topic, self)

    def pause_for(self, seconds: int) -> None:
        """A timed pause (beanstalkd pause-tube); 0 ends a pause at once."""
        now = trio.current_time()
        if seconds <= 0:
            self.pause_until = 0.0
            self.pause_length = 0
            self._dispatch()
            return
        self.pause_until = now + seconds
        self.pause_length = seconds
        if self.pause_until < self.next_wake:
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
