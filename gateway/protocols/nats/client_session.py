"""One NATS client connection (nats-py, nats.js, ... talking to the gateway directly).

Subjects are topics. A subscription is a broker tap: it sees every message published to a
topic its subject matches, from any protocol, as it is published (NATS core's
at-most-once delivery). A queue subscription joins the tap queue of its (subject, queue)
pair, which hands each message to one member. A NATS publish goes into the topic's groups
only when the topic exists (an NSQ channel or a beanstalkd tube made it): a subject
nobody keeps is not stored, as nats-server keeps nothing.
"""

from __future__ import annotations

import logging

import trio

from gateway.broker import query
from gateway.broker.errors import StoreUnavailable
from gateway.connection import Connection, HandshakeFailed
from gateway.model import Message
from gateway.protocols.nats import client_codec as cc
from gateway.protocols.nats import client_events as ev
from gateway.protocols.nats.headers import encode_headers, parse_headers
from gateway.protocols.nats.permissions import Permissions, violation
from gateway.protocols.nats.server import NATSServer
from gateway.stall import Stall
from gateway.subjects import is_valid_subject, is_valid_subscription, matches

# what _process tells the reader
_DONE, _MORE, _CLOSE = object(), object(), object()

log = logging.getLogger("gateway.nats")

_RECEIVE_SIZE = 65536
_NO_RESPONDERS = b"NATS/1.0 503\r\n\r\n"
# nats-server's firstClientPingInterval: the first PING to a client comes this soon (or at
# ping_interval, if shorter), then every ping_interval.
_FIRST_PING = 2.0


class Subscription:
    """A client's SUB: the broker calls `tap` for every message on a matching subject."""

    __slots__ = (
        "_names",
        "_topic",
        "delivered",
        "dropped",
        "filtered",
        "max_msgs",
        "queue",
        "session",
        "sid",
        "subject",
    )

    def __init__(self, session: NATSClientSession, subject: str, queue: str | None, sid: str):
        self.session = session
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.max_msgs: int | None = None
        self.delivered = 0
        self.dropped = False  # unsubscribed, or its max reached (a batch may still come)
        # a wildcard that overlaps the user's subscribe deny list: each message is checked
        perms = session.perms
        self.filtered = perms is not None and perms.filters_delivery(subject)
        # the topic of the last message and its frames' `<subject> <sid>`: a subscription
        # usually sees one subject, so that is encoded once, not once per message
        self._topic: str | None = None
        self._names = b""

    def tap(self, message: Message, publisher: object | None) -> bool:
        """Deliver; False when declined (a queue group then tries another member)."""
        session = self.session
        if self.dropped or (publisher is session and not session.echo):
            return False
        if self.filtered and not session.perms.can_receive(message.topic):  # type: ignore[union-attr]
            return False
        self.delivered += 1
        topic = message.topic
        if topic != self._topic:
            self._topic = topic
            self._names = cc.msg_names(topic, self.sid)
        session.send_message(self._names, message, publisher)
        if self.max_msgs is not None and self.delivered >= self.max_msgs:
            session.drop(self)
        return True


