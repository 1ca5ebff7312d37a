"""nsqd's HTTP API on the gateway: every endpoint with nsqd 1.3.0's status codes, bodies and
headers (docs/protocols/nsq.md §12), bad input included, and /stats in nsqd's exact shape for real
NSQ TCP traffic."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
import pytest
import trio

from gateway.app import Gateway
from tests.helpers import RawBeanstalk, RawNSQ, be32, http_base, parse_message, running_gateway

V1 = "nsq; version=1.0"
JSON = "application/json; charset=utf-8"
TEXT = "text/plain; charset=utf-8"

# The key order of nsqd 1.3.0's /stats?format=json (docs/protocols/nsq.md §12)
STATS_KEYS = ["version", "health", "start_time", "topics", "memory", "producers"]
TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
]
CLIENT_KEYS = [
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]
PRODUCER_KEYS = [*CLIENT_KEYS[:15], "pub_counts", *CLIENT_KEYS[15:]]
MEMORY_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]
NO_E2E = {"count": 0, "percentiles": None}


@asynccontextmanager
async def http_gateway(**overrides: Any) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    async with (
        running_gateway(http="127.0.0.1:0", **overrides) as gw,
        httpx.AsyncClient(base_url=http_base(gw)) as client,
    ):
        yield gw, client


def assert_error(reply: httpx.Response, status: int, message: str) -> None:
    assert (reply.status_code, reply.content) == (status, b'{"message":"%s"}' % message.encode())
    assert reply.headers["content-type"] == JSON
    assert reply.headers["x-nsq-content-type"] == V1


def assert_ok(reply: httpx.Response) -> None:
    """A V1 `OK` (publishes): text, with the X-NSQ header."""
    assert (reply.status_code, reply.content) == (200, b"OK"), reply.content
    assert reply.headers["content-type"] == TEXT
    assert reply.headers["x-nsq-content-type"] == V1


def assert_empty(reply: httpx.Response) -> None:
    """A V1 success with nothing to say: 200, no body, no content type."""
    assert (reply.status_code, reply.content) == (200, b""), reply.content
    assert reply.headers["content-length"] == "0"
    assert "content-type" not in reply.headers
    assert reply.headers["x-nsq-content-type"] == V1


def errors_counted(gw: Gateway, code: str) -> float:
    value = gw.metrics.registry.get_sample_value(
        "gateway_protocol_errors_total", {"protocol": "http", "code": code}
    )
    return value or 0.0


def mpub_body(*bodies: bytes, count: int | None = None) -> bytes:
    parts = [be32(len(bodies) if count is None else count)]
    for body in bodies:
        parts += [be32(len(body)), body]
    return b"".join(parts)


# -- node endpoints ------------------------------------------------------------------------------


async def test_ping_is_plain_text_without_the_nsq_header() -> None:
    async with http_gateway() as (_, client):
        reply = await client.get("/ping")
        assert (reply.status_code, reply.content) == (200, b"OK")
        assert reply.headers["content-type"] == TEXT
        assert "x-nsq-content-type" not in reply.headers
        assert "server" not in reply.headers  # nsqd sends none


async def test_info_reports_both_ports_and_durations_in_nanoseconds() -> None:
    async with http_gateway(nsqd__max_heartbeat_interval=45000) as (gw, client):
        reply = await client.get("/info")
        assert reply.headers["content-type"] == JSON
        assert reply.headers["x-nsq-content-type"] == V1
        info = reply.json()
        assert list(info) == [
            "version",
            "broadcast_address",
            "hostname",
            "http_port",
            "tcp_port",
            "start_time",
            "max_heartbeat_interval",
            "max_output_buffer_size",
            "max_output_buffer_timeout",
            "max_deflate_level",
        ]
        assert info["version"] == "1.3.0"
        assert info["tcp_port"] == gw.addresses["nsq"][1]
        assert info["http_port"] == gw.addresses["http"][1]
        assert info["broadcast_address"] == "127.0.0.1"  # the NSQ listener's host
        assert info["max_heartbeat_interval"] == 45_000_000_000
        assert info["max_output_buffer_timeout"] == 30_000_000_000
        assert info["max_output_buffer_size"] == 65536
        assert info["max_deflate_level"] == 6
        assert abs(info["start_time"] - gw.broker.started_at) < 1


async def test_broadcast_address_setting_and_a_disabled_nsq_listener() -> None:
    async with http_gateway(nsqd__broadcast_address="nsq.example", nsq="off") as (_, client):
        info = (await client.get("/info")).json()
        assert (info["broadcast_address"], info["tcp_port"]) == ("nsq.example", -1)


async def test_unknown_paths_wrong_methods_options_and_trailing_slashes() -> None:
    async with http_gateway() as (gw, client):
        for path in ("/nope", "/dpub", "/put", "/mput", "/create_topic", "/config/"):
            assert_error(await client.post(path), 404, "NOT_FOUND")
        reply = await client.get("/pub")
        assert_error(reply, 405, "METHOD_NOT_ALLOWED")
        assert reply.headers["allow"] == "OPTIONS, POST"
        reply = await client.post("/stats")
        assert_error(reply, 405, "METHOD_NOT_ALLOWED")
        assert reply.headers["allow"] == "GET, OPTIONS"
        reply = await client.options("/config/max_msg_size")
        assert (reply.status_code, reply.content) == (200, b"")
        assert reply.headers["allow"] == "GET, OPTIONS, PUT"
        # httprouter redirects a path that only differs by its trailing slash
        reply = await client.get("/ping/?x=1")
        assert (reply.status_code, reply.headers["location"]) == (301, "/ping?x=1")
        reply = await client.post("/pub/?topic=t", content=b"x")
        assert (reply.status_code, reply.headers["location"]) == (307, "/pub?topic=t")
        assert errors_counted(gw, "NOT_FOUND") == 6
        assert errors_counted(gw, "METHOD_NOT_ALLOWED") == 2


# -- publishing ----------------------------------------------------------------------------------


async def test_pub_delivers_the_body_byte_for_byte_after_the_store_took_it() -> None:
    body = b"\x00line one\nline two\r\n\xff"
    async with http_gateway() as (gw, client):
        sub = await RawNSQ.connect(gw)
        await sub.send(b"SUB web ch\nRDY 5\n")
        assert await sub.frame() == (0, b"OK")
        assert_ok(await client.post("/pub", params={"topic": "web"}, content=body))
        kind, data = await sub.frame()
        assert kind == 2
        _, attempts, _, got = parse_message(data)
        assert (attempts, got) == (1, body)
        topic = gw.broker.topics["web"]
        assert (topic.message_count, topic.message_bytes) == (1, len(body))
        await sub.aclose()


async def test_pub_with_defer_is_deferred_and_pub_creates_the_topic() -> None:
    async with http_gateway() as (gw, client):
        assert_empty(await client.post("/topic/create?topic=later"))
        assert_empty(await client.post("/channel/create?topic=later&channel=ch"))
        assert_ok(await client.post("/pub?topic=later&defer=60000", content=b"x"))
        assert_ok(await client.post("/pub?topic=later&defer=0", content=b"y"))
        group = gw.broker.topics["later"].groups["ch"]
        assert (len(group.deferred), group.depth) == (1, 1)
        assert_ok(await client.post("/pub?topic=fresh", content=b"z"))
        assert gw.broker.topics["fresh"].depth == 1  # no channel yet: kept for the first


LIMITS = {"nsqd__max_msg_size": 100, "nsqd__max_body_size": 1000, "nsqd__max_req_timeout": 5000}

PUB_BAD_INPUT = [
    # (query, body, status, message): nsqd checks in this order
    ("topic=t", b"x" * 101, 413, "MSG_TOO_BIG"),
    ("topic=bad!", b"x" * 101, 413, "MSG_TOO_BIG"),  # the body first
    ("topic=t", b"", 400, "MSG_EMPTY"),
    ("", b"", 400, "MSG_EMPTY"),
    ("", b"x", 400, "MISSING_ARG_TOPIC"),
    ("channel=c", b"x", 400, "MISSING_ARG_TOPIC"),
    ("topic=", b"x", 400, "INVALID_TOPIC"),
    ("topic=bad!topic", b"x", 400, "INVALID_TOPIC"),
    ("topic=" + "a" * 65, b"x", 400, "INVALID_TOPIC"),
    ("topic=t%23ephemeralx", b"x", 400, "INVALID_TOPIC"),
    ("topic=t%ZZ", b"x", 400, "INVALID_REQUEST"),
    ("topic=t;x=1", b"x", 400, "INVALID_REQUEST"),
    ("topic=t&defer=x", b"x", 400, "INVALID_DEFER"),
    ("topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
    ("topic=t&defer=5001", b"x", 400, "INVALID_DEFER"),
    ("topic=t&defer=1.5", b"x", 400, "INVALID_DEFER"),
    ("topic=t&defer=+5%20", b"x", 400, "INVALID_DEFER"),
    ("topic=t&defer=", b"x", 400, "INVALID_DEFER"),
    ("topic=t&defer=99999999999999999999", b"x", 400, "INVALID_DEFER"),
]


async def test_pub_bad_input_gets_nsqds_codes_in_nsqds_order() -> None:
    async with http_gateway(**LIMITS) as (gw, client):
        for query, body, status, message in PUB_BAD_INPUT:
            reply = await client.post(f"/pub?{query}", content=body)
            assert_error(reply, status, message)
        assert errors_counted(gw, "INVALID_DEFER") == 7
        assert errors_counted(gw, "MSG_TOO_BIG") == 2
        # the limits themselves are allowed
        assert_ok(await client.post("/pub?topic=t&defer=5000", content=b"x" * 100))
        assert_ok(await client.post("/pub?topic=t&defer=%2B5", content=b"x"))
        # a valid topic is created before the defer check, as in nsqd
        assert "t" in gw.broker.topics


async def test_oversize_bodies_are_refused_on_their_declared_or_streamed_length() -> None:
    async with http_gateway(**LIMITS) as (gw, client):

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(30):
                yield b"x" * 50  # chunked: no Content-Length, 1500 bytes in all

        assert_error(await client.post("/pub?topic=t", content=chunks()), 413, "MSG_TOO_BIG")
        assert_error(await client.post("/mpub?topic=t", content=chunks()), 413, "BODY_TOO_BIG")
        # A declared length over the limit is refused before any body byte arrives.
        host, port = gw.addresses["http"]
        for path, message in ((b"/pub", b"MSG_TOO_BIG"), (b"/mpub", b"BODY_TOO_BIG")):
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(
                b"POST " + path + b"?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n"
            )
            reply = b""
            with trio.fail_after(5):
                while b'"}' not in reply:
                    reply += await stream.receive_some(4096)
            assert reply.startswith(b"HTTP/1.1 413")
            assert reply.endswith(b'{"message":"' + message + b'"}')
            await stream.aclose()
        assert "t" not in gw.broker.topics or gw.broker.topics["t"].message_count == 0


async def test_mpub_text_mode_splits_on_newlines_and_skips_empty_lines() -> None:
    async with http_gateway(**LIMITS) as (gw, client):
        sub = await RawNSQ.connect(gw)
        await sub.send(b"SUB m ch\nRDY 10\n")
        assert await sub.frame() == (0, b"OK")
        assert_ok(await client.post("/mpub?topic=m", content=b"a\nb\r\n\n\nc"))
        got = [parse_message((await sub.frame())[1])[3] for _ in range(3)]
        assert got == [b"a", b"b\r", b"c"]  # only the \n is a separator
        assert_ok(await client.post("/mpub?topic=empty", content=b""))  # publishes nothing
        assert gw.broker.topics["empty"].message_count == 0
        assert_ok(await client.post("/mpub?topic=m&binary=false", content=b"d\n"))
        assert_ok(await client.post("/mpub?topic=m&binary=0", content=b"e"))
        assert gw.broker.topics["m"].message_count == 5
        rows = [
            ("topic=m", b"ok\n" + b"x" * 101 + b"\n", 413, "MSG_TOO_BIG"),
            ("topic=m", b"x" * 101 + b"\n" + b"y\n" * 500, 413, "BODY_TOO_BIG"),  # declared
            ("", b"a", 400, "MISSING_ARG_TOPIC"),
            ("topic=a/b", b"a", 400, "INVALID_TOPIC"),
        ]
        for query, body, status, message in rows:
            assert_error(await client.post(f"/mpub?{query}", content=body), status, message)

        async def chunked(body: bytes) -> AsyncIterator[bytes]:
            yield body  # no Content-Length: the limits apply as the lines are read

        for body, message in (
            (b"x" * 101 + b"\n" + b"y\n" * 500, "MSG_TOO_BIG"),  # the first fault read
            (b"y\n" * 500 + b"z", "BODY_TOO_BIG"),
        ):
            assert_error(await client.post("/mpub?topic=m", content=chunked(body)), 413, message)
        assert gw.broker.topics["m"].message_count == 5  # an error publishes none of it
        await sub.aclose()


async def test_mpub_binary_mode_and_its_malformed_bodies() -> None:
    async with http_gateway(**LIMITS) as (gw, client):
        for flag in ("true", "1", "yes"):  # any value but false/0 means binary
            reply = await client.post(
                f"/mpub?topic=bin&binary={flag}", content=mpub_body(b"a\nb", b"\x00")
            )
            assert_ok(reply)
        assert gw.broker.topics["bin"].message_count == 6
        assert [m.body for m in gw.broker.topics["bin"].backlog[:2]] == [b"a\nb", b"\x00"]
        too_many = (1000 - 4) // 5 + 1
        rows = [
            (b"", "BAD_BODY"),
            (b"\x00\x00", "BAD_BODY"),
            (be32(0), "BAD_BODY"),
            (be32(-1), "BAD_BODY"),
            (be32(too_many), "BAD_BODY"),
            (mpub_body(b"a", count=2), "BAD_MESSAGE"),  # the second size is missing
            (mpub_body(b"a") + b"\x00", "OK"),  # trailing bytes are ignored
            (be32(1) + be32(0), "BAD_MESSAGE"),
            (be32(1) + be32(-5), "BAD_MESSAGE"),
            (be32(1) + be32(101) + b"x" * 101, "BAD_MESSAGE"),
            (be32(1) + be32(10) + b"short", "BAD_MESSAGE"),
            (be32(1) + b"\x00\x00", "BAD_MESSAGE"),
        ]
        for body, message in rows:
            reply = await client.post("/mpub?topic=bin&binary=true", content=body)
            if message == "OK":
                assert_ok(reply)
            else:
                assert_error(reply, 413, message)
        assert gw.broker.topics["bin"].message_count == 7
        assert errors_counted(gw, "BAD_MESSAGE") == 6
        assert errors_counted(gw, "BAD_BODY") == 5


async def test_mpub_ignores_defer_as_nsqd_does() -> None:
    async with http_gateway() as (gw, client):
        assert_error(await client.post("/channel/create?topic=d&channel=c"), 404, "TOPIC_NOT_FOUND")
        assert_empty(await client.post("/topic/create?topic=d"))
        assert_empty(await client.post("/channel/create?topic=d&channel=c"))
        assert_ok(await client.post("/mpub?topic=d&defer=60000", content=b"a\nb"))
        group = gw.broker.topics["d"].groups["c"]
        assert (group.depth, len(group.deferred)) == (2, 0)


# -- topics and channels -------------------------------------------------------------------------

ADMIN_BAD_INPUT = [
    ("/topic/create", "", 400, "MISSING_ARG_TOPIC"),
    ("/topic/create", "topic=bad!", 400, "INVALID_TOPIC"),
    ("/topic/delete", "", 400, "MISSING_ARG_TOPIC"),
    ("/topic/delete", "topic=nope", 404, "TOPIC_NOT_FOUND"),
    ("/topic/delete", "topic=bad!", 404, "TOPIC_NOT_FOUND"),
    ("/topic/empty", "", 400, "MISSING_ARG_TOPIC"),
    ("/topic/empty", "topic=bad!", 400, "INVALID_TOPIC"),
    ("/topic/empty", "topic=nope", 404, "TOPIC_NOT_FOUND"),
    ("/topic/pause", "", 400, "MISSING_ARG_TOPIC"),
    ("/topic/pause", "topic=nope", 404, "TOPIC_NOT_FOUND"),
    ("/topic/unpause", "topic=bad!", 404, "TOPIC_NOT_FOUND"),
    ("/topic/pause", "topic=%", 400, "INVALID_REQUEST"),
]
CHANNEL_BAD_INPUT = [
    ("", 400, "MISSING_ARG_TOPIC"),
    ("channel=c", 400, "MISSING_ARG_TOPIC"),
    ("topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
    ("topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
    ("topic=t&channel=" + "c" * 65, 400, "INVALID_ARG_CHANNEL"),
    ("topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
]


async def test_topic_and_channel_administration_bad_input() -> None:
    async with http_gateway() as (_, client):
        assert_empty(await client.post("/topic/create?topic=t"))
        for path, query, status, message in ADMIN_BAD_INPUT:
            assert_error(await client.post(f"{path}?{query}"), status, message)
        for action in ("create", "delete", "empty", "pause", "unpause"):
            for query, status, message in CHANNEL_BAD_INPUT:
                reply = await client.post(f"/channel/{action}?{query}")
                assert_error(reply, status, message)
        for action in ("delete", "empty", "pause", "unpause"):
            reply = await client.post(f"/channel/{action}?topic=t&channel=nope")
            assert_error(reply, 404, "CHANNEL_NOT_FOUND")


async def test_pause_empty_and_delete_act_on_topics_and_channels() -> None:
    async with http_gateway() as (gw, client):
        sub = await RawNSQ.connect(gw)
        await sub.send(b"SUB adm ch\nRDY 10\n")
        assert await sub.frame() == (0, b"OK")
        topic = gw.broker.topics["adm"]
        group = topic.groups["ch"]

        assert_empty(await client.post("/channel/pause?topic=adm&channel=ch"))
        assert_ok(await client.post("/pub?topic=adm", content=b"held"))
        assert (group.paused, group.depth, len(group.in_flight)) == (True, 1, 0)
        assert_empty(await client.post("/channel/unpause?topic=adm&channel=ch"))
        assert parse_message((await sub.frame())[1])[3] == b"held"

        assert_empty(await client.post("/topic/pause?topic=adm"))
        assert_ok(await client.post("/pub?topic=adm", content=b"in the topic"))
        assert (topic.paused, topic.depth, group.depth) == (True, 1, 0)
        assert_empty(await client.post("/topic/empty?topic=adm"))
        assert topic.depth == 0
        assert_empty(await client.post("/topic/unpause?topic=adm"))
        assert not topic.paused

        assert_empty(await client.post("/channel/pause?topic=adm&channel=ch"))
        assert_ok(await client.post("/mpub?topic=adm", content=b"1\n2"))
        assert group.depth == 2
        assert_empty(await client.post("/channel/empty?topic=adm&channel=ch"))
        assert (group.depth, len(group.in_flight)) == (0, 0)

        # deleting a channel closes its clients' connections, as nsqd does
        assert_empty(await client.post("/channel/delete?topic=adm&channel=ch"))
        assert "ch" not in topic.groups
        assert await sub.closed()
        assert_empty(await client.post("/channel/create?topic=adm&channel=other%23ephemeral"))
        assert topic.groups["other#ephemeral"].ephemeral
        assert_empty(await client.post("/topic/delete?topic=adm"))
        assert "adm" not in gw.broker.topics


# -- /stats --------------------------------------------------------------------------------------


async def _traffic(gw: Gateway) -> tuple[RawNSQ, RawNSQ]:
    """A publisher (2 PUBs to st, 1 to other) and a consumer of st/ch that has FINed one
    message and holds the other, redelivered after a REQ."""
    pub = await RawNSQ.connect(gw)
    assert await pub.identify(client_id="pub1", hostname="pubhost", user_agent="raw/1.0") == (
        0,
        b"OK",
    )
    for topic, body in ((b"st", b"one"), (b"st", b"two"), (b"other", b"three")):
        await pub.send(b"PUB " + topic + b"\n" + be32(len(body)) + body)
        assert await pub.frame() == (0, b"OK")
    sub = await RawNSQ.connect(gw)
    assert await sub.identify(client_id="sub1", hostname="subhost", user_agent="raw/2.0") == (
        0,
        b"OK",
    )
    await sub.send(b"SUB st ch\nRDY 2\n")
    assert await sub.frame() == (0, b"OK")
    first = parse_message((await sub.frame())[1])
    second = parse_message((await sub.frame())[1])
    await sub.send(b"FIN " + first[2] + b"\nREQ " + second[2] + b" 0\n")
    again = parse_message((await sub.frame())[1])
    assert (again[1], again[3]) == (2, second[3])
    return pub, sub


async def test_stats_json_has_nsqds_shape_for_real_traffic() -> None:
    async with http_gateway() as (gw, client):
        pub, sub = await _traffic(gw)
        reply = await client.get("/stats?format=json")
        assert reply.headers["content-type"] == JSON
        assert reply.headers["x-nsq-content-type"] == V1
        stats = reply.json()
        assert list(stats) == STATS_KEYS
        assert (stats["version"], stats["health"]) == ("1.3.0", "OK")
        assert list(stats["memory"]) == MEMORY_KEYS
        assert all(isinstance(v, int) for v in stats["memory"].values())
        assert [t["topic_name"] for t in stats["topics"]] == ["other", "st"]  # sorted
        st = stats["topics"][1]
        assert list(st) == TOPIC_KEYS
        assert {k: st[k] for k in TOPIC_KEYS if k != "channels"} == {
            "topic_name": "st",
            "depth": 0,
            "backend_depth": 0,
            "message_count": 2,
            "message_bytes": 6,
            "paused": False,
            "e2e_processing_latency": NO_E2E,
        }
        (ch,) = st["channels"]
        assert list(ch) == CHANNEL_KEYS
        assert {k: ch[k] for k in CHANNEL_KEYS if k != "clients"} == {
            "channel_name": "ch",
            "depth": 0,
            "backend_depth": 0,
            "in_flight_count": 1,
            "deferred_count": 0,
            "message_count": 2,
            "requeue_count": 1,
            "timeout_count": 0,
            "client_count": 1,
            "paused": False,
            "e2e_processing_latency": NO_E2E,
        }
        (client_stats,) = ch["clients"]
        assert list(client_stats) == CLIENT_KEYS
        assert client_stats["remote_address"].startswith("127.0.0.1:")
        assert abs(client_stats["connect_ts"] - gw.broker.started_at) < 60
        del client_stats["remote_address"], client_stats["connect_ts"]
        assert client_stats == {
            "client_id": "sub1",
            "hostname": "subhost",
            "version": "V2",
            "state": 3,
            "ready_count": 2,
            "in_flight_count": 1,
            "message_count": 3,
            "finish_count": 1,
            "requeue_count": 1,
            "sample_rate": 0,
            "deflate": False,
            "snappy": False,
            "user_agent": "raw/2.0",
            "tls": False,
            "tls_cipher_suite": "",
            "tls_version": "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        assert stats["topics"][0]["channels"] == []
        assert stats["topics"][0]["depth"] == 1  # no channel: waiting in the topic
        (producer,) = stats["producers"]
        assert list(producer) == PRODUCER_KEYS
        assert (producer["client_id"], producer["user_agent"]) == ("pub1", "raw/1.0")
        # nsqd 1.3.0 lists one topic per producer (its loop breaks after the first)
        assert producer["pub_counts"] == [{"topic": "st", "count": 2}]
        await pub.aclose()
        await sub.aclose()


async def test_a_client_name_that_is_no_valid_text_reads_as_go_reads_it() -> None:
    """IDENTIFY strings as nsqd's encoding/json decodes them: an invalid UTF-8 byte or an
    unpaired surrogate escape becomes U+FFFD. Kept as they came, one client's name made
    every /stats fail (500) while it was connected."""
    async with http_gateway() as (gw, client):
        conn = await RawNSQ.connect(gw)
        body = b'{"client_id":"a\\ud800b","hostname":"h\xffst","user_agent":"ok"}'
        await conn.send(b"IDENTIFY\n" + be32(len(body)) + body)
        assert await conn.frame() == (0, b"OK")
        await conn.send(b"PUB st\n" + be32(1) + b"x")
        assert await conn.frame() == (0, b"OK")
        for fmt in ("json", "text"):
            reply = await client.get(f"/stats?format={fmt}")
            assert reply.status_code == 200, reply.text
        producer = (await client.get("/stats?format=json")).json()["producers"][0]
        assert (producer["client_id"], producer["hostname"]) == ("a\ufffdb", "h\ufffdst")


async def test_a_client_that_never_identified_is_named_by_its_address() -> None:
    """As nsqd's newClientV2: client_id and hostname are the remote address, and the
    state is 0 until SUB (nsqd never sets its "connected" 2 on a client)."""
    async with http_gateway() as (gw, client):
        conn = await RawNSQ.connect(gw)
        await conn.send(b"PUB st\n" + be32(1) + b"x")
        assert await conn.frame() == (0, b"OK")
        (producer,) = (await client.get("/stats?format=json")).json()["producers"]
        assert (producer["client_id"], producer["hostname"]) == ("127.0.0.1", "127.0.0.1")
        assert producer["state"] == 0


async def test_stats_filters_and_options() -> None:
    async with http_gateway() as (gw, client):
        pub, sub = await _traffic(gw)

        async def stats(query: str) -> dict[str, Any]:
            return (await client.get(f"/stats?format=json&{query}")).json()

        only = await stats("topic=st")
        assert [t["topic_name"] for t in only["topics"]] == ["st"]
        assert only["producers"][0]["pub_counts"] == [{"topic": "st", "count": 2}]
        other = await stats("topic=other")
        assert other["producers"][0]["pub_counts"] == [{"topic": "other", "count": 1}]
        unknown = await stats("topic=nope")
        assert unknown["topics"] is None and unknown["producers"] is None  # nsqd returns early
        assert (await stats("channel=nope"))["topics"] == []
        assert [t["topic_name"] for t in (await stats("channel=ch"))["topics"]] == ["st"]
        assert (await stats("topic=st&channel=nope"))["topics"] == []
        lean = await stats("include_clients=false&include_mem=false")
        assert list(lean) == ["version", "health", "start_time", "topics", "producers"]
        assert lean["producers"] is None
        assert lean["topics"][1]["channels"][0]["clients"] is None
        assert lean["topics"][1]["channels"][0]["client_count"] == 1
        # values other than true/1/false/0 mean the default
        assert "memory" in await stats("include_mem=no")
        assert_error(await client.get("/stats?topic=%G1"), 400, "INVALID_REQUEST")
        await pub.aclose()
        await sub.aclose()


async def test_stats_text_is_nsqds_report() -> None:
    async with http_gateway() as (gw, client):
        pub, sub = await _traffic(gw)
        await client.post("/channel/pause?topic=st&channel=ch")
        reply = await client.get("/stats")
        assert reply.headers["content-type"] == TEXT
        assert reply.headers["x-nsq-content-type"] == V1
        report = reply.text
        assert report.startswith("nsqd v1.3.0 (built w/")
        for piece in (
            "\nHealth: OK\n",
            "\nMemory:\n   heap_objects",
            "\nTopics:\n   [other          ] depth: 1     be-depth: 0     msgs: 1        e2e%: \n",
            "   [st             ] depth: 0 ",
            "   *P [ch                       ] depth: 0     be-depth: 0     inflt: 1    def: 0"
            "    re-q: 1     timeout: 0     msgs: 2        e2e%: \n",
            "        [V2 subhost:",
            " raw/2.0",
            "] state: 3 inflt: 1    rdy: 2    fin: 1        re-q: 1        msgs: 3        ",
            "\nProducers:\n   [V2 pubhost:",
            "] msgs: 2        topics: st=2 connected: ",
        ):
            assert piece in report, report
        empty = (await client.get("/stats?topic=none&include_mem=0")).text
        assert "\nTopics: None\n" in empty
        assert "Memory" not in empty
        await pub.aclose()
        await sub.aclose()


async def test_stats_lists_every_group_whatever_protocol_made_it() -> None:
    async with http_gateway(beanstalk="127.0.0.1:0") as (gw, client):
        worker = await RawBeanstalk.connect(gw)
        assert await worker.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        assert await worker.call(b"use jobs\r\n") == b"USING jobs\r\n"
        assert await worker.call(b"put 0 0 60 2\r\nhi\r\n") == b"INSERTED 1\r\n"
        assert await worker.call(b"put 0 0 60 2\r\nho\r\n") == b"INSERTED 2\r\n"
        assert (await worker.call(b"reserve\r\n")).startswith(b"RESERVED 1 2")
        stats = (await client.get("/stats?format=json")).json()
        topics = {t["topic_name"]: t for t in stats["topics"]}
        assert set(topics) == {"default", "jobs"}
        (ch,) = topics["jobs"]["channels"]
        assert ch["channel_name"] == gw.settings.beanstalkd.group
        assert (ch["depth"], ch["in_flight_count"], ch["client_count"]) == (1, 1, 1)
        (worker_stats,) = ch["clients"]
        assert list(worker_stats) == CLIENT_KEYS
        assert (worker_stats["version"], worker_stats["in_flight_count"]) == ("beanstalk", 1)
        # connected when it connected (nsqadmin shows how long ago), not at the epoch
        assert abs(worker_stats["connect_ts"] - gw.broker.started_at) < 60
        # nsqlookupd lists the tube too: its name is a valid NSQ topic
        assert (await client.get("/lookup?topic=jobs")).json()["channels"] == ["beanstalk"]
        await worker.aclose()


# -- /config -------------------------------------------------------------------------------------


async def test_config_reads_options_and_sets_the_log_level() -> None:
    async with http_gateway() as (_, client):
        reply = await client.get("/config/max_msg_size")
        assert (reply.status_code, reply.content) == (200, b"1048576")
        assert reply.headers["content-type"] == JSON
        assert (await client.get("/config/msg_timeout")).json() == 60_000_000_000
        assert (await client.get("/config/snappy")).json() is True
        assert (await client.get("/config/nsqlookupd_tcp_addresses")).json() == []
        # a string option as text, as nsqd's RespondV1 writes a string
        reply = await client.get("/config/tcp_address")
        assert (reply.text, reply.headers["content-type"]) == ("127.0.0.1:0", TEXT)
        assert_error(await client.get("/config/nope"), 400, "INVALID_OPTION")
        # an option nsqd 1.3.0 does not have
        assert_error(await client.get("/config/auth_http_request_method"), 400, "INVALID_OPTION")
        assert_error(await client.put("/config/log_level", content=b""), 413, "INVALID_VALUE")
        assert_error(await client.put("/config/log_level", content=b"loud"), 400, "INVALID_VALUE")
        reply = await client.put("/config/max_msg_size", content=b"5")
        assert_error(reply, 400, "INVALID_OPTION")
        logger = logging.getLogger("gateway")
        before = logger.level
        try:
            reply = await client.put("/config/log_level", content=b"DEBUG")
            assert (reply.status_code, reply.json()) == (200, 1)
            assert logger.level == logging.DEBUG
            reply = await client.put("/config/log_level", content=b"warn")
            assert (reply.status_code, reply.json()) == (200, 3)
        finally:
            logger.setLevel(before)


# -- robustness ----------------------------------------------------------------------------------


async def test_malformed_http_and_abandoned_requests_never_hurt_the_listener() -> None:
    async with http_gateway(**LIMITS) as (gw, client):
        host, port = gw.addresses["http"]
        attacks = [
            b"\x00\xff\x01 garbage\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\nshort",
            b"POST /mpub?topic=t&binary=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
            b"\r\n\r\n5\r\n\x00\x00",
            b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"y" * 70000 + b"\r\n\r\n",
        ]
        for attack in attacks:
            stream = await trio.open_tcp_stream(host, port)
            with suppress(trio.BrokenResourceError):
                await stream.send_all(attack)
            await stream.aclose()  # mid-request, for some
        for _ in range(3):
            assert (await client.get("/ping")).status_code == 200
        assert_ok(await client.post("/pub?topic=t", content=b"still fine"))
        assert gw.broker.topics["t"].message_count == 1


async def test_the_gateway_stops_with_http_connections_open() -> None:
    with trio.fail_after(10):
        async with running_gateway(http="127.0.0.1:0") as gw:
            host, port = gw.addresses["http"]
            idle = await trio.open_tcp_stream(host, port)
            busy = await trio.open_tcp_stream(host, port)
            await busy.send_all(
                b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhalf"
            )
            keep = httpx.AsyncClient(base_url=http_base(gw))
            assert (await keep.get("/ping")).status_code == 200  # a kept-alive connection
        await keep.aclose()
        await idle.aclose()
        await busy.aclose()


@pytest.mark.parametrize("version", ["1.0", "1.1"])
async def test_http_1_0_and_1_1_requests(version: str) -> None:
    async with http_gateway() as (gw, _):
        host, port = gw.addresses["http"]
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(f"GET /info HTTP/{version}\r\nHost: x\r\n\r\n".encode())
        reply = b""
        with trio.fail_after(5):
            while b"}" not in reply:
                reply += await stream.receive_some(4096)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert json.loads(body)["version"] == "1.3.0"
        await stream.aclose()
