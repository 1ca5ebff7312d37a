"""Read-your-writes across gateways sharing one Redis (docs/storage.md, "What a client sees
across gateways"): a reply that reports a change to shared state leaves only once Redis
holds the change, so a client of another gateway that acts on it at once sees it, as it
would on one nsqd or one beanstalkd.

Two real `gateway serve --store redis://...` processes on the session's redis-server; each
check runs ROUNDS times with new names (the race it guards against is a matter of
microseconds, so one round proves little). Every wait is on a reply, bounded by a timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.stores.redis import RedisStore
from tests.helpers import MAGIC, RawBeanstalk, RawNSQ, be32, running_gateway
from tests.integration.test_durability import (
    FRAME_RESPONSE,
    GatewayProc,
    NSQConsumer,
    beanstalk_conn,
    reserved,
    start_gateway,
    supervised,
)
from tests.integration.test_redis_scaleout import mpub

ROUNDS = 20
BODIES = [b"m%03d" % i for i in range(100)]
# a topic's backlog (published before it had a channel) goes to its first channel, as nsqd's
EXPECTED = sorted([b"before", *BODIES])


@pytest.fixture
def url(redis_url: str) -> str:  # the session's redis-server (tests/conftest.py), emptied
    return redis_url


@asynccontextmanager
async def two_gateways(url: str, tmp: Path) -> AsyncIterator[tuple[GatewayProc, GatewayProc]]:
    async with supervised() as sup:
        a = await start_gateway(sup, tmp / "a", "--store", url)
        b = await start_gateway(sup, tmp / "b", "--store", url)
        yield a, b


async def every_message(consumer: NSQConsumer, where: str) -> None:
    """The consumer gets exactly EXPECTED (each once, FINed), then nothing more is pending."""
    got = []
    for _ in EXPECTED:
        try:
            d = await consumer.message(timeout=5)
        except trio.TooSlowError:
            raise AssertionError(f"{where}: {len(got)} of {len(EXPECTED)} delivered") from None
        got.append(d.body)
        await consumer.fin([d.id])
    assert sorted(got) == EXPECTED, where
    await consumer.sync()


class Publisher:
    """An NSQ producer connection to one gateway, open before the race starts."""

    def __init__(self, conn: RawNSQ) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, gw: GatewayProc) -> Publisher:
        conn = RawNSQ(await trio.open_tcp_stream(*gw.addresses["nsq"]))
        await conn.send(MAGIC)
        return cls(conn)

    async def mpub(self, topic: str, bodies: list[bytes]) -> None:
        payload = be32(len(bodies)) + b"".join(be32(len(b)) + b for b in bodies)
        await self.conn.send(f"MPUB {topic}\n".encode() + be32(len(payload)) + payload)
        assert await self.conn.frame(10) == (FRAME_RESPONSE, b"OK")


async def test_the_ok_of_a_sub_leaves_only_once_redis_holds_the_channel(url: str) -> None:
    """Deterministic, in one process: the pipeline that creates the channel is held at
    Redis's door; the OK must not come before it got there (it came at once before)."""
    async with running_gateway(store=url) as gw:
        store = gw.store
        assert isinstance(store, RedisStore)
        send = store.link.send
        at_door, open_door = trio.Event(), trio.Event()

        async def held(ops: list[tuple[str, str, list[Any]]]) -> Any:
            if any(op[0] == "gw_add_group" for op in ops):
                at_door.set()
                await open_door.wait()
            return await send(ops)

        store.link.send = held  # type: ignore[method-assign]
        nsq = await RawNSQ.connect(gw)
        await nsq.send(b"SUB orders d\n")
        first: list[str] = []
        try:
            async with trio.open_nursery() as nursery:

                async def reply() -> None:
                    first.append(f"reply {await nsq.frame(10)}")
                    nursery.cancel_scope.cancel()

                async def door() -> None:
                    await at_door.wait()
                    first.append("the channel's write at Redis's door")
                    nursery.cancel_scope.cancel()

                nursery.start_soon(reply)
                nursery.start_soon(door)
        finally:
            open_door.set()  # a held write is shielded: the gateway stops only after it
        assert first == ["the channel's write at Redis's door"]
        assert await nsq.frame(10) == (FRAME_RESPONSE, b"OK")
        await nsq.aclose()


