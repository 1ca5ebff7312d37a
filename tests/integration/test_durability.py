"""Durability of the default (embedded, durable) store, on a real `gateway serve` process.

* Crash rounds: real client libraries publish at once (pynsq PUB, gnsq MPUB, greenstalk put,
  see tests/clients/durability_publisher.py), each writing down every body it got an
  acknowledgement for; the gateway is SIGKILLed at a seeded random point, restarted on the
  same data dir, and every topic is drained: every acknowledged body comes back, byte-exact and
  in order, nothing comes back that was never sent, and messages that were in flight to a
  consumer at the kill come back with attempts + 1.
* A deferred NSQ message and a delayed and a buried beanstalkd job keep their state.
* SIGTERM with 1,000 messages in flight: exit 0, a `messages kept` line, all 1,000 again.
* Start errors: a data dir that cannot be created or written, and one that another running
  gateway holds: one `error:` line, exit 1.

The seed is printed (pytest shows it for a failing test); GATEWAY_DURABILITY_SEED replays it.
Every wait is on an event (a line of output, a frame, a reply) bounded by a timeout.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.helpers import MAGIC, RawBeanstalk, RawNSQ, be32, parse_message

REPO = Path(__file__).resolve().parents[2]
PUBLISHER = REPO / "tests" / "clients" / "durability_publisher.py"
LISTENERS = ("nsq", "beanstalk", "http")
LISTENING_RE = re.compile(r"listening protocol=(\S+) address=(\S+):(\d+)")
START_TIMEOUT = 30.0
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
HEARTBEAT = b"_heartbeat_"
MAX_RDY = 2500  # nsqd's (and the gateway's) default max_rdy_count
NO_ID = b"0" * 16  # a message id nobody holds: FIN of it is answered E_FIN_FAILED
SMALL_WINDOW = 200  # [storage] memory_window for some restarts (the default is 10000)


def seed() -> int:
    value = int(os.environ.get("GATEWAY_DURABILITY_SEED") or random.randrange(2**32))
    print(f"GATEWAY_DURABILITY_SEED={value}")
    return value


# -- processes whose output the test waits on ---------------------------------------------------


class Changes:
    """Wakes a waiter whenever any watched process printed something (or exited)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def until(self, predicate: Callable[[], bool], what: str, timeout: float) -> None:
        with trio.move_on_after(timeout) as scope:
            while not predicate():
                await self._event.wait()
        if scope.cancelled_caught:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Child:
    """A subprocess; one of its output streams is read line by line, the other kept whole."""

    name: str
    process: trio.Process
    changes: Changes
    on_line: Callable[[bytes], None] | None = None
    lines: list[bytes] = field(default_factory=list)
    other: bytearray = field(default_factory=bytearray)
    eof: bool = False

    async def pump(
        self, watched: trio.abc.ReceiveStream, other: trio.abc.ReceiveStream | None
    ) -> None:
        async with trio.open_nursery() as nursery:
            if other is not None:
                nursery.start_soon(self._keep, other)
            buf = b""
            async for chunk in watched:
                buf += chunk
                *complete, buf = buf.split(b"\n")
                for line in complete:
                    self.lines.append(line)
                    if self.on_line is not None:
                        self.on_line(line)
                if complete:
                    self.changes.notify()
            if buf:
                self.lines.append(buf)
                if self.on_line is not None:
                    self.on_line(buf)
            self.eof = True
            self.changes.notify()

    async def _keep(self, stream: trio.abc.ReceiveStream) -> None:
        async for chunk in stream:
            self.other += chunk

    def text(self) -> str:
        out = b"\n".join(self.lines).decode(errors="replace")
        if self.other:
            out += "\n--- other stream ---\n" + self.other.decode(errors="replace")
        return out[-6000:]

    async def wait(self, timeout: float) -> int:
        with trio.fail_after(timeout):
            return await self.process.wait()


