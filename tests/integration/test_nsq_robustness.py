"""Bad input on one connection never disturbs another; limits are settings."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from tests.helpers import RawNSQ, be32, parse_message, running_gateway


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


async def _healthy_round_trips(gw: object, n: int, done: list[int]) -> None:
    pub = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    sub = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    # RDY 1: it waits for each message (with more room, nsqd's output buffering would
    # hold each one up to output_buffer_timeout, 250 ms, for company)
    await sub.send(b"SUB healthy ch\nRDY 1\n")
    assert await sub.frame() == (0, b"OK")
    for i in range(n):
        body = b"healthy %d" % i
        await pub.send(b"PUB healthy\n" + be32(len(body)) + body)
        assert await pub.frame() == (0, b"OK")
        kind, data = await sub.frame()
        assert kind == 2
        _, attempts, msg_id, got = parse_message(data)
        assert (attempts, got) == (1, body)
        await sub.send(b"FIN " + msg_id + b"\n")
        done.append(i)
        await trio.sleep(0)


async def _misbehave(gw: object, rng: random.Random) -> list[bytes]:
    """Garbage, oversize bodies, bad names, slow partial lines: collect the replies."""
    attacks = [
        b"\x00\xff garbage \x01\n",
        b"PUB " + b"x" * 100 + b"\n",
        b"PUB t\n" + be32(2_000_000),
        b"MPUB t\n" + be32(6_000_000),
        b"SUB bad!topic ch\n",
        b"IDENTIFY\n" + be32(10) + b"not json!!",
        b"RDY 9999\n",
        b"A" * 20000,  # a line past the 16 KiB limit: closed without a frame
        bytes(rng.getrandbits(8) for _ in range(300)),
    ]
    replies = []
    for attack in attacks:
        conn = await RawNSQ.connect(gw)  # type: ignore[arg-type]
        # slow partial writes: a few bytes at a time
        for i in range(0, len(attack), 997):
            try:
                await conn.send(attack[i : i + 997])
            except trio.BrokenResourceError:
                break
            await trio.sleep(0)
        try:
            kind, data = await conn.frame()
            replies.append(data if kind == 1 else b"?")
        except (EOFError, trio.BrokenResourceError):
            replies.append(b"<closed>")
        assert await conn.closed()
    return replies


async def test_a_misbehaving_client_does_not_disturb_a_healthy_one() -> None:
    async with running_gateway() as gw:
        done: list[int] = []
        replies: list[bytes] = []

        async def attacker() -> None:
            replies.extend(await _misbehave(gw, random.Random(7)))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_healthy_round_trips, gw, 300, done)
                nursery.start_soon(attacker)
        assert len(done) == 300
        assert replies[:8] == [
            b"E_INVALID invalid command \x00\xff",
            b'E_BAD_TOPIC PUB topic name "' + b"x" * 100 + b'" is not valid',
            b"E_BAD_MESSAGE PUB message too big 2000000 > 1048576",
            b"E_BAD_BODY MPUB body too big 6000000 > 5242880",
            b'E_BAD_TOPIC SUB topic name "bad!topic" is not valid',
            b"E_BAD_BODY IDENTIFY failed to decode JSON body",
            b"E_INVALID cannot RDY in current state",
            b"<closed>",
        ]
        assert replies[8].startswith(b"E_") or replies[8] == b"<closed>"
        errors = gw.metrics.registry.get_sample_value(
            "gateway_protocol_errors_total", {"protocol": "nsq", "code": "E_BAD_TOPIC"}
        )
        assert errors == 2


async def test_limits_are_settings() -> None:
    async with running_gateway(nsqd__max_msg_size=10, nsqd__max_rdy_count=3) as gw:
        conn = await RawNSQ.connect(gw)
        await conn.send(b"PUB t\n" + be32(10) + b"0123456789")
        assert await conn.frame() == (0, b"OK")
        await conn.send(b"PUB t\n" + be32(11) + b"0123456789x")
        assert await conn.frame() == (1, b"E_BAD_MESSAGE PUB message too big 11 > 10")
        conn = await RawNSQ.connect(gw)
        await conn.send(b"SUB t c\nRDY 4\n")
        assert await conn.frame() == (0, b"OK")
        assert await conn.frame() == (1, b"E_INVALID RDY count 4 out of range 0-3")


async def test_a_consumer_that_never_reads_does_not_stall_others() -> None:
    async with running_gateway(nsqd__max_output_bytes=65536) as gw:
        pub = await RawNSQ.connect(gw)
        body = b"x" * 60000
        await pub.send(b"MPUB big\n" + be32(4 + 40 * 60004) + be32(40) + (be32(60000) + body) * 40)
        assert await pub.frame() == (0, b"OK")
        lazy = await RawNSQ.connect(gw)
        await lazy.send(b"SUB big ch\nRDY 2500\n")  # and then never reads
        # the gateway keeps serving others while the lazy reader's socket is full
        other = await RawNSQ.connect(gw)
        for _ in range(50):
            await other.send(b"PUB other\n" + be32(1) + b"x")
            assert await other.frame() == (0, b"OK")
        lazy_session = next(s for s in gw.nsq.sessions if s.consumer is not None)
        assert lazy_session.consumer.in_flight == 40


async def test_write_deadline_closes_a_consumer_that_stopped_reading(
    autojump_clock: object,
) -> None:
    async with running_gateway() as gw:
        pub = await RawNSQ.connect(gw)
        body = b"y" * 400_000
        await pub.send(
            b"MPUB stuck\n" + be32(4 + 10 * 400_004) + be32(10) + (be32(400_000) + body) * 10
        )
        assert await pub.frame() == (0, b"OK")
        lazy = await RawNSQ.connect(gw)
        await lazy.send(b"IDENTIFY\n" + be32(27) + b'{"heartbeat_interval":1000}')
        await lazy.send(b"SUB stuck ch\nRDY 10\n")
        topic = gw.broker.topics["stuck"]
        with trio.fail_after(30):
            while not (topic.groups.get("ch") and topic.groups["ch"].in_flight):
                await trio.sleep(0.01)
            group = topic.groups["ch"]
            assert group.consumers
            while group.consumers:
                await trio.sleep(0.1)
        # the session ended by itself; its messages stay in flight until msg_timeout
        assert len(group.in_flight) == 10
