"""nsqd's output buffering of deliveries, on the gateway's clock (Trio's MockClock).

A subscriber's messages go out when they fill its output_buffer_size, when its RDY window
is full, output_buffer_timeout after the first of them at the latest, or with the next
reply to one of its commands; FIN, which nsqd does not answer, sends nothing. That is how
nsqd's messagePump flushes, and what lets a stream of single publishes reach a busy
consumer in a write per buffer. Nothing here sleeps: time moves only by `jump`.
"""

from __future__ import annotations

import select

import trio
import trio.testing

from tests.helpers import RawNSQ, be32, parse_message, running_gateway


def arrived(conn: RawNSQ) -> bool:
    """Whether the gateway has written anything more to this connection (loopback TCP
    hands the bytes over within the gateway's send)."""
    readable, _, _ = select.select([conn.stream.socket.fileno()], [], [], 0)
    return bool(readable) or bool(conn.buf)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def publish(gw: object, topic: str, body: bytes) -> None:
    pub = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    await pub.send(f"PUB {topic}\n".encode() + be32(len(body)) + body)
    assert await pub.frame() == (0, b"OK")
    await pub.aclose()


async def subscriber(gw: object, topic: str, rdy: int, **identify: object) -> RawNSQ:
    sub = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    if identify:
        assert (await sub.identify(**identify))[0] == 0
    await sub.send(f"SUB {topic} c\nRDY {rdy}\n".encode())
    assert await sub.frame() == (0, b"OK")
    return sub


async def test_a_message_waits_output_buffer_timeout_for_more(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway() as gw:
        sub = await subscriber(gw, "buffered", 10, output_buffer_timeout=100)
        await publish(gw, "buffered", b"first")
        mock_clock.jump(0.06)
        await publish(gw, "buffered", b"second")
        await settle()
        assert not arrived(sub)  # RDY 10, 2 in flight, a few bytes: buffered
        mock_clock.jump(0.05)  # 110 ms after the first
        await settle()
        assert arrived(sub)
        got = [parse_message((await sub.frame())[1]) for _ in range(2)]
        assert [m[3] for m in got] == [b"first", b"second"]
        # FIN is not answered, so it sends nothing: a message queued meanwhile waits
        await publish(gw, "buffered", b"third")
        await sub.send(b"".join(b"FIN " + m[2] + b"\n" for m in got))
        await settle()
        assert not arrived(sub)
        mock_clock.jump(0.1)
        await settle()
        kind, data = await sub.frame()
        assert (kind, parse_message(data)[3]) == (2, b"third")
        await sub.aclose()


async def test_the_default_timeout_is_nsqds_250_ms(mock_clock: trio.testing.MockClock) -> None:
    async with running_gateway() as gw:
        sub = await subscriber(gw, "default", 5)  # no IDENTIFY
        await publish(gw, "default", b"x")
        mock_clock.jump(0.249)
        await settle()
        assert not arrived(sub)
        mock_clock.jump(0.002)
        await settle()
        assert arrived(sub)


async def test_a_full_window_a_full_buffer_or_a_reply_sends_at_once(
    mock_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway() as gw:
        # RDY 1: the client waits for this very message
        one = await subscriber(gw, "window", 1, output_buffer_timeout=1000)
        await publish(gw, "window", b"now")
        await settle()
        assert parse_message((await one.frame())[1])[3] == b"now"
        # the buffer fills: 64 bytes, a message of 100
        small = await subscriber(gw, "size", 10, output_buffer_timeout=1000, output_buffer_size=64)
        await publish(gw, "size", b"y" * 100)
        await settle()
        assert parse_message((await small.frame())[1])[3] == b"y" * 100
        # a command's reply takes the buffered messages along, after them
        late = await subscriber(gw, "reply", 10, output_buffer_timeout=1000)
        await publish(gw, "reply", b"along")
        await settle()
        assert not arrived(late)
        await late.send(b"PUB elsewhere\n" + be32(1) + b"z")
        kind, data = await late.frame()
        assert (kind, parse_message(data)[3]) == (2, b"along")
        assert await late.frame() == (0, b"OK")
        # -1 turns buffering off
        off = await subscriber(gw, "off", 10, output_buffer_timeout=-1)
        await publish(gw, "off", b"unbuffered")
        await settle()
        assert parse_message((await off.frame())[1])[3] == b"unbuffered"
        for conn in (one, small, late, off):
            await conn.aclose()
