"""The store contract (gateway/stores/base.py). Every store runs this suite: add a factory to
STORES when a store is added. `reopen` gives what a restarted gateway would open: the same
object for the memory store, a new one on the same file for a durable one.

Two halves: the store's own calls (what is recorded comes back after a restart), and the
broker over each store (the states a client sees come back after a restart).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import trio

from gateway.broker import Broker
from gateway.model import Message
from gateway.stores import MemoryStore, SQLiteStore, Store, StoredState, open_store
from tests.redis_server import RedisServer
from tests.unit.test_broker import Collector

Reopen = Callable[[Store], Store]
StoreFactory = Callable[[Path], tuple[Store, Reopen]]


def _memory(tmp: Path) -> tuple[Store, Reopen]:
    return MemoryStore(), lambda store: store


def _sqlite(tmp: Path) -> tuple[Store, Reopen]:
    path = tmp / "gateway.db"
    return SQLiteStore(path), lambda store: SQLiteStore(path)


# the Redis server of the session (the `redis_server` fixture sets it per test)
REDIS: list[RedisServer] = []


def _redis(tmp: Path) -> tuple[Store, Reopen]:
    """One gateway owning a Redis database (shared=no): the broker pages a window in, as
    over the durable store. The shared mode's own steps: test_redis_claims.py."""
    url = REDIS[0].url + "?shared=no"
    return open_store(url, tmp), lambda store: open_store(url, tmp)


STORES: dict[str, StoreFactory] = {"memory": _memory, "sqlite": _sqlite, "redis": _redis}


class Pair:
    """A store under test, its committer running, and how to restart it."""

    def __init__(self, store: Store, reopen: Reopen, nursery: trio.Nursery) -> None:
        self.store = store
        self._reopen = reopen
        self._nursery = nursery
        self._scope = trio.CancelScope()

    async def start(self) -> None:
        scope = self._scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            with scope:
                await self.store.run(task_status=task_status)

        await self._nursery.start(run)

    async def handover(self) -> Store:
        """The store, closed and made anew, for a broker to open and run itself."""
        self._scope.cancel()
        await self.store.close()
        self.store = self._reopen(self.store)
        return self.store

    async def reopened(self, window: int = 0) -> StoredState:
        """Flush, close, and open the store again as a restarted gateway would."""
        await self.store.flush()
        self._scope.cancel()
        await self.store.close()
        self.store = self._reopen(self.store)
        state = await self.store.open(window)
        await self.start()
        return state


@pytest.fixture(params=sorted(STORES))
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.cli("FLUSHALL")
        REDIS[:] = [server]
    store, reopen = STORES[request.param](tmp_path)
    state = await store.open()
    assert state.topics == {} and state.last_id == 0
    async with trio.open_nursery() as nursery:
        p = Pair(store, reopen, nursery)
        await p.start()
        yield p
        await p.store.close()
        nursery.cancel_scope.cancel()


def msg(i: int, body: bytes = b"", **kw: object) -> Message:
    return Message(i, "t", body or b"m%d" % i, 1_700_000_000_000_000_000 + i, **kw)  # type: ignore[arg-type]


def ids(messages: list[Message]) -> list[int]:
    return [m.id for m in messages]


# -- the store's own calls ----------------------------------------------------------


async def test_put_and_remove(pair: Pair) -> None:
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    m1, m2, m3 = msg(1), msg(2), msg(3)
    s.put("t", ["g"], [m1, m2, m3], 0.0)
    s.remove("t", "g", [m2])
    state = await pair.reopened()
    group = state.topics["t"].groups["g"]
    assert ids(group.ready) == [1, 3]
    assert [m.body for m in group.ready] == [b"m1", b"m3"]
    assert state.last_id >= 3


async def test_backlog_goes_to_the_first_group(pair: Pair) -> None:
    pair.store.add_topic("t")
    pair.store.put("t", [], [msg(1), msg(2)], 0.0)
    state = await pair.reopened()
    assert ids(state.topics["t"].backlog) == [1, 2]
    pair.store.add_group("t", "g")
    pair.store.fan_out_backlog("t", ["g"])
    state = await pair.reopened()
    assert state.topics["t"].backlog == []
    assert ids(state.topics["t"].groups["g"].ready) == [1, 2]


