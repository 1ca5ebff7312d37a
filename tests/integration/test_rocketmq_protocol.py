"""The RocketMQ listener at the byte level: what each request code answers, as the notes
(docs/protocols/rocketmq-remoting.md) and the Java 4.9.8 broker say, for the requests
ali-ons does not make (SEND_MESSAGE 10, batches, oneway, the offset queries, dead letters)
and for pull states that are hard to reach with a real client."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import httpx

from gateway.app import Gateway
from gateway.protocols.rocketmq.codec import ResponseCode
from gateway.protocols.rocketmq.codes import RequestCode
from gateway.protocols.rocketmq.message import (
    BatchEntry,
    decode_records,
    encode_batch_body,
    offset_msg_id,
)
from tests.clients.harness import wait_until
from tests.helpers import http_base, running_gateway
from tests.integration.rocketmq_raw import RawRemoting


def rocketmq_gateway(**overrides: object):  # type: ignore[no-untyped-def]
    return running_gateway(nsq="127.0.0.1:0", rocketmq="127.0.0.1:0", **overrides)


def address(gw: Gateway) -> str:
    host, port = gw.addresses["rocketmq"]
    return f"{host}:{port}"


async def start_offset(c: RawRemoting, group: str, topic: str, queue_id: int = 0) -> int:
    """Where a group's consumer of one queue starts (QUERY_CONSUMER_OFFSET)."""
    fields = {"consumerGroup": group, "topic": topic, "queueId": queue_id}
    reply = await c.call(RequestCode.QUERY_CONSUMER_OFFSET, fields)
    return int(reply.ext_fields["offset"])


