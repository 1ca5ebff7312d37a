"""Bad beanstalkd input on one connection never disturbs another; limits are settings."""

from __future__ import annotations

import random

import trio

from tests.helpers import RawBeanstalk, running_gateway


def gateway(**overrides: object):  # type: ignore[no-untyped-def]
    return running_gateway(beanstalk="127.0.0.1:0", nsq="off", **overrides)


async def _healthy(gw: object, n: int, done: list[int]) -> None:
    conn = await RawBeanstalk.connect(gw)  # type: ignore[arg-type]
    assert await conn.call(b"use healthy\r\n") == b"USING healthy\r\n"
    assert await conn.call(b"watch healthy\r\n") == b"WATCHING 2\r\n"
    for i in range(n):
        body = b"job\r\n%d" % i
        reply = await conn.call(b"put 0 0 60 %d\r\n%s\r\n" % (len(body), body))
        assert reply.startswith(b"INSERTED ")
        job_id = int(reply.split()[1])
        assert await conn.call(b"reserve-with-timeout 0\r\n") == (
            b"RESERVED %d %d\r\n%s\r\n" % (job_id, len(body), body)
        )
        assert await conn.call(b"delete %d\r\n" % job_id) == b"DELETED\r\n"
        done.append(i)
        await trio.sleep(0)


async def _attack(gw: object, rng: random.Random) -> list[bytes]:
    """Garbage, over-long lines, slow partial lines and oversize jobs, one connection."""
    conn = await RawBeanstalk.connect(gw)  # type: ignore[arg-type]
    replies = []
    attacks = [
        b"\x00\xffgarbage\r\n",
        b"use " + b"a" * 300 + b"\r\n",  # over-long: discarded up to CRLF, one BAD_FORMAT
        b"put 0 0 10 20\r\n" + b"x" * 20 + b"\r\n",  # over the 10-byte job limit
        b"put 0 0 10 99999999999\r\n",  # not a uint32
        b"delete -1\r\n",
        bytes(rng.choice(b"abcdefgh \t") for _ in range(100)) + b"\r\n",
    ]
    for attack in attacks:
        for i in range(0, len(attack), 7):  # slow partial writes, a few bytes at a time
            await conn.send(attack[i : i + 7])
            await trio.sleep(0)
        replies.append(await conn.reply())
    # the connection is still in order after all that
    replies.append(await conn.call(b"list-tube-used\r\n"))
    return replies


async def test_bad_input_beside_a_healthy_connection() -> None:
    async with gateway(beanstalkd__max_job_size=10) as gw:
        done: list[int] = []
        replies: list[bytes] = []

        async def attacker() -> None:
            replies.extend(await _attack(gw, random.Random(3)))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_healthy, gw, 300, done)
                nursery.start_soon(attacker)
        assert len(done) == 300
        assert replies[:5] == [
            b"BAD_FORMAT\r\n",  # a NUL anywhere in a line
            b"BAD_FORMAT\r\n",
            b"JOB_TOO_BIG\r\n",
            b"BAD_FORMAT\r\n",
            b"BAD_FORMAT\r\n",
        ]
        assert replies[5] in (b"UNKNOWN_COMMAND\r\n", b"BAD_FORMAT\r\n")
        assert replies[6] == b"USING default\r\n"
        count = gw.metrics.registry.get_sample_value(
            "gateway_protocol_errors_total", {"protocol": "beanstalk", "code": "BAD_FORMAT"}
        )
        assert count is not None and count >= 4


async def test_a_huge_declared_job_is_drained_not_buffered() -> None:
    async with gateway() as gw:
        conn = await RawBeanstalk.connect(gw)
        size = 50 * 1024 * 1024
        await conn.send(b"put 0 0 10 %d\r\n" % size)
        chunk = b"z" * 65536
        sent = 0
        while sent < size:
            await conn.send(chunk[: min(len(chunk), size - sent)])
            sent += min(len(chunk), size - sent)
        session = next(iter(gw.beanstalk.sessions))
        assert session.codec.buffered < 65536 + 224
        await conn.send(b"\r\n")
        assert await conn.reply(timeout=30) == b"JOB_TOO_BIG\r\n"
        assert await conn.call(b"put 0 0 10 1\r\nx\r\n") == b"INSERTED 1\r\n"


async def test_a_client_that_disconnects_mid_reserve_releases_nothing_it_did_not_hold() -> None:
    async with gateway() as gw:
        worker = await RawBeanstalk.connect(gw)
        await worker.send(b"reserve\r\n")  # blocks
        with trio.fail_after(5):
            while not any(s.waiting for s in gw.beanstalk.sessions):
                await trio.sleep(0.01)
        await worker.aclose()
        with trio.fail_after(5):
            while gw.beanstalk.sessions:
                await trio.sleep(0.01)
        producer = await RawBeanstalk.connect(gw)
        assert await producer.call(b"put 0 0 10 1\r\nx\r\n") == b"INSERTED 1\r\n"
        other = await RawBeanstalk.connect(gw)
        assert await other.call(b"reserve-with-timeout 0\r\n") == b"RESERVED 1 1\r\nx\r\n"


async def test_a_reserve_that_waits_after_pipelined_commands_still_answers() -> None:
    """Replies queued before a reserve that has to wait leave first; the reserve's own
    reply follows once it has a job (it used to be queued where nothing sent it)."""
    async with gateway() as gw:
        worker = await RawBeanstalk.connect(gw)
        await worker.send(b"use t\r\nwatch t\r\nreserve\r\n")
        assert await worker.reply() == b"USING t\r\n"
        assert await worker.reply() == b"WATCHING 2\r\n"  # sent before the reserve waits
        producer = await RawBeanstalk.connect(gw)
        assert await producer.call(b"use t\r\nput 0 0 10 1\r\nx\r\n") == b"USING t\r\n"
        assert await producer.reply() == b"INSERTED 1\r\n"
        assert await worker.reply() == b"RESERVED 1 1\r\nx\r\n"
        assert await worker.call(b"delete 1\r\n") == b"DELETED\r\n"


async def test_a_reserve_with_timeout_after_pipelined_commands_times_out(
    autojump_clock: object,
) -> None:
    async with gateway() as gw:
        worker = await RawBeanstalk.connect(gw)
        await worker.send(b"watch t\r\nreserve-with-timeout 2\r\nlist-tube-used\r\n")
        assert await worker.reply() == b"WATCHING 2\r\n"
        assert await worker.reply(timeout=10) == b"TIMED_OUT\r\n"
        assert await worker.reply() == b"USING default\r\n"


async def test_a_pipeliner_whose_turns_run_out_gets_every_reply_in_order() -> None:
    """5,000 puts in one write, applied over many short turns while another connection
    works: its replies leave every few turns (tcp.PAUSES_PER_FLUSH) and at the end, every
    one of them, in order; the other connection is answered meanwhile."""
    async with gateway(limits__turn_microseconds=5) as gw:
        done: list[int] = []
        pipeliner = await RawBeanstalk.connect(gw)
        assert await pipeliner.call(b"use piped\r\n") == b"USING piped\r\n"
        n = 5000
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_healthy, gw, 50, done)
            await pipeliner.send(b"put 0 0 60 1\r\nx\r\n" * n + b"list-tube-used\r\n")
            replies = [await pipeliner.reply() for _ in range(n + 1)]
        assert all(r.startswith(b"INSERTED ") for r in replies[:n])
        ids = [int(r.split()[1]) for r in replies[:n]]
        assert ids == sorted(set(ids))  # in the order put, each once
        assert replies[n] == b"USING piped\r\n"
        assert done == list(range(50))
