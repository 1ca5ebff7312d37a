"""The shared Redis store (the default `redis://` mode): brokers of several gateways claim
from one Redis database. Here two brokers in one process, each on its own store and
connection, on the session's real redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from gateway.broker import Broker
from gateway.broker.group import Consumer
from gateway.model import Message
from gateway.stores import open_store
from tests.redis_server import RedisServer


class Finisher:
    """A consumer that finishes every message at once (or holds them: `hold`)."""

    def __init__(self, hold: bool = False) -> None:
        self.got: list[Message] = []
        self.hold = hold
        self.consumer: Consumer | None = None
        self.arrived = trio.Event()

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        self.got.append(message)
        self.arrived.set()
        if not self.hold:
            consumer.group.finish(consumer, message.id, pump=False)
        return True


@asynccontextmanager
async def gateway(url: str, tmp: Path) -> AsyncIterator[Broker]:
    broker = Broker(open_store(url, tmp))
    await broker.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        yield broker
        nursery.cancel_scope.cancel()
    await broker.close()


async def until(predicate: object, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.01)


async def test_two_gateways_share_a_channel_exactly_once(redis_url: str, tmp_path: Path) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        ga, gb = a.group("t", "c"), b.group("t", "c")
        sa, sb = Finisher(), Finisher()
        ga.attach(sa, 60).set_ready(5)
        gb.attach(sb, 60).set_ready(5)
        for i in range(0, 1000, 100):
            a.publish("t", [b"%d" % j for j in range(i, i + 100)])
            await a.flush()
        await until(lambda: len(sa.got) + len(sb.got) >= 1000)
        await trio.sleep(0.2)  # nothing more may come
        bodies = [m.body for m in sa.got + sb.got]
        assert sorted(bodies) == sorted(b"%d" % j for j in range(1000))
        assert sa.got and sb.got
        assert len({m.id for m in sa.got + sb.got}) == 1000


async def test_a_publish_on_one_gateway_wakes_an_idle_consumer_on_another(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        gb = b.group("t", "c")
        sb = Finisher()
        gb.attach(sb, 60).set_ready(1)
        await b.flush()
        await trio.sleep(0.1)  # b's claim found nothing: it is idle now
        a.topic("t")
        a.publish("t", [b"hello"])
        await a.flush()
        with trio.fail_after(0.5):  # far below the idle re-check (claims.REFRESH)
            await sb.arrived.wait()
        assert [m.body for m in sb.got] == [b"hello"]


async def test_a_dead_gateways_claims_come_back_with_attempts_counted(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as b:
        a = Broker(open_store(redis_url, tmp_path))
        await a.open()
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            ga = a.group("t", "c")
            held = Finisher(hold=True)
            ga.attach(held, 0.5).set_ready(10)
            a.publish("t", [b"%d" % i for i in range(10)])
            await a.flush()
            await until(lambda: len(held.got) == 10)
            await a.flush()
            nursery.cancel_scope.cancel()  # gateway A dies: nothing returned
        await a.store.link.close()
        gb = b.group("t", "c")
        sb = Finisher()
        gb.attach(sb, 60).set_ready(100)
        await until(lambda: len(sb.got) == 10)
        assert sorted(m.body for m in sb.got) == sorted(b"%d" % i for i in range(10))
        assert all(m.attempts == 2 for m in sb.got)


async def test_registry_and_depth_are_the_same_on_every_gateway(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        a.group("orders", "audit")
        a.publish("orders", [b"x"] * 25)
        await a.flush()
        assert b.claims is not None and a.claims is not None
        await b.claims.refresh()
        await a.claims.refresh()
        gb = b.topics["orders"].groups["audit"]
        ga = a.topics["orders"].groups["audit"]
        assert gb.depth == ga.depth == 25
        gb.pause()
        await b.flush()
        await a.claims.refresh()
        assert ga.paused


async def test_requeue_and_bury_go_back_to_redis_for_any_gateway(
    redis_url: str, tmp_path: Path
) -> None:
    async with gateway(redis_url, tmp_path) as a, gateway(redis_url, tmp_path) as b:
        ga = a.group("t", "c")
        held = Finisher(hold=True)
        ca = ga.attach(held, 60)
        ca.set_ready(2)
        a.publish("t", [b"one", b"two"])
        await a.flush()
        await until(lambda: len(held.got) == 2)
        one, two = held.got
        ca.set_ready(0)
        ga.requeue(ca, one.id, 0)
        ga.bury(ca, two.id)
        await a.flush()
        gb = b.group("t", "c")
        sb = Finisher()
        gb.attach(sb, 60).set_ready(10)
        await until(lambda: len(sb.got) == 1)
        assert sb.got[0].body == b"one" and sb.got[0].attempts == 2
        assert b.claims is not None
        await b.claims.refresh()
        assert gb.remote_buried == 1


async def test_a_publish_is_stored_once_and_goes_with_its_last_entry(
    redis_url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """One batch per publish (the bodies end to end): two groups finishing at different
    times, and a backlog handed to two groups, free it only with the last entry."""
    async with gateway(redis_url, tmp_path) as a:
        a.topic("t")
        a.publish("t", [b"early %d" % i for i in range(30)])  # the backlog: no group yet
        await a.flush()
        a.topic("t").pause()
        g1, g2 = a.group("t", "c1"), a.group("t", "c2")
        a.topic("t").unpause()  # the backlog goes to both groups
        s1, s2 = Finisher(), Finisher(hold=True)
        g1.attach(s1, 60).set_ready(500)
        c2 = g2.attach(s2, 60)
        c2.set_ready(500)
        a.publish("t", [b"%d" % i for i in range(100)])
        await a.flush()
        await until(lambda: len(s1.got) == 130 and len(s2.got) == 130)
        await a.flush()
        assert sorted(m.body for m in s2.got) == sorted(m.body for m in s1.got)
        assert redis_server.cli("HLEN", "gw:{t}:m").strip() == "2"
        for m in s2.got:
            g2.finish(c2, m.id)
        await a.flush()
        assert redis_server.cli("EXISTS", "gw:{t}:m", "gw:{t}:n", "gw:{t}:x").strip() == "0"


async def test_claims_follow_priority_then_id_across_publishes_and_requeues(
    redis_url: str, tmp_path: Path
) -> None:
    """A publish waits as one range; requeued messages are placed one by one. Claims of
    any size merge both in (priority, id) order, and the counts follow."""
    store = open_store(redis_url, tmp_path)
    await store.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.add_topic("t")
        store.add_group("t", "g")
        expected = []
        for prio, n in ((5, 7), (1, 3), (5, 4), (9, 1)):
            first = store.take_ids(n)
            ids = range(first, first + n)
            msgs = [Message(i, "t", b"%d" % i, 1, priority=prio) for i in ids]
            store.put("t", ["g"], msgs, 0.0)
            expected += [(prio, m.id) for m in msgs]
        await store.flush()
        got, _, _ = await store.claim("t", "g", 5)
        claimed = [(m.priority, m.id) for m in got]
        assert claimed == sorted(expected)[:5]
        back = got[1]  # requeued with a priority between the others: placed on its own
        back.priority = 5
        store.update("t", "g", back, expect="f")
        await store.flush()
        rest = sorted([*(e for e in expected if e not in claimed), (5, back.id)])
        (counts,) = await store.counts([("t", ["g"])])
        assert counts[0][:3] == (len(rest), 0, 4)
        seen = []
        for size in (2, 1, 3, 100):
            part, _, _ = await store.claim("t", "g", size)
            seen += [(m.priority, m.id) for m in part]
            assert all(m.body == b"%d" % m.id for m in part)
        assert seen == rest
        (counts,) = await store.counts([("t", ["g"])])
        assert counts[0][:3] == (0, 0, 4 + len(rest))
        nursery.cancel_scope.cancel()
    await store.close()
