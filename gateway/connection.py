"""The shell of one client connection, which every protocol session has (not is): its
socket, outbox and writer, the one reply gate, turns, errors in a row, metrics and close.
The listener side (bind, limits, one task per connection) and the raw reads and writes
it uses are in gateway.tcp."""

from __future__ import annotations

import contextlib
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.logs import Throttle, dropped_note, shown
from gateway.tcp import Turn, answered, receive, socket_fd, try_write

if TYPE_CHECKING:
    from gateway.broker.pass_end import PassEnd
    from gateway.metrics import Metrics

log = logging.getLogger("gateway")


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


# A connection's turn (Turn) unless its listener sets one ([limits] turn_budget's default).
DEFAULT_TURN = 0.00002
# How long what may still leave before a failed commit's last words may take to go.
_LAST_WORDS = 5.0

# A held reply's failure: its bytes when its commit failed (given the failure), or None
# when the reply stands either way (it only waits for the commit).
Failure = Callable[[StoreUnavailable], bytes] | None


class HandshakeFailed(Exception):
    """A TLS handshake failed or did not come in time (the text says which)."""


class _Commit:
    """One store commit that replies wait for: the replies (their place in the outbox,
    their failure, whether a failure ends the connection), then its outcome."""

    __slots__ = ("done", "error", "replies")

    def __init__(self) -> None:
        self.replies: list[tuple[int, Failure, bool]] = []
        self.done = False
        self.error: StoreUnavailable | None = None


