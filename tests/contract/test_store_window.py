"""The memory window of a paging store (LocalQueue, gateway/broker/queues.py), over every
store of the contract suite: past `memory_window` ready messages the rest stay on disk and
are paged in as consumers drain the window. Each message must be in exactly one place,
whatever order its priority puts it in: in memory, on disk only, in flight or deferred.
(Over the memory store nothing pages, and these are plain broker tests.)"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from gateway.broker import Broker, journal
from gateway.broker.members import Outcome
from gateway.model import Message
from tests.contract import test_store_contract as contract
from tests.contract.test_store_contract import Pair, started
from tests.unit.test_broker import Collector

pair = contract.pair  # the contract suite's fixture: every store, started


async def drain(g: object, sink: Collector, want: int) -> None:
    """Take and finish until `want` deliveries arrived (or nothing more comes)."""
    c = g.attach(sink, 60)  # type: ignore[attr-defined]
    c.set_ready(7)
    with trio.move_on_after(5):
        while len(sink.got) < want:
            seen = len(sink.got)
            for m in list(sink.got):
                if m.id in g.in_flight:  # type: ignore[attr-defined]
                    g.finish(c, m.id)  # type: ignore[attr-defined]
            await sink.until(seen + 1)
    for m in list(sink.got):
        if m.id in g.in_flight:  # type: ignore[attr-defined]
            g.finish(c, m.id)  # type: ignore[attr-defined]
    await trio.testing.wait_all_tasks_blocked()


def once_each(sink: Collector) -> list[bytes]:
    twice = [body for body, n in Counter(sink.bodies).items() if n > 1]
    assert not twice, f"delivered more than once: {twice[:5]}"
    return sink.bodies


async def held_then_spilled(b: Broker) -> tuple[Any, Any, Message]:
    """Group g of topic t with a job (priority 2000) delivered and held, then 33 more
    urgent ones published past a window of 10: the group, the holder, the held job."""
    g = b.group("t", "g")
    holder = Collector()
    h = g.attach(holder, 600)
    b.publish("t", [b"held"], priority=2000)
    h.set_ready(1)
    (held,) = holder.got
    h.set_ready(0)
    b.publish("t", [b"%02d" % i for i in range(33)], priority=1024)
    await b.flush()
    return g, h, held


async def test_a_less_urgent_job_in_flight_when_spilling_starts_is_not_paged_in_again(
    pair: Pair,
) -> None:
    """A job reserved before the window filled, with a less urgent priority than what
    spills after it: the page-in reads past it on disk (its record says ready, with the
    delivery counted) and must leave it to the worker that holds it."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        g, h, held = await held_then_spilled(b)
        sink = Collector()
        await drain(g, sink, 33)
        assert once_each(sink) == [b"%02d" % i for i in range(33)]
        assert g.finish(h, held.id) is Outcome.OK  # still the holder's, and finished once
        assert g.depth == 0 and not g.in_flight
        nursery.cancel_scope.cancel()


async def test_a_less_urgent_job_finished_after_spilling_starts_is_not_paged_in(
    pair: Pair,
) -> None:
    """As above, but the held job is finished before the page-in: a store that records
    the finish after the read (a log whose index lags) must still never bring it back."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        g, h, held = await held_then_spilled(b)
        assert g.finish(h, held.id) is Outcome.OK
        sink = Collector()
        await drain(g, sink, 33)
        assert once_each(sink) == [b"%02d" % i for i in range(33)]
        assert g.depth == 0 and not g.in_flight
        nursery.cancel_scope.cancel()


async def test_a_backlog_adopted_past_the_window_keeps_each_message_once(pair: Pair) -> None:
    """The first group takes a backlog whose first message is less urgent than the rest:
    kept in memory while the others spill, it must not also be paged in from disk."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        b.publish("t", [b"low"], priority=2000)
        b.publish("t", [b"%02d" % i for i in range(33)], priority=1024)
        await b.flush()
        g = b.group("t", "g")
        sink = Collector()
        await drain(g, sink, 34)
        assert once_each(sink) == [b"%02d" % i for i in range(33)] + [b"low"]
        assert g.depth == 0
        nursery.cancel_scope.cancel()