async def test_backlog_fans_out_to_every_group_and_each_keeps_its_copy(pair: Pair) -> None:
    s = pair.store
    s.add_topic("t")
    m1, m2 = msg(1), msg(2)
    s.put("t", [], [m1, m2], 0.0)
    s.add_group("t", "g")
    s.add_group("t", "h")
    s.fan_out_backlog("t", ["g", "h"])
    s.remove("t", "g", [m1, m2])
    s.remove("t", "h", [m1])
    state = await pair.reopened()
    groups = state.topics["t"].groups
    assert ids(groups["g"].ready) == [] and ids(groups["h"].ready) == [2]
    assert groups["h"].ready[0].body == b"m2"


async def test_one_body_for_several_groups_until_the_last_lets_go(pair: Pair) -> None:
    s = pair.store
    s.add_topic("t")
    for g in ("a", "b", "c"):
        s.add_group("t", g)
    m = msg(1, b"shared")
    s.put("t", ["a", "b", "c"], [m], 0.0)
    s.remove("t", "a", [m])
    s.remove("t", "b", [m])
    state = await pair.reopened()
    groups = state.topics["t"].groups
    assert [m.body for m in groups["c"].ready] == [b"shared"]
    assert groups["a"].ready == groups["b"].ready == []


async def test_update_keeps_attempts_priority_delay_and_burial(pair: Pair) -> None:
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    m1, m2, m3 = msg(1), msg(2), msg(3)
    s.put("t", ["g"], [m1, m2, m3], 0.0)
    m1.attempts, m1.priority = 3, 7
    s.update("t", "g", m1, priority_was=1024)
    m2.attempts = 5
    s.update("t", "g", m2, buried=True)
    due = time.time() + 3600
    s.update("t", "g", m3, due)
    state = await pair.reopened()
    group = state.topics["t"].groups["g"]
    ready = {m.id: m for m in group.ready}
    assert (ready[1].attempts, ready[1].priority, ready[1].deliver_at) == (3, 7, 0.0)
    assert ready[3].deliver_at == pytest.approx(due)
    assert [(m.id, m.attempts) for m in group.buried] == [(2, 5)]
    pair.store.update("t", "g", m2)  # kicked: buried no more
    state = await pair.reopened()
    assert sorted(ids(state.topics["t"].groups["g"].ready)) == [1, 2, 3]


async def test_what_was_not_recorded_does_not_come_back(pair: Pair) -> None:
    """The store keeps what it was told when it was told, not the live message."""
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    m = msg(1)
    s.put("t", ["g"], [m], 0.0)
    m.attempts, m.priority = 9, 3  # changed, never recorded
    state = await pair.reopened()
    (got,) = state.topics["t"].groups["g"].ready
    assert (got.attempts, got.priority) == (0, 1024)


async def test_clear_drop_and_pause(pair: Pair) -> None:
    s = pair.store
    for topic in ("t", "u"):
        s.add_topic(topic)
        s.add_group(topic, "g")
        s.add_group(topic, "h")
    s.put("t", ["g", "h"], [msg(1)], 0.0)
    s.put("u", ["g"], [msg(2)], 0.0)
    s.clear("t", "g")
    s.drop_group("t", "h")
    s.drop_topic("u")
    s.set_paused("t", None, True)
    s.set_paused("t", "g", True)
    state = await pair.reopened()
    assert set(state.topics) == {"t"}
    topic = state.topics["t"]
    assert topic.paused and set(topic.groups) == {"g"}
    assert topic.groups["g"].paused and topic.groups["g"].ready == []
    assert state.last_id >= 2  # ids are never handed out twice, even after deletion


async def test_reserved_ids_are_never_handed_out_again(pair: Pair) -> None:
    pair.store.reserve_ids(5000)
    state = await pair.reopened()
    assert state.last_id >= 5000


