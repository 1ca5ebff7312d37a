"""A durable store that cannot write (disk full, I/O error) at run time.

The failure is injected where the disk would raise it: the write of the store's log (on the
event loop) raises what `write(2)` raises on a full disk, and the index's transaction (in its
worker thread) what SQLite raises. Every protocol refuses the publish
with its own failure reply, /ready turns 503, a metric counts the failures, nothing
acknowledged before is harmed, and the gateway recovers by itself once writes succeed.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from gateway.app import Gateway
from gateway.stores import SQLiteStore
from tests.helpers import RawBeanstalk, RawNSQ, be32, http_base, parse_message, running_gateway


class Disk:
    """Makes the store's writes fail while `full` is set: the log's and the index's."""

    def __init__(self, store: SQLiteStore) -> None:
        self.full = False
        log = store._log
        assert log is not None
        write, apply = log.write, store._apply_sync

        def failing_write(frame: tuple[bytes, bytes]) -> tuple[int, int]:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(frame)

        def failing_apply(*args: Any) -> None:
            if self.full:
                raise sqlite3.OperationalError("database or disk is full")
            apply(*args)

        log.write = failing_write  # type: ignore[method-assign]
        store._apply_sync = failing_apply  # type: ignore[method-assign]


async def wait_for(condition: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


def disk_of(gateway: Gateway) -> tuple[SQLiteStore, Disk]:
    store = gateway.store
    assert isinstance(store, SQLiteStore)
    return store, Disk(store)


def sqlite_gateway(tmp_path: Path, **overrides: Any) -> Any:
    return running_gateway(
        store=f"sqlite://{tmp_path / 'gateway.db'}",
        http="127.0.0.1:0",
        beanstalk="127.0.0.1:0",
        **overrides,
    )


async def metric(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_failing_disk_refuses_publishes_everywhere_and_recovers(tmp_path: Path) -> None:
    async with sqlite_gateway(tmp_path) as gw:
        gateway: Gateway = gw
        store = gateway.store
        assert isinstance(store, SQLiteStore)
        disk = Disk(store)
        async with httpx.AsyncClient(base_url=http_base(gateway)) as http:
            nsq = await RawNSQ.connect(gateway)
            await nsq.send(b"PUB orders\n" + be32(6) + b"before")
            assert await nsq.frame() == (0, b"OK")
            assert (await http.get("/ready")).status_code == 200

            disk.full = True
            await nsq.send(b"PUB orders\n" + be32(6) + b"commit")
            frame_type, data = await nsq.frame()
            assert (frame_type, data.split(b" ")[0]) == (1, b"E_PUB_FAILED")
            assert b"No space left on device" in data
            assert await nsq.closed()  # fatal, as nsqd's E_PUB_FAILED
            await wait_for(lambda: store.failed is not None)

            bs = await RawBeanstalk.connect(gateway)
            assert await bs.call(b"use orders\r\n") == b"USING orders\r\n"
            assert await bs.call(b"put 0 0 60 7\r\nrefused\r\n") == b"OUT_OF_MEMORY\r\n"
            response = await http.post("/pub?topic=orders", content=b"refused")
            assert response.status_code == 503
            assert (await http.get("/ready")).status_code == 503
            assert await metric(http, "gateway_store_failing") == 1
            assert await metric(http, "gateway_store_write_errors_total") >= 1

            disk.full = False  # space again: the committer's retry succeeds by itself
            await wait_for(lambda: store.failed is None)
            assert (await http.get("/ready")).status_code == 200
            assert (await bs.call(b"put 0 0 60 5\r\nafter\r\n")).startswith(b"INSERTED ")
            response = await http.post("/pub?topic=orders", content=b"after2")
            assert response.status_code == 200
            await bs.aclose()

            # what was acknowledged is all there, and nothing that was refused
            consumer = await RawNSQ.connect(gateway)
            await consumer.send(b"SUB orders c\nRDY 10\n")
            assert await consumer.frame() == (0, b"OK")
            bodies = []
            with trio.move_on_after(1):
                while True:
                    _, data = await consumer.frame()
                    bodies.append(parse_message(data)[3])
            await consumer.aclose()
        assert {b"before", b"after", b"after2"} <= set(bodies)
        # refused up front: never queued. The publish whose commit failed was answered
        # E_PUB_FAILED and may still be delivered (its outcome is unknown to the client,
        # as with a lost OK: at least once), so it is not asserted either way.
        assert b"refused" not in bodies


async def test_a_commit_that_fails_under_a_batch_acknowledges_none_of_it(tmp_path: Path) -> None:
    """beanstalkd: the puts of a batch whose commit fails are answered INTERNAL_ERROR."""
    async with sqlite_gateway(tmp_path) as gw:
        store, disk = disk_of(gw)
        bs = await RawBeanstalk.connect(gw)
        # the session's `default` tube is written before the disk fills: a commit of it
        # that failed there would refuse the puts up front (OUT_OF_MEMORY) instead
        assert await bs.call(b"list-tube-used\r\n") == b"USING default\r\n"
        await gw.broker.flush()
        disk.full = True
        await bs.send(b"put 0 0 60 1\r\na\r\nput 0 0 60 1\r\nb\r\n")
        assert await bs.reply() == b"INTERNAL_ERROR\r\n"
        assert await bs.reply() == b"INTERNAL_ERROR\r\n"
        disk.full = False
        await wait_for(lambda: store.failed is None)
        reply = await bs.call(b"put 0 0 60 1\r\nc\r\n")
        assert reply.startswith(b"INSERTED ")
        await bs.aclose()


def mpub(topic: bytes, bodies: list[bytes]) -> bytes:
    payload = be32(len(bodies)) + b"".join(be32(len(b)) + b for b in bodies)
    return b"MPUB " + topic + b"\n" + be32(len(payload)) + payload


async def test_nsq_batches_whose_commits_overlap_are_answered_in_order(tmp_path: Path) -> None:
    """A store whose flush waits (fsync = "always" on a slow disk): batches of publishes
    are read while earlier fsyncs are under way (the reply gate of connection.Connection).
    Every publish is answered OK once stored, in order, and a client that closes its
    sending side right after still gets every answer."""
    async with sqlite_gateway(tmp_path, storage__fsync="always") as gw:
        store = gw.store
        assert isinstance(store, SQLiteStore) and store._log is not None
        log = store._log
        sync = log.sync

        def slow_sync() -> tuple[int, int]:
            time.sleep(0.02)  # a slow disk, in the store's fsync thread
            return sync()

        log.sync = slow_sync  # type: ignore[method-assign]
        nsq = await RawNSQ.connect(gw)
        sent = 0
        for i in range(40):
            bodies = [b"m%d-%d" % (i, k) for k in range(25)]
            # one command per send: the gateway reads them as many batches
            await nsq.send(mpub(b"overlap", bodies) + b"PUB overlap\n" + be32(4) + b"last")
            sent += len(bodies) + 1
        await nsq.stream.send_eof()
        frames = []
        with trio.fail_after(20):
            while True:
                try:
                    frames.append(await nsq.frame())
                except EOFError:
                    break
        assert frames == [(0, b"OK")] * 80
        topic = gw.broker.topic("overlap", create=False)
        assert topic is not None and topic.message_count == sent
        await nsq.aclose()


async def test_no_ok_leaves_after_a_failed_commit_of_overlapping_batches(tmp_path: Path) -> None:
    async with sqlite_gateway(tmp_path) as gw:
        _, disk = disk_of(gw)
        nsq = await RawNSQ.connect(gw)
        await nsq.send(mpub(b"failing", [b"stored"]))
        assert await nsq.frame() == (0, b"OK")
        disk.full = True
        # one write: the gateway may close before a later write of the client's
        await nsq.send(b"".join(mpub(b"failing", [b"x%d" % i] * 500) for i in range(10)))
        frame_type, data = await nsq.frame(timeout=10)
        # nsqd names the command: E_MPUB_FAILED MPUB failed ...
        assert (frame_type, data.split(b" ")[:2]) == (1, [b"E_MPUB_FAILED", b"MPUB"])
        assert await nsq.closed(timeout=10)
        disk.full = False


async def test_a_failed_publish_is_named_for_its_command_as_nsqd_names_it(tmp_path: Path) -> None:
    """nsqd's error names the command that failed: E_PUB_FAILED, E_MPUB_FAILED,
    E_DPUB_FAILED, each followed by the command and the reason, and the connection ends."""
    async with sqlite_gateway(tmp_path) as gw:
        _, disk = disk_of(gw)
        disk.full = True
        for command, expected in (
            (mpub(b"t", [b"x"]), b"E_MPUB_FAILED MPUB failed "),
            (b"DPUB t 1000\n" + be32(1) + b"x", b"E_DPUB_FAILED DPUB failed "),
        ):
            nsq = await RawNSQ.connect(gw)
            await nsq.send(command)
            frame_type, data = await nsq.frame(timeout=10)
            assert frame_type == 1 and data.startswith(expected), data
            assert await nsq.closed(timeout=10)
        disk.full = False