async def test_route_names_the_bound_address_with_configured_queues() -> None:
    async with rocketmq_gateway(
        rocketmq_broker__read_queues=8, rocketmq_broker__write_queues=2
    ) as gw:
        c = await RawRemoting.connect(gw)
        route = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Orders"})
        retry = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%G1"})
        missing = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
        bad = await c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "no spaces"})
        cluster = await c.call(RequestCode.GET_BROKER_CLUSTER_INFO)
        await c.aclose()
    assert route.code == ResponseCode.SUCCESS and route.flag & 1
    data = json.loads(route.body)
    assert data["brokerDatas"][0]["brokerAddrs"] == {"0": address(gw)}
    queue = data["queueDatas"][0]
    assert (queue["readQueueNums"], queue["writeQueueNums"], queue["perm"]) == (8, 2, 6)
    assert json.loads(retry.body)["queueDatas"][0]["readQueueNums"] == 1
    assert missing.code == bad.code == ResponseCode.TOPIC_NOT_EXIST
    assert missing.remark == "No topic route info in name server for the topic: TBW102"
    info = json.loads(cluster.body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    assert info["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": address(gw)}
    # the gateway never created the topics it was only asked about
    assert "Orders" not in gw.broker.topics


async def test_send_v1_batch_and_compressed_bodies_are_stored_as_meant() -> None:
    """SEND_MESSAGE (long names, the C++ client's), SEND_BATCH_MESSAGE (Java's) and a zlib
    body (sysFlag 1): stored inflated, so other protocols' consumers get the bytes meant."""
    async with rocketmq_gateway() as gw:
        c = await RawRemoting.connect(gw)
        v1 = await c.call(
            RequestCode.SEND_MESSAGE,
            {
                "producerGroup": "P",
                "topic": "mix",
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": "4",
                "queueId": "1",
                "sysFlag": "1",
                "bornTimestamp": "1700000000000",
                "flag": "0",
                "properties": "TAGS\x01A\x02",
                "reconsumeTimes": "0",
                "unitMode": "0",
            },
            zlib.compress(b"inflated" * 1000),
        )
        batch = await c.call(
            RequestCode.SEND_BATCH_MESSAGE,
            {"a": "P", "b": "mix", "e": 2, "f": 0, "i": ""},
            encode_batch_body(
                [BatchEntry(0, b"b1", "KEYS\x01x\x02"), BatchEntry(0, b"b2", "KEYS\x01y\x02")]
            ),
        )
        bodies = [m.body for m in gw.broker.topics["mix"].backlog]
        headers = [m.headers for m in gw.broker.topics["mix"].backlog]
        await c.aclose()
    assert v1.code == batch.code == ResponseCode.SUCCESS
    assert v1.ext_fields["queueId"] == "1" and v1.ext_fields["queueOffset"] == "0"
    ids = batch.ext_fields["msgId"].split(",")
    assert len(ids) == 2 and all(len(i) == 32 for i in ids)
    assert batch.ext_fields["queueId"] == "2"
    assert bodies == [b"inflated" * 1000, b"b1", b"b2"]
    assert headers == [[("TAGS", "A")], [("KEYS", "x")], [("KEYS", "y")]]
    host, port = gw.addresses["rocketmq"]
    first_id = gw.broker.last_id - 2
    assert v1.ext_fields["msgId"] == offset_msg_id(host, port, first_id)


async def test_pull_states_offsets_and_commits() -> None:
    async with rocketmq_gateway(rocketmq_broker__read_queues=1) as gw:
        c = await RawRemoting.connect(gw)
        assert (await c.heartbeat("cid@1", "G", {"P": "TagA"})).code == ResponseCode.SUCCESS
        start = await start_offset(c, "G", "P")
        empty = await c.pull("P", "G", 0, start, subscription="TagA")
        for tag, body in (("TagA", b"a1"), ("TagB", b"b1"), ("TagA", b"a2")):
            assert (await c.produce("P", body, f"TAGS\x01{tag}\x02")).code == 0
        found = await c.pull("P", "G", 0, start, subscription="TagA")
        records = decode_records(found.body)
        moved_high = await c.pull("P", "G", 0, start + 1000)
        commit = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "G", "topic": "P", "queueId": 0, "commitOffset": start + 1},
        )
        moved_low = await c.pull("P", "G", 0, start)
        again = await c.pull("P", "G", 0, start + 1, subscription="TagZ")
        max_offset = await c.call(RequestCode.GET_MAX_OFFSET, {"topic": "P", "queueId": 0})
        min_offset = await c.call(RequestCode.GET_MIN_OFFSET, {"topic": "P", "queueId": 0})
        group = gw.broker.topics["P"].groups["G"]
        finished = group.finish_count
        await c.aclose()
    assert empty.code == ResponseCode.PULL_NOT_FOUND
    assert empty.ext_fields["nextBeginOffset"] == str(start)
    assert found.code == ResponseCode.SUCCESS
    # TagB was never in the group's queues: the group subscribes to TagA only
    assert [r.body for r in records] == [b"a1", b"a2"]
    assert [r.queue_offset for r in records] == [start, start + 1]
    assert found.ext_fields["nextBeginOffset"] == str(start + 2)
    assert {"suggestWhichBrokerId", "minOffset", "maxOffset"} <= set(found.ext_fields)
    assert records[0].msg_id == offset_msg_id(*gw.addresses["rocketmq"], records[0].physical_offset)
    assert moved_high.code == ResponseCode.PULL_OFFSET_MOVED
    assert moved_high.ext_fields["nextBeginOffset"] == str(start)
    assert commit.code == ResponseCode.SUCCESS
    assert moved_low.code == ResponseCode.PULL_OFFSET_MOVED
    assert moved_low.ext_fields["nextBeginOffset"] == str(start + 1)
    assert again.code == ResponseCode.PULL_RETRY_IMMEDIATELY
    assert again.ext_fields["nextBeginOffset"] == str(start + 2)
    assert max_offset.ext_fields["offset"] == str(start + 2)
    assert min_offset.ext_fields["offset"] == str(start + 1)
    assert finished == 2  # a1 by the commit, TagB at once (not subscribed)


