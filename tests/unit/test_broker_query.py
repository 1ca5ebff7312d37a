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
        assert (c.delayed, c.reserved, c.buried, c.urgent) == (2, 1, 1, 1)
        view = query.group(b, "t", "g")
        assert view is not None and view.counts == c


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


def ids(msgs: list[Message]) -> list[int]:
    return [m.id for m in msgs]


async def test_group_peeks_give_copies() -> None:
    async with broker() as b:
        g, _, msgs = every_state(b)
        urgent = await query.peek(b, g, "ready")
        assert urgent is not None and urgent.id == msgs["urgent"].id
        assert urgent is not msgs["urgent"]  # a value: changing it changes nothing queued
        assert query.ready_head(g) == (msgs["urgent"].priority, msgs["urgent"].id)
        soon, buried = await query.peek(b, g, "delayed"), await query.peek(b, g, "buried")
        assert soon is not None and soon.id == msgs["soon"].id
        assert buried is not None and buried.id == msgs["buried"].id
        empty = b.group("other", "g")
        for state in ("ready", "delayed", "buried"):
            assert await query.peek(b, empty, state) is None
        assert query.ready_head(empty) is None


async def test_admin_lists_in_their_orders_and_limits() -> None:
    async with broker() as b:
        g, c, msgs = every_state(b)
        more = one(b, b"more", delay=1.0)
        assert ids(await query.first(b, g, "ready", 10)) == ids([msgs["urgent"], msgs["ready"]])
        assert ids(await query.first(b, g, "ready", 1)) == [msgs["urgent"].id]
        delayed = [more, msgs["soon"], msgs["late"]]
        assert ids(await query.first(b, g, "delayed", 10)) == ids(delayed)
        assert ids(await query.first(b, g, "delayed", 2)) == ids(delayed[:2])
        second = one(b, b"second buried", priority=0)
        assert g.take(c) is second
        g.bury(c, second.id)
        assert ids(await query.first(b, g, "buried", 10)) == ids([msgs["buried"], second])
        assert ids(await query.first(b, g, "buried", 1)) == [msgs["buried"].id]
        assert await query.first(b, g, "buried", 0) == []


async def test_backlog_split_counts_and_peeks(autojump_clock: trio.testing.MockClock) -> None:
    async with broker() as b:
        t = b.topic("t")
        assert t is not None and not query.has_groups(b, "t")
        low = one(b, b"low", priority=2000)
        urgent = one(b, b"urgent", priority=3)
        late = one(b, b"late", delay=20.0)
        soon = one(b, b"soon", delay=10.0)
        assert ids(await query.first(b, t, "ready", 9)) == ids([urgent, low])
        assert ids(await query.first(b, t, "delayed", 9)) == ids([soon, late])
        assert query.counts(t) == query.Counts(2, 2, 0, 0, 1, 0)
        view = query.topic(b, "t")
        assert view is not None and view.backlog == 4
        peeked = await query.peek(b, t, "ready")  # lowest (priority, id), not publish order
        assert peeked is not None and peeked.id == urgent.id
        peeked = await query.peek(b, t, "delayed")  # soonest due, not publish order
        assert peeked is not None and peeked.id == soon.id
        assert await query.peek(b, t, "buried") is None
        await trio.sleep(15)
        assert ids(await query.first(b, t, "ready", 9)) == ids([urgent, soon, low])
        assert query.counts(t).ready == 3
        peeked = await query.peek(b, t, "delayed")
        assert peeked is not None and peeked.id == late.id
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
            assert (found.state, found.message.id, found.group, found.topic) == (
                state,
                msgs[name].id,
                "g",
                "t",
            )
            assert found.message is not msgs[name] and not found.stored
        assert query.locate(g, 999) is None
        await trio.sleep(4)
        reserved = query.locate(g, msgs["reserved"].id)
        late = query.locate(g, msgs["late"].id)
        ready = query.locate(g, msgs["ready"].id)
        assert reserved is not None and late is not None and ready is not None
        assert reserved.left == pytest.approx(26.0)  # a 30 s timeout
        assert late.left == pytest.approx(16.0)
        assert ready.left == 0.0
        past = query.locate(g, msgs["late"].id, now=trio.current_time() + 60)
        assert past is not None and past.left == 0.0  # never negative
        deadline = query.deadline(g, msgs["reserved"].id, c)
        assert deadline == pytest.approx(trio.current_time() + 26.0)
        other = g.attach(Collector(), 30.0)
        assert query.deadline(g, msgs["reserved"].id, other) is None  # not this consumer's
        assert query.deadline(g, msgs["ready"].id, c) is None


async def test_locate_in_a_backlog_and_across_topics() -> None:
    async with broker() as b:
        waiting = one(b, b"waiting")
        later = one(b, b"later", delay=30.0)
        g = b.group("u", "g")
        (in_group,), _ = b.publish("u", [b"in group"])
        t = b.topic("t", create=False)
        assert t is not None
        found = query.locate(t, later.id)
        assert found is not None
        assert (found.state, found.message.id, found.topic, found.group) == (
            "delayed",
            later.id,
            "t",
            None,
        )
        located = query.locate_in(b, waiting.id, lambda topic: topic)
        assert located is not None and located.state == "ready" and located.topic == "t"
        # the picker decides which view of each topic is searched
        assert query.locate_in(b, in_group.id, lambda topic: topic) is None
        by_group = query.locate_in(b, in_group.id, lambda topic: topic.group("g", create=False))
        assert by_group is not None and (by_group.topic, by_group.group) == ("u", g.name)


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
        assert alpha is not None and alpha.groups == ("two", "one")
        assert query.has_groups(b, "alpha") and not query.has_groups(b, "zeta")
        assert [g.name for g in query.groups(b, "alpha")] == ["two", "one"]
        assert [g.name for g in query.groups(b, "alpha", by_name=True)] == ["one", "two"]
        assert query.group_names(b, "alpha", by_name=True) == ["one", "two"]
        one_group = query.group(b, "alpha", "one")
        assert one_group is not None and (one_group.topic, one_group.name) == ("alpha", "one")
        assert query.group(b, "alpha", "three") is None
        assert query.group(b, "nope", "one") is None
        assert [g.name for g in query.groups(b, "alpha")] == ["two", "one"]


async def test_views_are_values_taken_when_asked() -> None:
    async with broker() as b:
        g = b.group("t", "g")
        one(b, b"a")
        topic, group = query.topic(b, "t"), query.group(b, "t", "g")
        assert topic is not None and group is not None
        one(b, b"b")
        g.pause()
        b.group("t", "h")
        assert (group.counts.ready, group.paused, topic.groups) == (1, False, ("g",))
        assert topic.message_count == 1
        with pytest.raises(AttributeError):
            group.paused = True  # type: ignore[misc]


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
        view = query.group(b, "t", "g")
        assert view is not None and view.consumers == (
            query.ConsumerInfo("nsq", "10.0.0.1:5000", in_flight=3, ready=5, client=None),
            query.ConsumerInfo("other", "", in_flight=0, ready=0, client=None),
        )
        g.detach(first, requeue=True)
        view = query.group(b, "t", "g")
        assert view is not None and [c.protocol for c in view.consumers] == ["other"]
