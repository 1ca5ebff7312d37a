"""The Trio shell every TCP listener shares: bind, report, one task per connection."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from gateway.stall import Stall

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


# Byte counters go to Prometheus in steps of this (and at close, and before a scrape), not
# per request: a labelled Counter.inc takes a lock, a real share of a 20 us round trip.
_METRIC_STEP = 65536


class ByteCount:
    """One connection's bytes for a Prometheus counter, handed over in `_METRIC_STEP`s;
    `report()` hands over the rest (the session calls it at close and before a scrape)."""

    __slots__ = ("counter", "unreported")

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self.unreported = 0

    def inc(self, amount: int) -> None:
        amount += self.unreported
        if amount > _METRIC_STEP:
            self.counter.inc(amount)
            amount = 0
        self.unreported = amount

    def report(self) -> None:
        if self.unreported:
            self.counter.inc(self.unreported)
            self.unreported = 0


@dataclass
class Buffered:
    """Output bytes queued for clients of one protocol listener, all connections together
    (`[limits] max_buffered_bytes`). Past the limit, a connection with more than `share`
    bytes waiting is cut off when more is queued for it: a few slow readers cannot pin
    the memory that every connection's own bound would still allow."""

    limit: int
    share: int
    total: int = 0
    # past this, publishers feeding a connection with over 3/4 of `share` waiting stall
    # for it (see Stall), as they do for one over 3/4 of its own bound
    stall_at: int = field(init=False)

    def __post_init__(self) -> None:
        self.stall_at = self.limit // 4 * 3

    @classmethod
    def unbounded(cls) -> Buffered:
        """One connection's own account, for a protocol that sets no listener-wide bound."""
        return cls(limit=1 << 62, share=1 << 62)


# The most one write joins: output queued faster than the client reads (RDY x a large
# message size) is sent in pieces of about this much, not copied into one buffer at once.
_WRITE_SIZE = 256 * 1024
# A TLS send blocked on its socket is made in slices of this much, each counted down from
# the session's bounds once sent (a plain TCP one is counted down write by write).
_TLS_SLICE = 65536