async def test_long_poll_is_answered_when_a_message_arrives() -> None:
    async with rocketmq_gateway(rocketmq_broker__read_queues=1) as gw:
        consumer = await RawRemoting.connect(gw)
        producer = await RawRemoting.connect(gw)
        await consumer.heartbeat("cid@1", "G", {"LP": "*"})
        query = await consumer.call(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "LP", "queueId": 0}
        )
        start = int(query.ext_fields["offset"])
        held = await consumer.send(
            RequestCode.PULL_MESSAGE,
            consumer.pull_fields("LP", "G", 0, start, sysFlag=6, suspendTimeoutMillis=30000),
        )
        # the held pull does not block the connection's other requests
        route = await consumer.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "LP"})
        assert route.code == ResponseCode.SUCCESS
        assert (await producer.produce("LP", b"wake up")).code == ResponseCode.SUCCESS
        answer = await consumer.response(held, timeout=5)
        await consumer.aclose()
        await producer.aclose()
    assert answer.code == ResponseCode.SUCCESS
    assert [r.body for r in decode_records(answer.body)] == [b"wake up"]


async def test_long_poll_times_out_with_not_found() -> None:
    async with rocketmq_gateway(rocketmq_broker__max_suspend=0.1) as gw:
        c = await RawRemoting.connect(gw)
        await c.heartbeat("cid@1", "G", {"LP": "*"})
        answer = await c.pull("LP", "G", 0, 0, sysFlag=6, suspendTimeoutMillis=30000)
        await c.aclose()
    assert answer.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED)


async def test_membership_follows_heartbeats_unregister_and_close() -> None:
    async with rocketmq_gateway() as gw:
        a = await RawRemoting.connect(gw)
        b = await RawRemoting.connect(gw)
        await a.heartbeat("10.0.0.1@a", "G", {"M": "*"})
        await b.heartbeat("10.0.0.2@b", "G", {"M": "*"})
        both = await a.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
        await b.aclose()
        await wait_until(lambda: gw.rocketmq.client_ids("G") == ["10.0.0.1@a"], "b leaving")
        left = await a.call(
            RequestCode.UNREGISTER_CLIENT,
            {"clientID": "10.0.0.1@a", "consumerGroup": "G", "producerGroup": ""},
        )
        none = await a.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
        notified = [r.code for r in a.requests]
        await a.aclose()
    assert json.loads(both.body) == {"consumerIdList": ["10.0.0.1@a", "10.0.0.2@b"]}
    assert left.code == ResponseCode.SUCCESS
    assert none.code == ResponseCode.SYSTEM_ERROR
    assert none.remark == "no consumer for this group, G"
    # told when b joined and when it left (NOTIFY_CONSUMER_IDS_CHANGED, oneway)
    assert notified == [RequestCode.NOTIFY_CONSUMER_IDS_CHANGED] * 2


