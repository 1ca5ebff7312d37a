"""Topics, groups, in-flight tracking, timers and dead letters; protocol-agnostic."""

from gateway.broker.broker import Broker
from gateway.broker.errors import StoreUnavailable
from gateway.broker.group import Consumer, Group, InFlight, Outcome, Sink
from gateway.broker.ready import ReadyQueue
from gateway.broker.topic import Topic

__all__ = [
    "Broker",
    "Consumer",
    "Group",
    "InFlight",
    "Outcome",
    "ReadyQueue",
    "Sink",
    "StoreUnavailable",
    "Topic",
]