async def test_body_headers_and_fields_round_trip(pair: Pair) -> None:
    body = bytes(range(256)) * 4 + b"\r\n\x00"
    headers = [("k", "v"), ("x-y", "z"), ("k", "again")]
    m = msg(9, body, headers=headers, ttr=30.0, reply_to="_INBOX.1", origin="nsq a")
    m.header_block = b"NATS/1.0\r\nk: v\r\n\r\n"
    pair.store.add_topic("t")
    pair.store.add_group("t", "g")
    pair.store.put("t", ["g"], [m], 0.0)
    state = await pair.reopened()
    (got,) = state.topics["t"].groups["g"].ready
    assert (got.id, got.topic, got.body, got.headers, got.ttr, got.reply_to) == (
        9,
        "t",
        body,
        headers,
        30.0,
        "_INBOX.1",
    )
    assert (got.timestamp, got.origin, got.header_block) == (m.timestamp, "nsq a", m.header_block)


async def test_a_paging_store_opens_a_window_and_pages_the_rest_in_order(pair: Pair) -> None:
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    s.put("t", ["g"], [msg(i) for i in range(1, 11)], 0.0)
    s.put("t", ["g"], [msg(i, priority=1) for i in range(11, 14)], 0.0)
    state = await pair.reopened(window=4)
    group = state.topics["t"].groups["g"]
    if not pair.store.pages:
        assert ids(group.ready) == [11, 12, 13, *range(1, 11)] and group.spilled == 0
        return
    assert ids(group.ready) == [11, 12, 13, 1] and group.spilled == 9
    rest = await pair.store.load("t", "g", (1024, 2), 100)
    assert ids(rest) == list(range(2, 11))


# -- the broker over each store: what a client sees after a restart ----------------


async def started(pair: Pair, nursery: trio.Nursery, **kw: int) -> Broker:
    """A broker on the pair's store (handed over), opened and running in `nursery`."""
    b = Broker(await pair.handover(), **kw)
    await b.open()
    await nursery.start(b.run)
    return b


async def restart(pair: Pair, broker: Broker, nursery: trio.Nursery) -> Broker:
    """A new broker on the store reopened after `broker` stopped without closing: what
    was committed is all there is (kill -9 after the last commit)."""
    await broker.flush()
    await pair.store.close()  # releases the file; the broker's own close() is not called
    pair.store = pair._reopen(pair.store)
    b = Broker(pair.store)
    await b.open()
    await nursery.start(b.run)
    return b


async def test_broker_restart_keeps_every_state(pair: Pair) -> None:
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery)
        g = b.group("orders", "workers")
        sink = Collector()
        c = g.attach(sink, 60)
        c.set_ready(1)
        b.publish("orders", [b"in-flight", b"ready-1", b"ready-2"])
        b.publish("orders", [b"urgent"], priority=5)
        b.publish("orders", [b"later"], delay=3600)
        (delivered,) = sink.got
        b.publish("orders", [b"to-bury"], priority=0)
        c.set_ready(2)
        buried = sink.got[-1]
        assert buried.body == b"to-bury"
        g.bury(c, buried.id)
        b.topic("paused-topic")
        b.group("paused-topic", "g").pause()
        b.topic("paused-topic").pause()  # type: ignore[union-attr]
        b.publish("paused-topic", [b"waits"])
        due = time.time() + 3600
        nursery.cancel_scope.cancel()  # a crash: nothing returned, nothing closed
    async with trio.open_nursery() as nursery:
        b2 = await restart(pair, b, nursery)
        g2 = b2.topics["orders"].groups["workers"]
        assert len(g2.buried) == 1 and next(iter(g2.buried.values())).body == b"to-bury"
        ((when, _, later),) = g2.deferred
        assert later.body == b"later"
        assert when - trio.current_time() == pytest.approx(due - time.time(), abs=2)
        sink2 = Collector()
        g2.attach(sink2, 60).set_ready(10)
        # in (priority, id) order; the two that were in flight come back with attempts + 1
        assert sink2.bodies == [b"urgent", b"in-flight", b"ready-1", b"ready-2"]
        by_body = {m.body: m.attempts for m in sink2.got}
        assert by_body[b"in-flight"] == delivered.attempts + 1 == 2
        assert by_body[b"urgent"] == 2  # delivered once before the crash
        assert by_body[b"ready-1"] == 1
        t = b2.topics["paused-topic"]
        assert t.paused and t.groups["g"].paused and [m.body for m in t.backlog] == [b"waits"]
        assert g2.kick(10) == 1
        assert sink2.bodies[-1] == b"to-bury"
        nursery.cancel_scope.cancel()


