"""Slow consumers as nats-server detects them (issue 27): with a 1 MiB max_pending, a
subscriber that never reads is cut off, and one that reads as fast as it can gets every
message, the real nats-server and the gateway alike.

Both servers run as processes of their own, so that the clients below (one Trio loop in
the test process) compete with the server for the CPU as real clients do, not for the
gateway's own event loop.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import trio

from tests.clients.nats import servers
from tests.helpers import read_until

Address = tuple[str, int]

REPO = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024  # max_pending, on both servers
SIZE = 65536
BURST = 8
BURSTS = 128  # 1,024 messages, 64 MiB
LATER = 16  # published once the burst phase is over
MSG_HEAD = re.compile(rb"MSG big 1 (\d+)\r\n")
LISTENING = re.compile(rb"listening protocol=nats address=(\S+):(\d+)")


@asynccontextmanager
async def gateway_process(tmp_path: Path, limits: str) -> AsyncIterator[Address]:
    """`gateway serve` with these `[limits]`, NATS only, on a free port; its stderr is
    read for the whole run (a full pipe would block it)."""
    conf = tmp_path / "gateway.toml"
    conf.write_text(f"[limits]\n{limits}\n")
    args = ["--config", str(conf), "--store", "memory://", "--nats", "127.0.0.1:0"]
    for other in ("nsq", "http", "beanstalk", "nats-route", "rocketmq"):
        args += [f"--{other}", "off"]
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "gateway", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    found: list[Address] = []
    listening = trio.Event()

    async def drain() -> None:
        buf = b""
        async for chunk in stderr:
            if not listening.is_set():
                buf += chunk
                if m := LISTENING.search(buf):
                    found.append((m[1].decode(), int(m[2])))
                    listening.set()
        listening.set()  # exited: the test fails below

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            with trio.fail_after(20):
                await listening.wait()
            assert found, "the gateway exited before it listened"
            yield found[0]
            nursery.cancel_scope.cancel()
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


async def subscriber(address: Address) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(*address)
    await read_until(stream, b"\r\n")  # INFO
    await stream.send_all(b'CONNECT {"verbose":false}\r\nSUB big 1\r\nPING\r\n')
    assert (await read_until(stream, b"PONG\r\n")).endswith(b"PONG\r\n")
    return stream


class Reader:
    """A subscriber that reads as fast as it can: a plain blocking socket in a thread of
    its own, `recv(1 MiB)` in a loop, as the reviewer's client did. It counts the whole
    MSGs and answers the server's PINGs; `closed`: the server ended the connection."""

    def __init__(self, stream: trio.SocketStream, server: str) -> None:
        self.server = server
        # the same connection, as a blocking socket of its own (trio's is non-blocking)
        self.sock = socket.socket(fileno=os.dup(stream.socket.fileno()))
        self.sock.setblocking(True)
        self._stream = stream
        self.messages = 0
        self.closed = False
        self.changed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()

    def run(self) -> None:
        """The thread's loop, until the server closes the connection or `stop()`."""
        buf = bytearray()
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                self._token.run_sync_soon(self._changed)
                return
            buf += chunk
            if pings := self._parse(buf):
                self.sock.sendall(b"PONG\r\n" * pings)
            self._token.run_sync_soon(self._changed)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def _parse(self, buf: bytearray) -> int:
        """Count the whole MSGs of `buf` and take them off it; the PINGs among them."""
        start = pings = 0
        while True:
            end = buf.find(b"\r\n", start)
            if end < 0:
                break
            if buf.startswith(b"MSG ", start):
                m = MSG_HEAD.fullmatch(buf, start, end + 2)
                assert m, bytes(buf[start : end + 2])
                frame_end = end + 2 + int(m[1]) + 2
                if len(buf) < frame_end:
                    break
                self.messages += 1
                start = frame_end
                continue
            line = bytes(buf[start:end])
            assert line in (b"PING", b"PONG"), line  # nothing else: no -ERR, no +OK
            pings += line == b"PING"
            start = end + 2
        del buf[:start]
        return pings

    async def wait_for(self, messages: int) -> None:
        while self.messages < messages:
            assert not self.closed, (
                f"{self.server}: the reader was closed after {self.messages} messages"
            )
            await self.changed.wait()

    def stop(self) -> None:
        """End the thread's loop: a shutdown wakes its blocked recv (a close would not)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    async def aclose(self) -> None:
        """Once the thread is done."""
        self.sock.close()
        await self._stream.aclose()


async def pongs(stream: trio.SocketStream, count: int) -> None:
    """Read until `count` PONGs have come (a publisher gets nothing else, but for a PING
    of the server's now and then, left unanswered: it is never pinged twice in a test)."""
    buf = b""
    while buf.count(b"PONG\r\n") < count:
        chunk = await stream.receive_some(65536)
        assert chunk, "the publisher was closed"
        buf += chunk


async def the_scenario(address: Address, server: str) -> None:
    stalled = await subscriber(address)  # never reads again
    reader = Reader(await subscriber(address), server)
    publisher = await trio.open_tcp_stream(*address)
    await read_until(publisher, b"\r\n")
    await publisher.send_all(b'CONNECT {"verbose":false}\r\n')
    await publisher.send_all(b"PING\r\n")
    await pongs(publisher, 1)
    frame = b"PUB big %d\r\n%s\r\n" % (SIZE, b"m" * SIZE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.to_thread.run_sync, reader.run, abandon_on_cancel=True))
        with trio.fail_after(180):
            for _ in range(BURSTS):
                await publisher.send_all(frame * BURST + b"PING\r\n")
            await pongs(publisher, BURSTS)
            await reader.wait_for(BURSTS * BURST)
            # the stalled subscriber was cut off: what its socket still holds, then EOF
            tail = b""
            while chunk := await stalled.receive_some(1 << 20):
                tail = (tail + chunk)[-64:]
            # nats-server says nothing before it cuts a slow consumer off (its close
            # skips the flush), and so does the gateway: a client library told
            # -ERR 'Slow Consumer' would close for good instead of reconnecting
            assert b"-ERR" not in tail
            await publisher.send_all(frame * LATER + b"PING\r\n")
            await pongs(publisher, 1)
            await reader.wait_for(BURSTS * BURST + LATER)
        assert not reader.closed
        reader.stop()
    await reader.aclose()
    for stream in (stalled, publisher):
        await stream.aclose()