class QueuedWriter:
    """The one output path of every session. Frames queue in `_out`, from anywhere (the
    session's own replies, the broker's deliveries, other connections' publishes), and
    leave in as few writes as possible:

    * the reading task answers what it read with `await _flush()` at the end of its
      batch: one write of everything queued, straight to the socket on plain TCP (no
      scheduler pass), `send_all` only for what the socket did not take, which blocks
      the reader of a client that does not read (nothing more is read from it);
    * frames queued outside the session's own task set `_wake`, and `_writer` (a task
      of the session) writes whatever was queued during that scheduler pass in one go;
    * `_write_queued` writes the queue from synchronous code (the end of another
      connection's batch), the rest left to `_writer`.

    The bytes queued count in `_pending` (and the listener's `_buffered`) until the
    socket takes them: a send blocked by a client that does not read counts down write
    by write (`_count_down`), so what the session's bounds measure is what the client has
    not accepted yet, not a batch that is mostly on its way; a send that waits past
    `_write_deadline` ends the connection. A session whose `_pending` passes its
    `_stall_mark()` has its publishers wait for it (Stall, `_drained`).

    One sender at a time (`_sending`, a flag: acquiring a trio.Lock is a checkpoint even
    when nobody holds it); a sender loops until the queue is empty, so a flush that finds
    one under way just returns. `_holding`: the reading task is applying a batch whose
    replies may not leave yet (a publish is acknowledged after the store's flush), so
    `_writer` leaves the queue to the end of that batch.

    The session initialises the attributes without a default below and cancels
    `_cancel` to end the connection. `_encode`, when set, transforms every byte sent (NSQ
    snappy and deflate: a stream, so in order, by one sender at a time); a TLS stream
    sets `_fd` to None, so that every byte goes through `stream`.
    """

    stream: trio.abc.Stream
    _fd: int | None
    _out: list[bytes]
    _pending: int  # bytes queued, for the session's slow-consumer bound
    # the same bytes, counted with every other connection's of its listener (a session
    # whose protocol sets no such bound has its own, Buffered.unbounded())
    _buffered: Buffered
    _sending: bool
    _wake: trio.Event
    _cancel: trio.CancelScope
    _bytes_out: Any  # the counter of its protocol's bytes out (prometheus, or a ByteCount)
    _encode: Callable[[bytes], bytes] | None = None
    _holding = False
    # frames at the head of `_out` that may leave while the rest waits (NSQ: replies
    # held until the store commits the publishes they acknowledge); None: all may leave
    _gate: int | None = None
    _blocked = False  # a send is waiting for the socket now
    _blocked_sends = 0  # sends that had to wait for the socket, and finished
    _idle: trio.Event | None = None  # set when the sender under way is done (_settle)
    # set (and dropped) when `_pending` falls back under `_stall_mark()`: the publishers
    # stalled for this session wait on it (Stall)
    _drained: trio.Event | None = None
    # a publishing session's own stall (NATS and NSQ clients); None: it never waits
    _stall: Stall | None = None
    # a send that waits longer than this for the socket ends the connection (nats-server's
    # write_deadline); inf: it may wait for ever (the session's byte bounds cut it instead)
    _write_deadline = math.inf

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._holding:
                continue  # the batch under way writes when it is done
            try:
                await self._flush()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # the peer went away (reset, broken pipe): the session ends quietly
                self._cancel.cancel()
                return

    async def _flush(self) -> None:
        if self._sending:
            return
        self._sending = True
        try:
            while self._out:
                gate = self._gate
                if gate is None:
                    chunks = self._out
                    pending = self._pending
                    self._out = []
                else:
                    if not gate:
                        break  # the rest waits for its commit
                    # a new list, as above: the reading task may hold the old one
                    chunks, self._out = self._out[:gate], self._out[gate:]
                    self._gate = 0
                    pending = min(self._pending, sum(map(len, chunks)))
                # Counted down as the socket takes them, not when taken from the queue:
                # what a blocked send still holds counts against the slow-consumer bounds
                # (else a client that stops reading could pin twice its bound: one batch
                # in the send, as much again queued behind it), and what the client has
                # accepted does not (else a reader is cut off for a burst on its way).
                if pending <= _WRITE_SIZE:
                    pending = await self._write(b"".join(chunks), pending)
                else:
                    pending = await self._write_pieces(chunks, pending)
                self._count_down(pending)  # (nothing, unless the bytes were encoded)
        finally:
            self._sending = False
            idle = self._idle
            if idle is not None:
                self._idle = None
                idle.set()

    async def _write_pieces(self, chunks: list[bytes], counted: int) -> int:
        # Bodies in the queue are shared with the broker's; joining them all would copy
        # up to RDY x max-msg-size at once: bounded pieces instead.
        start = size = 0
        for i, chunk in enumerate(chunks):
            size += len(chunk)
            if size >= _WRITE_SIZE or i == len(chunks) - 1:
                counted = await self._write(b"".join(chunks[start : i + 1]), counted)
                start, size = i + 1, 0
        return counted

    async def _write(self, data: bytes, counted: int) -> int:
        """Write `data`, of which `counted` bytes (at most) count in `_pending`: they are
        counted down as the socket takes them (the first bytes taken count first: the
        uncounted ones are a session's small replies). Returns what is left of
        `counted` past `data`."""
        size = len(data)
        rest = self._write_now(data)
        if self._encode is not None:
            # what leaves is the encoded stream: the frames count down once all is sent
            if rest is not None:
                await self._send_all(rest)
            taken = min(size, counted)
            self._count_down(taken)
            return counted - taken
        taken = min(size if rest is None else size - len(rest), counted)
        if taken:
            self._count_down(taken)
        counted -= taken
        if rest is not None:
            counted = await self._send_all(rest, counted)
        return counted

    def _count_down(self, taken: int) -> None:
        self._pending -= taken
        self._buffered.total -= taken
        if self._drained is not None and self._pending <= self._stall_mark():
            self._unstall()

    def _stall_mark(self) -> int:
        """The `_pending` past which this session's publishers stall (Stall): never,
        unless its protocol says otherwise."""
        return 1 << 62

    def _unstall(self) -> None:
        """The publishers stalled for this session go on: it has drained to its mark,
        or it ends."""
        drained = self._drained
        if drained is not None:
            self._drained = None
            drained.set()

    def _write_now(self, data: bytes) -> bytes | memoryview | None:
        """Encode and count `data`, and write what the socket takes at once (plain TCP:
        trio's send_all always yields to the scheduler, which on a request/response
        protocol is most of a round trip). Returns what is left to send, or None."""
        if self._encode is not None:
            data = self._encode(data)
        self._bytes_out.inc(len(data))
        if self._fd is None:
            return data
        sent = try_write(self._fd, data)
        if sent == len(data):
            return None  # the common case: the socket buffer took it all
        return memoryview(data)[sent:]

    async def _send_all(self, data: bytes | memoryview, counted: int = 0) -> int:
        """Send what the socket did not take at once, waiting for it; up to `counted`
        of these bytes are counted down as they leave. Returns the rest of `counted`."""
        self._blocked = True
        try:
            with trio.move_on_after(self._write_deadline) as waited:
                view = memoryview(data)
                fd = self._fd
                while view:
                    if fd is not None:
                        await trio.lowlevel.wait_writable(fd)
                        sent = try_write(fd, view)
                    else:  # TLS: through the stream, a slice at a time
                        piece = view[:_TLS_SLICE]
                        await self.stream.send_all(piece)
                        sent = len(piece)
                    view = view[sent:]
                    if counted and sent:
                        taken = min(sent, counted)
                        counted -= taken
                        self._count_down(taken)
            if waited.cancelled_caught:
                self._write_stalled()
                # part of a frame may have left: nothing can follow it on this connection
                raise trio.BrokenResourceError("write deadline exceeded")
        finally:
            self._blocked = False
            self._blocked_sends += 1
        return counted

    def _write_stalled(self) -> None:
        """A send waited past `_write_deadline`; the connection ends. A session whose
        protocol sets a deadline says so and counts it."""

    async def _settle(self) -> None:
        """Wait until no send is under way (the writer task's, blocked on a socket that
        does not take more): then the caller may send, or swap the stream, alone."""
        while self._sending:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    async def _flush_all(self) -> None:
        """Everything queued so far is written when this returns (or the send failed)."""
        await self._settle()
        await self._flush()

    def _write_queued(self) -> None:
        """One non-blocking write of the queue, now, from synchronous code; whatever the
        socket does not take is left to the writer task."""
        if self._sending or not self._out:
            return
        if self._fd is None or self._encode is not None or self._holding or self._gate is not None:
            # TLS or a compression stream write from a task; a batch writes at its end
            self._wake.set()
            return
        data = b"".join(self._out)
        self._out = []
        self._buffered.total -= self._pending
        self._pending = 0
        try:
            rest = self._write_now(data)
        except trio.BrokenResourceError:
            self._cancel.cancel()
            return
        if rest is not None:
            self._out.append(bytes(rest))
            self._pending = len(rest)
            self._buffered.total += self._pending
            self._wake.set()
        if self._drained is not None and self._pending <= self._stall_mark():
            self._unstall()