class Supervisor:
    """Starts subprocesses and kills every one still running when the test ends."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.changes = Changes()
        self.children: list[Child] = []

    async def spawn(
        self,
        name: str,
        argv: list[str],
        *,
        watch: str = "stdout",
        env: dict[str, str] | None = None,
        on_line: Callable[[bytes], None] | None = None,
    ) -> Child:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        child = Child(name, process, self.changes, on_line)
        self.children.append(child)
        assert process.stdout is not None and process.stderr is not None
        if watch == "stdout":
            self.nursery.start_soon(child.pump, process.stdout, process.stderr)
        else:
            self.nursery.start_soon(child.pump, process.stderr, process.stdout)
        return child

    async def kill_all(self) -> None:
        for child in self.children:
            if child.process.returncode is None:
                child.process.kill()
        with trio.move_on_after(10):
            for child in self.children:
                await child.process.wait()


@asynccontextmanager
async def supervised() -> AsyncIterator[Supervisor]:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        try:
            yield sup
        finally:
            with trio.CancelScope(shield=True):
                await sup.kill_all()
            nursery.cancel_scope.cancel()


# -- the gateway ------------------------------------------------------------------------------


@dataclass
class GatewayProc:
    child: Child
    data_dir: Path
    addresses: dict[str, tuple[str, int]]

    @property
    def http(self) -> str:
        host, port = self.addresses["http"]
        return f"http://{host}:{port}"

    def stderr_lines(self) -> list[str]:
        return [line.decode(errors="replace") for line in self.child.lines]

    async def sigkill(self) -> None:
        self.child.process.kill()
        await self.child.wait(10)

    async def sigterm(self, timeout: float) -> int:
        self.child.process.send_signal(signal.SIGTERM)
        return await self.child.wait(timeout)


def gateway_argv(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--data-dir",
        str(data_dir),
        "--nsq",
        "127.0.0.1:0",
        "--beanstalk",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--nats",
        "off",
        "--nats-route",
        "off",
        "--rocketmq",
        "off",
        *extra,
    ]


async def start_gateway(
    sup: Supervisor, data_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> GatewayProc:
    child = await sup.spawn("gateway", gateway_argv(data_dir, *extra), watch="stderr", env=env)
    addresses: dict[str, tuple[str, int]] = {}

    def listening() -> bool:
        for line in child.lines[len(addresses) :]:
            if m := LISTENING_RE.search(line.decode(errors="replace")):
                addresses[m[1]] = (m[2], int(m[3]))
        if set(LISTENERS) <= addresses.keys():
            return True
        if child.eof:
            raise AssertionError(f"the gateway exited while starting:\n{child.text()}")
        return False

    await sup.changes.until(listening, "the gateway's listening lines", START_TIMEOUT)
    return GatewayProc(child, data_dir, addresses)


async def http_post(gw: GatewayProc, path: str, content: bytes = b"", **params: str) -> None:
    async with httpx.AsyncClient() as client:
        reply = await client.post(gw.http + path, params=params, content=content, timeout=10)
    assert reply.status_code == 200, (path, reply.status_code, reply.text)


async def create_channel(gw: GatewayProc, topic: str, channel: str) -> None:
    await http_post(gw, "/topic/create", topic=topic)  # nsqd's /channel/create needs the topic
    await http_post(gw, "/channel/create", topic=topic, channel=channel)


async def channel_stats(gw: GatewayProc, topic: str, channel: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        reply = await client.get(
            gw.http + "/stats",
            params={"format": "json", "topic": topic, "channel": channel},
            timeout=10,
        )
    assert reply.status_code == 200, reply.text
    topics = reply.json()["topics"]
    assert topics and topics[0]["channels"], f"no channel {topic}/{channel}: {reply.text}"
    stats: dict[str, Any] = topics[0]["channels"][0]
    return stats


# -- clients driven by the test itself ----------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    attempts: int
    id: bytes
    body: bytes


class NSQConsumer:
    """A raw NSQ consumer: every frame is read by the test, nothing is answered unless asked."""

    def __init__(self, conn: RawNSQ) -> None:
        self.conn = conn

    @classmethod
    async def subscribe(
        cls, gw: GatewayProc, topic: str, channel: str, rdy: int, msg_timeout: int = 60_000
    ) -> NSQConsumer:
        conn = RawNSQ(await trio.open_tcp_stream(*gw.addresses["nsq"]))
        await conn.send(MAGIC)
        ftype, _ = await conn.identify(feature_negotiation=True, msg_timeout=msg_timeout)
        assert ftype == FRAME_RESPONSE
        await conn.send(f"SUB {topic} {channel}\n".encode())
        assert await conn.frame() == (FRAME_RESPONSE, b"OK")
        await conn.send(b"RDY %d\n" % rdy)
        return cls(conn)

    async def _frame(self, timeout: float) -> tuple[int, bytes]:
        while True:
            ftype, data = await self.conn.frame(timeout)
            if ftype == FRAME_RESPONSE and data == HEARTBEAT:
                await self.conn.send(b"NOP\n")
                continue
            return ftype, data

    async def message(self, timeout: float = 15.0) -> Delivery:
        ftype, data = await self._frame(timeout)
        assert ftype == FRAME_MESSAGE, f"expected a message, got frame {ftype}: {data[:200]!r}"
        _ts, attempts, msg_id, body = parse_message(data)
        return Delivery(attempts, msg_id, body)

    async def fin(self, ids: Iterable[bytes]) -> None:
        await self.conn.send(b"".join(b"FIN " + i + b"\n" for i in ids))

    async def sync(self) -> None:
        """Return once the gateway has handled everything sent before: a FIN of an id nobody
        holds is answered with an error frame, in order, and the connection stays open."""
        await self.conn.send(b"FIN " + NO_ID + b"\n")
        ftype, data = await self._frame(10.0)
        assert ftype == FRAME_ERROR and data.startswith(b"E_FIN_FAILED"), (ftype, data[:200])

    async def aclose(self) -> None:
        await self.conn.aclose()


async def beanstalk_conn(gw: GatewayProc, tube: bytes | None = None) -> RawBeanstalk:
    conn = RawBeanstalk(await trio.open_tcp_stream(*gw.addresses["beanstalk"]))
    if tube is not None:
        assert (await conn.call(b"use " + tube + b"\r\n")).startswith(b"USING")
        assert (await conn.call(b"watch " + tube + b"\r\n")).startswith(b"WATCHING")
        assert await conn.call(b"ignore default\r\n") == b"WATCHING 1\r\n"
    return conn


def reserved(reply: bytes) -> tuple[int, bytes]:
    head, _, rest = reply.partition(b"\r\n")
    word, job_id, size = head.split(b" ")
    assert word == b"RESERVED", reply[:200]
    assert len(rest) == int(size) + 2
    return int(job_id), rest[:-2]


def stats_job(reply: bytes) -> dict[str, str]:
    """beanstalkd's stats-job YAML (`OK n\\r\\n---\\nkey: value\\n...`) as a dict."""
    assert reply.startswith(b"OK "), reply
    out = {}
    for line in reply.split(b"\r\n", 1)[1].decode().splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