async def test_a_deferred_message_due_at_restart_leaves_the_spilled_ones_reachable(
    pair: Pair, monkeypatch: object
) -> None:
    """Restart with more ready messages than the window and a deferred one (the newest)
    that fell due while the gateway was down: every message is delivered, none twice."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        b.group("t", "g")
        b.publish("t", [b"%02d" % i for i in range(30)])
        b.publish("t", [b"later"], delay=30)
        await b.flush()
        await pair.store.close()  # kill -9 after the last commit
        nursery.cancel_scope.cancel()
    # a minute later, on the wall clock the store keeps due times in
    real = journal.time.time
    monkeypatch.setattr(journal, "time", SimpleNamespace(time=lambda: real() + 60))  # type: ignore[attr-defined]
    pair.store = pair._reopen(pair.store)
    async with trio.open_nursery() as nursery:
        b2 = Broker(pair.store, memory_window=10)
        await b2.open()
        await nursery.start(b2.run)
        g2 = b2.topics["t"].groups["g"]
        sink = Collector()
        await drain(g2, sink, 31)
        assert sorted(once_each(sink)) == sorted([b"%02d" % i for i in range(30)] + [b"later"])
        assert g2.depth == 0 and not g2.deferred
        nursery.cancel_scope.cancel()


async def test_a_release_after_its_topic_was_deleted_finds_nothing(pair: Pair) -> None:
    """A beanstalkd worker releases (or buries) a job whose tube an operator deleted: the
    job went with the tube, the reply is NOT_FOUND, and nothing is recorded for it."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery)
        g = b.group("t", "g")
        sink = Collector()
        c = g.attach(sink, 60)
        b.publish("t", [b"a", b"b"])
        c.set_ready(2)
        first, second = sink.got
        b.delete_topic("t")
        assert g.requeue(c, first.id, 0) is Outcome.NOT_IN_FLIGHT
        assert g.bury(c, second.id) is Outcome.NOT_IN_FLIGHT
        await b.flush()
        nursery.cancel_scope.cancel()
    state = await pair.reopened()
    assert "t" not in state.topics


async def test_a_paused_topics_backlog_past_the_window_goes_to_its_group_once(
    pair: Pair,
) -> None:
    """A paused topic keeps what is published meanwhile in its backlog, which keeps a
    memory window of its own (the rest on disk). Unpaused, the group that already holds
    messages takes it over, memory and disk, and delivers every message once, in order."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        g = b.group("t", "g")
        b.publish("t", [b"a%02d" % i for i in range(5)])
        t = b.topics["t"]
        t.pause()
        b.publish("t", [b"b%02d" % i for i in range(30)])
        await b.flush()
        assert t.depth == 30 and g.depth == 5
        if pair.store.pages:
            assert len(t.backlog) == 10 and t.window.spilled == 20
        t.unpause()
        assert t.depth == 0 and g.depth == 35
        sink = Collector()
        await drain(g, sink, 35)
        assert once_each(sink) == [b"a%02d" % i for i in range(5)] + [
            b"b%02d" % i for i in range(30)
        ]
        nursery.cancel_scope.cancel()


async def test_a_backlog_past_the_window_waits_for_a_group_that_can_page_it_in(
    pair: Pair,
) -> None:
    """An ephemeral channel keeps nothing on disk: it does not take a backlog partly on
    disk (it gets what is published from then on), and the first durable group does."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        b.publish("t", [b"%02d" % i for i in range(25)])
        await b.flush()
        e = b.group("t", "e#ephemeral", ephemeral=True)
        b.publish("t", [b"new"])
        if pair.store.pages:
            assert b.topics["t"].depth == 25 and e.depth == 1
        g = b.group("t", "g")
        sink = Collector()
        want = 25 if pair.store.pages else 0  # else the ephemeral channel took them all
        await drain(g, sink, want)
        assert once_each(sink) == [b"%02d" % i for i in range(want)]
        nursery.cancel_scope.cancel()


async def test_publishes_wholly_past_the_window_page_in_once_in_order(pair: Pair) -> None:
    """Publishes that come after the spill point stay on disk whole (counted at once, not
    message by message), into a group and into a topic's backlog alike, and page in
    once each, in order, with a consumer draining them meanwhile."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        for k in range(4):  # a backlog: no group yet
            b.publish("t", [b"a%d-%02d" % (k, i) for i in range(15)])
        g = b.group("t", "g")
        for k in range(4):
            b.publish("t", [b"b%d-%02d" % (k, i) for i in range(15)])
        b.publish("t", [b"c"])
        await b.flush()
        if pair.store.pages:
            assert len(g.ready) <= 10 and g.queue.spilled == 121 - len(g.ready)
        sink = Collector()
        await drain(g, sink, 121)
        assert once_each(sink) == [
            *(b"a%d-%02d" % (k, i) for k in range(4) for i in range(15)),
            *(b"b%d-%02d" % (k, i) for k in range(4) for i in range(15)),
            b"c",
        ]
        nursery.cancel_scope.cancel()


async def test_withdrawn_messages_past_the_window_are_taken_back(pair: Pair) -> None:
    """A link whose publish failed to commit takes the messages back (Broker.withdraw) to
    hand them to the server it took them from: those that went to disk only, past the
    window of a group or of a topic's backlog, must go too, or they would arrive twice."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        g = b.group("t", "g")
        msgs, _ = b.publish("t", [b"g%02d" % i for i in range(25)])
        backlog, _ = b.publish("u", [b"u%02d" % i for i in range(25)])
        await b.flush()
        assert b.withdraw([*msgs[18:], *backlog[18:]]) == 14
        sink = Collector()
        await drain(g, sink, 18)
        assert once_each(sink) == [b"g%02d" % i for i in range(18)]
        assert b.topics["u"].depth == 18
        u = Collector()
        await drain(b.group("u", "g"), u, 18)
        assert once_each(u) == [b"u%02d" % i for i in range(18)]
        nursery.cancel_scope.cancel()
