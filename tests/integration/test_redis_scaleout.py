"""Several `gateway serve --store redis://...` processes sharing one real redis-server.

* NSQ: 2,000 messages MPUBed to A, one consumer on A and one on B in the same channel:
  each message delivered once in total, both get a share; a second channel consumed only
  on B gets all 2,000.
* A gateway SIGKILLed with 100 messages in flight, a third of them finished: a consumer
  on B gets exactly the other 66, attempts 2 (their claim expires in Redis, msg_timeout
  2 s), and none of the finished.
* beanstalkd across gateways: priorities, a delay, bury / peek-buried / kick.
* /stats on A and B show the same depth.
* Faults: Redis unreachable at start, Redis killed and restarted (AOF, appendfsync always)
  under two gateways: nothing acknowledged is lost, publishes fail while it is away,
  /ready is 503, and the gateways come back by themselves.

Every wait is on an event or a reply, bounded by a timeout.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import RawBeanstalk, RawNSQ, be32
from tests.integration.test_durability import (
    FRAME_ERROR,
    FRAME_RESPONSE,
    REPO,
    GatewayProc,
    NSQConsumer,
    channel_stats,
    start_gateway,
    supervised,
)
from tests.redis_server import RedisServer


@pytest.fixture
def url(redis_url: str) -> str:  # the session's redis-server (tests/conftest.py), emptied
    return redis_url


async def gateway(sup: object, tmp: Path, name: str, url: str, *extra: str) -> GatewayProc:
    return await start_gateway(sup, tmp / name, "--store", url, *extra)  # type: ignore[arg-type]


async def mpub(gw: GatewayProc, topic: str, bodies: list[bytes]) -> None:
    conn = await RawNSQ.connect(gw)  # type: ignore[arg-type]
    payload = be32(len(bodies)) + b"".join(be32(len(b)) + b for b in bodies)
    await conn.send(f"MPUB {topic}\n".encode() + be32(len(payload)) + payload)
    got = await conn.frame(10)
    assert got == (FRAME_RESPONSE, b"OK"), got
    await conn.aclose()


async def stats(gw: GatewayProc) -> dict[str, dict[str, int]]:
    """topic -> channel -> depth, from /stats?format=json."""
    async with httpx.AsyncClient() as client:
        reply = await client.get(gw.http + "/stats", params={"format": "json"}, timeout=10)
    assert reply.status_code == 200, reply.text
    return {
        t["topic_name"]: {c["channel_name"]: c["depth"] for c in t["channels"]}
        for t in reply.json()["topics"]
    }


async def until(predicate: object, what: str, timeout: float) -> None:
    with trio.move_on_after(timeout) as scope:
        while not await predicate():  # type: ignore[operator]
            await trio.sleep(0.05)
    if scope.cancelled_caught:
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


async def drain(
    consumer: NSQConsumer, into: list[bytes], done: trio.Event, ids: list[bytes]
) -> None:
    """FIN every message as it comes until `done`, keeping bodies and ids."""
    while not done.is_set():
        with trio.move_on_after(0.2):
            d = await consumer.message(timeout=60)
            into.append(d.body)
            ids.append(d.id)
            await consumer.fin([d.id])


async def test_nsq_channel_shared_by_two_gateways_exactly_once(url: str, tmp_path: Path) -> None:
    async with supervised() as sup:
        a = await gateway(sup, tmp_path, "a", url)
        b = await gateway(sup, tmp_path, "b", url)
        on_a = await NSQConsumer.subscribe(a, "orders", "work", rdy=20)
        on_b = await NSQConsumer.subscribe(b, "orders", "work", rdy=20)
        audit = await NSQConsumer.subscribe(b, "orders", "audit", rdy=200)

        async def channels_known() -> bool:
            return set((await stats(a)).get("orders", {})) == {"work", "audit"}

        await until(channels_known, "both channels in A's /stats", 10)
        bodies = [b"m%04d" % i for i in range(2000)]
        got_a: list[bytes] = []
        got_b: list[bytes] = []
        got_audit: list[bytes] = []
        ids: list[bytes] = []
        audit_ids: list[bytes] = []
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, on_a, got_a, done, ids)
            nursery.start_soon(drain, on_b, got_b, done, ids)
            nursery.start_soon(drain, audit, got_audit, done, audit_ids)
            for i in range(0, 2000, 100):
                await mpub(a, "orders", bodies[i : i + 100])

            async def all_in() -> bool:
                return len(got_a) + len(got_b) >= 2000 and len(got_audit) >= 2000

            await until(all_in, "2,000 deliveries in each channel", 60)

            async def settled() -> bool:
                depths = (await stats(a))["orders"]
                return depths == {"work": 0, "audit": 0}

            await until(settled, "empty channels", 10)
            done.set()
        assert sorted(got_a + got_b) == bodies  # exactly once over both gateways
        assert got_a and got_b, (len(got_a), len(got_b))
        assert sorted(got_audit) == bodies
        assert len(set(ids)) == 2000 and len(set(audit_ids)) == 2000


async def test_a_killed_gateways_messages_in_flight_reach_the_other(
    url: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A holds 100 messages of one publish in flight (one range claim in Redis) and has
    finished a third of them when it is SIGKILLed: B delivers exactly the other two
    thirds, attempts + 1, and none of the finished."""
    async with supervised() as sup:
        a = await gateway(sup, tmp_path, "a", url)
        b = await gateway(sup, tmp_path, "b", url)
        holder = await NSQConsumer.subscribe(a, "jobs", "work", rdy=100, msg_timeout=2000)
        bodies = [b"j%03d" % i for i in range(100)]
        await mpub(a, "jobs", bodies)
        held = [await holder.message() for _ in range(100)]
        assert sorted(d.body for d in held) == bodies
        assert all(d.attempts == 1 for d in held)
        finished = held[::3]
        await holder.fin([d.id for d in finished])

        async def fins_applied() -> bool:  # A's claim holds the rest only
            return redis_server.cli("HGET", "gw:{jobs}:held", "work").strip() == "66"

        await until(fins_applied, "A's FINs in Redis", 10)
        await a.sigkill()
        started = time.monotonic()
        taker = await NSQConsumer.subscribe(b, "jobs", "work", rdy=200)
        unfinished = sorted(d.body for d in held if d not in finished)
        got = []
        with trio.fail_after(30):
            while len(got) < len(unfinished):
                d = await taker.message(timeout=30)
                got.append(d)
                await taker.fin([d.id])
        assert time.monotonic() - started < 30
        assert sorted(d.body for d in got) == unfinished
        assert all(d.attempts == 2 for d in got), [d.attempts for d in got]
        await taker.sync()  # B handled the FINs; nothing else was delivered meanwhile
        assert redis_server.cli("EXISTS", "gw:{jobs}:m", "gw:{jobs}:c:work").strip() == "0"


