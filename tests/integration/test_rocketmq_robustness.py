"""Bad input on the RocketMQ port: an error response with the opaque echoed, or a close
within a second; never a crash, and never an effect on another connection (a producer
sending all along keeps getting SEND_OK)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable

import pytest
import trio

from gateway.app import Gateway
from gateway.protocols.rocketmq.codec import ResponseCode, encode_request
from gateway.protocols.rocketmq.codes import RequestCode
from tests.helpers import read_to_close, running_gateway
from tests.integration.rocketmq_raw import RawRemoting


def header_frame(header: bytes, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), kind << 24 | len(header)) + header + body


# Framing errors: the Java broker closes the channel without answering (NettyDecoder).
CLOSES = {
    "huge length": struct.pack(">i", 0x7FFFFFF0) + b"\x00" * 8,
    "negative length": struct.pack(">i", -5) + b"\x00" * 8,
    "header beyond the frame": struct.pack(">iI", 10, 500) + b"{}" * 3,
    "non-JSON header": header_frame(b"{not json"),
    "header not an object": header_frame(b"[1,2]"),
    "binary header too short": header_frame(b"\x00\x01", kind=1),
    "unknown serialize type": header_frame(b"{}", kind=7),
}


def request(code: int, opaque: int, ext: dict[str, object], body: bytes = b"") -> bytes:
    return encode_request(code, opaque, ext_fields=ext, body=body)


# Sound frames with bad requests: an error response with the opaque echoed.
ANSWERS: dict[str, tuple[bytes, int]] = {
    "unknown code": (request(4242, 7, {}), ResponseCode.REQUEST_CODE_NOT_SUPPORTED),
    "send without topic": (request(RequestCode.SEND_MESSAGE_V2, 7, {"a": "P"}), 1),
    "send to a bad topic name": (
        request(RequestCode.SEND_MESSAGE_V2, 7, {"b": "bad topic!", "e": 0}, b"x"),
        ResponseCode.SYSTEM_ERROR,
    ),
    "compressed flag on a plain body": (
        request(RequestCode.SEND_MESSAGE_V2, 7, {"b": "T", "e": 0, "f": 1}, b"not zlib"),
        ResponseCode.MESSAGE_ILLEGAL,
    ),
    "body over the message limit": (
        request(RequestCode.SEND_MESSAGE_V2, 7, {"b": "T", "e": 0}, b"x" * 5000),
        ResponseCode.MESSAGE_ILLEGAL,
    ),
    "a zlib bomb": (
        request(
            RequestCode.SEND_MESSAGE_V2,
            7,
            {"b": "T", "e": 0, "f": 1},
            zlib.compress(b"\x00" * 10_000_000),
        ),
        ResponseCode.MESSAGE_ILLEGAL,
    ),
    "broken batch": (
        request(RequestCode.SEND_BATCH_MESSAGE, 7, {"b": "T"}, b"\x00\x00\x00\x10\xff"),
        ResponseCode.MESSAGE_ILLEGAL,
    ),
    "pull with a word for an offset": (
        request(
            RequestCode.PULL_MESSAGE,
            7,
            {"consumerGroup": "G", "topic": "T", "queueId": 0, "queueOffset": "zero", "sysFlag": 4},
        ),
        ResponseCode.SYSTEM_ERROR,
    ),
    "pull from a queue that does not exist": (
        request(
            RequestCode.PULL_MESSAGE,
            7,
            {"consumerGroup": "G", "topic": "T", "queueId": 99, "queueOffset": 0, "sysFlag": 4},
        ),
        ResponseCode.SYSTEM_ERROR,
    ),
    "SQL92 filter": (
        request(
            RequestCode.PULL_MESSAGE,
            7,
            {
                "consumerGroup": "G",
                "topic": "T",
                "queueId": 0,
                "queueOffset": 0,
                "sysFlag": 4,
                "expressionType": "SQL92",
                "subscription": "a > 1",
            },
        ),
        ResponseCode.SUBSCRIPTION_PARSE_FAILED,
    ),
    "heartbeat that is not JSON": (
        request(RequestCode.HEART_BEAT, 7, {}, b"\xff{"),
        ResponseCode.SYSTEM_ERROR,
    ),
    "heartbeat without clientID": (
        request(RequestCode.HEART_BEAT, 7, {}, json.dumps({"consumerDataSet": []}).encode()),
        ResponseCode.SYSTEM_ERROR,
    ),
    "offset commit for a bad group name": (
        request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            7,
            {"consumerGroup": "no good", "topic": "T", "queueId": 0, "commitOffset": 1},
        ),
        ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
    ),
}


async def _keep_sending(gw: Gateway, stop: trio.Event, results: list[int]) -> None:
    producer = await RawRemoting.connect(gw)
    try:
        while not stop.is_set():
            results.append((await producer.produce("steady", b"ok")).code)
    finally:
        await producer.aclose()


async def _with_a_steady_producer(gw: Gateway, attack: Callable[[], object]) -> None:
    stop = trio.Event()
    results: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_keep_sending, gw, stop, results)
        await attack()  # type: ignore[misc]
        sent = len(results)
        with trio.fail_after(5):
            while len(results) < sent + 3:  # it still gets answers after the attack
                await trio.sleep(0)
        stop.set()
    assert results and set(results) == {ResponseCode.SUCCESS}


@pytest.mark.parametrize("name", sorted(CLOSES))
async def test_framing_errors_close_within_a_second(name: str) -> None:
    async with running_gateway(nsq="off", rocketmq="127.0.0.1:0") as gw:

        async def attack() -> None:
            stream = await trio.open_tcp_stream(*gw.addresses["rocketmq"])
            await stream.send_all(CLOSES[name])
            assert await read_to_close(stream, timeout=1) == b""
            await stream.aclose()

        await _with_a_steady_producer(gw, attack)
        errors = gw.metrics.registry.get_sample_value(
            "gateway_protocol_errors_total", {"protocol": "rocketmq", "code": "FRAME"}
        )
    assert errors == 1


@pytest.mark.parametrize("name", sorted(ANSWERS))
async def test_bad_requests_get_an_error_with_their_opaque(name: str) -> None:
    frame, code = ANSWERS[name]
    async with running_gateway(
        nsq="off", rocketmq="127.0.0.1:0", rocketmq_broker__max_message_size=4096
    ) as gw:

        async def attack() -> None:
            c = await RawRemoting.connect(gw)
            await c.stream.send_all(frame)
            answer = await c.response(7, timeout=1)
            assert (answer.code, answer.flag & 1) == (code, 1), answer
            # and the connection goes on
            assert (await c.produce("after", b"fine")).code == ResponseCode.SUCCESS
            await c.aclose()

        await _with_a_steady_producer(gw, attack)


async def test_a_peer_that_stops_reading_does_not_stall_others() -> None:
    """Pulls piling answers on a connection that never reads: it stops being read once
    max_output_bytes wait; the steady producer is not affected."""
    async with running_gateway(
        nsq="off", rocketmq="127.0.0.1:0", rocketmq_broker__max_output_bytes=65536
    ) as gw:

        async def attack() -> None:
            stream = await trio.open_tcp_stream(*gw.addresses["rocketmq"])
            routes = b"".join(
                request(RequestCode.GET_ROUTEINFO_BY_TOPIC, i, {"topic": "T" * 100})
                for i in range(5000)
            )
            with trio.move_on_after(1):
                await stream.send_all(routes)
            await stream.aclose()

        await _with_a_steady_producer(gw, attack)
