"""The broker's read-only query API on Trio's MockClock: counts per state (spilled ready
messages included), peeks, the admin lists, locating an id, and the one ready/delayed
selection over a topic backlog."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from gateway.broker import Broker, Consumer, Group, query
from gateway.model import DEFAULT_PRIORITY, Message
from tests.helpers import running_broker as broker


class Collector:
    def __init__(self) -> None:
        self.got: list[Message] = []

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self.got.append(message)
        return True


def one(b: Broker, body: bytes, *, priority: int = DEFAULT_PRIORITY, delay: float = 0.0) -> Message:
    (msg,), _ = b.publish("t", [body], priority=priority, delay=delay)
    return msg


def every_state(b: Broker) -> tuple[Group, Consumer, dict[str, Message]]:
    """A group `t/g` with messages in every state: two ready (one urgent), two delayed,
    one reserved, one buried."""
    g = b.group("t", "g")
    reserved = one(b, b"reserved", priority=0)
    c = g.attach(Collector(), 30.0)
    c.set_ready(1)  # takes `reserved`, the only ready message
    c.set_ready(0)
    buried = one(b, b"buried")
    assert g.take(c) is buried
    g.bury(c, buried.id)
    msgs = {
        "reserved": reserved,
        "buried": buried,
        "ready": one(b, b"ready"),
        "urgent": one(b, b"urgent", priority=5),
        "late": one(b, b"late", delay=20.0),
        "soon": one(b, b"soon", delay=10.0),
    }
    return g, c, msgs


async def test_group_counts_per_state_and_spilled_ready() -> None:
    async with broker() as b:
        g, _, _ = every_state(b)
        assert query.counts(g) == query.Counts(
            ready=2, delayed=2, reserved=1, buried=1, urgent=1, spilled=0
        )
        g.queue.spilled = 7  # a durable store holds seven more ready messages on disk
        c = query.counts(g)
        assert (c.ready, c.spilled) == (9, 7)
        assert query.ready_count(g) == 9
        assert (query.delayed_count(g), query.reserved_count(g), query.buried_count(g)) == (2, 1, 1)
        assert query.urgent_count(g) == 1


async def test_counts_add_up_field_by_field() -> None:
    a = query.Counts(1, 2, 3, 4, 5, 6)
    assert sum([a, a], query.NO_COUNTS) == query.Counts(2, 4, 6, 8, 10, 12)


async def test_holds_messages_counts_spilled_ones() -> None:
    async with broker() as b:
        g = b.group("t", "g")
        assert not query.holds_messages(g)
        g.queue.spilled = 1
        assert query.holds_messages(g)
        g.queue.spilled = 0
        one(b, b"x", delay=5.0)
        assert query.holds_messages(g)


async def test_group_peeks() -> None:
    async with broker() as b:
        g, _, msgs = every_state(b)
        assert query.peek_ready(g) is msgs["urgent"]
        assert query.peek_delayed(g) is msgs["soon"]
        assert query.peek_buried(g) is msgs["buried"]
        empty = b.group("other", "g")
        assert query.peek_ready(empty) is None
        assert query.peek_delayed(empty) is None
        assert query.peek_buried(empty) is None


async def test_admin_lists_in_their_orders_and_limits() -> None:
    async with broker() as b:
        g, c, msgs = every_state(b)
        more = one(b, b"more", delay=1.0)
        assert query.first_ready(g, 10) == [msgs["urgent"], msgs["ready"]]
        assert query.first_ready(g, 1) == [msgs["urgent"]]
        assert query.first_delayed(g, 10) == [more, msgs["soon"], msgs["late"]]
        assert query.first_delayed(g, 2) == [more, msgs["soon"]]
        second = one(b, b"second buried", priority=0)
        assert g.take(c) is second
        g.bury(c, second.id)
        assert query.first_buried(g, 10) == [msgs["buried"], second]
        assert query.first_buried(g, 1) == [msgs["buried"]]
        assert query.first_buried(g, 0) == []


async def test_backlog_split_counts_and_peeks(autojump_clock: trio.testing.MockClock) -> None:
    async with broker() as b:
        t = b.topic("t")
        assert t is not None and not query.has_groups(t)
        low = one(b, b"low", priority=2000)
        urgent = one(b, b"urgent", priority=3)
        late = one(b, b"late", delay=20.0)
        soon = one(b, b"soon", delay=10.0)
        ready, delayed = query.split_backlog(t)
        assert (ready, delayed) == ([low, urgent], [late, soon])
        assert query.counts(t) == query.Counts(2, 2, 0, 0, 1, 0)
        assert query.backlog_depth(t) == 4
        assert query.peek_ready(t) is urgent  # lowest (priority, id), not publish order
        assert query.peek_delayed(t) is soon  # soonest due, not publish order
        assert query.peek_buried(t) is None
        await trio.sleep(15)
        assert query.split_backlog(t) == ([low, urgent, soon], [late])
        assert query.counts(t).ready == 3
        assert query.peek_delayed(t) is late
        # an explicit `now` is what every count and peek compares against
        assert query.counts(t, now=trio.current_time() + 100).delayed == 0


async def test_locate_in_a_group_and_time_left(autojump_clock: trio.testing.MockClock) -> None:
    async with broker() as b:
        g, c, msgs = every_state(b)
        for name, state in [
            ("reserved", "reserved"),
            ("buried", "buried"),
            ("ready", "ready"),
            ("urgent", "ready"),
            ("late", "delayed"),
        ]:
            found = query.locate(g, msgs[name].id)
            assert found is not None
            assert (found.state, found.message, found.group, found.topic) == (
                state,
                msgs[name],
                g,
                g.topic,
            )
            assert found.view is g
        assert query.locate(g, 999) is None
        await trio.sleep(4)
        reserved = query.locate(g, msgs["reserved"].id)
        late = query.locate(g, msgs["late"].id)
        ready = query.locate(g, msgs["ready"].id)
        assert reserved is not None and late is not None and ready is not None
        assert query.time_left(reserved) == pytest.approx(26.0)  # a 30 s timeout
        assert query.time_left(late) == pytest.approx(16.0)
        assert query.time_left(ready) == 0.0
        assert query.time_left(late, now=trio.current_time() + 60) == 0.0  # never negative
        entry = query.reservation(g, msgs["reserved"].id)
        assert entry is not None and entry.consumer is c
        assert query.reservation(g, msgs["ready"].id) is None


async def test_locate_in_a_backlog_and_across_topics() -> None:
    async with broker() as b:
        waiting = one(b, b"waiting")
        later = one(b, b"later", delay=30.0)
        g = b.group("u", "g")
        (in_group,), _ = b.publish("u", [b"in group"])
        t = query.topic(b, "t")
        assert t is not None
        found = query.locate(t, later.id)
        assert found is not None
        assert (found.state, found.message, found.group, found.view) == ("delayed", later, None, t)
        located = query.locate_in(b, waiting.id, lambda topic: topic)
        assert located is not None and located.state == "ready" and located.view is t
        # the picker decides which view of each topic is searched
        assert query.locate_in(b, in_group.id, lambda topic: topic) is None
        by_group = query.locate_in(b, in_group.id, lambda topic: query.group(topic, "g"))
        assert by_group is not None and by_group.group is g


async def test_topic_and_group_lookup_and_listing() -> None:
    async with broker() as b:
        b.topic("zeta")
        b.group("alpha", "two")
        b.group("alpha", "one")
        assert query.topic(b, "nope") is None
        assert "nope" not in query.topic_names(b)  # looking never creates
        assert query.topic_names(b) == ["zeta", "alpha"]  # creation order
        assert query.topic_names(b, by_name=True) == ["alpha", "zeta"]
        assert [t.name for t in query.topics(b)] == ["zeta", "alpha"]
        assert [t.name for t in query.topics(b, by_name=True)] == ["alpha", "zeta"]
        alpha = query.topic(b, "alpha")
        assert alpha is not None and query.has_groups(alpha)
        assert [g.name for g in query.groups(alpha)] == ["two", "one"]
        assert [g.name for g in query.groups(alpha, by_name=True)] == ["one", "two"]
        one_group = query.group(alpha, "one")
        assert one_group is not None and one_group.name == "one"
        assert query.group(alpha, "three") is None
        assert [g.name for g in query.groups(alpha)] == ["two", "one"]


class Peer(Collector):
    protocol = "nsq"

    def __init__(self, remote: str) -> None:
        super().__init__()
        self.remote = remote


async def test_consumers_with_protocol_address_and_in_flight() -> None:
    async with broker() as b:
        g = b.group("t", "g")
        for body in (b"a", b"b", b"c"):
            one(b, body)
        first = g.attach(Peer("10.0.0.1:5000"), 30.0)
        g.attach(Collector(), 30.0)  # a sink without protocol or address
        first.set_ready(5)
        assert query.consumers(g) == [
            query.ConsumerInfo("nsq", "10.0.0.1:5000", in_flight=3, ready=5),
            query.ConsumerInfo("other", "", in_flight=0, ready=0),
        ]
        g.detach(first, requeue=True)
        assert [c.protocol for c in query.consumers(g)] == ["other"]
