"""One NSQ TCP connection: reads commands, applies them to the broker, writes frames.

Tasks per connection, on its connection shell (connection.Connection): the reader (parse every
complete command of one receive, apply them all, and write the replies and the
deliveries of the batch itself, in one write), the shell's writer (what other tasks
queued during one scheduler pass, deliveries from other connections' publishes and
heartbeats, in one write), and the heartbeat ticker. Deliveries arrive from the broker
synchronously through `deliver()`, which only appends a frame (and, outside the
session's own batch, wakes the writer).

A publish is acknowledged once the store has committed it (the broker says which
publishes wait: `Broker.owed`): its OK goes through the shell's reply gate, and the
batch's commit runs in a task of its own while the reader goes on with the next batch
(with a store whose flush waits, a round trip per batch otherwise). At most `AHEAD`
batches' commits are under way; the reader waits for all of them before anything that
changes how bytes are framed (IDENTIFY's compression or TLS, AUTH) or ends the
connection. A failed commit turns its first OK into nsqd's fatal E_PUB_FAILED
(E_MPUB_FAILED, E_DPUB_FAILED), after which nothing leaves and the connection ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Sequence
from functools import partial

import trio

from gateway.broker import Consumer, Group, Outcome
from gateway.broker.errors import StoreUnavailable
from gateway.clients import ClientInfo, TLSInfo
from gateway.connection import Connection, HandshakeFailed
from gateway.model import Message
from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.auth import AuthFailed, AuthState
from gateway.protocols.nsq.codec import (
    CLOSE_WAIT_FRAME,
    DPUB_OK_FRAME,
    HEARTBEAT_FRAME,
    MPUB_OK_FRAME,
    OK_FRAME,
    NSQServerCodec,
    State,
    error_frame,
    message_header,
    response_frame,
)
from gateway.protocols.nsq.compression import CompressionError, DeflateStream, SnappyStream
from gateway.protocols.nsq.names import is_ephemeral
from gateway.protocols.nsq.negotiation import (
    IdentifyError,
    Identity,
    identify,
    negotiation_response,
)
from gateway.protocols.nsq.server import NSQServer
from gateway.stall import Stall
from gateway.tcp import try_read

log = logging.getLogger("gateway.nsq")

_RECEIVE_SIZE = 65536
# batches whose commits may be under way at once, per connection (the Redis store's
# pipelines in flight are four)
AHEAD = 4
_TLS_HANDSHAKE_TIMEOUT = 5.0  # nsqd's deadline for the upgrade handshake
_NOT_IN_FLIGHT = b"ID not in flight"
_NOT_OWNER = b"client does not own message"


class _Close(Exception):
    """End the connection after sending what is queued (`frame`: a last error frame)."""

    def __init__(self, frame: bytes | None = None) -> None:
        self.frame = frame


def _parse_id(raw: bytes) -> int | None:
    """Message ids are 16 lowercase hex digits; anything else is simply not in flight."""
    try:
        value = int(raw, 16)
    except ValueError:
        return None
    return value if b"%016x" % value == raw else None


class NSQSession:
    protocol = "nsq"  # the metrics label of this consumer's deliveries

    def __init__(self, server: NSQServer, stream: trio.abc.Stream, remote: str) -> None:
        self.server = server
        self.remote = remote  # "ip:port"
        self.remote_ip = remote.rsplit(":", 1)[0].strip("[]")
        # `pending` counts the deliveries' bytes, for max_output_bytes; no listener-wide
        # bound
        self.conn = Connection(
            stream,
            remote,
            "nsq",
            server.metrics,
            commit=server.broker.flush,
            commit_now=server.broker.flush_now,
            pass_end=server.broker.pass_end,
            turn_budget=server.turn_budget,
            batched_bytes=True,
        )
        # its wait, as a publisher, for the NATS subscribers it feeds faster than they read
        self.stall = Stall()
        self._owed = server.broker.owed  # which publishes wait for their commit
        self._flush_waits = server.broker.flush_waits  # see _read_more
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
        self._secret = b""
        # subscription
        self.group: Group | None = None
        self.consumer: Consumer | None = None
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self._auth_on = server.auth is not None
        # Deadlines, enforced by the _timers task rather than a cancel scope per read or
        # write (entering and leaving scopes was a fifth of a PUB round trip).
        self._next_heartbeat = 0.0
        self._read_deadline = math.inf
        self._timer_scope: trio.CancelScope | None = None
        self._metrics = server.metrics
        self._origin = f"nsq {remote}"  # of every message it publishes
        # a publish's failed commit, named for its command (see _publish)
        self._failed = {c: partial(self._failed_commit, c) for c in ("PUB", "MPUB", "DPUB", "SUB")}

    @property
    def stream(self) -> trio.abc.Stream:
        return self.conn.stream

    # -- life cycle ------------------------------------------------------------

    async def run(self) -> None:
        self.server.sessions.add(self)
        await self.conn.run(self._reader, self._timers, on_close=self._closed)

    def _closed(self) -> None:
        self.server.sessions.discard(self)
        if self.consumer is not None and self.group is not None:
            # nsqd leaves a leaving client's messages in flight until their timeout
            self.group.detach(self.consumer, requeue=False)

    def close(self) -> None:
        """End the connection from outside. The session detaches and closes its stream as
        on any other end."""
        self.conn.cancel()

    # the broker's word that the channel was deleted (over HTTP, here or on another
    # gateway sharing the store): nsqd closes its clients, who subscribe again
    group_closed = close

    def report_bytes(self) -> None:
        """The byte counters are batched (connection.ByteCount): a scrape wants them now."""
        self.conn.report_bytes()

    async def _reader(self) -> None:
        conn = self.conn
        now = trio.current_time()
        self._read_deadline = self._silence_deadline(now)
        self._next_heartbeat = now + self.heartbeat_interval
        max_output = self.server.max_output_bytes
        try:
            while True:
                if conn.commits_held >= AHEAD:
                    await conn.settled(AHEAD - 1)  # so many commits ahead at most
                if conn.pending > max_output:
                    # the client does not read: stop reading its commands until it does
                    await conn.flush_all()
                if self.stall.sessions:  # its publishes went to a NATS subscriber
                    await self.stall.wait()  # faster than that one reads (stall.py)
                data = await conn.receive(_RECEIVE_SIZE)
                self.stall.spent = 0.0
                if not data:
                    # the client closed its side: what it published is still answered
                    await conn.settled()
                    await conn.flush_all()
                    return
                try:
                    self.codec.receive_data(data)
                except CompressionError:
                    return  # nsqd drops the connection silently on a corrupt stream
                while await self._process():
                    # its turn is over (Turn): everyone else runs before the rest
                    await conn.turn.pause()
                    if conn.commits_held >= AHEAD:
                        await conn.settled(AHEAD - 1)
        except _Close as close:
            with trio.move_on_after(self.heartbeat_interval if self.heartbeat_interval > 0 else 5):
                # the peer may be gone before it could read why
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await conn.settled()  # earlier publishes' replies go first
                    # A commit that failed meanwhile has already queued E_PUB_FAILED, the
                    # connection's last words: a failing store also refuses this batch's
                    # publish, whose own E_PUB_FAILED would follow the first one.
                    if close.frame is not None and not conn.ended:
                        conn.protocol_error(close.frame[8:])
                        conn.out.append(close.frame)
                    await conn.flush_all()
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
        outbox back; the OKs of publishes wait in the reply gate for the batch's commit.
        """
        conn = self.conn
        codec = self.codec
        out = conn.out
        start = len(out)
        got_command = False
        delivered = self.message_count
        conn.holding = True
        deadline, self._read_deadline = self._read_deadline, math.inf  # not while processing
        more = False
        turn = conn.turn
        turn.start()
        try:
            while True:
                if turn.over():
                    more = True
                    break
                event = codec.next_event()
                if event is None:
                    if conn.open_commit is not None and self._flush_waits and self._read_more():
                        continue  # more input is here already: the same commit takes it
                    break
                got_command = True
                cls = event.__class__
                if cls is ev.FinBatch:
                    self._fins(event.ids)  # type: ignore[union-attr]
                elif cls is ev.Fin:
                    raw = event.msg_id  # type: ignore[union-attr]
                    self._fins((_parse_id(raw),), raw)
                elif cls is ev.Pub:
                    if self._auth_on:  # no coroutine per publish when auth is off
                        await self._check_auth("PUB", event.topic, "")  # type: ignore[union-attr]
                    self._publish(event.topic, [event.body], OK_FRAME)  # type: ignore[union-attr]
                elif cls is ev.Rdy:
                    if self.consumer is not None:
                        self.consumer.set_ready(event.count)  # type: ignore[union-attr]
                elif cls is ev.Mpub:
                    self._publish(event.topic, event.bodies, MPUB_OK_FRAME, command="MPUB")  # type: ignore[union-attr]
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
                    delay = event.defer_ms / 1000  # type: ignore[union-attr]
                    self._publish(event.topic, [event.body], DPUB_OK_FRAME, delay, "DPUB")  # type: ignore[union-attr]
                elif cls is ev.Sub:
                    await self._sub(event)  # type: ignore[arg-type]
                elif cls is ev.Cls:
                    if self.consumer is not None:
                        self.consumer.set_ready(0)
                    conn.out.append(CLOSE_WAIT_FRAME)
                elif cls is ev.Identify:
                    await conn.settled()  # the framing may change: earlier bytes first
                    await self._identify(event)  # type: ignore[arg-type]
                elif cls is ev.Auth:
                    await conn.settled()
                    await self._auth(event)  # type: ignore[arg-type]
                elif cls is ev.ProtocolError:
                    raise _Close(event.frame)  # type: ignore[union-attr]
        finally:
            self._read_deadline = (
                self._silence_deadline(trio.current_time()) if got_command else deadline
            )
            if self.group is not None and got_command:
                self.group.pump()  # refill the window once for the whole batch of FINs
            # the commit runs while the next batch is read; this batch's OKs wait for it
            conn.commit_soon()
            conn.holding = False
        if (
            conn.out is out
            and conn.held_from is None  # no OK waits for a commit
            and len(out) - start == 2 * (self.message_count - delivered)
            and self.consumer is not None
            and not self._send_deliveries(self.consumer)
        ):
            return more  # nothing but deliveries (two chunks each) since the batch began
        if conn.out:
            if conn.sending:
                conn.wake.set()
            else:
                # Reply from the reader's own task: one task switch less per round trip,
                # which is most of a PUB's latency. A client that stops reading blocks
                # its own reader here, as nsqd's does.
                await conn.flush()
        return more

    def _read_more(self) -> bool:
        """With a store whose flush waits (Redis, the durable store with fsync = "always"),
        what the client has already sent joins the batch before its commit, with one
        non-blocking read: a producer with several MPUBs outstanding (one read holds about
        three of 20 KB) then waits for one commit instead of one per read. Never when the
        commit does not wait (the memory store, the durable store's one write), where the
        read would usually find nothing."""
        conn = self.conn
        if conn.fd is None:
            return False
        data = try_read(conn.fd, _RECEIVE_SIZE)
        if not data:
            return False  # nothing there, or closed (the next receive sees it too)
        conn.bytes_in.inc(len(data))
        try:
            self.codec.receive_data(data)
        except CompressionError:
            raise _Close() from None  # nsqd drops the connection silently
        return True

    def _publish(
        self,
        topic: str,
        bodies: list[bytes],
        ok: bytes,
        delay: float = 0.0,
        command: str = "PUB",
    ) -> None:
        owed = self._owed
        before = owed.count
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
            # The store cannot write: nsqd's fatal E_PUB_FAILED (E_MPUB_FAILED,
            # E_DPUB_FAILED), after the replies queued before it.
            raise _Close(self._failed_frame(command, exc)) from None
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)
        if owed.count != before:
            self.conn.reply_after_commit(ok, self._failed[command], last=True)
        else:
            self.conn.out.append(ok)

    def _failed_commit(self, command: str, exc: StoreUnavailable) -> bytes:
        """A publish's (or a shared store's SUB's) commit failed: its OK becomes nsqd's
        fatal error, E_PUB_FAILED ... E_SUB_FAILED (counted here; the connection ends
        after it)."""
        frame = self._failed_frame(command, exc)
        self.conn.protocol_error(frame[8:])
        return frame

    @staticmethod
    def _failed_frame(command: str, exc: StoreUnavailable) -> bytes:
        return error_frame(f"E_{command}_FAILED {command} failed {exc}".encode())

    async def _timers(self) -> None:
        """Heartbeats, and nsqd's deadlines: the read deadline (two heartbeat intervals
        without a command) and the write deadline (a write blocked for a heartbeat
        interval; checked at each heartbeat, so it fires within one to two intervals)."""
        conn = self.conn
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
                if conn.out:
                    conn.wake.set()  # buffered deliveries: their time is up
            if now >= self._read_deadline:
                conn.cancel()  # silence: close without an error frame
                return
            if now >= self._next_heartbeat:
                if conn.blocked and conn.blocked_sends == watched_sends:
                    conn.cancel()  # a write stuck since the last heartbeat
                    return
                watched_sends = conn.blocked_sends if conn.blocked else -1
                conn.out.append(HEARTBEAT_FRAME)
                conn.wake.set()
                self._next_heartbeat += self.heartbeat_interval

    # -- IDENTIFY and AUTH -------------------------------------------------------------

    async def _identify(self, event: ev.Identify) -> None:
        features = self.server.features
        out = self.conn.out
        try:
            identity = identify(event.body, features, self.remote_ip)
        except IdentifyError as exc:
            raise _Close(error_frame(str(exc).encode())) from None
        if identity.snappy and identity.deflate:
            raise _Close(
                error_frame(b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
            )
        self._apply_identity(identity)
        if not identity.feature_negotiation:
            out.append(OK_FRAME)
            self.codec.resume()
            return
        out.append(response_frame(negotiation_response(identity, features)))
        if not (identity.tls_v1 or identity.snappy or identity.deflate):
            self.codec.resume()
            return
        # Upgrades: the JSON goes out in plain text first, then each step answers OK in
        # its new framing (docs/protocols/nsq.md §9). The client sends nothing until each OK.
        await self.conn.flush_all()
        if identity.tls_v1:
            await self._upgrade_tls()
            await self._send_now(OK_FRAME)
        if identity.snappy:
            snappy = SnappyStream()
            self.codec.set_decoder(snappy.decode)
            self.conn.encode = snappy.encode
            self.snappy = True
            await self._send_now(OK_FRAME)
        if identity.deflate:
            deflate = DeflateStream(identity.deflate_level)
            self.codec.set_decoder(deflate.decode)
            self.conn.encode = deflate.encode
            self.deflate = True
            await self._send_now(OK_FRAME)
        self.codec.resume()

    async def _send_now(self, frame: bytes) -> None:
        self.conn.out.append(frame)
        await self.conn.flush_all()

    def _apply_identity(self, identity: Identity) -> None:
        self.client_id = identity.client_id
        self.hostname = identity.hostname
        self.user_agent = identity.user_agent
        self.sample_rate = identity.sample_rate
        self.msg_timeout = identity.msg_timeout / 1000
        self.output_buffer_size = identity.output_buffer_size
        self.output_buffer_timeout = identity.output_buffer_timeout / 1000
        if self.consumer is not None:
            self.consumer.timeout = self.msg_timeout
        now = trio.current_time()
        if identity.heartbeat_interval == -1:
            self.codec.heartbeats_disabled = True
            self.heartbeat_interval = 0.0
            self._next_heartbeat = math.inf
        else:
            self.codec.heartbeats_disabled = False
            self.heartbeat_interval = identity.heartbeat_interval / 1000
            self._next_heartbeat = now + self.heartbeat_interval
        if self._timer_scope is not None:
            self._timer_scope.deadline = min(self._next_heartbeat, self._flush_at)

    async def _upgrade_tls(self) -> None:
        assert self.server.ssl_context is not None
        if self.codec.buffered:
            raise _Close()  # the client must wait for the JSON before its TLS hello
        try:
            await self.conn.start_tls(self.server.ssl_context, _TLS_HANDSHAKE_TIMEOUT)
        except HandshakeFailed:
            raise _Close() from None
        self.tls = True
        self.codec.tls_required = False

    async def _auth(self, event: ev.Auth) -> None:
        if self.auth_state is not None:
            raise _Close(error_frame(b"E_INVALID AUTH already set"))
        if self.server.auth is None:
            raise _Close(error_frame(b"E_AUTH_DISABLED AUTH disabled"))
        state = await self._query_auth(event.secret)
        if not state.authorizations:
            raise _Close(error_frame(b"E_UNAUTHORIZED AUTH no authorizations found"))
        self.auth_state = state
        self._secret = event.secret
        self.conn.out.append(response_frame(state.response_json()))

    async def _query_auth(self, secret: bytes) -> AuthState:
        assert self.server.auth is not None
        try:
            return await self.server.auth.query(
                secret.decode("utf-8", "surrogateescape"), self.remote_ip, self.tls
            )
        except AuthFailed:
            raise _Close(error_frame(b"E_AUTH_FAILED AUTH failed")) from None

    async def _check_auth(self, cmd: str, topic: str, channel: str) -> None:
        if self.server.auth is None:
            return
        state = self.auth_state
        if state is None or not state.authorizations:
            raise _Close(error_frame(f"E_AUTH_FIRST AUTH required before {cmd}".encode()))
        if state.is_expired(trio.current_time()):
            state = self.auth_state = await self._query_auth(self._secret)
        if not state.is_allowed(topic, channel, "subscribe" if cmd == "SUB" else "publish"):
            raise _Close(
                error_frame(
                    f'E_UNAUTHORIZED AUTH failed for {cmd} on "{topic}" "{channel}"'.encode()
                )
            )

    # -- SUB, FIN, REQ, TOUCH ---------------------------------------------------------

    async def _sub(self, event: ev.Sub) -> None:
        await self._check_auth("SUB", event.topic, event.channel)
        before = self._owed.count
        group = self.server.broker.group(
            event.topic,
            event.channel,
            ephemeral_topic=is_ephemeral(event.topic),
            ephemeral=is_ephemeral(event.channel),
        )
        self.group = group
        self.consumer = group.attach(self, self.msg_timeout)
        if self._owed.count != before:
            # a store shared with other gateways: the channel is in it before the OK, so a
            # publish on another gateway right after the OK reaches the channel too
            self.conn.reply_after_commit(OK_FRAME, self._failed["SUB"], last=True)
        else:
            self.conn.out.append(OK_FRAME)

    def _fins(self, ids: Sequence[int | None], raw: bytes = b"") -> None:
        """FINs of `ids`; None: one that names no id of ours (`raw`: as the client sent
        it, the one id of a lone FIN; a batch's are well formed, so written back)."""
        group = self.group
        assert group is not None
        refused = group.finish_many(self.consumer, ids)
        for k, outcome in refused:
            i = ids[k]
            sent = raw if i is None else b"%016x" % i
            self.conn.out.append(self._refused(b"E_FIN_FAILED FIN", sent, outcome))
        self.finish_count += len(ids) - len(refused)

    def _req(self, event: ev.Req) -> None:
        msg_id = _parse_id(event.msg_id)
        assert self.group is not None
        # nsqd clamps a REQ timeout past max-req-timeout silently (pynsq's default backoff
        # of 90 s x attempts passes one hour after 40 attempts)
        delay = min(event.timeout_ms, self.server.max_req_timeout) / 1000
        outcome = (
            Outcome.NOT_IN_FLIGHT
            if msg_id is None
            else self.group.requeue(self.consumer, msg_id, delay, pump=False)
        )
        if outcome:
            self.conn.out.append(self._refused(b"E_REQ_FAILED REQ", event.msg_id, outcome))
        else:
            self.requeue_count += 1

    def _touch(self, event: ev.Touch) -> None:
        msg_id = _parse_id(event.msg_id)
        assert self.group is not None
        outcome = (
            Outcome.NOT_IN_FLIGHT
            if msg_id is None
            else self.group.touch(
                self.consumer, msg_id, self.msg_timeout, self.server.max_msg_timeout / 1000
            )
        )
        if outcome:
            self.conn.out.append(self._refused(b"E_TOUCH_FAILED TOUCH", event.msg_id, outcome))

    def _refused(self, prefix: bytes, msg_id: bytes, outcome: Outcome) -> bytes:
        reason = _NOT_OWNER if outcome is Outcome.NOT_OWNER else _NOT_IN_FLIGHT
        text = b"%s %s failed %s" % (prefix, msg_id, reason)
        self.conn.protocol_error(text)
        return error_frame(text)

    # -- delivery (called by the broker, synchronously) --------------------------

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        # sample_rate N: nsqd drops about (99-N)% of this client's messages for the channel
        if self.sample_rate and random.randrange(100) > self.sample_rate:
            return False
        # header and body go separately: the writer's join copies the body once
        body = message.body
        conn = self.conn
        out = conn.out
        out.append(message_header(len(body), message.timestamp, message.attempts, message.id))
        out.append(body)
        conn.pending += 34 + len(body)
        self.message_count += 1
        if not conn.holding and self._send_deliveries(consumer):
            conn.wake.set()  # from another task: the writer sends them
        return True

    def _send_deliveries(self, consumer: Consumer) -> bool:
        """Whether queued deliveries go out now, as nsqd's messagePump decides: when they
        fill output_buffer_size, or the client's window is full (it waits for them);
        otherwise output_buffer_timeout after the first at the latest (the timer is set
        here), or with the next reply to a command. A stream of single publishes thus
        reaches a busy consumer in one write per buffer, not one write per message, and
        FINs, which nsqd does not answer, do not flush either."""
        if (
            self.conn.pending >= self.output_buffer_size
            or consumer.in_flight >= consumer.ready
            or not self.output_buffer_timeout
        ):
            return True
        if self._flush_at == math.inf:
            self._flush_at = at = trio.current_time() + self.output_buffer_timeout
            scope = self._timer_scope
            if scope is not None and at < scope.deadline:
                scope.deadline = at
        return False

    # -- views -----------------------------------------------------------------------

    @property
    def state(self) -> int:
        """nsqd's client state numbers for /stats: 0 until SUB (nsqd never sets its
        "connected" 2 on a client), 3 subscribed, 4 closing."""
        return {State.INIT: 0, State.SUBSCRIBED: 3, State.CLOSING: 4}.get(self.codec.state, 1)

    def client_info(self) -> ClientInfo:
        """What /stats shows of this connection (clientV2 stats), as values."""
        consumer = self.consumer
        auth = self.auth_state
        if auth is not None and not auth.authorizations:
            auth = None  # nsqd shows authed fields once the auth server granted something
        return ClientInfo(
            client_id=self.client_id,
            hostname=self.hostname,
            version="V2",
            remote_address=self.remote,
            state=self.state,
            ready_count=consumer.ready if consumer is not None else 0,
            in_flight_count=consumer.in_flight if consumer is not None else 0,
            message_count=self.message_count,
            finish_count=self.finish_count,
            requeue_count=self.requeue_count,
            connect_ts=self.connect_ts,
            sample_rate=self.sample_rate,
            deflate=self.deflate,
            snappy=self.snappy,
            user_agent=self.user_agent,
            tls=TLSInfo.of(self.stream) if self.tls else None,
            authed=auth is not None,
            auth_identity=auth.identity if auth is not None else "",
            auth_identity_url=auth.identity_url if auth is not None else "",
            pub_counts=tuple(self.pub_counts.items()),
        )
