"""The Trio shell every TCP listener shares: bind, report, one task per connection, the
turns a connection runs in, and the raw reads and writes (gateway.connection builds the
connection shell of every protocol session on them)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    pass

log = logging.getLogger("gateway")


def peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "unknown:0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


Handle = Callable[[trio.SocketStream, str], Awaitable[None]]


_REFUSAL_SECONDS = 0.25  # what a refused connection may cost: its answer and close


@dataclass
class ConnectionLimits:
    """How many connections one listener takes, in all and from one address (0: no
    limit per address). Past either, `refuse` answers the new connection in its
    protocol's words (bounded to a quarter of a second) and it is closed;
    `refused(reason)` counts it."""

    max_connections: int
    max_per_ip: int
    refuse: Handle
    refused: Callable[[str], None]
    open: int = 0
    per_ip: Counter[str] = field(default_factory=Counter)

    def admit(self, ip: str) -> str | None:
        """None when admitted (and counted), else the reason for refusing."""
        if self.open >= self.max_connections:
            return "max_connections"
        if self.max_per_ip and self.per_ip[ip] >= self.max_per_ip:  # 0: no limit
            return "max_connections_per_ip"
        self.open += 1
        self.per_ip[ip] += 1
        return None

    def release(self, ip: str) -> None:
        self.open -= 1
        self.per_ip[ip] -= 1
        if not self.per_ip[ip]:
            del self.per_ip[ip]


async def serve(
    protocol: str,
    handle: Handle,
    limits: ConnectionLimits | None,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def handler(stream: trio.SocketStream) -> None:
        remote = peer_name(stream)
        ip = remote.rpartition(":")[0]
        if limits is not None:
            reason = limits.admit(ip)
            if reason is not None:
                limits.refused(reason)
                log.info("%s connection from %s refused: %s reached", protocol, remote, reason)
                with (
                    trio.move_on_after(_REFUSAL_SECONDS),
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    await limits.refuse(stream, remote)
                    # closing a socket with unread input sends a reset, which can destroy
                    # the refusal before the client reads it: end our side, read theirs
                    await stream.send_eof()
                    while await stream.receive_some(65536):
                        pass
                await trio.aclose_forcefully(stream)
                return
        try:
            await handle(stream, remote)
        except Exception:
            # A bug triggered by one client must not take the listener down with it.
            log.exception("%s connection from %s failed", protocol, remote)
        finally:
            if limits is not None:
                limits.release(ip)

    # serve_listeners backs off and logs on EMFILE-like accept errors instead of dying
    await trio.serve_listeners(handler, listeners, task_status=task_status)


class Turn:
    """A connection's share of the event loop between two yields.

    One receive can hold thousands of commands (20,000 empty beanstalkd lines fit in
    40 KB, a burst of NATS PINGs more). Applied in one go they would hold the loop for
    tens of milliseconds while every other connection waits. A session asks `over()`
    before each command; past its budget it yields (`pause()`), and the rest of the buffer
    waits for its next turn, unread input staying in the socket.

    The budget adapts. A yield that comes straight back (nobody else had anything to do)
    doubles it, up to `long`: a client alone on the gateway pipelines with few yields. A
    yield during which other connections ran sets it to `short` and yields once more, so
    that while anyone else is waiting, a connection that keeps its socket full gets one
    short turn for every two turns of each of the others. The clock is read every 4
    commands only: a command costs a few microseconds, a clock read a twentieth of one.
    """

    __slots__ = ("budget", "count", "ends", "long", "pauses", "short")

    def __init__(self, short: float, long: float | None = None) -> None:
        self.short = short
        self.long = long if long is not None else 20 * short
        self.budget = short
        self.ends = 0.0
        self.count = 0
        self.pauses = 0

    def start(self) -> None:
        self.ends = time.perf_counter() + self.budget
        self.count = 0

    def over(self) -> bool:
        self.count += 1
        if self.count & 3:
            return False
        return time.perf_counter() >= self.ends

    def flush_due(self) -> bool:
        """Asked before a pause: whether the connection's output is to be written first
        (at every PAUSES_PER_FLUSH-th pause, see there)."""
        self.pauses += 1
        return not self.pauses % PAUSES_PER_FLUSH

    async def pause(self) -> None:
        """The yield of a connection that used its whole turn. Shielded: nothing read is
        ever dropped."""
        started = time.perf_counter()
        await trio.lowlevel.cancel_shielded_checkpoint()
        if time.perf_counter() - started > _OTHERS_RAN:
            self.budget = self.short
            await trio.lowlevel.cancel_shielded_checkpoint()
        else:
            self.budget = min(self.budget * 2, self.long)


# A yield that took longer than this let other tasks run (an empty scheduler pass takes a
# few microseconds).
_OTHERS_RAN = 0.00002

# A connection whose turns keep running out (a client pipelining faster than its share)
# has its replies written at every this many pauses, not at every one: each write is a
# system call and a wake-up of the client, paid out of the other connections' time (under
# the flood test's attackers, a quarter of the gateway's CPU went to them). Its replies
# wait a few turns longer; all of them leave once its input runs out, as before.
PAUSES_PER_FLUSH = 4


def socket_fd(stream: trio.abc.Stream) -> int | None:
    """The descriptor of a plain TCP stream (None for TLS or anything else)."""
    return stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None


def answered(fd: int) -> None:
    """A reply to what was read from `fd` is on its way (see _ANSWERED)."""
    _streaks[fd] = _ANSWERED


def try_write(fd: int, data: bytes | memoryview) -> int:
    """One non-blocking write straight to the socket; how many bytes it took.

    trio's send_all always yields to the scheduler, which on a request/response protocol
    is most of a round trip. The socket is non-blocking already (trio made it so), so a
    direct write either takes the reply at once, as it nearly always does, or tells us
    how much is left for send_all.
    """
    try:
        sent = os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"send failed: {exc}") from exc
    _streaks[fd] = _ANSWERED
    return sent


# Per descriptor: reads in a row that found data waiting, or _ANSWERED (see receive()).
_streaks: dict[int, int] = {}
# Something was written to the descriptor since its last read. A request/response client
# sends nothing more until it has read its answer, so a read now would find nothing: the
# next receive() parks at once instead of trying (one system call less per request; issue
# 15 measured a no-work Trio server at 0.68x of beanstalkd with the read, 0.79x without).
# Every session gets this from the one write path, and must: beside sessions that park at
# once, one that tries the read first is served more often whenever the loop is busy
# (tests/clients/flood.py's healthy clients: NATS, still trying first, got up to four times
# the round trips of NSQ and beanstalkd, which parked; all parking, they go in turn again).
_ANSWERED = -1
# After this many, or after a read that filled half the buffer, the reading task yields
# once. A request/response client rarely gets there (its requests are small, and its next
# one is usually not there yet when the reply has gone, so the task parks); a client that
# keeps its socket full (a publisher in a loop) gets there on every read, and so lets
# every other connection run between two of its reads.
_STREAK_YIELD = 8


async def receive(stream: trio.abc.Stream, fd: int | None, size: int) -> bytes:
    """Like stream.receive_some(size), with less machinery on plain TCP.

    A non-blocking read first, unless the connection was answered since its last read
    (_ANSWERED); only when there is nothing to read does the task park in the I/O
    manager. receive_some pays two scheduler checkpoints on top of that on every call, a
    large share of a small request's cost here.
    """
    if fd is None:
        return await stream.receive_some(size)
    streak = _streaks.get(fd, 0)
    if streak != _ANSWERED:
        data = try_read(fd, size)
        if data is not None:
            streak += 1
            if streak < _STREAK_YIELD and len(data) < size >> 1:
                _streaks[fd] = streak
            else:
                # without this a flooding client would never let the task yield, and
                # every other connection (the subscribers it feeds included) would
                # starve; shielded, so no data read is ever dropped
                _streaks[fd] = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data
    _streaks[fd] = 0
    while True:
        await trio.lowlevel.wait_readable(fd)
        data = try_read(fd, size)
        if data is not None:
            return data


def try_read(fd: int, size: int) -> bytes | None:
    """One non-blocking read straight from the socket: None when nothing is there yet
    (b"" when the peer closed)."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
