"""The broker on Trio's MockClock: deadlines, deferral, requeue delay, max_attempts, fan-out."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from gateway.broker import Broker, Consumer, Outcome
from gateway.broker.stats import DELIVERED
from gateway.model import Message
from gateway.stores import MemoryStore
from tests.helpers import running_broker as broker


class Collector:
    """A sink that records deliveries, like a connection's outbox."""

    def __init__(self) -> None:
        self.got: list[Message] = []
        self.attempts: list[int] = []
        self.accept = True
        self._more = trio.Event()

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        if not self.accept:
            return False
        self.got.append(message)
        self.attempts.append(message.attempts)
        self._more.set()
        return True

    async def until(self, count: int) -> None:
        """Wait, without spinning, until `count` deliveries arrived. (A loop of
        wait_all_tasks_blocked and sleep(0) keeps the GIL so busy that a store's worker
        thread can wait seconds to take it back after a syscall.)"""
        while len(self.got) < count:
            self._more = trio.Event()
            await self._more.wait()

    @property
    def bodies(self) -> list[bytes]:
        return [m.body for m in self.got]


async def test_topic_without_group_buffers_for_the_first_group() -> None:
    async with broker() as b:
        b.publish("t", [b"m1", b"m2"])
        g = b.group("t", "c1")
        sink = Collector()
        g.attach(sink, 60).set_ready(10)
        assert sink.bodies == [b"m1", b"m2"]
        # a second group only sees what is published after it exists
        g2 = b.group("t", "c2")
        sink2 = Collector()
        g2.attach(sink2, 60).set_ready(10)
        b.publish("t", [b"m3"])
        assert sink.bodies == [b"m1", b"m2", b"m3"]
        assert sink2.bodies == [b"m3"]


async def test_ready_is_a_window_not_a_counter() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        sink = Collector()
        c = g.attach(sink, 60)
        b.publish("t", [b"a", b"b", b"c"])
        assert sink.bodies == []
        c.set_ready(1)
        assert sink.bodies == [b"a"]
        assert g.finish(c, sink.got[0].id) is Outcome.OK
        assert sink.bodies == [b"a", b"b"]  # no new RDY needed
        c.set_ready(0)
        g.finish(c, sink.got[1].id)
        assert sink.bodies == [b"a", b"b"]
        c.set_ready(1)
        assert sink.bodies == [b"a", b"b", b"c"]


async def test_one_member_per_message_inside_a_group() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s1, s2 = Collector(), Collector()
        g.attach(s1, 60).set_ready(100)
        g.attach(s2, 60).set_ready(100)
        b.publish("t", [b"%d" % i for i in range(100)])
        assert len(s1.got) + len(s2.got) == 100
        assert sorted(s1.bodies + s2.bodies) == sorted(b"%d" % i for i in range(100))
        assert s1.got and s2.got


async def test_consumers_sharing_a_group_take_equal_runs_of_what_is_ready() -> None:
    """Several consumers with room share what is ready in turns of an equal share each,
    as one run of consecutive messages (their finishes are then runs of ids, which a
    shared store records as one range); one message at a time still goes round."""
    async with broker() as b:
        g = b.group("t", "c")
        sinks = [Collector() for _ in range(3)]
        for s in sinks:
            g.attach(s, 60).set_ready(1000)
        b.publish("t", [b"%d" % i for i in range(300)])
        runs = [[int(m.body) for m in s.got] for s in sinks]
        assert sorted(len(r) for r in runs) == [100, 100, 100]
        assert all(r == list(range(r[0], r[0] + 100)) for r in runs)
        for _ in range(3):
            b.publish("t", [b"one"])
        assert [len(s.got) for s in sinks] == [101, 101, 101]


async def test_priority_then_id_order() -> None:
    async with broker() as b:
        b.publish("t", [b"low"], priority=2000)
        b.publish("t", [b"urgent1"], priority=0)
        b.publish("t", [b"default"])
        b.publish("t", [b"urgent2"], priority=0)
        g = b.group("t", "c")
        sink = Collector()
        g.attach(sink, 60).set_ready(10)
        assert sink.bodies == [b"urgent1", b"urgent2", b"default", b"low"]


