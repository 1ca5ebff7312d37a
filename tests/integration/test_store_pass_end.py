"""The durable store's write per pass (broker/pass_end.py), through real connections: the
publishes that arrive together on many connections share one write of the log, and a
write that fails at the end of a pass answers every one of them in its protocol's words."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import trio

from gateway.app import Gateway
from gateway.stores import SQLiteStore
from tests.helpers import MAGIC, RawBeanstalk, RawNSQ, be32, running_gateway

CONNECTIONS = 8


class LogWrites:
    """Counts the store's log writes; while `full` is set they fail as on a full disk, after
    the first `room` of them."""

    def __init__(self, store: SQLiteStore) -> None:
        self.count = 0
        self.full = False
        self.room = 0
        log = store._log
        assert log is not None
        write = log.write

        def counting(frame: tuple[bytes, bytes]) -> tuple[int, int]:
            self.count += 1
            if self.full and self.count > self.room:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(frame)

        log.write = counting  # type: ignore[method-assign]


async def nsq_clients(gateway: Gateway, n: int) -> list[tuple[socket.socket, RawNSQ]]:
    """`n` NSQ connections, each with a socket the test can write to without yielding."""
    host, port = gateway.addresses["nsq"]
    clients = []
    for _ in range(n):
        sock = socket.create_connection((host, port))
        raw = RawNSQ(trio.SocketStream(trio.socket.from_stdlib_socket(sock)))
        await raw.send(MAGIC)
        clients.append((sock, raw))
    return clients


def pub(topic: bytes, body: bytes) -> bytes:
    return b"PUB " + topic + b"\n" + be32(len(body)) + body


async def test_publishes_that_arrive_together_share_one_write(tmp_path: Path) -> None:
    async with running_gateway(store=f"sqlite://{tmp_path / 'gateway.db'}") as gateway:
        store = gateway.store
        assert isinstance(store, SQLiteStore)
        clients = await nsq_clients(gateway, CONNECTIONS)
        for _, raw in clients:  # the topic exists, every reader waits for its socket
            await raw.send(pub(b"orders", b"first"))
            assert await raw.frame() == (0, b"OK")
        await gateway.broker.flush()
        writes = LogWrites(store)
        # every PUB reaches its socket before the gateway runs again (no checkpoint
        # here): the readers all wake in the same pass of the scheduler
        for sock, _ in clients:
            sock.send(pub(b"orders", b"together"))
        for _, raw in clients:
            assert await raw.frame() == (0, b"OK")
        # all eight are written at the end of the pass, with one write (not eight; the
        # store's background write, if its timer fell in this pass, or the readers'
        # wake-ups spread over two passes may make one or two more)
        assert 1 <= writes.count <= 3, writes.count
        for _, raw in clients:
            await raw.aclose()


async def test_a_failed_write_at_the_end_of_a_pass_answers_every_client(
    tmp_path: Path,
) -> None:
    async with running_gateway(
        store=f"sqlite://{tmp_path / 'gateway.db'}", beanstalk="127.0.0.1:0"
    ) as gateway:
        store = gateway.store
        assert isinstance(store, SQLiteStore)
        clients = await nsq_clients(gateway, 4)
        for _, raw in clients:
            await raw.send(pub(b"orders", b"first"))
            assert await raw.frame() == (0, b"OK")
        host, port = gateway.addresses["beanstalk"]
        bsock = socket.create_connection((host, port))
        bs = RawBeanstalk(trio.SocketStream(trio.socket.from_stdlib_socket(bsock)))
        assert await bs.call(b"use orders\r\n") == b"USING orders\r\n"
        await gateway.broker.flush()
        writes = LogWrites(store)
        # the end of the pass writes every one of them, and that write fails
        writes.full = True
        for sock, _ in clients:
            sock.send(pub(b"orders", b"maybe"))
        bsock.send(b"put 0 0 60 5\r\nmaybe\r\n")
        replies = []
        for _, raw in clients:
            ftype, data = await raw.frame()
            replies.append(data if ftype == 0 else data.split(b" ")[0])
        replies.append(await bs.reply())
        # each in its protocol's words
        assert set(replies) == {b"E_PUB_FAILED", b"INTERNAL_ERROR\r\n"}, replies
        assert 1 <= writes.count <= 3, writes.count
        for (_, raw), reply in zip(clients, replies, strict=False):
            if reply == b"E_PUB_FAILED":
                assert await raw.closed()  # fatal, as nsqd's
        writes.full = False
        with trio.fail_after(10):
            while store.failed is not None:
                await trio.sleep(0.01)
        reply = await bs.call(b"put 0 0 60 5\r\nafter\r\n")
        assert reply.startswith(b"INSERTED ")
        await bs.aclose()