async def drain_nsq(
    gw: GatewayProc, topic: str, channel: str, hold: Callable[[Delivery], bool] | None = None
) -> tuple[list[Delivery], list[Delivery], NSQConsumer]:
    """Everything a channel delivers, up to a marker published after the consumer subscribed
    (ready messages come in order, so the marker comes last). Deliveries `hold` picks are
    left in flight; the rest are FINed. Returns (deliveries, held, the consumer, still open)."""
    consumer = await NSQConsumer.subscribe(gw, topic, channel, MAX_RDY)
    marker = b"marker:" + os.urandom(8).hex().encode()
    await http_post(gw, "/pub", marker, topic=topic)
    deliveries: list[Delivery] = []
    held: list[Delivery] = []
    while True:
        d = await consumer.message()
        if d.body == marker:
            await consumer.fin([d.id])
            break
        deliveries.append(d)
        if hold is not None and hold(d):
            held.append(d)
        else:
            await consumer.fin([d.id])
    await consumer.sync()  # every FIN handled (and recorded) before the test goes on
    stats = await channel_stats(gw, topic, channel)
    left = (stats["depth"], stats["deferred_count"], stats["in_flight_count"])
    assert left == (0, 0, len(held)), f"{topic}/{channel} after its marker: {stats}"
    return deliveries, held, consumer