async def test_a_batch_of_finishes_is_kept_and_refusals_keep_their_places(pair: Pair) -> None:
    """A consumer's batch of FINs (`finish_many`): the ids it may finish are finished and
    stay finished after a crash, in the store's one batch record; an id not in flight, one
    unreadable and another consumer's are refused at their places and change nothing."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery)
        g = b.group("t", "c")
        mine, theirs = Collector(), Collector()
        c = g.attach(mine, 60)
        c.set_ready(6)
        b.publish("t", [b"%d" % i for i in range(6)])
        other = g.attach(theirs, 60)
        other.set_ready(1)
        b.publish("t", [b"other", b"ready"])
        ids = [m.id for m in mine.got]
        g.finish(c, ids[1], pump=False)  # a record the batch extends
        batch = [ids[0], ids[2], 10**9, ids[3], None, theirs.got[0].id, ids[5], ids[0]]
        refused = g.finish_many(c, batch)
        assert [k for k, _ in refused] == [2, 4, 5, 7]
        assert [o.name for _, o in refused] == [
            "NOT_IN_FLIGHT",
            "NOT_IN_FLIGHT",
            "NOT_OWNER",
            "NOT_IN_FLIGHT",
        ]
        assert sorted(g.in_flight) == sorted([ids[4], theirs.got[0].id])
        await b.flush()
        nursery.cancel_scope.cancel()  # a crash
    async with trio.open_nursery() as nursery:
        b2 = await restart(pair, b, nursery)
        sink = Collector()
        b2.topics["t"].groups["c"].attach(sink, 60).set_ready(10)
        assert sorted(sink.bodies) == [b"4", b"other", b"ready"]
        nursery.cancel_scope.cancel()


async def test_a_clean_stop_returns_deliveries_and_keeps_them(pair: Pair) -> None:
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery)
        g = b.group("t", "g")
        sink = Collector()
        g.attach(sink, 60).set_ready(100)
        b.publish("t", [b"%d" % i for i in range(50)])
        assert len(g.in_flight) == 50
        nursery.cancel_scope.cancel()
    await b.close()
    pair.store = pair._reopen(pair.store)
    async with trio.open_nursery() as nursery:
        b2 = Broker(pair.store)
        await b2.open()
        await nursery.start(b2.run)
        sink2 = Collector()
        b2.topics["t"].groups["g"].attach(sink2, 60).set_ready(100)
        assert sink2.bodies == [b"%d" % i for i in range(50)]
        nursery.cancel_scope.cancel()
    await b2.close()
    pair.store = pair._reopen(pair.store)
    state = await pair.store.open()
    assert len(state.topics["t"].groups["g"].ready) == 50


async def test_take_any_of_a_buried_message_is_recorded(pair: Pair) -> None:
    """beanstalkd reserve-job of a buried job: after a restart it is not buried again."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery)
        g = b.group("t", "g")
        sink = Collector()
        c = g.attach(sink, 60)
        (m,), _ = b.publish("t", [b"job"])
        assert g.take(c) is m
        g.bury(c, m.id)
        assert g.take_any(c, m.id) is m
        g.finish(c, m.id)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        b2 = await restart(pair, b, nursery)
        g2 = b2.topics["t"].groups["g"]
        assert not g2.buried and not g2.ready
        nursery.cancel_scope.cancel()