async def test_a_reading_subscriber_is_never_cut_off_a_stalled_one_is(tmp_path: Path) -> None:
    """nats-server (the venv's 2.15.1, then Debian's 2.9.10) with max_pending 1 MiB, then
    the gateway with [limits] max_pending_bytes 1 MiB: 1,024 messages of 64 KiB in bursts
    of 8 (a PING after each), to a subscriber that never reads and one that reads as fast
    as it can, then 16 more. On each, the reader gets all 1,040 and the stalled one is
    cut off."""
    conf = tmp_path / "nats.conf"
    conf.write_text(f"max_pending: {LIMIT}\n")
    for binary in (servers.NATS_SERVER, servers.DEBIAN_NATS_SERVER):
        async with servers.real_nats_server("-c", str(conf), binary=binary) as address:
            await the_scenario(address, binary)
    async with gateway_process(tmp_path, f"max_pending_bytes = {LIMIT}") as address:
        await the_scenario(address, "gateway")


async def test_the_same_under_max_buffered_bytes(tmp_path: Path) -> None:
    """The gateway's bound on all NATS clients' output together (nats-server has none):
    with max_buffered_bytes at 1 MiB and max_pending_bytes far above, the stalled
    subscriber is cut off by the former, and the reader still gets everything."""
    limits = f"max_pending_bytes = {64 * LIMIT}\nmax_buffered_bytes = {LIMIT}"
    async with gateway_process(tmp_path, limits) as address:
        await the_scenario(address, "gateway, max_buffered_bytes")
