"""Recovery after kill -9. A gateway killed with kill -9 leaves its store's log behind; if
its tail is torn (a write cut short) or followed by garbage, the next start keeps every
complete write before it, drops the rest with a log line, and serves: never a crash loop.
And no message id a client has seen is handed out again, even one whose publish was never
committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from gateway.app import Gateway
from gateway.broker import query
from tests.helpers import (
    MAGIC,
    RawBeanstalk,
    RawNSQ,
    parse_message,
    running_gateway,
    written_end,
)

REPO = Path(__file__).resolve().parents[2]


async def start(
    data_dir: Path, env: dict[str, str] | None = None
) -> tuple[trio.Process, dict[str, str], bytes]:
    """`gateway serve` on data_dir; returns it, its listeners, and stderr up to ready."""
    proc = await trio.lowlevel.open_process(
        [
            *(sys.executable, "-m", "gateway", "serve", "--data-dir", str(data_dir)),
            *("--nsq", "127.0.0.1:0", "--http", "127.0.0.1:0", "--beanstalk", "off"),
            *("--nats", "off", "--nats-route", "off", "--rocketmq", "off"),
        ],
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    assert proc.stderr is not None
    out = b""
    with trio.fail_after(20):
        while b" ready: " not in out:
            chunk = await proc.stderr.receive_some(4096)
            assert chunk, f"gateway exited: {out.decode(errors='replace')}"
            out += chunk
    addresses = {}
    for line in out.decode().splitlines():
        if line.startswith("listening protocol="):
            protocol, address = (part.split("=", 1)[1] for part in line.split()[1:3])
            addresses[protocol] = address
    return proc, addresses, out


async def nsq_conn(address: str, first: bytes = b"") -> RawNSQ:
    host, port = address.rsplit(":", 1)
    conn = RawNSQ(await trio.open_tcp_stream(host, int(port)))
    await conn.send(MAGIC + first)
    if first.startswith(b"SUB"):
        assert await conn.frame() == (0, b"OK")
    return conn


async def consume(
    address: str, topic: str, channel: str, timeout: float = 1.0, fin: bool = False
) -> list[tuple[bytes, bytes]]:
    """(id, body) of each message delivered on `channel` until none came for `timeout`."""
    conn = await nsq_conn(address, f"SUB {topic} {channel}\nRDY 1000\n".encode())
    got = []
    while True:
        with trio.move_on_after(timeout) as quiet:  # the quiet, not the whole drain
            _, data = await conn.frame()
        if quiet.cancelled_caught:
            break
        _, _, msg_id, body = parse_message(data)
        got.append((msg_id, body))
        if fin:
            await conn.send(b"FIN " + msg_id + b"\n")
    await conn.aclose()
    return got


async def stop(proc: trio.Process) -> None:
    """SIGTERM, and a clean exit within 10 s."""
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await proc.wait() == 0


@asynccontextmanager
async def windowed_beanstalk(tmp_path: Path) -> AsyncIterator[tuple[Gateway, RawBeanstalk]]:
    """A gateway on the durable store with a memory window of 100 ready messages per
    group, and a beanstalkd connection to it."""
    async with running_gateway(
        store=f"sqlite://{tmp_path / 'gateway.db'}",
        nsq="off",
        beanstalk="127.0.0.1:0",
        storage__memory_window=100,
    ) as gw:
        bs = await RawBeanstalk.connect(gw)
        yield gw, bs
        await bs.aclose()


async def put_all(bs: RawBeanstalk, n: int) -> list[int]:
    """Put jobs "0000" to n - 1 into the tube in use; their ids."""
    ids = []
    for i in range(n):
        reply = await bs.call(b"put 0 0 60 4\r\n%04d\r\n" % i)
        assert reply.startswith(b"INSERTED "), reply
        ids.append(int(reply.split()[1]))
    return ids


async def reserve_all(bs: RawBeanstalk, n: int) -> list[bytes]:
    """The bodies of the n jobs left in the watched tubes, reserved with `reserve-with-
    timeout 0` sent in one write (they empty the window faster than any page-in could
    refill it), one more answering TIMED_OUT."""
    await bs.send(b"reserve-with-timeout 0\r\n" * (n + 1))
    bodies = []
    for _ in range(n):
        head, body, _ = (await bs.reply()).split(b"\r\n")
        assert head.startswith(b"RESERVED "), head
        bodies.append(body)
    assert await bs.reply() == b"TIMED_OUT\r\n"
    return bodies


async def test_a_torn_log_tail_is_cut_off_and_the_gateway_serves(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    proc, addr, _ = await start(data_dir)
    try:
        async with httpx.AsyncClient(base_url=f"http://{addr['http']}") as http:
            await http.post("/channel/create?topic=t&channel=c")
            for i in range(20):  # one commit each: the client waits for every OK
                response = await http.post("/pub?topic=t", content=b"m%02d" % i)
                assert response.status_code == 200
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    log_dir = data_dir / "gateway.db-log"
    segment = max(p for p in log_dir.iterdir() if written_end(p) > 0)
    size = written_end(segment)
    assert size > 100, "kill -9 must leave the store's log behind"
    with open(segment, "r+b") as f:
        f.truncate(size - 100)  # the last write's frame cut short
        f.seek(0, os.SEEK_END)
        f.write(os.urandom(3000))  # and garbage where the next frames would be

    proc, addr, out = await start(data_dir)
    try:
        bodies = [body for _, body in await consume(addr["nsq"], "t", "c")]
        # every complete write before the damage is back, in order; the torn one is not,
        # unless the index had it already (it is brought up to date from the log a moment
        # after each write: test_store_log.py cuts a tail the index lacks every time)
        assert bodies == [b"m%02d" % i for i in range(len(bodies))]
        assert 15 <= len(bodies) <= 20
        if len(bodies) < 20:
            assert b"cut at" in out, out.decode(errors="replace")
        async with httpx.AsyncClient(base_url=f"http://{addr['http']}") as http:
            assert (await http.post("/pub?topic=t", content=b"after")).status_code == 200
            assert (await http.get("/ready")).status_code == 200
    finally:
        await stop(proc)


async def test_an_id_a_consumer_saw_is_never_handed_out_again(tmp_path: Path) -> None:
    """A waiting consumer gets a message as soon as it is published, before its commit
    (its publisher is answered after). Killed right then, the gateway must not give that
    id to another message after the restart: consumers that deduplicate by id would drop
    it. Every start reserves its first block of ids before it serves."""
    data_dir = tmp_path / "data"
    always = {"GATEWAY_STORAGE__FSYNC": "always"}  # slow commits: a wide window to die in
    bodies_by_id: dict[bytes, set[bytes]] = {}
    for attempt in range(3):
        proc, addr, _ = await start(data_dir, always)
        try:
            consumer = await nsq_conn(addr["nsq"], b"SUB t c\nRDY 1\n")
            publisher = await nsq_conn(addr["nsq"])
            body = b"attempt-%d" % attempt
            await publisher.send(b"PUB t\n" + len(body).to_bytes(4, "big") + body)
            _, data = await consumer.frame()
        finally:
            proc.send_signal(signal.SIGKILL)  # as soon as the consumer has it
            await proc.wait()
        _, _, msg_id, got = parse_message(data)
        assert got == body
        bodies_by_id.setdefault(msg_id, set()).add(got)
        # the next start finds the queue empty and its files clean (a SIGTERM after the
        # drain), as the publish of a restarted gateway usually does
        proc, addr, _ = await start(data_dir, always)
        try:
            for msg_id, got in await consume(addr["nsq"], "t", "c", timeout=0.5, fin=True):
                bodies_by_id.setdefault(msg_id, set()).add(got)
        finally:
            await stop(proc)
    reused = {i: b for i, b in bodies_by_id.items() if len(b) > 1}
    assert not reused, f"ids handed to two messages: {reused}"


async def test_jobs_past_the_memory_window_are_found_by_their_ids(tmp_path: Path) -> None:
    """beanstalkd finds every job by its id, however deep its tube. A ready job the durable
    store keeps on disk past the memory window answers peek, stats-job, delete and
    reserve-job as one in memory does (they answered NOT_FOUND), and the tube then holds
    each other job exactly once."""
    async with windowed_beanstalk(tmp_path) as (_, bs):
        assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"  # the tube's group
        assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
        ids = await put_all(bs, 300)
        deep, taken, kept = ids[250], ids[260], ids[270]
        assert await bs.call(b"peek %d\r\n" % deep) == b"FOUND %d 4\r\n0250\r\n" % deep
        stats = await bs.call(b"stats-job %d\r\n" % kept)
        assert b"\nstate: ready\n" in stats and b'\ntube: "jobs"\n' in stats, stats
        assert await bs.call(b"delete %d\r\n" % deep) == b"DELETED\r\n"
        assert await bs.call(b"peek %d\r\n" % deep) == b"NOT_FOUND\r\n"
        assert await bs.call(b"delete %d\r\n" % deep) == b"NOT_FOUND\r\n"
        got = await bs.call(b"reserve-job %d\r\n" % taken)
        assert got == b"RESERVED %d 4\r\n0260\r\n" % taken
        assert await bs.call(b"delete %d\r\n" % taken) == b"DELETED\r\n"
        bodies = await reserve_all(bs, 298)
        assert bodies == [b"%04d" % i for i in range(300) if i not in (250, 260)]


async def test_reserve_with_timeout_0_takes_jobs_past_the_memory_window(tmp_path: Path) -> None:
    """Jobs a durable store keeps on disk past the memory window are ready jobs: a
    `reserve-with-timeout 0` gets them (as from beanstalkd, which keeps every job in
    memory), waiting for the page-in instead of answering TIMED_OUT."""
    async with windowed_beanstalk(tmp_path) as (_, bs):
        assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
        await put_all(bs, 350)
        assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        bodies = await reserve_all(bs, 350)
        assert bodies == [b"%04d" % i for i in range(350)]


async def test_a_tube_purged_by_peek_ready_and_delete_is_emptied_past_the_window(
    tmp_path: Path,
) -> None:
    """The usual way to empty a tube without reserving: `peek-ready`, `delete` that id,
    until NOT_FOUND. Deleting ready jobs by id takes them out of the memory window as
    reserving does, and the window must be refilled from disk the same way (it was not:
    peek-ready answered NOT_FOUND once the window was empty, and a reserve waited for ever
    on a tube that still held 250 jobs)."""
    async with windowed_beanstalk(tmp_path) as (_, bs):
        assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
        assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        ids = await put_all(bs, 350)
        deleted = []
        with trio.fail_after(30):
            while (reply := await bs.call(b"peek-ready\r\n")) != b"NOT_FOUND\r\n":
                job = int(reply.split()[1])
                assert await bs.call(b"delete %d\r\n" % job) == b"DELETED\r\n"
                deleted.append(job)
        assert deleted == ids
        stats = await bs.call(b"stats-tube jobs\r\n")
        assert b"\ncurrent-jobs-ready: 0\n" in stats, stats


def mpub(topic: bytes, bodies: list[bytes]) -> bytes:
    payload = len(bodies).to_bytes(4, "big") + b"".join(
        len(b).to_bytes(4, "big") + b for b in bodies
    )
    return b"MPUB " + topic + b"\n" + len(payload).to_bytes(4, "big") + payload


async def topic_stats(http: httpx.AsyncClient, topic: str) -> tuple[int, int]:
    """(depth, backend_depth) of a topic, as nsqd's /stats reports them."""
    stats = (await http.get("/stats?format=json")).json()
    [t] = [t for t in stats["topics"] if t["topic_name"] == topic]
    return t["depth"], t["backend_depth"]


