"""The cross-protocol decisions of docs/semantics.md, byte level (raw beanstalkd + raw NSQ)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.helpers import RawBeanstalk, RawNSQ, be32, parse_message, running_gateway


def gateway():  # type: ignore[no-untyped-def]
    return running_gateway(beanstalk="127.0.0.1:0")


async def _nsq_consumer(gw: object, topic: bytes, channel: bytes, rdy: int = 10) -> RawNSQ:
    conn = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    await conn.send(b"SUB %s %s\nRDY %d\n" % (topic, channel, rdy))
    assert await conn.frame() == (0, b"OK")
    return conn


async def _message(conn: RawNSQ, timeout: float = 5.0) -> tuple[int, bytes, bytes]:
    kind, data = await conn.frame(timeout)
    assert kind == 2
    _, attempts, msg_id, body = parse_message(data)
    return attempts, msg_id, body


async def test_a_producer_creates_the_topic_not_the_group() -> None:
    async with gateway() as gw:
        producer = await RawBeanstalk.connect(gw)
        assert await producer.call(b"use jobs\r\n") == b"USING jobs\r\n"
        assert await producer.call(b"put 5 0 60 3\r\none\r\n") == b"INSERTED 1\r\n"
        assert gw.broker.topics["jobs"].groups == {}
        # the backlog is the tube's view until some group exists
        assert await producer.call(b"peek-ready\r\n") == b"FOUND 1 3\r\none\r\n"
        # an NSQ consumer arriving later gets it, and later puts, and no copy stays behind
        nsq = await _nsq_consumer(gw, b"jobs", b"workers")
        assert await _message(nsq) == (1, b"0000000000000001", b"one")
        assert await producer.call(b"put 5 0 60 3\r\ntwo\r\n") == b"INSERTED 2\r\n"
        assert (await _message(nsq))[2] == b"two"
        assert set(gw.broker.topics["jobs"].groups) == {"workers"}


async def test_nsq_channel_named_like_the_group_shares_work_with_beanstalk_workers() -> None:
    async with gateway() as gw:
        worker = await RawBeanstalk.connect(gw)
        assert await worker.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        nsq = await _nsq_consumer(gw, b"jobs", b"beanstalk", rdy=1)
        producer = await RawBeanstalk.connect(gw)
        await producer.call(b"use jobs\r\n")
        for i in range(4):
            assert await producer.call(b"put 0 0 60 1\r\n%d\r\n" % i) == b"INSERTED %d\r\n" % (
                i + 1
            )
        _, nsq_id, nsq_body = await _message(nsq)  # window 1: it holds one
        got = {nsq_body}
        for _ in range(3):
            reply = await worker.call(b"reserve-with-timeout 0\r\n")
            assert reply.startswith(b"RESERVED")
            got.add(reply.split(b"\r\n")[1])
        assert got == {b"0", b"1", b"2", b"3"}  # each job to exactly one of them
        assert await worker.call(b"reserve-with-timeout 0\r\n") == b"TIMED_OUT\r\n"
        # the NSQ side's delivery is a reservation for beanstalkd clients
        assert (await worker.call(b"stats-job %d\r\n" % int(nsq_id, 16))).count(b"state: reserved")


async def test_an_nsq_channel_named_like_the_group_outlives_beanstalkd_tube_releases() -> None:
    """The NSQ channel named like the workers' group is an NSQ channel: nsqd keeps it when
    its consumers leave, and messages published meanwhile wait in it. A beanstalkd
    connection that stops watching (or using) the tube must not delete it."""
    async with gateway() as gw:
        nsq = await _nsq_consumer(gw, b"jobs", b"beanstalk")
        await nsq.aclose()
        bs = await RawBeanstalk.connect(gw)
        assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        assert await bs.call(b"ignore jobs\r\n") == b"WATCHING 1\r\n"
        assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
        assert await bs.call(b"use default\r\n") == b"USING default\r\n"
        assert "beanstalk" in gw.broker.topics["jobs"].groups
        publisher = await RawNSQ.connect(gw)
        await publisher.send(b"PUB jobs\n" + be32(4) + b"kept")
        assert await publisher.frame() == (0, b"OK")
        nsq = await _nsq_consumer(gw, b"jobs", b"beanstalk")
        assert (await _message(nsq))[2] == b"kept"


async def test_nsq_req_is_a_release_and_fin_is_a_delete() -> None:
    async with gateway() as gw:
        producer = await RawBeanstalk.connect(gw)
        await producer.call(b"use jobs\r\n")
        await producer.call(b"put 9 0 60 1\r\nx\r\n")
        nsq = await _nsq_consumer(gw, b"jobs", b"beanstalk", rdy=1)
        attempts, msg_id, _ = await _message(nsq)
        assert attempts == 1
        await nsq.send(b"REQ " + msg_id + b" 0\n")
        attempts, msg_id, _ = await _message(nsq)
        assert attempts == 2
        stats = await producer.call(b"stats-job 1\r\n")
        assert b"reserves: 2\n" in stats and b"releases: 1\n" in stats
        await nsq.send(b"FIN " + msg_id + b"\n")
        with trio.fail_after(5):
            while (await producer.call(b"stats-job 1\r\n")) != b"NOT_FOUND\r\n":
                await trio.sleep(0.01)


async def test_priority_orders_what_an_nsq_consumer_receives() -> None:
    async with gateway() as gw:
        producer = await RawBeanstalk.connect(gw)
        await producer.call(b"use prio\r\n")
        for pri, body in ((50, b"c"), (10, b"a"), (50, b"d"), (20, b"b")):
            await producer.call(b"put %d 0 60 1\r\n%s\r\n" % (pri, body))
        nsq = await _nsq_consumer(gw, b"prio", b"ch")
        assert [(await _message(nsq))[2] for _ in range(4)] == [b"a", b"b", b"c", b"d"]


async def test_a_message_published_over_nsq_gets_the_default_ttr() -> None:
    async with gateway() as gw:
        pub = await RawNSQ.connect(gw)
        await pub.send(b"PUB fromnsq\n" + be32(2) + b"hi")
        assert await pub.frame() == (0, b"OK")
        worker = await RawBeanstalk.connect(gw)
        await worker.call(b"watch fromnsq\r\n")
        assert await worker.call(b"reserve-with-timeout 0\r\n") == b"RESERVED 1 2\r\nhi\r\n"
        stats = await worker.call(b"stats-job 1\r\n")
        assert b"ttr: 60\n" in stats and b"pri: 1024\n" in stats


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_ttr_bounds_an_nsq_consumers_delivery(autojump_clock: trio.testing.MockClock) -> None:
    async with gateway() as gw:
        producer = await RawBeanstalk.connect(gw)
        await producer.call(b"use short\r\n")
        await producer.call(b"put 0 0 5 1\r\nx\r\n")  # ttr 5 s; the NSQ msg_timeout is 60 s
        nsq = await _nsq_consumer(gw, b"short", b"ch", rdy=1)
        start = trio.current_time()
        assert (await _message(nsq))[0] == 1
        assert (await _message(nsq, timeout=30))[0] == 2  # redelivered when the ttr ran out
        assert trio.current_time() - start == pytest.approx(5, abs=0.2)


async def test_deadline_soon_and_ttr_expiry_on_mock_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with gateway() as gw:
        worker = await RawBeanstalk.connect(gw)
        await worker.call(b"put 0 0 3 1\r\na\r\n")
        assert await worker.call(b"reserve\r\n") == b"RESERVED 1 1\r\na\r\n"
        start = trio.current_time()
        # a waiting reserve ends with DEADLINE_SOON one second before the ttr runs out
        assert await worker.call(b"reserve\r\n", timeout=10) == b"DEADLINE_SOON\r\n"
        assert trio.current_time() - start == pytest.approx(2, abs=0.2)
        other = await RawBeanstalk.connect(gw)
        assert await other.call(b"reserve\r\n", timeout=10) == b"RESERVED 1 1\r\na\r\n"
        assert trio.current_time() - start == pytest.approx(3, abs=0.2)
        assert await worker.call(b"delete 1\r\n") == b"NOT_FOUND\r\n"
        assert b"timeouts: 1\n" in await other.call(b"stats-job 1\r\n")