async def drain_beanstalk(gw: GatewayProc, tube: str) -> list[tuple[int, bytes]]:
    """Reserve and delete every ready job of a tube, in reserve order."""
    conn = await beanstalk_conn(gw, tube.encode())
    jobs = []
    while (reply := await conn.call(b"reserve-with-timeout 0\r\n")) != b"TIMED_OUT\r\n":
        job_id, body = reserved(reply)
        assert await conn.call(b"delete %d\r\n" % job_id) == b"DELETED\r\n"
        jobs.append((job_id, body))
    await conn.aclose()
    return jobs


# -- publishers and what they were told ---------------------------------------------------------


@dataclass
class Stream:
    """One publisher's queue, and everything known about it across restarts."""

    mode: str  # pub | mpub | put (see durability_publisher.py)
    topic: str
    sent: set[bytes] = field(default_factory=set)
    acked: set[bytes] = field(default_factory=set)  # must come back
    held: dict[bytes, int] = field(default_factory=dict)  # in flight at the kill: attempts
    finished: set[bytes] = field(default_factory=set)  # FINed before the kill: may come back
    child: Child | None = None
    end: str = ""

    @property
    def nsq(self) -> bool:
        return self.mode != "put"

    def on_line(self, line: bytes) -> None:
        kind, _, rest = line.partition(b" ")
        if kind == b"S":
            self.sent.add(bytes.fromhex(rest.decode()))
        elif kind == b"A":
            self.acked.add(bytes.fromhex(rest.decode()))
        elif kind == b"END":
            self.end = rest.decode(errors="replace")


def index_of(body: bytes) -> int:
    return int(body.split(b":", 2)[1])


def describe(bodies: Iterable[bytes], limit: int = 5) -> str:
    listed = sorted(bodies, key=index_of)
    shown = [b.split(b":", 2)[0].decode() + ":" + str(index_of(b)) for b in listed[:limit]]
    return ", ".join(shown) + (f" (+{len(listed) - limit} more)" if len(listed) > limit else "")


def verify(stream: Stream, deliveries: list[tuple[int, bytes]], where: str) -> None:
    """What a drain got, against what the publisher and the consumers knew at the kill."""
    bodies = [body for _attempts, body in deliveries]
    label = f"{where} {stream.mode} {stream.topic}"
    print(
        f"{label}: {len(bodies)} delivered; {len(stream.acked)} acknowledged, "
        f"{len(stream.sent)} sent, {len(stream.held)} were in flight"
    )
    twice = [b for b, n in Counter(bodies).items() if n > 1]
    assert not twice, f"{label}: delivered more than once: {describe(twice)}"
    unknown = [b for b in bodies if b not in stream.sent]
    assert not unknown, f"{label}: {len(unknown)} never-sent bodies, e.g. {unknown[:3]!r}"
    missing = stream.acked - set(bodies)
    assert not missing, (
        f"{label}: {len(missing)} of {len(stream.acked)} acknowledged bodies not delivered "
        f"(lost, or kept where the channel does not see them): {describe(missing)}"
    )
    if stream.nsq:
        wrong = [
            (index_of(b), a, stream.held.get(b, 0) + 1)
            for a, b in deliveries
            if b not in stream.finished and a != stream.held.get(b, 0) + 1
        ]
        assert not wrong, f"{label}: (index, attempts, expected attempts): {wrong[:10]}"
    # publish order, apart from what was in flight (it was ahead of the rest anyway)
    fresh = [index_of(b) for b in bodies if b not in stream.held and b not in stream.finished]
    assert fresh == sorted(fresh), f"{label}: ready messages out of publish order"
    again = set(bodies) & stream.finished
    if again:
        print(f"{label}: {len(again)} FINed before the kill delivered again (at-least-once)")