async def test_finish_errors() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s1, s2 = Collector(), Collector()
        c1 = g.attach(s1, 60)
        c2 = g.attach(s2, 60)
        c1.set_ready(1)
        b.publish("t", [b"x"])
        mid = s1.got[0].id
        assert g.finish(c2, mid) is Outcome.NOT_OWNER
        assert g.finish(c1, 999) is Outcome.NOT_IN_FLIGHT
        assert g.finish(c1, mid) is Outcome.OK
        assert g.finish(c1, mid) is Outcome.NOT_IN_FLIGHT


async def test_deadline_expiry_redelivers_with_attempts_plus_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s1 = Collector()
        c1 = g.attach(s1, 5.0)
        c1.set_ready(1)
        b.publish("t", [b"x"])
        assert s1.attempts == [1]
        g.detach(c1, requeue=False)  # nsqd: stays in flight until the deadline
        s2 = Collector()
        g.attach(s2, 5.0).set_ready(1)
        start = trio.current_time()
        await trio.sleep(4.999)
        assert s2.got == []
        await trio.sleep(0.002)
        assert s2.attempts == [2]
        assert g.timeout_count == 1
        assert trio.current_time() - start == pytest.approx(5.001)


async def test_touch_extends_but_not_past_the_cap(autojump_clock: trio.testing.MockClock) -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 10.0)
        c.set_ready(1)
        b.publish("t", [b"x"])
        mid = s.got[0].id
        await trio.sleep(8)
        assert g.touch(c, mid, 10.0, cap=15.0) is Outcome.OK  # now 18 > cap 15
        await trio.sleep(6.9)  # t = 14.9
        assert g.timeout_count == 0
        await trio.sleep(0.2)  # t = 15.1
        assert g.timeout_count == 1
        assert s.attempts == [1, 2]


async def test_deferred_publish(autojump_clock: trio.testing.MockClock) -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        g.attach(s, 60).set_ready(10)
        b.publish("t", [b"later"], delay=1.0)
        b.publish("t", [b"now"])
        assert s.bodies == [b"now"]
        assert len(g.deferred) == 1
        await trio.sleep(0.999)
        assert s.bodies == [b"now"]
        await trio.sleep(0.002)
        assert s.bodies == [b"now", b"later"]


async def test_requeue_with_delay(autojump_clock: trio.testing.MockClock) -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 60)
        c.set_ready(1)
        b.publish("t", [b"x"])
        assert g.requeue(c, s.got[0].id, 2.5) is Outcome.OK
        assert g.requeue_count == 1
        await trio.sleep(2.49)
        assert len(s.got) == 1
        await trio.sleep(0.02)
        assert s.attempts == [1, 2]


async def test_requeue_now_goes_back_in_id_order() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 60)
        b.publish("t", [b"a", b"b", b"c"])
        c.set_ready(1)
        g.requeue(c, s.got[0].id, 0)
        assert s.bodies == [b"a", b"a"]


async def test_max_attempts_buries_and_kick_returns(autojump_clock: trio.testing.MockClock) -> None:
    async with broker(max_attempts=2) as b:
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 1.0)
        c.set_ready(1)
        b.publish("t", [b"poison"])
        await trio.sleep(1.01)  # attempt 1 timed out
        assert s.attempts == [1, 2]
        await trio.sleep(1.01)  # attempt 2 timed out: buried
        assert s.attempts == [1, 2]
        assert list(g.buried) == [s.got[0].id]
        assert g.kick(10) == 1
        assert s.attempts == [1, 2, 3]
        assert g.finish(c, s.got[0].id) is Outcome.OK