async def test_beanstalkd_priorities_delays_and_burials_across_gateways(
    url: str, tmp_path: Path
) -> None:
    async with supervised() as sup:
        a = await gateway(sup, tmp_path, "a", url)
        b = await gateway(sup, tmp_path, "b", url)
        on_a = RawBeanstalk(await trio.open_tcp_stream(*a.addresses["beanstalk"]))
        on_b = RawBeanstalk(await trio.open_tcp_stream(*b.addresses["beanstalk"]))
        for conn in (on_a, on_b):
            assert (await conn.call(b"use jobs\r\n")).startswith(b"USING")
            assert (await conn.call(b"watch jobs\r\n")).startswith(b"WATCHING")
            assert (await conn.call(b"ignore default\r\n")).startswith(b"WATCHING")
        for pri in (5, 1, 3):
            reply = await on_b.call(b"put %d 0 60 2\r\np%d\r\n" % (pri, pri))
            assert reply.startswith(b"INSERTED"), reply
        order = []
        for _ in range(3):
            reply = await on_a.call(b"reserve-with-timeout 5\r\n", timeout=10)
            assert reply.startswith(b"RESERVED"), reply
            order.append(reply.split(b"\r\n")[1])
            job = reply.split(b" ")[1]
            assert await on_a.call(b"delete " + job + b"\r\n") == b"DELETED\r\n"
        assert order == [b"p1", b"p3", b"p5"]

        # a delay set on A holds on B
        put_at = time.monotonic()
        assert (await on_a.call(b"put 10 2 60 5\r\nlater\r\n")).startswith(b"INSERTED")
        assert await on_b.call(b"reserve-with-timeout 0\r\n") == b"TIMED_OUT\r\n"
        reply = await on_b.call(b"reserve-with-timeout 10\r\n", timeout=15)
        assert reply.startswith(b"RESERVED") and reply.endswith(b"later\r\n"), reply
        assert time.monotonic() - put_at >= 1.5
        job = reply.split(b" ")[1]
        assert await on_b.call(b"delete " + job + b"\r\n") == b"DELETED\r\n"

        # buried on A, seen and kicked on B, reserved on A again
        assert (await on_a.call(b"put 7 0 60 4\r\ngrim\r\n")).startswith(b"INSERTED")
        reply = await on_a.call(b"reserve-with-timeout 5\r\n", timeout=10)
        assert reply.startswith(b"RESERVED"), reply
        job = reply.split(b" ")[1]
        assert await on_a.call(b"bury " + job + b" 7\r\n") == b"BURIED\r\n"

        async def buried_on_b() -> bool:
            return (await on_b.call(b"peek-buried\r\n")).startswith(b"FOUND " + job)

        await until(buried_on_b, "the burial in B's peek-buried", 10)
        assert await on_b.call(b"kick 1\r\n") == b"KICKED 1\r\n"
        reply = await on_a.call(b"reserve-with-timeout 5\r\n", timeout=10)
        assert reply.startswith(b"RESERVED " + job) and reply.endswith(b"grim\r\n"), reply
        assert await on_a.call(b"delete " + job + b"\r\n") == b"DELETED\r\n"