async def test_send_back_retries_then_buries_in_the_dead_letter_queue() -> None:
    async with rocketmq_gateway(
        rocketmq_broker__read_queues=1, rocketmq_broker__delay_levels=[0.0] * 18
    ) as gw:
        c = await RawRemoting.connect(gw)
        await c.heartbeat("cid@1", "G", {"D": "*", "%RETRY%G": "*"})
        await c.produce("D", b"poison", "TAGS\x01X\x02")
        start = int(
            (
                await c.call(
                    RequestCode.QUERY_CONSUMER_OFFSET,
                    {"consumerGroup": "G", "topic": "D", "queueId": 0},
                )
            ).ext_fields["offset"]
        )
        [original] = decode_records((await c.pull("D", "G", 0, start)).body)
        back = await c.call(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {
                "offset": original.physical_offset,
                "group": "G",
                "delayLevel": 0,
                "originMsgId": original.msg_id,
                "originTopic": "D",
                "maxReconsumeTimes": 1,
            },
        )
        retry_start = int(
            (
                await c.call(
                    RequestCode.QUERY_CONSUMER_OFFSET,
                    {"consumerGroup": "G", "topic": "%RETRY%G", "queueId": 0},
                )
            ).ext_fields["offset"]
        )
        retried = await c.pull(
            "%RETRY%G", "G", 0, retry_start, sysFlag=6, suspendTimeoutMillis=5000
        )
        [again] = decode_records(retried.body)
        dead = await c.call(
            RequestCode.CONSUMER_SEND_MSG_BACK,
            {
                "offset": again.physical_offset,
                "group": "G",
                "delayLevel": 0,
                "maxReconsumeTimes": 1,
            },
        )
        unknown = await c.call(
            RequestCode.CONSUMER_SEND_MSG_BACK, {"offset": 99999999, "group": "G", "delayLevel": 0}
        )
        dlq = gw.broker.topics["%DLQ%G"].groups["G"]
        buried = list(dlq.buried.values())
        await c.aclose()
    assert back.code == dead.code == ResponseCode.SUCCESS
    assert again.body == b"poison" and again.reconsume_times == 1
    assert again.topic == "%RETRY%G"
    assert "RETRY_TOPIC\x01D\x02" in again.properties
    assert f"ORIGIN_MESSAGE_ID\x01{original.msg_id}\x02" in again.properties
    assert unknown.code == ResponseCode.SYSTEM_ERROR
    assert unknown.remark == "look message by offset failed, 99999999"
    assert [m.body for m in buried] == [b"poison"]
    assert ("RETRY_TOPIC", "D") in (buried[0].headers or [])


async def test_oneway_requests_get_no_answer_and_unknown_codes_do() -> None:
    async with rocketmq_gateway() as gw:
        c = await RawRemoting.connect(gw)
        await c.send(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, oneway=True)
        unknown = await c.call(9999, {"x": 1})
        await c.aclose()
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert unknown.opaque == 2 and unknown.remark == " request type 9999 not supported"
    assert 1 not in c.responses  # the oneway request was not answered
    assert (
        gw.metrics.registry.get_sample_value(
            "gateway_protocol_errors_total",
            {"protocol": "rocketmq", "code": "REQUEST_CODE_NOT_SUPPORTED"},
        )
        == 1
    )


async def test_half_messages_are_refused_and_other_sends_go_on() -> None:
    """A transaction's half message, by sysFlag (prepared) or by its TRAN_MSG property, is
    answered NO_PERMISSION with the Java broker's remark and stored nowhere; a message whose
    TRAN_MSG is not "true" is an ordinary one."""
    async with rocketmq_gateway() as gw:
        c = await RawRemoting.connect(gw)
        by_flag = await c.produce("Tx", b"half", sys_flag=4)
        by_property = await c.produce("Tx", b"half", properties="TRAN_MSG\x01true\x02")
        ordinary = await c.produce("Tx", b"plain", properties="TRAN_MSG\x01false\x02")
        await c.aclose()
        stored = [m.body for m in gw.broker.topics["Tx"].backlog]
    host = gw.addresses["rocketmq"][0]
    for refused in (by_flag, by_property):
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.remark == f"the broker[{host}] sending transaction message is forbidden"
    assert ordinary.code == ResponseCode.SUCCESS
    assert stored == [b"plain"]


async def test_admin_state_and_stats_show_rocketmq_groups() -> None:
    async with rocketmq_gateway(http="127.0.0.1:0") as gw:
        c = await RawRemoting.connect(gw)
        await c.heartbeat("192.0.2.2@7", "GID_admin", {"Shown": "*"})
        await c.produce("Shown", b"held until committed")
        async with httpx.AsyncClient(base_url=http_base(gw)) as client:
            state = (await client.get("/admin/api/state")).json()
            stats = (await client.get("/stats", params={"format": "json"})).json()
        await c.aclose()
    [topic] = [t for t in state["topics"] if t["name"] == "Shown"]
    [group] = topic["groups"]
    assert group["name"] == "GID_admin" and group["consumers"] == {"rocketmq": 1}
    [client_state] = group["clients"]
    # delivered to the group's queues, acknowledged only by a commit
    assert client_state["address"] == "192.0.2.2@7" and client_state["in_flight"] == 1
    assert state["connections"]["rocketmq"] == 1
    [nsq_topic] = [t for t in stats["topics"] if t["topic_name"] == "Shown"]
    [channel] = nsq_topic["channels"]
    assert channel["channel_name"] == "GID_admin" and channel["in_flight_count"] == 1
    assert channel["clients"][0]["version"] == "rocketmq"


