"""Orderly consumers' queue locks (LOCK_BATCH_MQ 41, UNLOCK_BATCH_MQ 42) at the byte level:
one client holds a queue at a time, as the Java broker's RebalanceLockManager decides."""

from __future__ import annotations

import json
from typing import Any

import trio

from gateway.protocols.rocketmq.codec import ResponseCode
from gateway.protocols.rocketmq.codes import RequestCode
from tests.helpers import running_gateway
from tests.integration.rocketmq_raw import RawRemoting


def rocketmq_gateway(**overrides: object):  # type: ignore[no-untyped-def]
    return running_gateway(nsq="off", rocketmq="127.0.0.1:0", **overrides)


def mq(queue_id: int, topic: str = "Orders") -> dict[str, Any]:
    return {"brokerName": "broker-a", "queueId": queue_id, "topic": topic}


def body(client: str, queues: list[Any], group: Any = "G") -> bytes:
    return json.dumps({"consumerGroup": group, "clientId": client, "mqSet": queues}).encode()


async def lock(c: RawRemoting, client: str, *queues: int) -> list[int]:
    """The queue ids granted, in the order asked."""
    reply = await c.call(RequestCode.LOCK_BATCH_MQ, body=body(client, [mq(q) for q in queues]))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    granted = json.loads(reply.body)["lockOKMQSet"]
    assert all(m == mq(m["queueId"]) for m in granted)  # answered as asked
    return [m["queueId"] for m in granted]


async def unlock(c: RawRemoting, client: str, *queues: int) -> None:
    reply = await c.call(RequestCode.UNLOCK_BATCH_MQ, body=body(client, [mq(q) for q in queues]))
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def test_a_queue_is_held_by_one_client_until_released_or_expired(
    autojump_clock: object,
) -> None:
    async with rocketmq_gateway(rocketmq_broker__queue_lock_seconds=60) as gw:
        a, b = await RawRemoting.connect(gw), await RawRemoting.connect(gw)
        assert await lock(a, "10.0.0.1@a", 0, 1) == [0, 1]
        assert await lock(b, "10.0.0.2@b", 1, 2) == [2]  # queue 1 is a's
        assert await lock(a, "10.0.0.1@a", 0, 1) == [0, 1]  # a renews its own
        # releasing a queue someone else holds does nothing
        await unlock(b, "10.0.0.2@b", 0)
        assert await lock(b, "10.0.0.2@b", 0) == []
        await unlock(a, "10.0.0.1@a", 1)
        assert await lock(b, "10.0.0.2@b", 1) == [1]
        # another group's locks are its own
        other = await a.call(RequestCode.LOCK_BATCH_MQ, body=body("10.0.0.1@a", [mq(2)], "H"))
        assert [m["queueId"] for m in json.loads(other.body)["lockOKMQSet"]] == [2]
        # a holds queue 0 and lets it lapse: past queue_lock_seconds without renewal it goes
        # to whoever asks next; a renewal just before keeps it
        await trio.sleep(59)
        assert await lock(b, "10.0.0.2@b", 1, 2) == [1, 2]  # b renews
        assert await lock(b, "10.0.0.2@b", 0) == []
        await trio.sleep(2)
        assert await lock(b, "10.0.0.2@b", 0) == [0]
        assert await lock(a, "10.0.0.1@a", 0) == []
        # a closed connection keeps its locks: its client may come back with the same id
        await b.aclose()
        assert await lock(a, "10.0.0.1@a", 0, 1, 2) == []
        c = await RawRemoting.connect(gw)
        assert await lock(c, "10.0.0.2@b", 0, 1, 2) == [0, 1, 2]
        await a.aclose()
        await c.aclose()


async def test_bad_lock_requests_get_an_error_naming_what_is_wrong() -> None:
    async with rocketmq_gateway() as gw:
        c = await RawRemoting.connect(gw)
        not_json = await c.call(RequestCode.LOCK_BATCH_MQ, body=b"{nope")
        no_client = await c.call(RequestCode.UNLOCK_BATCH_MQ, body=body("", [mq(0)]))
        bad_group = await c.call(RequestCode.LOCK_BATCH_MQ, body=body("x@1", [mq(0)], "a b"))
        # queues of no valid topic, past the topic's queues, or not objects: never granted
        odd = [mq(0, "no spaces"), mq(4), mq(-1), {"topic": "Orders", "queueId": "1"}, 7, mq(3)]
        mixed = await c.call(RequestCode.LOCK_BATCH_MQ, body=body("x@1", odd))
        still = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        await c.aclose()
    assert (not_json.code, not_json.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the lock request body is not a JSON object",
    )
    assert (no_client.code, no_client.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the lock request names no clientId",
    )
    assert bad_group.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
    assert "'a b'" in bad_group.remark
    assert mixed.code == ResponseCode.SUCCESS
    assert json.loads(mixed.body)["lockOKMQSet"] == [mq(3)]
    assert still.code == ResponseCode.SUCCESS  # the connection goes on
    assert set(gw.rocketmq.locks) == {("G", "Orders", 3)}