class Connection:
    """The shell of one client connection, which every protocol session has (not is): the
    socket, the outbox and its writer, the reply gate, the turns, errors in a row, the
    metrics and the close. The session reads commands and decides the bytes; this sends
    them.

    Output. Frames queue in `out`, from anywhere (the session's own replies, the broker's
    deliveries, other connections' publishes), and leave in as few writes as possible:

    * the reading task answers what it read with `await flush()` at the end of its
      batch: one write of everything queued, straight to the socket on plain TCP (no
      scheduler pass), `send_all` only for what the socket did not take, which blocks
      the reader of a client that does not read (nothing more is read from it);
    * frames queued outside the session's own task set `wake`, and the writer task
      writes whatever was queued during that scheduler pass in one go;
    * `write_queued()` writes the queue from synchronous code (the end of another
      connection's batch), the rest left to the writer task.

    The bytes a session counts in `pending` (and the listener's `buffered`) count until
    the socket takes them: a send blocked by a client that does not read counts down
    write by write, so what the session's bounds measure is what the client has not
    accepted yet, not a batch that is mostly on its way; a send that waits past
    `write_deadline` ends the connection (`on_write_stalled` says so first). A connection
    whose `pending` passes `stall_mark()` has its publishers wait for it (Stall,
    `drained`).

    One sender at a time (`sending`, a flag: acquiring a trio.Lock is a checkpoint even
    when nobody holds it); a sender loops until the queue is empty, so a flush that finds
    one under way just returns. `holding`: the reading task is applying a batch, so the
    writer task leaves the queue to the end of that batch. `encode`, when set, transforms
    every byte sent (NSQ snappy and deflate: a stream, so in order, by one sender at a
    time); after `start_tls` every byte goes through the TLS stream (`fd` is None).

    The reply gate. A reply that may leave only once the store has committed what its
    command did (a publish's OK, with a shared store any write's answer) is queued with
    `reply_after_commit(reply, failure)`; it and everything queued after it wait. The
    broker tells which replies those are: `Broker.owed` counts the records that must be
    durable before their reply, so a session compares the count before and after a
    command. The replies of one batch wait for one commit (`open_commit`), started by
    `commit()` (in the caller's task) or `commit_soon()` (in a task of its own: the
    reader goes on with the next batch, whose commit travels while this one is on the
    wire; `settled(most)` bounds how many are under way). Commits settle in any order;
    the gate releases their replies in order: each reply as queued if its commit
    succeeded, else its failure's bytes (beanstalkd's INTERNAL_ERROR, RocketMQ's error
    response). A failure marked `last` (NSQ's fatal E_PUB_FAILED) is the connection's
    last words: nothing queued after it leaves, and the connection ends once it is
    written (`ended`).
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        remote: str,
        protocol: str,
        metrics: Metrics,
        *,
        commit: Callable[[], Awaitable[None]] | None = None,
        commit_now: Callable[[], bool] | None = None,
        pass_end: PassEnd | None = None,
        buffered: Buffered | None = None,
        turn_budget: float = DEFAULT_TURN,
        max_errors_in_a_row: int = 0,
        batched_bytes: bool = False,
        write_deadline: float = math.inf,
    ) -> None:
        self.stream = stream
        self.remote = remote
        self.protocol = protocol  # the metrics label
        self.metrics = metrics
        # Plain TCP: reads and writes straight on the descriptor. None once TLS wraps it.
        self.fd = socket_fd(stream)
        self.out: list[bytes] = []
        self.pending = 0  # bytes queued that the session counts (its slow-consumer bound)
        # the same bytes, counted with every other connection's of its listener
        self.buffered = buffered if buffered is not None else Buffered.unbounded()
        self.sending = False
        self.wake = trio.Event()
        self.holding = False
        self.encode: Callable[[bytes], bytes] | None = None
        self.blocked = False  # a send is waiting for the socket now
        self.blocked_sends = 0  # sends that had to wait for the socket, and finished
        self._idle: trio.Event | None = None  # set when the sender under way is done
        # set (and dropped) when `pending` falls back under `stall_mark()`: the
        # publishers stalled for this connection wait on it (Stall)
        self.drained: trio.Event | None = None
        # a send that waits longer than this for the socket ends the connection
        # (nats-server's write_deadline); inf: the session's byte bounds cut it instead
        self.write_deadline = write_deadline
        self.on_write_stalled: Callable[[], None] | None = None
        self.stall_mark: Callable[[], int] = _never
        self.turn = Turn(turn_budget)
        self.errors_in_a_row = 0  # a session sets it to 0 on every good command
        self.max_errors_in_a_row = max_errors_in_a_row
        self.cancel_scope = trio.CancelScope()
        self.nursery: trio.Nursery | None = None
        # bytes in and out: Prometheus counters, or a ByteCount of each (a protocol whose
        # scrapes call report_bytes) where a labelled counter's lock would cost too much
        bytes_in = metrics.bytes_in.labels(protocol)
        bytes_out = metrics.bytes_out.labels(protocol)
        self._batched = batched_bytes
        self.bytes_in = ByteCount(bytes_in) if batched_bytes else bytes_in
        self.bytes_out = ByteCount(bytes_out) if batched_bytes else bytes_out
        # the reply gate (see above)
        self._commit = commit
        # settles a commit without waiting where the store can (Broker.flush_now)
        self._commit_now = commit_now
        # or hands it to the end of the scheduler's pass, which settles the commits of
        # every connection with one write (Broker.pass_end)
        self._pass_end = pass_end
        self._publishing = False  # counted among the pass end's connections with commits
        self._commits: deque[_Commit] = deque()  # started or open, oldest first
        self.open_commit: _Commit | None = None  # collecting the replies of a batch
        self._taken = 0  # frames ever taken off the head of `out` (a place = _taken + index)
        self.held_from: int | None = None  # the place of the first held frame; None: none
        self._released: trio.Event | None = None  # made by a task that waits for a release
        self.ended = False  # a failed commit's last words are queued
        self._error_log: Throttle | None = None  # made at the first protocol error
        self.opened = time.time()  # wall clock, for the admin page's "connected since"

    # -- life cycle ------------------------------------------------------------------

    async def run(
        self,
        reader: Callable[[], Awaitable[object]],
        *tasks: Callable[[], Awaitable[object]],
        on_close: Callable[[], None],
        writer: bool = True,
    ) -> None:
        """The connection's life: its tasks (the writer, unless every byte is written by
        the reader; `tasks`) beside `reader`, until `reader` returns or `cancel()`; then
        `on_close` (the session lets go of what it held) and the stream's close, shielded:
        a session always ends the same way. A peer that went away (a reset, a close mid-
        write) is normal and logged by nobody."""
        m, label = self.metrics, self.protocol
        m.connections.labels(label).inc()
        m.connections_total.labels(label).inc()
        log.debug("%s connection from %s opened", label, self.remote)
        try:
            async with trio.open_nursery() as nursery:
                self.cancel_scope = nursery.cancel_scope
                self.nursery = nursery
                if writer:
                    nursery.start_soon(self._writer)
                for task in tasks:
                    nursery.start_soon(task)
                await reader()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.fd = None  # never write to a descriptor number that may be reused
            self.report_bytes()
            self.buffered.total -= self.pending  # what it never got is freed with it
            self.pending = 0
            self.unstall()  # no publisher waits for it any more
            if self._publishing:
                assert self._pass_end is not None
                self._pass_end.done_publishing()
            try:
                on_close()
            finally:
                m.connections.labels(label).dec()
                log.debug("%s connection from %s closed", label, self.remote)
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(self.stream)

    def cancel(self) -> None:
        """End the connection (from anywhere): its tasks stop, and run() closes it."""
        self.cancel_scope.cancel()

    def report_bytes(self) -> None:
        """Hand the batched byte counts over (at close, and before a scrape)."""
        if self._batched:
            self.bytes_in.report()
            self.bytes_out.report()

    async def receive(self, size: int) -> bytes:
        data = await receive(self.stream, self.fd, size)
        self.bytes_in.inc(len(data))
        return data

    async def start_tls(self, context: ssl.SSLContext, timeout: float) -> None:
        """Wrap the stream in TLS, server side, and shake hands within `timeout`; raises
        HandshakeFailed. A send under way ends first, and the writer keeps off the stream
        while it changes."""
        await self.settle_sends()
        self.sending = True
        try:
            tls = trio.SSLStream(self.stream, context, server_side=True)
            with trio.move_on_after(timeout) as scope:
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError as exc:
                    raise HandshakeFailed(f"TLS handshake failed: {exc.__cause__}") from None
            if scope.cancelled_caught:
                raise HandshakeFailed(f"no TLS handshake within {timeout:g} s")
            self.stream = tls
            self.fd = None  # from now on every byte goes through the TLS stream
        finally:
            self.sending = False

    def protocol_error(self, reply: bytes | str, code: bytes | str | None = None) -> None:
        """A command refused with `reply`: counted by its code (`code`, else the reply's
        first word) and logged with the peer and the reply, a few lines at most per
        connection (Throttle): a client that sends only garbage cannot flood the log."""
        self.metrics.protocol_error(self.protocol, reply if code is None else code)
        if self._error_log is None:
            self._error_log = Throttle()
        dropped = self._error_log.allow()
        if dropped is not None:
            log.info(
                "%s client %s: protocol error, replied %s%s",
                self.protocol,
                self.remote,
                shown(reply),
                dropped_note(dropped),
            )

    def too_many_errors(self) -> bool:
        """Whether the bad commands in a row (`errors_in_a_row`) reached the bound: a
        client that sends nothing else is cut off (said in the log and counted)."""
        if self.errors_in_a_row < self.max_errors_in_a_row:
            return False
        log.info(
            "%s client %s: %d protocol errors in a row: closing",
            self.protocol,
            self.remote,
            self.errors_in_a_row,
        )
        self.metrics.protocol_error(self.protocol, "TOO_MANY_ERRORS")
        return True

    # -- the reply gate --------------------------------------------------------------

    def reply_after_commit(self, reply: bytes, failure: Failure, last: bool = False) -> None:
        """Queue `reply` to leave once the batch's commit has settled (see the class)."""
        commit = self.open_commit
        if commit is None:
            commit = self.open_commit = _Commit()
            self._commits.append(commit)
        place = self._taken + len(self.out)
        if self.held_from is None:
            self.held_from = place
        commit.replies.append((place, failure, last))
        self.out.append(reply)

    @property
    def commits_held(self) -> int:
        """Commits whose replies still wait."""
        return len(self._commits)

    async def commit(self) -> None:
        """Commit the open batch's records now, in this task, and release its replies."""
        commit = self.open_commit
        if commit is not None:
            self.open_commit = None
            if not self._settled_now(commit):
                await self._settle(commit)

    def commit_soon(self) -> None:
        """Commit the open batch's records in a task of its own: the caller goes on (its
        replies stay held until the commit settles, those of later batches behind them).
        Where the store needs no wait, the commit settles here and now instead."""
        commit = self.open_commit
        if commit is not None:
            self.open_commit = None
            if not self._settled_now(commit):
                assert self.nursery is not None
                self.nursery.start_soon(self._commit_task, commit)

    def _settled_now(self, commit: _Commit) -> bool:
        """Settle `commit` without waiting if the store can: no task, no scheduler pass
        between a reply and its commit. A failure takes the waiting path, which answers
        it (and ends the connection where the protocol does). Where the commits of a pass
        share one write (PassEnd), the commit is handed to the end of the pass instead:
        its replies leave from there."""
        pass_end = self._pass_end
        if pass_end is not None:
            if not self._publishing:
                self._publishing = True
                pass_end.publishing()
            if pass_end.joins():
                pass_end.defer(partial(self._settle_at_pass_end, commit))
                if self.fd is not None:
                    answered(self.fd)  # the reply leaves before the client can say more
                return True
        if self._commit_now is None:
            return False
        try:
            if not self._commit_now():
                return False
        except StoreUnavailable:
            return False
        commit.done = True
        self._release()
        return True

    def _settle_at_pass_end(self, commit: _Commit, error: StoreUnavailable | None) -> bool:
        """The end of the pass wrote the records (or could not): release the replies and
        write them now (PassEnd: no task runs, nothing here may wait). True when a task
        may have been made runnable (the pass's end then wakes the loop)."""
        commit.error = error
        commit.done = True
        woke = self._released is not None  # a task waits for this release
        self._release()
        if self.ended:
            if self.nursery is not None:
                with contextlib.suppress(RuntimeError):  # the connection is over already
                    self.nursery.start_soon(self._last_words)
            return True
        if not self.holding and self.out:
            woke = self.write_queued() or woke
        return woke

    async def _last_words(self) -> None:
        """What may still go out goes at once, then the connection ends."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            with trio.move_on_after(_LAST_WORDS):
                await self.flush_all()
        self.cancel()

    async def settled(self, most: int = 0) -> None:
        """Until at most `most` commits hold replies (the open one started first)."""
        self.commit_soon()
        while len(self._commits) > most:
            if self._released is None:
                self._released = trio.Event()
            await self._released.wait()

    async def _settle(self, commit: _Commit) -> None:
        assert self._commit is not None, "a connection that holds replies commits"
        try:
            await self._commit()
        except StoreUnavailable as exc:
            commit.error = exc
        commit.done = True
        self._release()

    async def _commit_task(self, commit: _Commit) -> None:
        await self._settle(commit)
        if self.ended:
            await self._last_words()
            return
        try:
            if not self.holding and self.out:
                await self.flush()  # what was released; a batch under way writes at its end
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.cancel()  # the peer went away: the session ends quietly

    def _release(self) -> None:
        commits = self._commits
        out = self.out
        while commits and commits[0].done and not self.ended:
            commit = commits.popleft()
            error = commit.error
            if error is None:
                continue
            for place, failure, last in commit.replies:
                i = place - self._taken
                if failure is not None:
                    out[i] = failure(error)
                if last:
                    # the connection's last words: nothing queued after them leaves
                    del out[i + 1 :]
                    self.held_from = place + 1
                    self.ended = True
                    commits.clear()
                    self.open_commit = None
                    break
        if not self.ended:
            self.held_from = commits[0].replies[0][0] if commits else None
        if self._released is not None:  # only when a task waits: one Event per wait
            self._released.set()
            self._released = None

    # -- output ----------------------------------------------------------------------

    async def _writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            if self.holding:
                continue  # the batch under way writes when it is done
            try:
                await self.flush()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                # the peer went away (reset, broken pipe): the session ends quietly
                self.cancel()
                return

    async def flush(self) -> None:
        """Write what is queued and may leave (one sender at a time: a flush that finds
        one under way returns, and that one writes it)."""
        if self.sending:
            return
        self.sending = True
        try:
            while self.out:
                held = self.held_from
                if held is None:
                    chunks = self.out
                    pending = self.pending
                    self.out = []
                else:
                    free = held - self._taken
                    if free <= 0:
                        break  # the rest waits for its commit
                    # a new list, as above: the reading task may hold the old one
                    chunks, self.out = self.out[:free], self.out[free:]
                    pending = min(self.pending, sum(map(len, chunks)))
                self._taken += len(chunks)
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
            self.sending = False
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
        """Write `data`, of which `counted` bytes (at most) count in `pending`: they are
        counted down as the socket takes them (the first bytes taken count first: the
        uncounted ones are a session's small replies). Returns what is left of
        `counted` past `data`."""
        size = len(data)
        rest = self._write_now(data)
        if self.encode is not None:
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
        self.pending -= taken
        self.buffered.total -= taken
        if self.drained is not None and self.pending <= self.stall_mark():
            self.unstall()

    def unstall(self) -> None:
        """The publishers stalled for this connection go on: it has drained to its mark,
        or it ends."""
        drained = self.drained
        if drained is not None:
            self.drained = None
            drained.set()

    def _write_now(self, data: bytes) -> bytes | memoryview | None:
        """Encode and count `data`, and write what the socket takes at once (plain TCP:
        trio's send_all always yields to the scheduler, which on a request/response
        protocol is most of a round trip). Returns what is left to send, or None."""
        if self.encode is not None:
            data = self.encode(data)
        self.bytes_out.inc(len(data))
        if self.fd is None:
            return data
        sent = try_write(self.fd, data)
        if sent == len(data):
            return None  # the common case: the socket buffer took it all
        return memoryview(data)[sent:]

    async def _send_all(self, data: bytes | memoryview, counted: int = 0) -> int:
        """Send what the socket did not take at once, waiting for it; up to `counted`
        of these bytes are counted down as they leave. Returns the rest of `counted`."""
        self.blocked = True
        try:
            with trio.move_on_after(self.write_deadline) as waited:
                view = memoryview(data)
                fd = self.fd
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
                if self.on_write_stalled is not None:
                    self.on_write_stalled()
                # part of a frame may have left: nothing can follow it on this connection
                raise trio.BrokenResourceError("write deadline exceeded")
        finally:
            self.blocked = False
            self.blocked_sends += 1
        return counted

    async def settle_sends(self) -> None:
        """Wait until no send is under way (the writer task's, blocked on a socket that
        does not take more): then the caller may send, or swap the stream, alone."""
        while self.sending:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    async def flush_all(self) -> None:
        """Everything queued so far that may leave is written when this returns (or the
        send failed)."""
        await self.settle_sends()
        await self.flush()

    def write_queued(self) -> bool:
        """One non-blocking write of the queue, now, from synchronous code; whatever the
        socket does not take is left to the writer task. True when a task may have been
        woken (the writer, a stalled publisher, the connection's own on an error)."""
        if self.sending or not self.out:
            return False
        if self.fd is None or self.encode is not None or self.holding or self.held_from is not None:
            # TLS or a compression stream write from a task; a batch writes at its end
            self.wake.set()
            return True
        data = b"".join(self.out)
        self._taken += len(self.out)
        self.out = []
        self.buffered.total -= self.pending
        self.pending = 0
        try:
            rest = self._write_now(data)
        except trio.BrokenResourceError:
            self.cancel()
            return True
        woke = False
        if rest is not None:
            self.out.append(bytes(rest))
            self._taken -= 1  # the rest is queued again, as one frame
            self.pending = len(rest)
            self.buffered.total += self.pending
            self.wake.set()
            woke = True
        if self.drained is not None and self.pending <= self.stall_mark():
            self.unstall()
            woke = True
        return woke


def _never() -> int:
    """The `pending` past which a connection's publishers stall: never, unless its
    protocol says otherwise."""
    return 1 << 62