async def test_detach_with_requeue_makes_messages_ready_at_once() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s1, s2 = Collector(), Collector()
        c1 = g.attach(s1, 60)
        c1.set_ready(5)
        b.publish("t", [b"1", b"2"])
        g.attach(s2, 60).set_ready(5)
        g.detach(c1, requeue=True)
        assert s2.bodies == [b"1", b"2"]


async def test_ephemeral_group_goes_with_its_last_consumer() -> None:
    async with broker() as b:
        g = b.group("t", "c#ephemeral", ephemeral=True)
        c = g.attach(Collector(), 60)
        assert "c#ephemeral" in b.topics["t"].groups
        g.detach(c, requeue=False)
        assert "c#ephemeral" not in b.topics["t"].groups


async def test_declined_delivery_counts_as_finished() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        s.accept = False
        g.attach(s, 60).set_ready(1)
        b.publish("t", [b"a", b"b"])
        assert g.finish_count == 2
        assert not g.in_flight


async def test_a_window_refilled_at_once_is_recorded_before_the_sink_sees_it() -> None:
    """A consumer alone with room for many gets them in one batch: in priority order,
    attempts counted, every one in flight with its deadline; what the sink declines is
    finished, never left recorded as delivered."""
    async with broker() as b:
        g = b.group("t", "c")
        b.publish("t", [b"late"], priority=9)
        b.publish("t", [b"a", b"b", b"c"], priority=1)
        s = Collector()
        c = g.attach(s, 60)
        c.set_ready(10)
        assert s.bodies == [b"a", b"b", b"c", b"late"] and s.attempts == [1, 1, 1, 1]
        assert len(g.in_flight) == 4 and c.in_flight == 4
        entries = [g.in_flight[m.id] for m in s.got]
        assert all(e.deadline == e.delivered_at + 60 for e in entries)
        assert c.counts[DELIVERED] == 4
        for m in s.got:
            assert g.finish(c, m.id, pump=False) is Outcome.OK
        s.accept = False  # the next batch is declined: each one finished at once
        b.publish("t", [b"x", b"y"])
        assert g.finish_count == 6 and not g.in_flight and c.in_flight == 0
        # the memory store holds nothing for them (a restart would not bring them back)
        assert not b.journal.store._topics["t"].groups["c"].messages  # type: ignore[attr-defined]


async def test_a_sink_that_lets_its_consumer_go_mid_batch_gets_no_more() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        b.publish("t", [b"1", b"2", b"3"])
        got: list[bytes] = []

        class Leaving:
            def deliver(self, message: Message, consumer: Consumer) -> bool:
                got.append(message.body)
                g.detach(consumer, requeue=True)  # as a connection closing would
                return True

        g.attach(Leaving(), 60).set_ready(3)
        assert got == [b"1"]
        s = Collector()
        g.attach(s, 60).set_ready(3)
        assert s.bodies == [b"1", b"2", b"3"]  # all back, none lost or doubled


async def test_pause_and_empty() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 60)
        c.set_ready(10)
        g.pause()
        b.publish("t", [b"a", b"b"])
        assert s.got == []
        g.unpause()
        assert s.bodies == [b"a", b"b"]
        g.empty()
        assert not g.in_flight
        assert g.finish(c, s.got[0].id) is Outcome.NOT_IN_FLIGHT


async def test_stale_deadlines_do_not_pile_up() -> None:
    async with broker() as b:
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 60)
        c.set_ready(100)
        for _ in range(200):
            b.publish("t", [b"x"] * 100)
            for m in list(s.got):
                g.finish(c, m.id)
            s.got.clear()
        assert len(g._deadlines) <= 2 * len(g.in_flight) + 4097