async def start_publishers(
    sup: Supervisor, gw: GatewayProc, streams: list[Stream], rng_seed: int
) -> None:
    for s in streams:
        listener = "nsq" if s.nsq else "beanstalk"
        argv = [
            sys.executable,
            str(PUBLISHER),
            s.mode,
            "--port",
            str(gw.addresses[listener][1]),
            "--topic",
            s.topic,
            "--tag",
            s.topic,
            "--seed",
            str(rng_seed),
        ]
        if s.mode == "mpub":
            argv += ["--batch", "20", "--window", "4"]
        s.child = await sup.spawn(f"publisher {s.mode}", argv, on_line=s.on_line)


async def wait_publishers_gone(sup: Supervisor, streams: list[Stream]) -> None:
    """After the kill every publisher sees its connection fail, says END and exits."""

    def gone() -> bool:
        return all(s.child is not None and s.child.eof for s in streams)

    await sup.changes.until(gone, "the publishers to notice the kill", 20)
    for s in streams:
        assert s.child is not None
        assert await s.child.wait(10) == 0, s.child.text()
        assert s.end.startswith("error"), f"{s.mode}: {s.end!r}\n{s.child.text()}"


def acks(streams: list[Stream]) -> int:
    return sum(len(s.acked) for s in streams)


# -- the crash rounds ---------------------------------------------------------------------------


@pytest.mark.clients
async def test_sigkill_at_random_points_loses_no_acknowledged_message(tmp_path: Path) -> None:
    rng = random.Random(seed())
    data_dir = tmp_path / "data"
    # total acknowledgements across the publishers at which each round's SIGKILL comes
    kill_at = [rng.randrange(300, 2500), rng.randrange(200, 2000), rng.randrange(1, 300)]
    print(f"kill after {kill_at} acknowledgements")
    # restarts 1 and 3 keep only 200 ready messages per group in memory: round 1 publishes past
    # that window, and round 0's messages come back from disk through it
    small_window = {"GATEWAY_STORAGE__MEMORY_WINDOW": str(SMALL_WINDOW)}
    rounds = [[Stream(mode, f"r{r}_{mode}") for mode in ("pub", "mpub", "put")] for r in range(3)]
    with trio.fail_after(120):
        async with supervised() as sup:
            # -- round 0: three publishers, no channel yet (NSQ keeps a topic backlog)
            gw = await start_gateway(sup, data_dir)
            await start_publishers(sup, gw, rounds[0], rng.randrange(2**32))
            await sup.changes.until(
                lambda: (
                    acks(rounds[0]) >= kill_at[0] and all(len(s.acked) >= 20 for s in rounds[0])
                ),
                f"{kill_at[0]} acknowledgements",
                30,
            )
            await gw.sigkill()
            await wait_publishers_gone(sup, rounds[0])

            # -- restart 1: everything acknowledged in round 0 is there, in order
            gw = await start_gateway(sup, data_dir, env=small_window)
            for s in rounds[0]:
                await drain_and_verify(gw, s, "restart 1")
            # round 1: channels first; consumers hold messages in flight (never FIN) at the kill
            pub, mpub, put = rounds[1]
            for s in (pub, mpub):
                await create_channel(gw, s.topic, "ch")
            holders = {pub.topic: 50, mpub.topic: 40}
            holding = {t: await NSQConsumer.subscribe(gw, t, "ch", n) for t, n in holders.items()}
            await start_publishers(sup, gw, rounds[1], rng.randrange(2**32))
            for s in (pub, mpub):
                for _ in range(holders[s.topic]):  # RDY n: exactly n in flight, none unread
                    d = await holding[s.topic].message()
                    s.held[d.body] = d.attempts
            bs_holder = await beanstalk_conn(gw, put.topic.encode())
            for _ in range(5):
                reserved(await bs_holder.call(b"reserve-with-timeout 10\r\n", timeout=15))
            await sup.changes.until(
                lambda: acks(rounds[1]) >= kill_at[1] and all(s.acked for s in rounds[1]),
                f"{kill_at[1]} acknowledgements",
                30,
            )
            await gw.sigkill()
            await wait_publishers_gone(sup, rounds[1])
            for c in holding.values():
                await c.aclose()
            await bs_holder.aclose()

            # -- restart 2: the held messages come back with attempts + 1; this time the drain
            # of round 1's PUB topic keeps 10 of them (attempts 2) in flight through the kill
            gw = await start_gateway(sup, data_dir)
            await drain_and_verify(gw, rounds[0][0], "restart 2 (drained before)")
            keeper = await drain_and_verify(gw, pub, "restart 2", hold=10)
            for s in (mpub, put):
                await drain_and_verify(gw, s, "restart 2")
            await start_publishers(sup, gw, rounds[2], rng.randrange(2**32))
            await sup.changes.until(
                lambda: acks(rounds[2]) >= kill_at[2], f"{kill_at[2]} acknowledgements", 30
            )
            await gw.sigkill()
            await wait_publishers_gone(sup, rounds[2])
            assert keeper is not None
            await keeper.aclose()

            # -- restart 3: round 2, and round 1's twice-held messages with attempts 3
            gw = await start_gateway(sup, data_dir, env=small_window)
            await drain_and_verify(gw, pub, "restart 3")
            for s in rounds[2]:
                await drain_and_verify(gw, s, "restart 3")
            assert await gw.sigterm(10) == 0, gw.child.text()