async def test_a_topic_without_a_channel_keeps_its_memory_window(tmp_path: Path) -> None:
    """A topic published to before any channel exists keeps only its memory window in
    memory, as a channel does (nsqd's mem-queue-size holds for a topic too); the rest
    stays on disk only (backend_depth), through a restart too, and the first channel
    gets every message, in order, once. The whole backlog was held in memory and read
    back whole on every start: a million queued took 500 MB."""
    data_dir = tmp_path / "data"
    window = {"GATEWAY_STORAGE__MEMORY_WINDOW": "100"}
    bodies = [b"m%03d" % i for i in range(350)]
    proc, addr, _ = await start(data_dir, window)
    try:
        publisher = await nsq_conn(addr["nsq"])
        for k in range(0, 350, 50):
            await publisher.send(mpub(b"t", bodies[k : k + 50]))
            assert await publisher.frame() == (0, b"OK")
        async with httpx.AsyncClient(base_url=f"http://{addr['http']}") as http:
            assert await topic_stats(http, "t") == (350, 250)
    finally:
        await stop(proc)
    proc, addr, _ = await start(data_dir, window)
    try:
        async with httpx.AsyncClient(base_url=f"http://{addr['http']}") as http:
            assert await topic_stats(http, "t") == (350, 250)
        got = [body for _, body in await consume(addr["nsq"], "t", "c", fin=True)]
        assert got == bodies
    finally:
        await stop(proc)