async def test_what_one_gateway_answered_the_other_sees_at_once(url: str, tmp_path: Path) -> None:
    """Across two gateway processes (one pair for every check: starting them is most of
    the cost), each check ROUNDS times on new names."""
    async with two_gateways(url, tmp_path) as (a, b):
        await a_channel_subscribed_on_b_gets_what_a_publishes_next(a, b)
        await a_channel_created_over_http_on_b_gets_what_a_publishes_next(a, b)
        await a_job_buried_on_a_is_at_once_buried_on_b(a, b)
        await a_tube_made_on_a_is_at_once_a_tube_on_b(a, b)


async def a_channel_subscribed_on_b_gets_what_a_publishes_next(
    a: GatewayProc, b: GatewayProc
) -> None:
    on_a = await Publisher.connect(a)
    for r in range(ROUNDS):
        topic = f"sub-race-{r}"
        await on_a.mpub(topic, [b"before"])  # the topic exists, the channel not yet
        conn = RawNSQ(await trio.open_tcp_stream(*b.addresses["nsq"]))
        await conn.send(MAGIC + f"SUB {topic} d\n".encode())
        assert await conn.frame() == (FRAME_RESPONSE, b"OK")
        await on_a.mpub(topic, BODIES)  # the moment B said OK (RDY after, as pynsq's)
        await conn.send(b"RDY 200\n")
        await every_message(NSQConsumer(conn), f"SUB, round {r}")
        await conn.aclose()
    await on_a.conn.aclose()


async def a_channel_created_over_http_on_b_gets_what_a_publishes_next(
    a: GatewayProc, b: GatewayProc
) -> None:
    async with httpx.AsyncClient() as http:
        for r in range(ROUNDS):
            topic = f"http-race-{r}"
            await mpub(a, topic, [b"before"])
            reply = await http.post(
                b.http + "/channel/create", params={"topic": topic, "channel": "d"}, timeout=10
            )
            assert reply.status_code == 200, f"round {r}: {reply.text}"
            await mpub(a, topic, BODIES)
            consumer = await NSQConsumer.subscribe(b, topic, "d", rdy=200)
            await every_message(consumer, f"HTTP channel, round {r}")
            await consumer.aclose()


async def a_job_buried_on_a_is_at_once_buried_on_b(a: GatewayProc, b: GatewayProc) -> None:
    for r in range(ROUNDS):
        tube = b"bury-race-%d" % r
        on_a = await beanstalk_conn(a, tube)
        on_b: RawBeanstalk = await beanstalk_conn(b, tube)
        assert (await on_a.call(b"put 0 0 60 3\r\nabc\r\n")).startswith(b"INSERTED ")
        job, _ = reserved(await on_a.call(b"reserve-with-timeout 5\r\n"))
        assert await on_a.call(b"bury %d 0\r\n" % job) == b"BURIED\r\n"
        reply = await on_b.call(b"peek-buried\r\n")
        assert reply == b"FOUND %d 3\r\nabc\r\n" % job, f"bury, round {r}: {reply!r}"
        await on_a.aclose()
        await on_b.aclose()


async def a_tube_made_on_a_is_at_once_a_tube_on_b(a: GatewayProc, b: GatewayProc) -> None:
    """stats-tube and pause-tube on B of a tube a put on A just made (NOT_FOUND before,
    until B's next read of the registry)."""
    on_b = await beanstalk_conn(b)
    for r in range(ROUNDS):
        tube = b"tube-race-%d" % r
        on_a = await beanstalk_conn(a)
        assert await on_a.call(b"use " + tube + b"\r\n") == b"USING " + tube + b"\r\n"
        assert (await on_a.call(b"put 0 0 60 3\r\nabc\r\n")).startswith(b"INSERTED ")
        reply = await on_b.call(b"stats-tube " + tube + b"\r\n")
        assert reply.startswith(b"OK "), f"stats-tube, round {r}: {reply!r}"
        assert b"\ncurrent-jobs-ready: 1\n" in reply, f"stats-tube, round {r}: {reply!r}"
        assert await on_b.call(b"pause-tube " + tube + b" 0\r\n") == b"PAUSED\r\n"
        await on_a.aclose()
    await on_b.aclose()