async def test_restart_from_the_store_keeps_unacknowledged_messages() -> None:
    store = MemoryStore()
    b = Broker(store)
    await b.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        g = b.group("t", "c")
        s = Collector()
        c = g.attach(s, 60)
        c.set_ready(2)
        b.publish("t", [b"a", b"b", b"c"])
        g.finish(c, s.got[0].id)  # a acknowledged, b and c in flight
        nursery.cancel_scope.cancel()
    b2 = Broker(store)
    await b2.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(b2.run)
        g2 = b2.topics["t"].groups["c"]
        s2 = Collector()
        g2.attach(s2, 60).set_ready(10)
        assert s2.bodies == [b"b", b"c"]
        # both were in flight: the recorded delivery counts, so this one is their second
        assert [m.attempts for m in s2.got] == [2, 2]
        b2.publish("t", [b"d"])
        # ids continue after the reserved block, never below an id handed out before
        assert s2.got[-1].id > 3
        nursery.cancel_scope.cancel()


async def test_each_group_counts_its_own_attempts() -> None:
    async with broker() as b:
        sinks = []
        for name in ("c1", "c2", "c3"):
            sink = Collector()
            b.group("t", name).attach(sink, 60).set_ready(10)
            sinks.append(sink)
        b.publish("t", [b"x", b"y"])
        assert [s.attempts for s in sinks] == [[1, 1]] * 3


async def test_a_failing_store_refuses_only_what_it_would_keep() -> None:
    from gateway.broker import StoreUnavailable
    from gateway.stores.base import StoreError

    store = MemoryStore()
    b = Broker(store)
    await b.open()
    b.group("kept", "g")
    store.failed = StoreError("store x: write failed: disk full")
    with pytest.raises(StoreUnavailable, match="disk full"):  # the broker's, not the store's
        b.publish("kept", [b"a"])
    with pytest.raises(StoreUnavailable):
        b.publish("new-topic", [b"a"])  # it would be made, and kept
    assert "new-topic" not in b.topics
    # a subject nobody keeps (NATS, at most once) and an ephemeral topic go on
    assert len(b.publish("nobody.keeps", [b"a"], create=False)[0]) == 1
    assert len(b.publish("t#ephemeral", [b"a"], ephemeral=True)[0]) == 1
    store.failed = None
    assert len(b.publish("kept", [b"a"])[0]) == 1


async def test_a_memory_url_store_records_nothing_and_the_broker_works_the_same() -> None:
    """`--store memory://` makes a store nothing reads back: the broker records its
    messages nowhere (as for ephemeral topics), and queues, deliveries, requeues and
    acknowledgements behave as on the recording store."""
    from pathlib import Path

    from gateway.stores import open_store

    store = open_store("memory://", Path("/nonexistent"))
    assert isinstance(store, MemoryStore) and store.forgets
    assert not MemoryStore().forgets  # the contract suite's and these tests' store
    b = Broker(store)
    await b.open()
    b.publish("t", [b"a", b"b", b"c"])
    g = b.group("t", "g")
    sink = Collector()
    c = g.attach(sink, 60)
    c.set_ready(2)
    assert sink.bodies == [b"a", b"b"]
    assert g.finish(c, sink.got[0].id) is Outcome.OK
    assert sink.bodies == [b"a", b"b", b"c"]
    assert g.requeue(c, sink.got[1].id, 0.0) is Outcome.OK
    assert sink.bodies[-1] == b"b" and sink.attempts[-1] == 2
    assert store._topics == {}  # nothing was recorded


async def test_a_timed_pause_that_ends_with_nobody_waiting_leaves_no_wake_up(
    mock_clock: trio.testing.MockClock,
) -> None:
    """beanstalkd pause-tube whose time runs out while no worker waits: the timer's pass
    at its end must clear it and ask for no further wake-up. It asked for one at the
    pause's (past) end again, and the timer task called it again at once, for ever: the
    whole gateway stopped answering."""
    async with broker() as b:
        g = b.group("t", "c")
        g.pause_for(1)
        mock_clock.jump(1.5)
        g.on_timer(trio.current_time())  # the timer task's call at the pause's end
        assert g.pause_until == 0.0
        assert g.next_wake == math.inf
        b.publish("t", [b"x"])  # and the tube works
        s = Collector()
        g.attach(s, 60).set_ready(1)
        assert s.bodies == [b"x"]
