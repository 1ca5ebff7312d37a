"""Gateways on a Redis Cluster (three masters on loopback, started by the test): a
channel consumed on two gateways gets every message exactly once, over topics that hash to
different slots (each topic's keys share one slot, its hash tag); a topic's slot migrated
to another master while it is published and consumed costs no publish and no message."""

from __future__ import annotations

from pathlib import Path

import trio

from gateway.stores.redis_cluster_wire import key_slot
from tests.integration.test_durability import NSQConsumer, supervised
from tests.integration.test_redis_scaleout import drain, gateway, mpub, stats, until
from tests.redis_server import RedisCluster, RedisServer

TOPICS = ("alpha", "beta", "gamma")  # three hash tags: three slots, spread over the masters


async def test_exactly_once_over_two_gateways_on_a_redis_cluster(tmp_path: Path) -> None:
    cluster = RedisCluster(tmp_path / "cluster").start()
    try:
        async with supervised() as sup:
            a = await gateway(sup, tmp_path, "a", cluster.url)
            b = await gateway(sup, tmp_path, "b", cluster.url)
            got_a: list[bytes] = []
            got_b: list[bytes] = []
            ids: list[bytes] = []
            done = trio.Event()
            consumers = []
            for topic in TOPICS:
                consumers.append(await NSQConsumer.subscribe(a, topic, "work", rdy=20))
                consumers.append(await NSQConsumer.subscribe(b, topic, "work", rdy=20))

            async def known() -> bool:
                seen = await stats(a)
                return all("work" in seen.get(t, {}) for t in TOPICS)

            await until(known, "the channels in A's /stats", 10)
            sent = sorted(b"%s-%04d" % (t.encode(), i) for t in TOPICS for i in range(500))
            async with trio.open_nursery() as nursery:
                for i, consumer in enumerate(consumers):
                    nursery.start_soon(drain, consumer, got_a if i % 2 == 0 else got_b, done, ids)
                for topic in TOPICS:
                    for i in range(0, 500, 100):
                        await mpub(
                            a, topic, [b"%s-%04d" % (topic.encode(), j) for j in range(i, i + 100)]
                        )

                async def all_in() -> bool:
                    return len(got_a) + len(got_b) >= len(sent)

                await until(all_in, "every message delivered", 60)

                async def settled() -> bool:
                    seen = await stats(b)
                    return all(seen.get(t) == {"work": 0} for t in TOPICS)

                await until(settled, "empty channels on B", 10)
                done.set()
            assert sorted(got_a + got_b) == sent
            assert got_a and got_b
            assert len(set(ids)) == len(sent)
    finally:
        cluster.stop()


def errors(node: RedisServer, kind: str) -> int:
    """How many `kind` error replies (MOVED, ASK) the node has given (INFO errorstats)."""
    for line in node.cli("INFO", "errorstats").splitlines():
        if line.startswith(f"errorstat_{kind}:count="):
            return int(line.split("=", 1)[1])
    return 0


async def test_a_slot_migrated_under_load_costs_no_publish_and_no_message(tmp_path: Path) -> None:
    cluster = RedisCluster(tmp_path / "cluster").start()
    try:
        async with supervised() as sup:
            a = await gateway(sup, tmp_path, "a", cluster.url)
            topic = "migrating"
            consumer = await NSQConsumer.subscribe(a, topic, "work", rdy=50)
            sent = [b"m-%04d" % i for i in range(1000)]
            got: list[bytes] = []
            ids: list[bytes] = []
            done = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain, consumer, got, done, ids)
                await mpub(a, topic, sent[:200])  # the topic's keys are on its master now
                source = cluster.owner(key_slot(topic))
                target = next(n for n in cluster.nodes if n is not source)
                before = errors(source, "MOVED")
                cluster.move_slot(key_slot(topic), target)
                assert cluster.owner(key_slot(topic)) is target
                for i in range(200, 1000, 100):  # each answered OK: no error reached them
                    await mpub(a, topic, sent[i : i + 100])

                async def all_in() -> bool:
                    return len(got) >= len(sent)

                await until(all_in, "every message delivered", 60)
                done.set()
            assert sorted(got) == sent
            assert len(set(ids)) == len(sent)
            # the gateway did send to the old master after the move, and was told so
            assert errors(source, "MOVED") > before
    finally:
        cluster.stop()