async def test_the_durable_store_keeps_what_was_not_committed(tmp_path: Path) -> None:
    """Commit one of three, restart: the other two come back (at new, higher offsets), the
    committed one does not, and a commit of an offset from before acknowledges nothing."""
    store = f"sqlite:///{tmp_path / 'gateway.db'}"
    overrides = {"store": store, "rocketmq_broker__read_queues": 1}
    async with rocketmq_gateway(**overrides) as gw:
        c = await RawRemoting.connect(gw)
        await c.heartbeat("cid@1", "G", {"R": "*"})
        for body in (b"one", b"two", b"three"):
            assert (await c.produce("R", body)).code == ResponseCode.SUCCESS
        query = {"consumerGroup": "G", "topic": "R", "queueId": 0}
        start = int((await c.call(RequestCode.QUERY_CONSUMER_OFFSET, query)).ext_fields["offset"])
        assert len(decode_records((await c.pull("R", "G", 0, start)).body)) == 3
        await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, {**query, "commitOffset": start + 1})
        await c.aclose()
    async with rocketmq_gateway(**overrides) as gw:
        c = await RawRemoting.connect(gw)
        await c.heartbeat("cid@1", "G", {"R": "*"})
        stale = await c.call(
            RequestCode.UPDATE_CONSUMER_OFFSET, {**query, "commitOffset": start + 3}
        )
        after = int((await c.call(RequestCode.QUERY_CONSUMER_OFFSET, query)).ext_fields["offset"])
        moved = await c.pull("R", "G", 0, start + 1)
        records = decode_records((await c.pull("R", "G", 0, after)).body)
        await c.aclose()
    assert stale.code == ResponseCode.SUCCESS
    assert after > start + 3
    assert moved.code == ResponseCode.PULL_OFFSET_MOVED
    assert moved.ext_fields["nextBeginOffset"] == str(after)
    assert [r.body for r in records] == [b"two", b"three"]


async def test_a_delay_level_defers_the_message() -> None:
    """Property DELAY=2 publishes with delay_levels[1] (here 3 s): not there at once, then
    delivered to the pull held for it."""
    levels = [1.0, 3.0] + [1.0] * 16
    async with rocketmq_gateway(
        rocketmq_broker__read_queues=1, rocketmq_broker__delay_levels=levels
    ) as gw:
        c = await RawRemoting.connect(gw)
        await c.heartbeat("cid@1", "G", {"Later": "*"})
        query = {"consumerGroup": "G", "topic": "Later", "queueId": 0}
        start = int((await c.call(RequestCode.QUERY_CONSUMER_OFFSET, query)).ext_fields["offset"])
        sent = await c.produce("Later", b"not yet", "DELAY\x012\x02")
        now = await c.pull("Later", "G", 0, start)
        later = await c.pull(
            "Later", "G", 0, start, sysFlag=6, suspendTimeoutMillis=15000, timeout=20
        )
        await c.aclose()
    assert sent.code == ResponseCode.SUCCESS
    assert now.code == ResponseCode.PULL_NOT_FOUND
    [record] = decode_records(later.body)
    assert record.body == b"not yet" and "DELAY\x012\x02" in record.properties