async def drain_and_verify(
    gw: GatewayProc, stream: Stream, where: str, hold: int | None = None
) -> NSQConsumer | None:
    """Drain a stream's queue and check it; then record what the next restart must see.

    `hold`: keep that many redelivered (attempts > 1) messages in flight, and return the
    consumer (to be closed after the next kill).
    """
    if not stream.nsq:
        jobs = await drain_beanstalk(gw, stream.topic)
        verify(stream, [(0, body) for _id, body in jobs], where)
        stream.finished |= {body for _id, body in jobs}
        stream.acked = set()
        return None
    kept = 0

    def pick(d: Delivery) -> bool:
        nonlocal kept
        if hold and d.attempts > 1 and kept < hold:
            kept += 1
            return True
        return False

    deliveries, held, consumer = await drain_nsq(gw, stream.topic, "ch", pick)
    verify(stream, [(d.attempts, d.body) for d in deliveries], where)
    stream.finished |= {d.body for d in deliveries} - {d.body for d in held}
    stream.held = {d.body: d.attempts for d in held}
    stream.acked = set(stream.held)
    if held:
        return consumer
    await consumer.aclose()
    return None


# -- deferred, delayed and buried ---------------------------------------------------------------


async def test_deferred_delayed_and_buried_keep_their_state_across_a_crash(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    topic, tube = "dur_deferred", b"dur_delayed"
    defer_ms, delay_s = 4000, 30
    with trio.fail_after(60):
        async with supervised() as sup:
            gw = await start_gateway(sup, data_dir)
            await create_channel(gw, topic, "ch")
            nsq = RawNSQ(await trio.open_tcp_stream(*gw.addresses["nsq"]))
            await nsq.send(MAGIC)
            sent_at = time.time()
            for ms, body in ((defer_ms, b"soon\x00\xff"), (600_000, b"much later")):
                await nsq.send(b"DPUB %s %d\n" % (topic.encode(), ms) + be32(len(body)) + body)
                assert await nsq.frame() == (FRAME_RESPONSE, b"OK")
            acked_at = time.time()
            assert (await channel_stats(gw, topic, "ch"))["deferred_count"] == 2

            bs = await beanstalk_conn(gw, tube)
            put_at = time.time()
            reply = await bs.call(b"put 100 %d 60 7\r\nlater\r\n\r\n" % delay_s)
            put_acked_at = time.time()
            delayed_id = int(reply.split()[1])
            reply = await bs.call(b"put 200 0 60 6\r\nbur\x00ed\r\n")
            buried_id = int(reply.split()[1])
            assert reserved(await bs.call(b"reserve-with-timeout 0\r\n"))[0] == buried_id
            assert await bs.call(b"bury %d 300\r\n" % buried_id) == b"BURIED\r\n"
            # BURIED goes out before the bury is written (only a publish waits for the group
            # commit); an acknowledged put after it is written after it, so the bury is too
            reply = await bs.call(b"put 0 %d 60 7\r\nbarrier\r\n" % (delay_s * 2))
            assert reply.startswith(b"INSERTED "), reply

            await gw.sigkill()
            await nsq.aclose()
            await bs.aclose()
            gw = await start_gateway(sup, data_dir)

            # beanstalkd: still delayed, with the same due time (time-left is whole seconds)
            bs = await beanstalk_conn(gw, tube)
            before = time.time()
            job = stats_job(await bs.call(b"stats-job %d\r\n" % delayed_id))
            after = time.time()
            assert job["state"] == "delayed", job
            low = put_at + delay_s - after - 1.5
            high = put_acked_at + delay_s - before + 1.5
            assert low <= int(job["time-left"]) <= high, (job, low, high)
            # still buried, with its priority; kickable, and then the only ready job
            job = stats_job(await bs.call(b"stats-job %d\r\n" % buried_id))
            assert (job["state"], job["pri"]) == ("buried", "300"), job
            assert await bs.call(b"peek-buried\r\n") == b"FOUND %d 6\r\nbur\x00ed\r\n" % buried_id
            assert await bs.call(b"kick-job %d\r\n" % buried_id) == b"KICKED\r\n"
            assert reserved(await bs.call(b"reserve-with-timeout 0\r\n")) == (
                buried_id,
                b"bur\x00ed",
            )
            assert await bs.call(b"delete %d\r\n" % buried_id) == b"DELETED\r\n"
            assert await bs.call(b"reserve-with-timeout 0\r\n") == b"TIMED_OUT\r\n"
            # ids are never reused across a restart
            reply = await bs.call(b"put 0 0 60 3\r\nnew\r\n")
            assert reply.startswith(b"INSERTED ") and int(reply.split()[1]) > buried_id, reply

            # NSQ: both still deferred; the short one arrives at its wall-clock due time
            assert (await channel_stats(gw, topic, "ch"))["deferred_count"] == 2
            consumer = await NSQConsumer.subscribe(gw, topic, "ch", 10)
            d = await consumer.message(timeout=defer_ms / 1000 + 10)
            arrived = time.time()
            assert (d.body, d.attempts) == (b"soon\x00\xff", 1)
            due_low, due_high = sent_at + defer_ms / 1000, acked_at + defer_ms / 1000
            assert due_low - 1 <= arrived <= due_high + 1, (arrived - due_low, arrived - due_high)
            await consumer.fin([d.id])
            await consumer.sync()
            stats = await channel_stats(gw, topic, "ch")
            assert (stats["deferred_count"], stats["depth"]) == (1, 0), stats
            await consumer.aclose()
            await bs.aclose()
            assert await gw.sigterm(10) == 0, gw.child.text()


# -- SIGTERM ------------------------------------------------------------------------------------


async def test_sigterm_keeps_a_thousand_messages_in_flight(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    topic, n = "dur_sigterm", 1000
    bodies = [b"%d:" % i + os.urandom(40) + b"\x00\n" for i in range(n)]
    with trio.fail_after(60):
        async with supervised() as sup:
            gw = await start_gateway(sup, data_dir)
            consumer = await NSQConsumer.subscribe(gw, topic, "ch", n)
            pub = RawNSQ(await trio.open_tcp_stream(*gw.addresses["nsq"]))
            await pub.send(MAGIC)
            for i in range(0, n, 100):
                inner = be32(100) + b"".join(be32(len(b)) + b for b in bodies[i : i + 100])
                await pub.send(b"MPUB %s\n" % topic.encode() + be32(len(inner)) + inner)
                assert await pub.frame() == (FRAME_RESPONSE, b"OK")
            await pub.aclose()
            first = [await consumer.message() for _ in range(n)]  # RDY 1000, no FIN
            assert sorted(d.body for d in first) == sorted(bodies)
            assert {d.attempts for d in first} == {1}

            t0 = trio.current_time()
            status = await gw.sigterm(10)
            stopped_in = trio.current_time() - t0
            log = gw.stderr_lines()
            assert status == 0, gw.child.text()
            assert any("messages kept" in line for line in log), gw.child.text()
            print(f"SIGTERM with {n} in flight: exit 0 after {stopped_in:.2f} s")
            await consumer.aclose()

            gw = await start_gateway(sup, data_dir)
            consumer = await NSQConsumer.subscribe(gw, topic, "ch", n)
            again = [await consumer.message() for _ in range(n)]
            assert [d.body for d in again] == [d.body for d in first], "not all again, in order"
            assert {d.attempts for d in again} == {2}, Counter(d.attempts for d in again)
            await consumer.fin(d.id for d in again)
            await consumer.sync()
            stats = await channel_stats(gw, topic, "ch")
            assert (stats["depth"], stats["in_flight_count"]) == (0, 0), stats
            await consumer.aclose()
            assert await gw.sigterm(10) == 0, gw.child.text()


# -- start errors -------------------------------------------------------------------------------


async def refused(sup: Supervisor, data_dir: Path) -> str:
    """Start a gateway that must refuse this data dir: its one `error:` line (exit status 1,
    no traceback). A gateway that starts listening instead fails the test at once."""
    child = await sup.spawn("refused gateway", gateway_argv(data_dir), watch="stderr")

    def ended() -> bool:
        if any(b"listening protocol=" in line for line in child.lines):
            raise AssertionError(f"started on {data_dir} instead of refusing:\n{child.text()}")
        return child.eof

    await sup.changes.until(ended, "the gateway to refuse its data dir", START_TIMEOUT)
    status = await child.wait(10)
    stderr = [line.decode(errors="replace") for line in child.lines]
    errors = [line for line in stderr if line.startswith("error: ")]
    assert status == 1, child.text()
    assert len(errors) == 1, child.text()
    assert str(data_dir) in errors[0], errors[0]
    assert not any("Traceback" in line for line in stderr), child.text()
    return errors[0]


def unwritable_dirs(tmp_path: Path) -> list[Path]:
    """Data dirs this process cannot create or write in, root or not (root ignores chmod)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    dirs = [blocker / "data"]  # cannot be created: its parent is a regular file
    if os.geteuid() != 0:
        readonly = tmp_path / "readonly"
        readonly.mkdir(mode=0o500)
        dirs.append(readonly)
    elif Path("/sys/kernel").is_dir():
        try:  # sysfs takes no new files, not even from root
            (Path("/sys/kernel") / "gateway-probe").touch()
        except OSError:
            dirs.append(Path("/sys/kernel"))
    return dirs


async def test_a_data_dir_that_cannot_be_written_is_one_error_line(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with supervised() as sup:
            for data_dir in unwritable_dirs(tmp_path):
                print(await refused(sup, data_dir))


async def test_a_second_gateway_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with trio.fail_after(60):
        async with supervised() as sup:
            first = await start_gateway(sup, data_dir)
            print(await refused(sup, data_dir))
            # the first one is unaffected: it still takes and delivers messages
            await http_post(first, "/pub", b"still here", topic="dur_lock")
            consumer = await NSQConsumer.subscribe(first, "dur_lock", "ch", 1)
            d = await consumer.message()
            assert (d.body, d.attempts) == (b"still here", 1)
            await consumer.fin([d.id])
            await consumer.sync()
            await consumer.aclose()
            assert first.child.process.returncode is None
            assert await first.sigterm(10) == 0, first.child.text()
