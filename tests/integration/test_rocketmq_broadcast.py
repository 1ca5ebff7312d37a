"""BROADCASTING consumers at the byte level: each client reads through a group of its own,
its pulls acknowledge what they pass, and the group goes with the client. (The C++
client's broadcasting consumers: test_rocketmq_cpp.py.)"""

from __future__ import annotations

from gateway.protocols.rocketmq.codec import ResponseCode
from gateway.protocols.rocketmq.codes import RequestCode
from gateway.protocols.rocketmq.message import decode_records
from tests.clients.harness import wait_until
from tests.helpers import running_gateway
from tests.integration.rocketmq_raw import RawRemoting


def rocketmq_gateway(**overrides: object):  # type: ignore[no-untyped-def]
    return running_gateway(
        nsq="off", rocketmq="127.0.0.1:0", rocketmq_broker__read_queues=1, **overrides
    )


async def max_offset(c: RawRemoting, topic: str) -> int:
    answer = await c.call(RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
    return int(answer.ext_fields["offset"])


async def test_each_client_gets_every_message_and_its_pulls_acknowledge() -> None:
    async with rocketmq_gateway() as gw:
        a, b = await RawRemoting.connect(gw), await RawRemoting.connect(gw)
        await a.heartbeat("10.0.0.1@a", "G", {"B": "*"}, "BROADCASTING")
        await b.heartbeat("10.0.0.2@b", "G", {"B": "*"}, "BROADCASTING")
        # each starts where its own group ends (CONSUME_FROM_LAST_OFFSET asks this)
        start_a, start_b = await max_offset(a, "B"), await max_offset(b, "B")
        for body in (b"m1", b"m2"):
            assert (await a.produce("B", body)).code == ResponseCode.SUCCESS
        got_a = decode_records((await a.pull("B", "G", 0, start_a)).body)
        got_b = decode_records((await b.pull("B", "G", 0, start_b)).body)
        groups = gw.broker.topics["B"].groups
        own_a, own_b = groups["G@10.0.0.1@a"], groups["G@10.0.0.2@b"]
        before = own_a.finish_count
        # the next pull passes what a received: acknowledged (a broadcast is not retried)
        nothing = await a.pull("B", "G", 0, start_a + 2)
        after = own_a.finish_count
        await a.aclose()
        await wait_until(lambda: "G@10.0.0.1@a" not in groups, "a's group to go")
        left = sorted(gw.broker.topics["B"].groups)
        b_still = own_b.finish_count
        await b.aclose()
    assert [r.body for r in got_a] == [r.body for r in got_b] == [b"m1", b"m2"]
    assert "G" not in left  # nobody reads the group itself
    assert (before, after) == (0, 2)
    assert nothing.code == ResponseCode.PULL_NOT_FOUND
    assert left == ["G@10.0.0.2@b"]  # a's group went with its connection
    assert b_still == 0  # b has not pulled past its messages


async def test_a_reconnected_client_pulls_once_its_heartbeat_says_who_it_is() -> None:
    """A broadcasting client that reconnected pulls before its next heartbeat: the pull
    waits for it (the gateway cannot tell whose group to read), and no group is made for
    the group name itself; a pull that may not wait gets PULL_NOT_FOUND."""
    async with rocketmq_gateway() as gw:
        a = await RawRemoting.connect(gw)
        await a.heartbeat("10.0.0.1@a", "G", {"R": "*"}, "BROADCASTING")
        again = await RawRemoting.connect(gw)
        quick = await again.pull("R", "G", 0, 7)
        held = await again.send(
            RequestCode.PULL_MESSAGE,
            again.pull_fields("R", "G", 0, 7, sysFlag=2, suspendTimeoutMillis=15000),
        )
        # answered in order: had the pull been answered, it would be here before this
        await again.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "R"})
        waited = held not in again.responses
        await again.heartbeat("10.0.0.9@again", "G", {"R": "*"}, "BROADCASTING")
        answer = await again.response(held)
        groups = sorted(gw.broker.topics["R"].groups)
        await a.aclose()
        await again.aclose()
    assert waited
    assert quick.code == ResponseCode.PULL_NOT_FOUND
    assert quick.ext_fields["nextBeginOffset"] == "7"
    # answered from its own group, where offset 7 is from another life: moved to its start
    assert answer.code == ResponseCode.PULL_OFFSET_MOVED
    assert groups == ["G@10.0.0.1@a", "G@10.0.0.9@again"]