async def test_a_tube_nobody_watches_keeps_its_memory_window(tmp_path: Path) -> None:
    """beanstalkd's view of a tube nobody watches, with most of its jobs on disk past the
    memory window: its counts, peek-ready, a job by id (peek, stats-job, delete), and
    then a worker that watches it reserves every job left, once, in order."""
    async with windowed_beanstalk(tmp_path) as (gw, bs):
        assert await bs.call(b"use jobs\r\n") == b"USING jobs\r\n"
        ids = await put_all(bs, 300)
        stats = await bs.call(b"stats-tube jobs\r\n")
        assert b"\ncurrent-jobs-ready: 300\n" in stats, stats
        view = query.topic(gw.broker, "jobs")
        assert view is not None and view.spilled == 200  # on disk only
        assert await bs.call(b"peek-ready\r\n") == b"FOUND %d 4\r\n0000\r\n" % ids[0]
        deep = ids[200]
        assert await bs.call(b"peek %d\r\n" % deep) == b"FOUND %d 4\r\n0200\r\n" % deep
        assert b"\nstate: ready\n" in await bs.call(b"stats-job %d\r\n" % deep)
        assert await bs.call(b"delete %d\r\n" % deep) == b"DELETED\r\n"
        assert await bs.call(b"peek %d\r\n" % deep) == b"NOT_FOUND\r\n"
        assert await bs.call(b"watch jobs\r\n") == b"WATCHING 2\r\n"
        got = await reserve_all(bs, 299)
        assert got == [b"%04d" % i for i in range(300) if i != 200]


