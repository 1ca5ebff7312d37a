"""Unmodified ali-ons 3.12.0 (npm, the pure JavaScript RocketMQ 4.x client) against the
gateway as its nameserver and broker (one port, `nameSrv` always given).

Each test starts a gateway with only the RocketMQ listener, and ali-ons producers and push
consumers in node subprocesses (tests/clients/node/rocketmq_client.js).
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest
import trio

from gateway.app import Gateway
from tests.clients import alions
from tests.clients.alions import message, unb64
from tests.clients.harness import wait_until
from tests.helpers import running_gateway

pytestmark = pytest.mark.clients

MSG_ID = re.compile(r"[0-9A-F]{32}\Z")
# retries after 0.2 s instead of the broker's 10 s (level 3), so a retry test is quick
FAST_RETRIES = [0.2] * 18


def rocketmq_gateway(**overrides: object):  # type: ignore[no-untyped-def]
    return running_gateway(
        nsq="off", rocketmq="127.0.0.1:0", rocketmq_broker__delay_levels=FAST_RETRIES, **overrides
    )


def bodies_of(events: list[dict[str, object]]) -> list[bytes]:
    return [unb64(str(e["body"])) for e in events]


async def test_tags_keys_properties_and_tag_filter() -> None:
    """A `TagA || TagB` consumer gets only those tags; a `*` consumer in another group gets
    all three; keys, user properties and msgIds arrive as sent; send results carry 32-hex
    msgIds and queue offsets that increase within each queue."""
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        filtered = await alions.start(
            nursery,
            "consume",
            alions.consumer_options(gw, "T1", "GID_tags", 2, subExpr="TagA || TagB"),
        )
        everything = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "T1", "GID_all", 11)
        )
        await filtered.until("ready")
        await everything.until("ready")
        specs = [
            message(b"hello", "TagA", keys=["k1", "k2"], props={"color": "red"}),
            message(b"filtered out", "TagC"),
            message(b"second", "TagB"),
        ] + [message(b"more %d" % i, "TagZ") for i in range(8)]
        sent = await alions.produce(gw, "T1", specs)
        assert await filtered.wait() == 0
        assert await everything.wait() == 0
    assert all(s["sendStatus"] == "SEND_OK" and MSG_ID.match(s["msgId"]) for s in sent)
    assert len({s["msgId"] for s in sent}) == len(sent)
    by_queue: dict[int, list[int]] = {}
    for s in sent:
        by_queue.setdefault(s["queueId"], []).append(s["queueOffset"])
    assert len(by_queue) > 1  # the producer spreads over the route's queues
    for offsets in by_queue.values():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)

    got = filtered.of("message")
    assert sorted(bodies_of(got)) == [b"hello", b"second"]
    first = next(m for m in got if m["tags"] == "TagA")
    assert first["keys"] == "k1 k2"
    assert first["properties"]["color"] == "red"
    assert first["msgId"] == sent[0]["msgId"]
    assert first["reconsumeTimes"] == 0 and first["topic"] == "T1"
    assert sorted(bodies_of(everything.of("message"))) == sorted(unb64(s["body"]) for s in specs)
    assert {m["msgId"] for m in everything.of("message")} == {s["msgId"] for s in sent}


async def test_handler_failure_comes_back_through_the_retry_topic() -> None:
    """ACTION_RETRY -> CONSUMER_SEND_MSG_BACK -> the message again, from %RETRY%group,
    with the original topic restored, reconsumeTimes 1 and a new msgId."""
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        consumer = await alions.start(
            nursery,
            "consume",
            alions.consumer_options(gw, "T2", "GID_retry", 2, retryFirst=True),
        )
        await consumer.until("ready")
        sent = await alions.produce(
            gw, "T2", [message(b"fails once", "TagA"), message(b"also once", "TagB")]
        )
        assert await consumer.wait() == 0
        retry_topic = gw.broker.topics["%RETRY%GID_retry"]
    got = consumer.of("message")
    firsts = [m for m in got if m["reconsumeTimes"] == 0]
    retries = [m for m in got if m["reconsumeTimes"] == 1]
    assert sorted(bodies_of(firsts)) == sorted(bodies_of(retries)) == [b"also once", b"fails once"]
    assert {m["msgId"] for m in firsts} == {s["msgId"] for s in sent}
    assert not {m["msgId"] for m in retries} & {s["msgId"] for s in sent}
    for m in retries:
        assert m["topic"] == "T2"  # restored by the client from RETRY_TOPIC
        assert m["properties"]["RETRY_TOPIC"] == "T2"
        assert m["tags"] in ("TagA", "TagB")
    assert retry_topic.message_count == 2


async def test_consumer_handoff_in_one_group_loses_nothing() -> None:
    """A consumer that handles part of the messages and closes (committing), then a new
    consumer in the same group: together every message, none handled twice beyond one
    pull batch."""
    n = 200
    specs = [message(b"m%03d" % i, "T") for i in range(n)]
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        await alions.produce(gw, "T3", specs)
        first = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "T3", "GID_handoff", 60, handleMs=10)
        )
        assert await first.wait() == 0
        left = n - len(set(bodies_of(first.of("message"))))
        rest = await alions.start(
            nursery,
            "consume",
            alions.consumer_options(
                gw,
                "T3",
                "GID_handoff",
                left,
                distinct=True,
                ignore=[m["body"] for m in first.of("message")],
            ),
        )
        assert await rest.wait() == 0
        group = gw.broker.topics["T3"].groups["GID_handoff"]
        # both closed after committing: every message acknowledged, nothing held
        assert group.finish_count == n and not group.in_flight and not group.ready
    handled_first = bodies_of(first.of("message"))
    handled_rest = bodies_of(rest.of("message"))
    assert set(handled_first) | set(handled_rest) == {unb64(s["body"]) for s in specs}
    twice = Counter(handled_first + handled_rest)
    duplicates = sum(c - 1 for c in twice.values() if c > 1)
    assert duplicates <= 32, duplicates


async def test_compressed_8kb_body_arrives_intact() -> None:
    """ali-ons compresses bodies of 4 KB and more (sysFlag bit 0); the gateway stores the
    inflated bytes and delivers them uncompressed: byte for byte the same."""
    body = os.urandom(4096).hex().encode()  # 8 KB, compressible
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        consumer = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "T4", "GID_big", 1)
        )
        await consumer.until("ready")
        await alions.produce(gw, "T4", [message(body, "Big")])
        assert await consumer.wait() == 0
        stored = gw.broker.topics["T4"].message_bytes
    assert bodies_of(consumer.of("message")) == [body]
    assert stored == len(body)


async def test_metrics_count_connections_and_bytes(gateway_for_metrics: Gateway) -> None:
    gw = gateway_for_metrics
    await alions.produce(gw, "T5", [message(b"x", "A")])
    text = gw.metrics.registry.get_sample_value(
        "gateway_connections_total", {"protocol": "rocketmq"}
    )
    assert text is not None and text >= 1
    assert gw.metrics.registry.get_sample_value(
        "gateway_received_bytes_total", {"protocol": "rocketmq"}
    )


@pytest.fixture
async def gateway_for_metrics():  # type: ignore[no-untyped-def]
    async with rocketmq_gateway() as gw:
        yield gw


async def test_past_max_reconsume_times_the_message_is_buried_in_the_dlq() -> None:
    """A handler that always fails, maxReconsumeTimes 2: the first delivery and two
    retries, then the gateway buries it in %DLQ%group (where a kick would bring it back)."""
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        consumer = await alions.start(
            nursery,
            "consume",
            alions.consumer_options(gw, "T6", "GID_dlq", 1, failAll=True, maxReconsumeTimes=2),
        )
        await consumer.until("ready")
        await alions.produce(gw, "T6", [message(b"poison", "Bad")])

        def buried() -> bool:
            group = gw.rocketmq.dead_letter_group("GID_dlq")
            return group is not None and len(group.buried) == 1

        await wait_until(buried, "the message buried in %DLQ%GID_dlq")
        consumer.process.terminate()
        await consumer.wait()
        [dead] = gw.rocketmq.dead_letter_group("GID_dlq").buried.values()  # type: ignore[union-attr]
    deliveries = consumer.of("message")
    assert [m["reconsumeTimes"] for m in deliveries] == [0, 1, 2]
    assert dead.body == b"poison" and ("RETRY_TOPIC", "T6") in (dead.headers or [])
    assert ("TAGS", "Bad") in (dead.headers or [])


async def test_two_consumers_of_one_group_share_its_queues() -> None:
    """Both in the group at once: the clients split the four queues between them (each
    gets messages), and together they get every message."""
    n = 400
    specs = [message(b"s%03d" % i, "T") for i in range(n)]
    options = {"handleMs": 10, "rebalanceInterval": 300, "timeoutMs": 60000}
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        a = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "T7", "GID_pair", n, **options)
        )
        b = await alions.start(
            nursery, "consume", alions.consumer_options(gw, "T7", "GID_pair", n, **options)
        )
        await a.until("ready")
        await b.until("ready")
        await wait_until(lambda: len(gw.rocketmq.client_ids("GID_pair")) == 2, "both members")
        await alions.produce(gw, "T7", specs)

        def everything() -> bool:
            seen = {m["body"] for m in a.of("message") + b.of("message")}
            return len(seen) == n

        await wait_until(everything, f"{n} distinct messages between the two", timeout=60)
        a.process.terminate()
        b.process.terminate()
        await a.wait()
        await b.wait()
    got_a = {unb64(m["body"]) for m in a.of("message")}
    got_b = {unb64(m["body"]) for m in b.of("message")}
    # two queues each once they have rebalanced (the producer spreads over all four)
    assert len(got_a) >= n // 4 and len(got_b) >= n // 4, (len(got_a), len(got_b))
    assert got_a | got_b == {unb64(s["body"]) for s in specs}


async def test_a_half_message_of_a_transaction_is_refused_and_never_delivered() -> None:
    """ali-ons marks a message whose TRAN_MSG property is set as a transaction's half
    message; the gateway keeps no half messages, so it answers NO_PERMISSION, as a Java
    broker that rejects transactions does, and the send fails at the producer. Nothing
    reaches the topic: a consumer would otherwise see what a rollback may undo."""
    async with rocketmq_gateway() as gw, trio.open_nursery() as nursery:
        options = {
            "nameSrv": alions.name_server(gw),
            "topic": "T9",
            "messages": [message(b"half", "A", props={"TRAN_MSG": "true", "PGROUP": "P"})],
        }
        producer = await alions.start(nursery, "produce", options)
        code = await producer.wait()
        topic = gw.broker.topics.get("T9")
        refused = gw.metrics.registry.get_sample_value(
            "gateway_protocol_errors_total", {"protocol": "rocketmq", "code": "NO_PERMISSION"}
        )
    assert code != 0 and not producer.of("sent")
    assert "still failed" in producer.of("fatal")[0]["message"]
    assert refused is not None and refused >= 1
    assert topic is None or topic.message_count == 0