async def test_a_deep_queue_is_paged_through_a_bounded_window(pair: Pair) -> None:
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=10)
        g = b.group("t", "g")
        for i in range(0, 100, 5):
            b.publish("t", [b"%03d" % j for j in range(i, i + 5)])
        b.publish("t", [b"urgent"], priority=1)
        await b.flush()
        if pair.store.pages:
            assert len(g.ready) <= 11 and g.depth == 101
        sink = Collector()
        c = g.attach(sink, 60)
        c.set_ready(3)
        with trio.fail_after(10):
            while len(sink.got) < 101:
                seen = len(sink.got)
                for m in list(sink.got):
                    if m.id in g.in_flight:
                        g.finish(c, m.id)
                await sink.until(seen + 1)
        assert sink.bodies == [b"urgent"] + [b"%03d" % j for j in range(100)]
        assert g.depth == 0
        nursery.cancel_scope.cancel()


async def test_a_priority_change_is_found_by_the_calls_after_it(pair: Pair) -> None:
    """beanstalkd release/bury with a new priority: later updates and removals still find
    the message (a store may key it by priority)."""
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    m1, m2, m3 = msg(1), msg(2), msg(3)
    s.put("t", ["g"], [m1, m2, m3], 0.0)
    m1.priority = 5
    s.update("t", "g", m1, priority_was=1024)
    m1.priority = 9
    s.update("t", "g", m1, buried=True, priority_was=5)
    s.remove("t", "g", [m2])
    state = await pair.reopened()
    group = state.topics["t"].groups["g"]
    assert [(m.id, m.priority) for m in group.ready] == [(3, 1024)]
    assert [(m.id, m.priority) for m in group.buried] == [(1, 9)]
    pair.store.remove("t", "g", [m1])
    state = await pair.reopened()
    assert state.topics["t"].groups["g"].buried == []


async def test_released_with_a_new_priority_and_finished_leaves_nothing(pair: Pair) -> None:
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery)
        g = b.group("t", "g")
        sink = Collector()
        c = g.attach(sink, 60)
        b.publish("t", [b"a", b"b"], priority=100)
        first = g.take(c)
        assert first is not None
        g.requeue(c, first.id, 0, priority=3)
        again = g.take(c)
        assert again is first and again.priority == 3
        g.bury(c, first.id, priority=7)
        assert g.kick(1) == 1
        assert g.take(c) is first
        g.finish(c, first.id)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        b2 = await restart(pair, b, nursery)
        g2 = b2.topics["t"].groups["g"]
        assert [m.body for m in g2.ready] == [b"b"] and not g2.buried
        nursery.cancel_scope.cancel()


async def test_a_backlog_adopted_past_the_window_pages_in_before_any_flush(pair: Pair) -> None:
    """The first group takes a backlog larger than its window; the rest is paged in even
    though nothing flushed the store in between (the page-in must see what was recorded)."""
    async with trio.open_nursery() as nursery:
        b = await started(pair, nursery, memory_window=100)
        b.publish("t", [b"%03d" % i for i in range(300)])
        g = b.group("t", "g")
        sink = Collector()
        g.attach(sink, 60).set_ready(1000)
        with trio.fail_after(5):
            await sink.until(300)
        assert sink.bodies == [b"%03d" % i for i in range(300)]
        nursery.cancel_scope.cancel()


async def test_many_changes_to_one_message_between_commits_keep_the_last(pair: Pair) -> None:
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    m = msg(1)
    s.put("t", ["g"], [m], 0.0)
    await s.flush()
    m.attempts = 1
    s.update("t", "g", m)  # delivered
    m.priority = 7
    s.update("t", "g", m, time.time() + 60, priority_was=1024)  # released, delayed
    m.attempts = 2
    s.update("t", "g", m)  # kicked and delivered again
    state = await pair.reopened()
    (got,) = state.topics["t"].groups["g"].ready
    assert (got.attempts, got.priority, got.deliver_at) == (2, 7, 0.0)


async def test_a_publish_of_thousands_comes_back_whole(pair: Pair) -> None:
    """An MPUB of many small messages (more than a durable store numbers in one go)."""
    s = pair.store
    s.add_topic("t")
    s.add_group("t", "g")
    s.put("t", ["g"], [msg(i, b"%d" % i) for i in range(1, 5001)], 0.0)
    state = await pair.reopened()
    ready = state.topics["t"].groups["g"].ready
    assert [m.id for m in ready] == list(range(1, 5001))
    assert ready[4999].body == b"5000"