async def test_stats_show_the_same_depth_on_every_gateway(url: str, tmp_path: Path) -> None:
    async with supervised() as sup:
        a = await gateway(sup, tmp_path, "a", url)
        b = await gateway(sup, tmp_path, "b", url)
        async with httpx.AsyncClient() as client:
            for path in ("/topic/create", "/channel/create"):
                reply = await client.post(
                    a.http + path, params={"topic": "quiet", "channel": "c"}, timeout=10
                )
                assert reply.status_code == 200, reply.text
        await mpub(a, "quiet", [b"x"] * 30)

        async def same() -> bool:
            on_a, on_b = await stats(a), await stats(b)  # B never saw the topic itself
            return on_a.get("quiet") == on_b.get("quiet") == {"c": 30}

        await until(same, "depth 30 on A and on B", 10)
        assert (await channel_stats(b, "quiet", "c"))["depth"] == 30


async def test_a_channel_deleted_on_one_gateway_closes_its_consumers_on_every_gateway(
    url: str, tmp_path: Path
) -> None:
    """nsqd closes the clients of a deleted channel, and they subscribe again (which
    makes the channel anew). Deleted over A's HTTP API, the channel's consumers on B must
    be closed too, not left attached to a channel that is gone, receiving nothing."""
    async with supervised() as sup:
        a = await gateway(sup, tmp_path, "a", url)
        b = await gateway(sup, tmp_path, "b", url)
        on_b = await NSQConsumer.subscribe(b, "orders", "work", rdy=10)

        async def known_on_a() -> bool:
            return "work" in (await stats(a)).get("orders", {})

        await until(known_on_a, "the channel in A's /stats", 10)
        async with httpx.AsyncClient() as client:
            reply = await client.post(
                a.http + "/channel/delete", params={"topic": "orders", "channel": "work"}
            )
            assert reply.status_code == 200, reply.text
        # B learns of it at its next refresh of the registry (every second)
        assert await on_b.conn.closed(10), "B's consumer is still connected"


async def test_redis_unreachable_at_start_is_one_line_and_exit_1(tmp_path: Path) -> None:
    from tests.redis_server import free_port

    port = free_port()
    started = time.monotonic()
    with trio.fail_after(20):
        done = await trio.run_process(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--store",
                f"redis://127.0.0.1:{port}/0",
                "--store-wait",
                "0",
                "--data-dir",
                str(tmp_path),
                "--nsq",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
                "--beanstalk",
                "off",
                "--nats",
                "off",
                "--nats-route",
                "off",
                "--rocketmq",
                "off",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
        )
    assert done.returncode != 0 and time.monotonic() - started < 20
    err = done.stderr.decode()
    assert f"error: Redis at 127.0.0.1:{port}: cannot connect" in err, err
    assert "Traceback" not in err, err


