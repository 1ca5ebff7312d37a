"""The connection the Redis store writes through: plain RESP on one socket, in order.

coredis costs about 110-190 µs of CPU per round trip on Trio (measured here: a writer
task, a reader task, memory streams and cancel scopes per request), against about 20 µs
for the same PING on a bare Trio socket; with a pipeline per flush that was most of the
gateway's cost of a publish. So the store's own writes and claims, the hot path, go
through this small connection instead; coredis keeps everything else (pub/sub, the
registry, counts, loading, Cluster).

No task of its own: whoever sends a pipeline encodes it and queues it at once (so the
order of `send` calls is the order on the wire), then the first caller that finds nobody
writing writes everything queued, and the first that finds nobody reading reads and
hands every reply to the pipeline it belongs to, in order, until its own is complete.
Replies are parsed by coredis's compiled RESP parser.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any

import trio
from coredis.parser import NotEnoughData, Parser

from gateway.stores.base import StoreError
from gateway.stores.redis_url import CONNECT_TIMEOUT, STREAM_TIMEOUT, RedisTarget
from gateway.tcp import receive, socket_fd, try_write

_RECEIVE = 1 << 18
# what a lost, closed or stuck connection raises while reading or writing
_BROKEN = (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError)


def encode(command: Sequence[Any]) -> list[bytes]:
    """One command as RESP (an array of bulk strings)."""
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        out += (b"$%d\r\n" % len(arg), arg, b"\r\n")
    return out


class Replies:
    """The replies of one pipeline, as they arrive."""

    __slots__ = ("error", "expected", "got")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.got: list[Any] = []
        self.error: StoreError | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or len(self.got) >= self.expected


class Wire:
    def __init__(self, target: RedisTarget) -> None:
        self.target = target
        self.where = f"Redis at {target.address}"
        self._stream: trio.abc.Stream | None = None
        self._fd: int | None = None
        self._parser = Parser()
        self._out: list[bytes] = []
        self._waiting: deque[Replies] = deque()
        self._writing = False
        self._reading = False
        self._changed = trio.Event()
        self._opening = trio.Lock()

    @property
    def usable(self) -> bool:
        return self._stream is not None

    async def open(self) -> None:
        """Connect, unless connected already; callers at the same time share one try."""
        async with self._opening:
            if self._stream is None:
                await self._open()

    async def _open(self) -> None:
        host, port = self.target.nodes[0]
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                context = self.target.ssl_context()
                if context is not None:
                    tls = trio.SSLStream(stream, context, server_hostname=host)
                    await tls.do_handshake()
                    stream = tls
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            raise StoreError(f"{self.where}: {str(exc) or type(exc).__name__}") from None
        self._stream = stream
        self._fd = socket_fd(stream)  # plain TCP: the gateway's cheaper reads and writes
        self._parser = Parser()
        hello: list[list[Any]] = []
        if self.target.password is not None:
            user = self.target.username
            secret = self.target.password
            hello.append(["AUTH", user, secret] if user else ["AUTH", secret])
        if self.target.db:
            hello.append(["SELECT", self.target.db])
        if hello:
            for reply in await self.call(hello):
                if isinstance(reply, BaseException):
                    await self.close()
                    raise StoreError(f"{self.where}: {reply}")

    async def call(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send a pipeline and wait for its replies (error replies are exceptions in the
        list). Raises StoreError when the connection fails."""
        return await self.submit(commands)

    def submit(self, commands: Sequence[Sequence[Any]]) -> Awaitable[list[Any]]:
        """Queue a pipeline now (`send`); await the result for its replies (`result`)."""
        return self.result(self.send(commands))

    def send(self, commands: Sequence[Sequence[Any]]) -> Replies:
        """Queue a pipeline behind every one queued before; no await."""
        if self._stream is None:
            raise StoreError(f"{self.where}: not connected")
        out = self._out
        for command in commands:
            out += encode(command)
        replies = Replies(len(commands))
        self._waiting.append(replies)
        return replies

    async def result(self, replies: Replies) -> list[Any]:
        await self._write()
        while not replies.done:
            if self._reading:
                await self._changed.wait()
            else:
                await self._read_until(replies)
        if replies.error is not None:
            raise replies.error
        return replies.got

    async def flush(self) -> None:
        """Write everything queued (the first writer writes for every caller)."""
        await self._write()

    def drop(self, why: str) -> None:
        """Give the connection up: every pipeline not answered fails (as when it is lost)."""
        if self._stream is not None:
            self._lost(ConnectionResetError(why))

    async def _write(self) -> None:
        if self._writing:
            return  # the writer at work sends what was queued, ours included
        self._writing = True
        try:
            while self._out and self._stream is not None:
                data = b"".join(self._out)
                self._out = []
                sent = try_write(self._fd, data) if self._fd is not None else 0
                if sent < len(data):  # the socket is full (or TLS): wait for room
                    try:
                        with trio.fail_after(STREAM_TIMEOUT):
                            await self._stream.send_all(memoryview(data)[sent:])
                    except trio.Cancelled as exc:
                        # half a command on the wire would garble everything after it
                        self._lost(exc)
                        raise
        except _BROKEN as exc:
            self._lost(exc)
        finally:
            self._writing = False

    async def _read_until(self, mine: Replies) -> None:
        self._reading = True
        try:
            while not mine.done and self._stream is not None:
                with trio.fail_after(STREAM_TIMEOUT):
                    data = await receive(self._stream, self._fd, _RECEIVE)
                if not data:
                    raise trio.BrokenResourceError("connection closed")
                parser = self._parser
                parser.feed(data)
                waiting = self._waiting
                while True:
                    reply = parser.parse(decode=False, encoding="utf-8")
                    if isinstance(reply, NotEnoughData):
                        break
                    head = waiting[0]
                    head.got.append(reply[1])
                    if head.done:
                        waiting.popleft()
                self._wake()
        except _BROKEN as exc:
            self._lost(exc)
        finally:
            self._reading = False
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _lost(self, exc: BaseException) -> None:
        """Every pipeline not answered fails; the next `open()` connects again."""
        error = StoreError(f"{self.where}: {str(exc) or type(exc).__name__}")
        stream, self._stream, self._fd = self._stream, None, None
        if stream is not None:
            trio.lowlevel.spawn_system_task(trio.aclose_forcefully, stream)
        while self._waiting:
            self._waiting.popleft().error = error
        self._out = []
        self._wake()

    async def close(self) -> None:
        stream, self._stream, self._fd = self._stream, None, None
        if stream is not None:
            await trio.aclose_forcefully(stream)
