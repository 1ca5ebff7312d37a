"""One NSQ TCP connection: reads commands, applies them to the broker, writes frames.

Three tasks per connection: the reader (parse every complete command of one receive,
apply them all, acknowledge publishes after one store flush, and write the replies and
the deliveries of the batch itself, in one write), the writer (tcp.QueuedWriter's: what
other tasks queued during one scheduler pass, deliveries from other connections'
publishes and heartbeats, in one write), and the heartbeat ticker; on a store whose
flush waits, a task per batch commit (commits.py). Deliveries arrive from the broker
synchronously through `deliver()`, which only appends a frame (and, outside the
session's own batch, wakes the writer). IDENTIFY and AUTH live in handshake.py, SUB,
deliveries, FIN, REQ and TOUCH in consuming.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable

import trio

from gateway.broker import Consumer, Group
from gateway.broker.errors import StoreUnavailable
from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.auth import AuthState
from gateway.protocols.nsq.codec import (
    CLOSE_WAIT_FRAME,
    DPUB_OK_FRAME,
    HEARTBEAT_FRAME,
    MPUB_OK_FRAME,
    OK_FRAME,
    NSQServerCodec,
    State,
)
from gateway.protocols.nsq.commits import AHEAD, Commits, withdraw_oks
from gateway.protocols.nsq.compression import CompressionError
from gateway.protocols.nsq.consuming import Consuming
from gateway.protocols.nsq.handshake import Handshake, _Close
from gateway.protocols.nsq.names import is_ephemeral
from gateway.protocols.nsq.server import NSQServer
from gateway.stall import Stall
from gateway.tcp import Buffered, ByteCount, QueuedWriter, Turn, receive, socket_fd, try_read

log = logging.getLogger("gateway.nsq")

_RECEIVE_SIZE = 65536


class NSQSession(Handshake, Consuming, QueuedWriter):
    protocol = "nsq"  # the metrics label of this consumer's deliveries

    def __init__(self, server: NSQServer, stream: trio.abc.Stream, remote: str) -> None:
        self.server = server
        self.stream: trio.abc.Stream = stream
        self.remote = remote  # "ip:port"
        self.remote_ip = remote.rsplit(":", 1)[0].strip("[]")
        self._turn = Turn(server.turn_budget)
        self.codec = NSQServerCodec(server.limits)
        self.codec.tls_required = server.tls_required and server.ssl_context is not None
        self.connect_ts = int(time.time())
        # identity, as /stats shows it; until IDENTIFY says otherwise, the client_id and
        # hostname are the remote address (nsqd's newClientV2)
        self.client_id = self.remote_ip
        self.hostname = self.remote_ip
        self.user_agent = ""
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.sample_rate = 0
        self.msg_timeout = server.features.msg_timeout / 1000
        self.heartbeat_interval = server.features.heartbeat_interval / 1000
        # nsqd's output buffering of deliveries (IDENTIFY output_buffer_size/_timeout):
        # see deliver()
        self.output_buffer_size = server.features.output_buffer_size
        self.output_buffer_timeout = server.features.output_buffer_timeout / 1000
        self._flush_at = math.inf  # when buffered deliveries go out at the latest
        self.auth_state: AuthState | None = None
        # subscription
        self.group: Group | None = None
        self.consumer: Consumer | None = None
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        # output: tcp.QueuedWriter's (`_pending` counts the deliveries' bytes, for
        # max_output_bytes)
        self._out: list[bytes] = []
        self._pending = 0
        self._buffered = Buffered.unbounded()  # no listener-wide bound
        # its wait, as a publisher, for the NATS subscribers it feeds faster than they read
        self._stall = Stall()
        self._wake = trio.Event()
        self._encode: Callable[[bytes], bytes] | None = None
        self._sending = False
        # Plain TCP: reads and writes straight on the descriptor. None once TLS wraps it.
        self._fd = socket_fd(stream)
        self._holding = False  # a command batch is running: it writes when it is done
        self._flush_waits = server.broker.flush_waits  # see _read_more and commits.py
        self._commits = Commits(self)
        self._nursery: trio.Nursery | None = None  # the commits' tasks run in it
        self._auth_on = server.auth is not None
        # Deadlines, enforced by the _timers task rather than a cancel scope per read or
        # write (entering and leaving scopes was a fifth of a PUB round trip).
        self._next_heartbeat = 0.0
        self._read_deadline = math.inf
        self._timer_scope: trio.CancelScope | None = None
        self._metrics = server.metrics
        self._origin = f"nsq {remote}"  # of every message it publishes
        self._cancel = trio.CancelScope()
        self._bytes_in = ByteCount(server.metrics.bytes_in.labels("nsq"))
        self._bytes_out = ByteCount(server.metrics.bytes_out.labels("nsq"))

    # -- life cycle ------------------------------------------------------------

    async def run(self) -> None:
        m = self._metrics
        m.connections.labels("nsq").inc()
        m.connections_total.labels("nsq").inc()
        self.server.sessions.add(self)
        try:
            async with trio.open_nursery() as nursery:
                self._cancel = nursery.cancel_scope
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._timers)
                await self._reader()
                nursery.cancel_scope.cancel()
        finally:
            self._fd = None  # never write to a descriptor number that may be reused
            self.report_bytes()
            self.server.sessions.discard(self)
            m.connections.labels("nsq").dec()
            if self.consumer is not None and self.group is not None:
                # nsqd leaves a leaving client's messages in flight until their timeout
                self.group.detach(self.consumer, requeue=False)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    def close(self) -> None:
        """End the connection from outside. The session detaches and closes its stream as
        on any other end."""
        self._cancel.cancel()

    # the broker's word that the channel was deleted (over HTTP, here or on another
    # gateway sharing the store): nsqd closes its clients, who subscribe again
    group_closed = close

    def report_bytes(self) -> None:
        """The byte counters are batched (tcp.ByteCount): a scrape wants them now."""
        self._bytes_in.report()
        self._bytes_out.report()

    async def _reader(self) -> None:
        now = trio.current_time()
        self._read_deadline = self._silence_deadline(now)
        self._next_heartbeat = now + self.heartbeat_interval
        bytes_in = self._bytes_in
        max_output = self.server.max_output_bytes
        try:
            while True:
                if self._commits.pending >= AHEAD:
                    await self._commits.wait(AHEAD - 1)  # commits.py: so many ahead at most
                if self._pending > max_output:
                    # the client does not read: stop reading its commands until it does
                    await self._flush_all()
                if self._stall.sessions:  # its publishes went to a NATS subscriber
                    await self._stall.wait()  # faster than that one reads (stall.py)
                data = await receive(self.stream, self._fd, _RECEIVE_SIZE)
                self._stall.spent = 0.0
                if not data:
                    # the client closed its side: what it published is still answered
                    await self._commits.wait()
                    await self._flush_all()
                    return
                bytes_in.inc(len(data))
                try:
                    self.codec.receive_data(data)
                except CompressionError:
                    return  # nsqd drops the connection silently on a corrupt stream
                while await self._process():
                    # its turn is over (Turn): everyone else runs before the rest
                    await self._turn.pause()
                    if self._commits.pending >= AHEAD:
                        await self._commits.wait(AHEAD - 1)
        except _Close as close:
            with trio.move_on_after(self.heartbeat_interval if self.heartbeat_interval > 0 else 5):
                # the peer may be gone before it could read why
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._commits.wait()  # earlier publishes' replies go first
                    # An earlier batch's commit that failed meanwhile has already queued
                    # E_PUB_FAILED, the connection's last words: a failing store also
                    # refuses this batch's publish, whose own E_PUB_FAILED would follow
                    # the first one.
                    if close.frame is not None and not self._commits.failed:
                        self._metrics.protocol_error("nsq", close.frame[8:])
                        self._out.append(close.frame)
                    await self._flush_all()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    def _silence_deadline(self, now: float) -> float:
        # nsqd's read deadline: two heartbeat intervals after the last command line
        return now + 2 * self.heartbeat_interval if self.heartbeat_interval > 0 else math.inf

    # -- commands ----------------------------------------------------------------

    async def _process(self) -> bool:
        """Apply the complete commands of one turn (Turn); True when some are left.

        Replies and deliveries go into one outbox in the order they happen (a client must
        see SUB's OK before the first message). While a batch runs the writer holds the
        outbox back, and a batch that published awaits one store flush before releasing
        it: that is the group commit, and no OK leaves before its message is stored.
        """
        codec = self.codec
        out = self._out
        start = len(out)
        published = False
        failed: StoreUnavailable | None = None
        got_command = False
        delivered = self.message_count
        self._holding = True
        deadline, self._read_deadline = self._read_deadline, math.inf  # not while processing
        more = False
        turn = self._turn
        turn.start()
        try:
            while True:
                if turn.over():
                    more = True
                    break
                event = codec.next_event()
                if event is None:
                    if published and self._flush_waits and self._read_more():
                        continue  # more input is here already: the same commit takes it
                    break
                got_command = True
                cls = event.__class__
                if cls is ev.FinBatch:
                    self._fins(event.msg_ids)  # type: ignore[union-attr]
                elif cls is ev.Fin:
                    self._fins([event.msg_id])  # type: ignore[union-attr]
                elif cls is ev.Pub:
                    if self._auth_on:  # no coroutine per publish when auth is off
                        await self._check_auth("PUB", event.topic, "")  # type: ignore[union-attr]
                    self._publish(event.topic, [event.body])  # type: ignore[union-attr]
                    self._out.append(OK_FRAME)
                    published = True
                elif cls is ev.Rdy:
                    if self.consumer is not None:
                        self.consumer.set_ready(event.count)  # type: ignore[union-attr]
                elif cls is ev.Mpub:
                    self._publish(event.topic, event.bodies, command="MPUB")  # type: ignore[union-attr]
                    self._out.append(MPUB_OK_FRAME)
                    published = True
                elif cls is ev.MpubStart:
                    if self._auth_on:  # no coroutine per publish when auth is off
                        await self._check_auth("MPUB", event.topic, "")  # type: ignore[union-attr]
                elif cls is ev.Req:
                    self._req(event)  # type: ignore[arg-type]
                elif cls is ev.Touch:
                    self._touch(event)  # type: ignore[arg-type]
                elif cls is ev.Nop:
                    pass
                elif cls is ev.Dpub:
                    if self._auth_on:  # no coroutine per publish when auth is off
                        await self._check_auth("DPUB", event.topic, "")  # type: ignore[union-attr]
                    self._publish(event.topic, [event.body], event.defer_ms / 1000, "DPUB")  # type: ignore[union-attr]
                    self._out.append(DPUB_OK_FRAME)
                    published = True
                elif cls is ev.Sub:
                    await self._sub(event)  # type: ignore[arg-type]
                elif cls is ev.Cls:
                    if self.consumer is not None:
                        self.consumer.set_ready(0)
                    self._out.append(CLOSE_WAIT_FRAME)
                elif cls is ev.Identify:
                    await self._commits.wait()  # the framing may change: earlier bytes first
                    await self._identify(event)  # type: ignore[arg-type]
                elif cls is ev.Auth:
                    await self._commits.wait()
                    await self._auth(event)  # type: ignore[arg-type]
                elif cls is ev.ProtocolError:
                    raise _Close(event.frame)  # type: ignore[union-attr]
        finally:
            self._read_deadline = (
                self._silence_deadline(trio.current_time()) if got_command else deadline
            )
            if self.group is not None and got_command:
                self.group.pump()  # refill the window once for the whole batch of FINs
            if published and self._flush_waits and self._nursery is not None:
                # the commit runs while the next batch is read (commits.py); this
                # batch's frames wait for it
                self._commits.hold(
                    self._nursery, len(out) - start if self._out is out else len(self._out)
                )
            elif published:
                # Group commit: one store flush acknowledges every publish of this batch.
                try:
                    await self.server.broker.flush()
                except StoreUnavailable as exc:
                    failed = exc
            self._holding = False
            out_at_start = out
            del out
        if failed is not None:
            self._pub_failed(start, failed)
        if (
            self._out is out_at_start
            and self._gate is None  # no commit released frames meanwhile (commits.py)
            and len(out_at_start) - start == 2 * (self.message_count - delivered)
            and self.consumer is not None
            and not self._send_deliveries(self.consumer)
        ):
            return more  # nothing but deliveries (two chunks each) since the batch began
        if self._out:
            if self._sending:
                self._wake.set()
            else:
                # Reply from the reader's own task: one task switch less per round trip,
                # which is most of a PUB's latency. A client that stops reading blocks
                # its own reader here, as nsqd's does.
                await self._flush()
        return more

    def _read_more(self) -> bool:
        """With a store whose flush waits (Redis, the durable store), what the client has
        already sent joins the batch before its commit, with one non-blocking read: a
        producer with several MPUBs outstanding (one read holds about three of 20 KB) then
        waits for one commit instead of one per read. Never with the memory store, where a
        commit costs nothing and the read would usually find nothing."""
        if self._fd is None:
            return False
        data = try_read(self._fd, _RECEIVE_SIZE)
        if not data:
            return False  # nothing there, or closed (the next receive sees it too)
        self._bytes_in.inc(len(data))
        try:
            self.codec.receive_data(data)
        except CompressionError:
            raise _Close() from None  # nsqd drops the connection silently
        return True

    def _publish(
        self, topic: str, bodies: list[bytes], delay: float = 0.0, command: str = "PUB"
    ) -> None:
        try:
            self.server.broker.publish(
                topic,
                bodies,
                delay=delay,
                origin=self._origin,
                ephemeral=is_ephemeral(topic),
                publisher=self,  # a NATS subscriber fed past its stall mark stalls it
            )
        except StoreUnavailable as exc:
            self._pub_failed(len(self._out), exc, command)
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)

    def _pub_failed(self, start: int, exc: StoreUnavailable, command: str = "PUB") -> None:
        """The store cannot write: no OK of this batch goes out, and the client gets
        nsqd's fatal E_PUB_FAILED (E_MPUB_FAILED, E_DPUB_FAILED; nsqd closes the
        connection after it too)."""
        raise _Close(withdraw_oks(self._out, start, exc, command))

    # -- output (tcp.QueuedWriter) ---------------------------------------------------

    async def _send_now(self, frames: list[bytes]) -> None:
        self._out.extend(frames)
        await self._flush_all()

    async def _timers(self) -> None:
        """Heartbeats, and nsqd's deadlines: the read deadline (two heartbeat intervals
        without a command) and the write deadline (a write blocked for a heartbeat
        interval; checked at each heartbeat, so it fires within one to two intervals)."""
        watched_sends = -1
        while True:
            deadline = min(self._next_heartbeat, self._read_deadline, self._flush_at)
            with trio.CancelScope(deadline=deadline) as scope:
                self._timer_scope = scope
                await trio.sleep_forever()
            self._timer_scope = None
            now = trio.current_time()
            if now >= self._flush_at:
                self._flush_at = math.inf
                if self._out:
                    self._wake.set()  # buffered deliveries: their time is up
            if now >= self._read_deadline:
                self._cancel.cancel()  # silence: close without an error frame
                return
            if now >= self._next_heartbeat:
                if self._blocked and self._blocked_sends == watched_sends:
                    self._cancel.cancel()  # a write stuck since the last heartbeat
                    return
                watched_sends = self._blocked_sends if self._blocked else -1
                self._out.append(HEARTBEAT_FRAME)
                self._wake.set()
                self._next_heartbeat += self.heartbeat_interval

    # -- views -----------------------------------------------------------------------

    @property
    def state(self) -> int:
        """nsqd's client state numbers for /stats: 0 until SUB (nsqd never sets its
        "connected" 2 on a client), 3 subscribed, 4 closing."""
        return {State.INIT: 0, State.SUBSCRIBED: 3, State.CLOSING: 4}.get(self.codec.state, 1)
