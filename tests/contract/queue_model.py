"""The model of a group's queue the model-based tests check the broker against
(test_store_model.py: one gateway over each paging store; test_redis_model.py: two
gateways sharing Redis), and the client actions on one group that both make the same
way: each does it on the broker and to the model, and asserts what the broker answered."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
from hypothesis import strategies as st

from gateway.broker import Broker
from gateway.broker.group import Group
from gateway.broker.members import Consumer, Outcome
from tests.unit.test_broker import Collector

GROUPS = ("a", "b")
PRIORITIES = (0, 1024, 2000)
HOUR = 3600.0  # a delay nothing in a run waits out: delayed until kicked

# the answers to a delivery, as both tests draw them (`answer`): which group, which of the
# messages it holds (by index, modulo), a requeue's new priority and whether it is delayed
ANSWERS = (
    st.tuples(st.just("finish"), st.sampled_from(GROUPS), st.integers(0, 7)),
    st.tuples(
        st.just("requeue"),
        st.sampled_from(GROUPS),
        st.integers(0, 7),
        st.sampled_from((None, *PRIORITIES)),
        st.booleans(),
    ),
    st.tuples(st.just("bury"), st.sampled_from(GROUPS), st.integers(0, 7)),
)


@dataclass
class Held:
    """One group as the model has it: message id -> priority, per state; deliveries per
    id; with several gateways, the one holding each delivered message."""

    ready: dict[int, int] = field(default_factory=dict)
    in_flight: dict[int, int] = field(default_factory=dict)
    buried: dict[int, int] = field(default_factory=dict)
    deferred: dict[int, int] = field(default_factory=dict)  # due in an hour: until kicked
    deliveries: dict[int, int] = field(default_factory=dict)
    holder: dict[int, int] = field(default_factory=dict)
    paused: bool = False

    def most_urgent(self) -> int:
        return min(self.ready, key=lambda i: (self.ready[i], i))

    def state(self, msg_id: int) -> str | None:
        """Where the message is, in beanstalkd's words (None: finished or deleted)."""
        for name, queue in (
            ("ready", self.ready),
            ("reserved", self.in_flight),
            ("buried", self.buried),
            ("delayed", self.deferred),
        ):
            if msg_id in queue:
                return name
        return None

    def delivered(self, msg_id: int, attempts: int, priority: int) -> None:
        """The message went to a consumer: with its attempts counted, in flight."""
        self.deliveries[msg_id] = self.deliveries.get(msg_id, 0) + 1
        assert attempts == self.deliveries[msg_id]
        self.in_flight[msg_id] = priority


async def deliver(
    consumer: Consumer, sink: Collector, held: Held, bodies: dict[int, bytes], where: str
) -> int:
    """One delivery to `consumer` (RDY one more, then 0): the most urgent ready message,
    its body and its attempts. Returns its id."""
    want = held.most_urgent()
    seen = len(sink.got)
    consumer.set_ready(consumer.in_flight + 1)
    with trio.fail_after(10):
        await sink.until(seen + 1)
    consumer.set_ready(0)
    got = sink.got[-1]
    assert len(sink.got) == seen + 1
    assert (got.id, got.priority) == (want, held.ready[want]), (
        f"{where} delivered {got.id} (priority {got.priority}), the most urgent ready is"
        f" {want} (priority {held.ready[want]})"
    )
    assert got.body == bodies[want]
    held.delivered(want, got.attempts, held.ready.pop(want))
    return want


def answer(g: Group, held: Held, kind: str, msg_id: int, priority: int | None, delay: bool) -> None:
    """finish, requeue (with `priority` if not None, for an hour if `delay`) or bury a
    message in flight, on the group of the gateway that holds it."""
    was = held.in_flight.pop(msg_id)
    if kind == "finish":
        outcome = g.finish(None, msg_id)
    elif kind == "requeue":
        outcome = g.requeue(None, msg_id, HOUR if delay else 0.0, priority)
        into = held.deferred if delay else held.ready
        into[msg_id] = was if priority is None else priority
    else:
        outcome = g.bury(None, msg_id)
        held.buried[msg_id] = was
    assert outcome is Outcome.OK


async def kick(b: Broker, g: Group, held: Held) -> None:
    """beanstalkd kick: the buried ones, or if none the delayed ones."""
    kicked = await b.kick(g, 1000)
    moved = held.buried or held.deferred
    assert kicked == len(moved)
    held.ready.update(moved)
    moved.clear()


async def by_id(
    b: Broker,
    g: Group,
    held: Held,
    kind: str,
    k: int,
    consumer: Consumer | None,
    bodies: dict[int, bytes],
) -> int | None:
    """beanstalkd delete or reserve-job (`kind` "take") of the k-th waiting message,
    ready, buried or delayed (None if none waits), reserved for `consumer`; its id."""
    waiting = {**held.ready, **held.buried, **held.deferred}
    if not waiting:
        return None
    msg_id = sorted(waiting)[k % len(waiting)]
    for queue in (held.ready, held.buried, held.deferred):
        queue.pop(msg_id, None)
    if kind == "delete":
        assert await b.delete_stored(g, msg_id)
    else:
        assert consumer is not None
        got = await b.take_stored(g, consumer, msg_id)
        assert got is not None and (got.id, got.body) == (msg_id, bodies[msg_id])
        held.delivered(msg_id, got.attempts, waiting[msg_id])
    return msg_id