async def test_java_style_pulls_take_the_heartbeat_subscription() -> None:
    """Java's push consumer pulls without the subscription flag (postSubscriptionWhenPull
    false) and commits offsets oneway (flag 2): the group's heartbeat subscription
    filters, and the oneway commit is applied without an answer."""
    async with rocketmq_gateway(rocketmq_broker__read_queues=1) as gw:
        c = await RawRemoting.connect(gw)
        unknown = await c.pull("J", "GJ", 0, 0, sysFlag=2)
        await c.heartbeat("10.0.0.9@java", "GJ", {"J": "TagA"})
        for tag in ("TagA", "TagB", "TagA"):
            await c.produce("J", tag.encode(), f"TAGS\x01{tag}\x02")
        query = {"consumerGroup": "GJ", "topic": "J", "queueId": 0}
        start = int((await c.call(RequestCode.QUERY_CONSUMER_OFFSET, query)).ext_fields["offset"])
        pulled = await c.pull("J", "GJ", 0, start, sysFlag=2, subscription=None)
        await c.send(
            RequestCode.UPDATE_CONSUMER_OFFSET, {**query, "commitOffset": start + 2}, oneway=True
        )
        after = await c.call(RequestCode.QUERY_CONSUMER_OFFSET, query)
        await c.aclose()
    assert unknown.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert [r.body for r in decode_records(pulled.body)] == [b"TagA", b"TagA"]
    assert after.ext_fields["offset"] == str(start + 2)
    assert c.opaque - 1 not in c.responses  # the oneway commit was not answered


async def test_a_producers_queue_choice_holds_while_its_group_consumes() -> None:
    """An orderly producer sends to one queue (MessageQueueSelector); with the group's
    consumers running, the feed takes each message as it is published. Every message
    must be in the queue the producer chose, in order; it went to `id mod queues`,
    while the send result still named the chosen queue."""
    async with rocketmq_gateway() as gw:
        c = await RawRemoting.connect(gw)
        assert (await c.heartbeat("cid@1", "G", {"O": "*"})).code == ResponseCode.SUCCESS
        offsets = {q: await start_offset(c, "G", "O", q) for q in range(4)}
        for i in range(4):
            sent = await c.produce("O", b"m%d" % i, queue_id=2)
            assert sent.ext_fields["queueId"] == "2"
        got = {}
        for q in range(4):
            reply = await c.pull("O", "G", q, offsets[q])
            got[q] = [r.body for r in decode_records(reply.body)] if reply.body else []
        await c.aclose()
    assert got == {0: [], 1: [], 2: [b"m0", b"m1", b"m2", b"m3"], 3: []}


async def test_values_a_java_broker_takes_are_answered_not_fatal() -> None:
    """A property cut inside a surrogate pair (a JS string cut mid-emoji) is stored as
    Java stores it ("?") and pulled like any other; a count that str.isdigit() takes and
    int() does not ("²") or a malformed number ("--5") gets an error answer with the
    opaque, never a dropped connection (which took the connection's held pulls with it)."""
    async with rocketmq_gateway(rocketmq_broker__read_queues=1) as gw:
        c = await RawRemoting.connect(gw)
        assert (await c.heartbeat("cid@1", "G", {"S": "*"})).code == ResponseCode.SUCCESS
        start = await start_offset(c, "G", "S")
        cut = "TAGS\x01A\x02note\x01cut \ud83d\x02RECONSUME_TIME\x01\u00b2\x02DELAY\x01\u00b2\x02"
        assert (await c.produce("S", b"odd", cut)).code == ResponseCode.SUCCESS
        assert (await c.produce("S", b"plain")).code == ResponseCode.SUCCESS
        reply = await c.pull("S", "G", 0, start)
        assert [r.body for r in decode_records(reply.body)] == [b"odd", b"plain"]
        assert "cut ?" in decode_records(reply.body)[0].properties
        for bad in ("--5", "\u00b2"):
            commit = await c.call(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "G", "topic": "S", "queueId": 0, "commitOffset": bad},
            )
            assert commit.code != ResponseCode.SUCCESS, bad
        assert (await c.produce("S", b"after")).code == ResponseCode.SUCCESS  # still open
        await c.aclose()
