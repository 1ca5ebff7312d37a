"""Shared test helpers: an in-process gateway and a raw NSQ connection."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from gateway import config
from gateway.app import Gateway
from gateway.broker import Broker
from gateway.stores import MemoryStore
from gateway.stores import log as store_log

MAGIC = b"  V2"


def be32(n: int) -> bytes:
    return struct.pack(">i", n)


def settings(**overrides: Any) -> config.Settings:
    flags: dict[str, Any] = {
        "nsq": "127.0.0.1:0",
        "http": "off",
        "https": "off",
        "beanstalk": "off",
        "nats": "off",
        "nats_route": "off",
        "rocketmq": "off",
        "store": "memory://",
    }
    sections: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        section, sep, name = key.partition("__")
        if sep:
            sections.setdefault(section, {})[name] = value
        else:
            flags[key] = value
    flags.update(sections)
    return config.Settings.model_validate(flags)


@asynccontextmanager
async def running_broker(**kw: Any) -> AsyncIterator[Broker]:
    """A broker on the memory store with its timer task running (unit tests, MockClock)."""
    b = Broker(MemoryStore(), **kw)
    await b.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        yield b
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def running_gateway(**overrides: Any) -> AsyncIterator[Gateway]:
    gateway = Gateway(settings(**overrides))
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.serve)
        yield gateway
        nursery.cancel_scope.cancel()


async def read_until(stream: trio.abc.ReceiveStream, marker: bytes, timeout: float = 10) -> bytes:
    """Everything received until `marker` has arrived (a close before it fails the test)."""
    buf = b""
    with trio.fail_after(timeout):
        while marker not in buf:
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed before {marker!r}; got {buf!r}"
            buf += chunk
    return buf


async def read_to_close(stream: trio.abc.ReceiveStream, timeout: float = 5) -> bytes:
    """Everything the server sends until it closes the connection."""
    buf = b""
    with trio.fail_after(timeout):
        while chunk := await stream.receive_some(65536):
            buf += chunk
    return buf


def http_base(gateway: Gateway) -> str:
    """The URL of the gateway's HTTP listener (started with http="127.0.0.1:0")."""
    host, port = gateway.addresses["http"]
    return f"http://{host}:{port}"


class RawNSQ:
    """A byte-level NSQ client for transcripts: send bytes, read whole frames."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    @classmethod
    async def connect(cls, gateway: Gateway, magic: bytes = MAGIC) -> RawNSQ:
        host, port = gateway.addresses["nsq"]
        conn = cls(await trio.open_tcp_stream(host, port))
        if magic:
            await conn.send(magic)
        return conn

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def identify(self, **fields: Any) -> tuple[int, bytes]:
        body = json.dumps(fields).encode()
        await self.send(b"IDENTIFY\n" + be32(len(body)) + body)
        return await self.frame()

    async def frame(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """The next frame as (type, data); raises EOFError when the server closed."""
        with trio.fail_after(timeout):
            while True:
                if len(self.buf) >= 8:
                    size, ftype = struct.unpack_from(">ii", self.buf)
                    if len(self.buf) >= 4 + size:
                        data = bytes(self.buf[8 : 4 + size])
                        del self.buf[: 4 + size]
                        return ftype, data
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise EOFError("closed by the server")
                self.buf += chunk

    async def closed(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection with nothing more sent."""
        with trio.fail_after(timeout):
            try:
                chunk = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                return True
        return not chunk and not self.buf

    async def aclose(self) -> None:
        await self.stream.aclose()


def parse_message(data: bytes) -> tuple[int, int, bytes, bytes]:
    ts, attempts = struct.unpack_from(">qH", data)
    return ts, attempts, data[10:26], data[26:]


class RawBeanstalk:
    """A byte-level beanstalkd client: send a command, read one reply (with its data)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    @classmethod
    async def connect(cls, gateway: Gateway) -> RawBeanstalk:
        host, port = gateway.addresses["beanstalk"]
        return cls(await trio.open_tcp_stream(host, port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise EOFError("closed by the server")
        self.buf += chunk

    async def reply(self, timeout: float = 5.0) -> bytes:
        """One whole reply: the line, plus `<bytes>\\r\\n` of data for RESERVED/FOUND/OK."""
        with trio.fail_after(timeout):
            while b"\r\n" not in self.buf:
                await self._fill()
            end = self.buf.index(b"\r\n") + 2
            words = bytes(self.buf[: end - 2]).split(b" ")
            if words[0] in (b"RESERVED", b"FOUND", b"OK"):
                end += int(words[-1]) + 2
                while len(self.buf) < end:
                    await self._fill()
            out = bytes(self.buf[:end])
            del self.buf[:end]
            return out

    async def call(self, command: bytes, timeout: float = 5.0) -> bytes:
        await self.send(command)
        return await self.reply(timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()


def frames(segment: Path) -> list[memoryview]:
    """The payloads of the frames written to a store log segment, read without touching
    the file (a replay cuts the allocated rest of the segment being written)."""
    data = memoryview(segment.read_bytes())
    out = []
    offset = 0
    while offset + store_log.HEADER.size <= len(data):
        length, _ = store_log.HEADER.unpack_from(data, offset)
        if length == 0:
            break
        start = offset + store_log.HEADER.size
        out.append(data[start : start + length])
        offset = start + length
    return out


def written_end(segment: Path) -> int:
    """Where the frames written to a store log segment end: its file is longer while it
    is being written (its blocks are allocated when it is made, the rest reads as
    zeros), as a killed gateway leaves it."""
    size = segment.stat().st_size
    return min(sum(store_log.HEADER.size + len(f) for f in frames(segment)), size)