async def test_sigterm_while_waiting_for_redis_at_start_stops_at_once(tmp_path: Path) -> None:
    """While the gateway waits for Redis (60 s by default), a SIGTERM (an orchestrator
    giving up on the pod) must stop it, exit 0, not wait for the kill."""
    from tests.redis_server import free_port

    argv = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--store",
        f"redis://127.0.0.1:{free_port()}/0",
        "--data-dir",
        str(tmp_path),
    ]
    for listener in ("nsq", "http", "beanstalk", "nats", "nats-route", "rocketmq"):
        argv += [f"--{listener}", "off"]
    proc = await trio.lowlevel.open_process(argv, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stderr is not None
    log = b""
    try:
        with trio.fail_after(20):
            while b"cannot connect" not in log:  # waiting for Redis now
                log += await proc.stderr.receive_some(4096)
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        if proc.poll() is None:  # it did not stop: no stray gateway after the test
            proc.kill()
            await proc.wait()
        await proc.stderr.aclose()


async def test_waiting_for_redis_at_start_health_is_up_and_ready_says_why(
    tmp_path: Path,
) -> None:
    """Redis not reachable yet: the HTTP listener is up at once, /health says alive,
    /ready 503 names the cause, other calls answer 503, each retry is one short line, and
    the NSQ listener waits for the queues. Redis comes up: the gateway is ready."""
    server = RedisServer(tmp_path / "redis")  # not started yet: its port refuses
    argv = [sys.executable, "-m", "gateway", "serve", "--store", server.url]
    argv += ["--data-dir", str(tmp_path / "gw"), "--nsq", "127.0.0.1:0", "--http", "127.0.0.1:0"]
    for listener in ("beanstalk", "nats", "nats-route", "rocketmq"):
        argv += [f"--{listener}", "off"]
    proc = await trio.lowlevel.open_process(argv, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stderr is not None
    log = b""

    async def read_until(marker: bytes) -> None:
        nonlocal log
        while marker not in log:
            chunk = await proc.stderr.receive_some(4096)  # type: ignore[union-attr]
            assert chunk, log.decode()
            log += chunk

    try:
        with trio.fail_after(30):
            await read_until(b"(attempt 2)")
            http = log.split(b"listening protocol=http address=")[1].split()[0].decode()
            assert b"protocol=nsq" not in log  # no queues yet: no NSQ clients either
            retries = [line for line in log.decode().splitlines() if "cannot connect" in line]
            assert all(len(line) < 200 for line in retries), retries
            assert "Connection refused (attempt 1); next in" in retries[0], retries
            async with httpx.AsyncClient(base_url=f"http://{http}") as client:
                health = await client.get("/health")
                assert (health.status_code, health.text) == (200, "OK - starting")
                ready = await client.get("/ready")
                assert ready.status_code == 503
                assert ready.text.startswith(
                    f"NOT READY - starting: Redis at 127.0.0.1:{server.port}: cannot connect: "
                ), ready.text
                assert ready.text.endswith("Connection refused"), ready.text
                stats = await client.get("/stats", params={"format": "json"})
                assert stats.status_code == 503 and "STARTING" in stats.text
                server.start()
                await read_until(b"listening protocol=nsq")
                await read_until(b"ready: ")
                assert (await client.get("/ready")).text == "OK"
                assert (await client.get("/stats")).status_code == 200
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            await proc.wait()
        await proc.stderr.aclose()
        server.stop()


async def test_redis_killed_and_restarted_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", aof=True).start()
    try:
        async with supervised() as sup:
            a = await gateway(sup, tmp_path, "a", server.url)
            b = await gateway(sup, tmp_path, "b", server.url)
            await NSQConsumer.subscribe(a, "kept", "c", rdy=0)  # the channel exists
            bodies = [b"k%03d" % i for i in range(200)]
            for i in range(0, 200, 50):
                await mpub(b, "kept", bodies[i : i + 50])
            server.kill()

            async def ready(gw: GatewayProc) -> int:
                async with httpx.AsyncClient() as client:
                    return (await client.get(gw.http + "/ready", timeout=5)).status_code

            async def not_ready() -> bool:
                return await ready(b) == 503

            await until(not_ready, "/ready 503 while Redis is away", 10)
            conn = await RawNSQ.connect(b)  # type: ignore[arg-type]
            await conn.send(b"PUB kept\n" + be32(4) + b"lost")
            ftype, data = await conn.frame(15)
            assert ftype == FRAME_ERROR and data.startswith(b"E_PUB_FAILED"), (ftype, data)
            server.start()
            back = time.monotonic()

            async def is_ready() -> bool:
                return await ready(a) == 200 and await ready(b) == 200

            await until(is_ready, "/ready 200 after Redis came back", 15)
            assert time.monotonic() - back < 15
            taker = await NSQConsumer.subscribe(a, "kept", "c", rdy=300)
            got: set[bytes] = set()
            with trio.fail_after(30):
                # the refused publish may be written once Redis is back (as a client
                # would retry it): at least once, never less
                while not set(bodies) <= got:
                    d = await taker.message(timeout=30)
                    got.add(d.body)
                    await taker.fin([d.id])
            assert got - set(bodies) <= {b"lost"}
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:notaport/0", "bad host:port '127.0.0.1:notaport'"),
        ("redis://127.0.0.1:6379/zero", "bad database 'zero'"),
        ("redis://a:1,b:2/0", "only redis+cluster:// takes a list"),
        ("redis+cluster://a:1/3", "bad database '3'"),
        ("redis://127.0.0.1:6379/0?shared=maybe", "bad shared='maybe'"),
        ("redis://127.0.0.1:6379/0?pool=9", "unknown option 'pool'"),
    ],
)
async def test_a_malformed_redis_url_is_one_config_error(
    url: str, says: str, tmp_path: Path
) -> None:
    done = await trio.run_process(
        [sys.executable, "-m", "gateway", "serve", "--store", url, "--data-dir", str(tmp_path)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=REPO,
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith("config error: --store: ") and says in err, err
    assert "Traceback" not in err, err