class NATSClientSession:
    def __init__(self, server: NATSServer, stream: trio.abc.Stream, remote: str) -> None:
        self.server = server
        self.remote = remote
        # output counts in the listener's max_buffered_bytes; a send waiting past
        # write_deadline ends the connection, a slow consumer as nats-server says
        self.conn = conn = Connection(
            stream,
            remote,
            "nats",
            server.metrics,
            buffered=server.buffered,
            turn_budget=server.turn_budget,
            max_errors_in_a_row=server.max_errors_in_a_row,
            write_deadline=server.write_deadline,
        )
        conn.stall_mark = self._stall_mark
        conn.on_write_stalled = self._write_stalled
        self.codec = cc.NATSClientCodec(server.max_payload, server.max_control_line)
        self.codec.require_connect = server.auth_required
        self.subs: dict[str, Subscription] = {}
        self.connected = False
        self.verbose = True  # nats-server's, until CONNECT says otherwise
        self.pedantic = True
        self.echo = True
        self.headers = False
        self.no_responders = False
        self.name = ""
        self.perms: Permissions | None = None  # the user's, from CONNECT; None: all
        self._erred = False
        self.client_id = server.take_client_id()
        # past this, the publishers feeding it stall (nats-server's c.out.mp/4*3)
        self._stall_at = server.max_pending // 4 * 3
        self.stall = Stall()  # its own wait, as a publisher
        self._origin = f"nats {remote}"
        self._pings_out = 0
        self._heard = False  # anything read since the last ping tick
        self._metrics = server.metrics

    # -- life cycle -------------------------------------------------------------

    async def run(self) -> None:
        server = self.server
        server.sessions.add(self)
        tasks = (self._pinger, self._auth_timer) if server.auth_required else (self._pinger,)
        await self.conn.run(self._serve, *tasks, on_close=self._closed)

    async def _serve(self) -> None:
        self.conn.out.append(self.server.info(self.client_id, self.remote))
        await self.conn.flush()
        if self.server.ssl_context is None or await self._start_tls():
            await self._reader()

    def _closed(self) -> None:
        self.server.sessions.discard(self)
        for sub in list(self.subs.values()):
            self.drop(sub)

    async def _start_tls(self) -> bool:
        """nats-server's TLS: the client starts its handshake right after INFO; one that
        does not, or fails it, is closed (False)."""
        assert self.server.ssl_context is not None
        try:
            await self.conn.start_tls(self.server.ssl_context, self.server.tls_timeout)
        except HandshakeFailed as exc:
            log.info("nats client %s: %s", self.remote, exc)
            self._metrics.protocol_error("nats", "TLS_HANDSHAKE")
            return False
        return True

    async def _auth_timer(self) -> None:
        """nats-server's auth_timeout: a client that must authenticate and has not sent
        CONNECT in time gets 'Authentication Timeout' and is closed."""
        await trio.sleep(self.server.auth_timeout)
        if not self.connected:
            self._error("Authentication Timeout")
            log.info(
                "nats client %s: no CONNECT within %s s", self.remote, self.server.auth_timeout
            )
            try:
                await self.conn.flush()
            finally:
                self.conn.cancel()

    async def _pinger(self) -> None:
        """nats-server's ping timer: PING an idle client every ping_interval; a client that
        leaves ping_max PINGs unanswered gets 'Stale Connection' and is closed. A client
        heard from since the last tick is not pinged (nats-server skips it too)."""
        interval = self.server.ping_interval
        await trio.sleep(min(interval, _FIRST_PING))
        while True:
            if self._heard or (not self.connected and self.server.auth_required):
                # a client that must authenticate is not PINGed before its CONNECT, as
                # nats-server does not: the auth timer ends it if CONNECT never comes
                self._heard = False
                self._pings_out = 0
            elif self._pings_out + 1 > self.server.ping_max:
                self._error("Stale Connection")
                log.info("nats client %s is stale: closing", self.remote)
                try:
                    await self.conn.flush()
                finally:
                    self.conn.cancel()
                return
            else:
                self._pings_out += 1
                self.conn.out.append(cc.PING)
                self.conn.wake.set()
            await trio.sleep(interval)

    async def _reader(self) -> None:
        conn = self.conn
        stall = self.stall
        while True:
            data = await conn.receive(_RECEIVE_SIZE)
            if not data:
                return
            stall.spent = 0.0  # its stall budget is per receive, as nats-server's per read
            self._heard = True
            self.codec.receive_data(data)
            while True:
                # Deliveries made while a client's batch is applied are written at its
                # end, one write per session (see send_message).
                server = self.server
                server.in_batch = True
                try:
                    outcome = self._process()
                finally:
                    server.in_batch = False
                    dirty = server.dirty
                    for session in dirty:
                        if session is not self:  # (its own output is flushed below)
                            session.write_now()
                    dirty.clear()
                if outcome is _CLOSE:
                    await conn.flush()
                    return
                if outcome is _DONE or conn.turn.flush_due():  # tcp.PAUSES_PER_FLUSH
                    if not conn.sending:
                        await conn.flush()
                    else:
                        conn.wake.set()
                if stall.sessions:  # it fed some subscriber faster than that one reads
                    await stall.wait()
                if outcome is _DONE:
                    break
                # its turn is over (Turn): everyone else runs before the rest of the buffer
                await conn.turn.pause()

    # -- commands -----------------------------------------------------------------

    def _process(self) -> object:
        """Apply the complete operations of one turn: _DONE when none is left, _MORE when
        the turn ended first, _CLOSE when the connection must close."""
        conn = self.conn
        out = conn.out
        turn = conn.turn
        turn.start()
        codec = self.codec
        while True:
            if self._erred:  # the last operation was answered with -ERR
                self._erred = False
                if conn.too_many_errors():
                    return _CLOSE
            else:
                conn.errors_in_a_row = 0
            if turn.over():
                return _MORE
            event = codec.next_event()
            if event is None:
                break
            cls = event.__class__
            if not self.connected and cls is not ev.Connect and self.server.auth_required:
                self._error("Authorization Violation")
                return _CLOSE
            if cls is ev.Pub:  # (a publish says its own +OK)
                self._publish(event.subject, event.reply, event.payload, None)  # type: ignore[union-attr]
                continue
            if cls is ev.HPub:
                self._publish(event.subject, event.reply, event.payload, event.headers)  # type: ignore[union-attr]
                continue
            if cls is ev.Ping:
                out.append(cc.PONG)
                continue
            elif cls is ev.Pong:
                self._pings_out = 0
                continue
            elif cls is ev.Sub:
                if not self._subscribe(event):  # type: ignore[arg-type]
                    continue
            elif cls is ev.Unsub:
                self._unsubscribe(event)  # type: ignore[arg-type]
            elif cls is ev.Connect:
                if not self._connect(event):  # type: ignore[arg-type]
                    return _CLOSE
            elif cls is ev.ProtocolError:
                if event.reply is not None:  # type: ignore[union-attr]
                    out.append(event.reply)  # type: ignore[union-attr]
                    self.conn.protocol_error(event.reply, event.reply[6:-3])  # type: ignore[union-attr]
                if event.close:  # type: ignore[union-attr]
                    return _CLOSE
                continue
            if self.verbose:
                out.append(cc.OK)
        return _DONE

    def _error(self, text: str) -> None:
        self.conn.out.append(cc.err(text))
        self.conn.protocol_error(text)
        self._erred = True
        self.conn.errors_in_a_row += 1

    def _connect(self, event: ev.Connect) -> bool:
        options = event.options
        option = cc.connect_option
        accepted, self.perms = self.server.authenticate(
            option(options, "user"), option(options, "pass"), option(options, "auth_token")
        )
        if not accepted:
            self._error("Authorization Violation")
            return False
        # nats-server's defaults for what CONNECT leaves out: verbose and pedantic on
        self.verbose = option(options, "verbose", True) is not False
        self.pedantic = option(options, "pedantic", True) is not False
        self.echo = option(options, "echo", True) is not False
        self.headers = option(options, "headers") is True
        self.no_responders = option(options, "no_responders") is True
        if self.no_responders and not self.headers:
            self._error("no responders requires headers support")
            return False
        name = option(options, "name", "")
        # str() of a deeply nested JSON value raises RecursionError; nats-server reads the
        # field as a string anyway
        self.name = name if isinstance(name, str) else ""
        self.connected = True
        return True

    def _publish(
        self, subject: str, reply: str | None, payload: bytes, block: bytes | None
    ) -> None:
        """nats-server's order: pedantic check, permission check, +OK (verbose), MSGs."""
        if self.pedantic and not is_valid_subject(subject):
            self._error("Invalid Publish Subject")  # nats-server publishes it all the same
        if self.perms is not None and not self.perms.can_publish(subject):
            # nats-server: the message is dropped, the connection stays
            self._error(violation("Publish", subject))
            return
        if self.verbose:
            self.conn.out.append(cc.OK)
        broker = self.server.broker
        # a request nobody can serve gets a 503: no queue keeps its subject (as it was
        # before this publish) and no subscription takes it
        served = not reply or not self.no_responders or query.has_groups(broker, subject)
        unserved = None if served else reply
        try:
            _, reached = broker.publish(
                subject,
                [payload],
                headers=parse_headers(block) if block else None,
                header_block=block or None,  # HPUB of 0 header bytes: a plain MSG, as nats-server
                reply_to=reply,
                origin=self._origin,
                create=False,
                publisher=self,
            )
        except StoreUnavailable:
            # a subject a queue keeps, and the store cannot write: nothing was queued; the
            # connection stays up (NATS publishes are at most once)
            self._error("Store Unavailable")
            return
        if unserved and not reached:  # (its own sub with echo off: not reached)
            self._answer_no_responders(unserved)

    def _answer_no_responders(self, reply: str) -> None:
        """nats-server's answer to a request nobody can serve: a 503 status on the reply
        subject, to the requester's own subscription for it."""
        for sub in self.subs.values():
            if matches(sub.subject.split("."), reply.split(".")):
                self.conn.out.append(cc.hmsg(reply, sub.sid, None, _NO_RESPONDERS, b""))
                return

    def _subscribe(self, event: ev.Sub) -> bool:
        if not is_valid_subscription(event.subject):
            self._error("Invalid Subject")
            return False
        if self.perms is not None and not self.perms.can_subscribe(event.subject):
            self._error(violation("Subscription", event.subject, event.queue))
            return False
        if event.sid in self.subs:
            return True  # nats-server keeps the subscription it has under that sid
        sub = Subscription(self, event.subject, event.queue, event.sid)
        self.subs[event.sid] = sub
        self.server.broker.subscribe(event.subject, sub, event.queue)
        return True

    def _unsubscribe(self, event: ev.Unsub) -> None:
        sub = self.subs.get(event.sid)
        if sub is None:
            return
        if event.max_msgs and event.max_msgs > sub.delivered:
            sub.max_msgs = event.max_msgs
        else:
            self.drop(sub)

    def drop(self, sub: Subscription) -> None:
        sub.dropped = True
        if self.subs.get(sub.sid) is sub:
            del self.subs[sub.sid]
            self.server.broker.unsubscribe(sub.subject, sub, sub.queue)

    # -- delivery (called by the broker, synchronously) ---------------------------------

    def send_message(self, names: bytes, message: Message, publisher: object | None) -> None:
        """Queue `message` as MSG (HMSG) for the subscription whose frames start with
        `names` (client_codec.msg_names). The queue is written by whoever comes first: at
        the end of the client batch that published it (write_now), or by the writer task,
        woken once when the queue stops being empty, not once per message. Past its stall
        mark, `publisher` (a session with a Stall) waits for it after its batch."""
        block = message.header_block
        if block is None and message.headers:
            block = encode_headers(message.headers)
        if block is not None and self.headers:
            frame = cc.hmsg_frame(names, message.reply_to, block, message.body)
        else:
            frame = cc.msg_frame(names, message.reply_to, message.body)
        conn = self.conn
        out = conn.out
        if not out:
            server = self.server
            if server.in_batch:
                server.dirty.append(self)
            else:
                conn.wake.set()
        out.append(frame)
        size = len(frame)
        pending = conn.pending = conn.pending + size
        buffered = conn.buffered
        buffered.total += size
        if pending > self._stall_at or buffered.total > buffered.stall_at:
            self._over(size, publisher)

    def _over(self, size: int, publisher: object | None) -> None:
        """Past a stall mark (send_message): nats-server's slow consumer past
        max_pending (queueOutbound), the same past the listener's max_buffered_bytes for
        one that had over its share waiting before this message; otherwise the
        publisher stalls for it. Every byte counted is one its socket has not taken."""
        pending = self.conn.pending
        buffered = self.conn.buffered
        if pending > self.server.max_pending:
            self._slow_consumer(f"{pending} bytes wait for it, over max_pending")
        elif buffered.total > buffered.limit and pending - size > buffered.share:
            # its count before this message: one that reads has next to nothing waiting
            # once its publishers stalled for it, whatever the size of the next message
            self._slow_consumer(f"{pending} bytes wait for it, over max_buffered_bytes")
        elif pending > self._stall_mark():
            stall = getattr(publisher, "stall", None)  # a route or HTTP: none
            if stall is not None:
                stall.add(self.conn)

    def _stall_mark(self) -> int:
        """The output past which its publishers stall (connection.Connection.stall_mark)."""
        buffered = self.conn.buffered
        if buffered.total > buffered.stall_at:
            # near the listener-wide bound: drained to 3/4 of its share, it stays
            return min(self._stall_at, buffered.share // 4 * 3)
        return self._stall_at

    def _write_stalled(self) -> None:
        self._slow_consumer(f"a write waited {self.server.write_deadline:g} s (write_deadline)")

    def _slow_consumer(self, why: str) -> None:
        """nats-server's slow consumer: the client cannot keep up, so it is cut off, with
        nothing said on the wire (nats-server's close skips the flush for it; a client
        library told -ERR would close for good instead of reconnecting). Said in the log
        and counted once; its subscriptions take nothing more (a queue group's next
        member does) while its task ends, and no publisher waits for it."""
        if not self.conn.cancel_scope.cancel_called:
            log.info("nats client %s is a slow consumer (%s): closing", self.remote, why)
            self._metrics.protocol_error("nats", "SLOW_CONSUMER")
            for sub in self.subs.values():
                sub.dropped = True
            self.conn.unstall()
        self.conn.cancel()

    def write_now(self) -> None:
        """Write what is queued, without waiting for the writer task: called at the end of
        a NATS client's batch for every session it delivered to, so a request reaches its
        responder (and the reply its requester) in the publisher's turn, one write each."""
        if self.conn.fd is None:
            self.conn.wake.set()  # TLS: only the writer task writes
        else:
            self.conn.write_queued()
