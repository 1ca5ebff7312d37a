"""A group's members and their bookkeeping: the consumers that take its deliveries
(`Consumer`, with its RDY-like window), what they hold (`InFlight`), what a sink is, and
the outcome of an acknowledgement. Kept apart from group.py, which moves the messages."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

from gateway.broker.stats import COUNTS, Histogram
from gateway.model import Message

if TYPE_CHECKING:
    from gateway.broker.group import Group


class Outcome(IntEnum):
    OK = 0
    NOT_IN_FLIGHT = 1
    NOT_OWNER = 2


class Sink(Protocol):
    """Where a consumer's deliveries go (a session). A sink may also have
    `group_closed()`, called when its group is deleted while it is attached."""

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        """Take a delivery. False declines it (NSQ sample_rate): it counts as finished."""
        ...


class Consumer:
    """A member of a group. `ready` is a window: deliveries flow while in_flight < ready."""

    __slots__ = (
        "attached",
        "counts",
        "group",
        "in_flight",
        "latency",
        "latency_samples",
        "ready",
        "sink",
        "timeout",
        "waiting",
    )

    def __init__(self, group: Group, sink: Sink, timeout: float) -> None:
        self.group = group
        self.sink = sink
        protocol = getattr(sink, "protocol", "other")
        # this consumer's protocol's counters in the group, and its ack-latency histogram
        self.counts = group.by_protocol.setdefault(protocol, [0] * len(COUNTS))
        self.latency = group.topic.broker.ack_latency.setdefault(protocol, Histogram())
        self.latency_samples = self.latency.samples  # appended to, folded by the histogram
        # seconds a delivery may stay in flight (unless the message has a ttr)
        self.timeout = timeout
        self.ready = 0
        self.in_flight = 0
        self.attached = True
        self.waiting = False  # queued in the group's list of consumers with room

    def set_ready(self, count: int) -> None:
        self.ready = count
        if count > self.in_flight:
            self.group._offer(self)


class InFlight:
    __slots__ = ("consumer", "deadline", "delivered_at", "message")

    def __init__(self, message: Message, consumer: Consumer, deadline: float, now: float) -> None:
        self.message = message
        self.consumer = consumer
        self.deadline = deadline
        self.delivered_at = now