async def test_emptying_a_topic_drops_its_backlog_on_disk_too(tmp_path: Path) -> None:
    """nsqd's /topic/empty of a topic whose backlog is mostly on disk past the memory
    window: nothing of it is left, counted, delivered to a new channel, or back after a
    restart."""
    data_dir = tmp_path / "data"
    window = {"GATEWAY_STORAGE__MEMORY_WINDOW": "100"}
    proc, addr, _ = await start(data_dir, window)
    try:
        publisher = await nsq_conn(addr["nsq"])
        await publisher.send(mpub(b"t", [b"old%03d" % i for i in range(300)]))
        assert await publisher.frame() == (0, b"OK")
        async with httpx.AsyncClient(base_url=f"http://{addr['http']}") as http:
            assert await topic_stats(http, "t") == (300, 200)
            assert (await http.post("/topic/empty?topic=t")).status_code == 200
            assert await topic_stats(http, "t") == (0, 0)
        await publisher.send(mpub(b"t", [b"new"]))
        assert await publisher.frame() == (0, b"OK")
    finally:
        await stop(proc)
    proc, addr, _ = await start(data_dir, window)
    try:
        got = [body for _, body in await consume(addr["nsq"], "t", "c", fin=True)]
        assert got == [b"new"]
    finally:
        await stop(proc)
