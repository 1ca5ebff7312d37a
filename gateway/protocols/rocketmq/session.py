"""One RocketMQ remoting connection: nameserver and broker requests, on the TCP shell.

The reader parses every complete frame of one receive and answers them in order of
arrival: a send's answer waits in the connection shell's reply gate for the store commit
the broker says it needs (one commit for the batch's sends), and a pull with nothing to
return is held in a task of its own until a message arrives in its queue or its suspend
time runs out (a long poll must not block the other requests on the connection; clients
match answers by opaque, in any order; notes 1). Its Consumer (consume.py) and Producer
(produce.py) answer the broker's requests; a handler refuses one with rq.BadRequest.

A framing error (negative or oversize length, header past the frame, undecodable header)
closes the connection without an answer, as NettyDecoder does; any other bad request gets
an error response with its opaque.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import trio

from gateway.broker.errors import StoreUnavailable
from gateway.connection import Connection
from gateway.protocols.rocketmq import requests as rq
from gateway.protocols.rocketmq.codec import (
    RemotingCodec,
    ResponseCode,
    encode_response,
    not_supported,
    ok,
)
from gateway.protocols.rocketmq.codes import RequestCode
from gateway.protocols.rocketmq.consume import Consumer
from gateway.protocols.rocketmq.events import ProtocolError, Request
from gateway.protocols.rocketmq.mapping import valid_topic
from gateway.protocols.rocketmq.produce import Producer
from gateway.protocols.rocketmq.server import RocketMQServer

log = logging.getLogger("gateway.rocketmq")

_RECEIVE_SIZE = 65536
PROTOCOL = "rocketmq"

Answer = bytes | None
# the requests that publish: their answers acknowledge what the store keeps
_SENDS = frozenset(
    {
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.CONSUMER_SEND_MSG_BACK,
    }
)


class RocketMQSession:
    protocol = PROTOCOL

    def __init__(self, server: RocketMQServer, stream: trio.abc.Stream, remote: str) -> None:
        self.server = server
        self.remote = remote
        broker = server.broker
        self.conn = Connection(
            stream,
            remote,
            PROTOCOL,
            server.metrics,
            commit=broker.flush,
            commit_now=broker.flush_now,
            pass_end=broker.pass_end,
        )
        self._owed = server.broker.owed  # which sends' answers wait for their commit
        self.codec = RemotingCodec(server.max_frame_size, server.max_header_size)
        self._metrics = server.metrics
        self.consumer = consumer = Consumer(server, self.conn, self._answer)
        producer = Producer(server, f"{PROTOCOL} {remote}")
        self._handlers: dict[int, Callable[[Request], Answer]] = {
            RequestCode.SEND_MESSAGE_V2: producer.send_message,
            RequestCode.SEND_MESSAGE: producer.send_message,
            RequestCode.SEND_BATCH_MESSAGE: producer.send_batch,
            RequestCode.PULL_MESSAGE: consumer.pull,
            RequestCode.QUERY_CONSUMER_OFFSET: consumer.query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: consumer.update_offset,
            RequestCode.GET_MAX_OFFSET: consumer.max_offset,
            RequestCode.GET_MIN_OFFSET: consumer.min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: consumer.search_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: consumer.earliest_time,
            RequestCode.HEART_BEAT: consumer.heartbeat,
            RequestCode.UNREGISTER_CLIENT: consumer.unregister,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer.consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: producer.send_back,
            RequestCode.LOCK_BATCH_MQ: consumer.lock,
            RequestCode.UNLOCK_BATCH_MQ: consumer.unlock,
            RequestCode.CHECK_CLIENT_CONFIG: ok,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
        }

    # -- life cycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        self.server.sessions.add(self)
        await self.conn.run(self._reader, on_close=self._closed)

    def _closed(self) -> None:
        self.server.sessions.discard(self)
        self.consumer.leave_all()

    def close(self) -> None:
        self.conn.cancel()

    async def _reader(self) -> None:
        conn = self.conn
        limit = self.server.max_output_bytes
        while True:
            # the peer does not read its answers: neither do we read its requests, until
            # what waits is written (the writer may be blocked in a send right now)
            if conn.pending > limit:
                await conn.flush_all()
            data = await conn.receive(_RECEIVE_SIZE)
            if not data:
                return
            self.codec.receive_data(data)
            if not await self._process():
                await conn.flush()
                return

    async def _process(self) -> bool:
        """Answer every complete frame; False when the stream cannot be read further."""
        conn = self.conn
        owed = self._owed
        keep_open = True
        for event in self.codec.events():
            if event.__class__ is Request:
                before = owed.count
                answer = self._answer(event)  # type: ignore[arg-type]
                if answer is None:
                    continue
                if owed.count != before:
                    # it changed what must be stored before it is answered (a send; with
                    # a shared store any change: an offset, a consumer group, a pull's
                    # claims); a failed commit turns a send's answer into an error, the
                    # others' only wait for it
                    code = event.code  # type: ignore[union-attr]
                    failed = partial(self._store_failed, event) if code in _SENDS else None
                    conn.reply_after_commit(answer, failed)
                else:
                    conn.out.append(answer)
                    conn.pending += len(answer)
            elif event.__class__ is ProtocolError:
                self.conn.protocol_error("FRAME")
                log.info("rocketmq connection from %s closed: %s", self.remote, event.reason)  # type: ignore[union-attr]
                keep_open = False
            # a Response answers a request the gateway sent; nothing waits for it
        await conn.commit()  # the sends' group commit, if they wait for one
        if not conn.sending:
            conn.write_queued()
        return keep_open

    def _answer(self, request: Request) -> Answer:
        handler = self._handlers.get(request.code)
        if handler is None:
            self.conn.protocol_error(
                f"REQUEST_CODE_NOT_SUPPORTED {request.code}", "REQUEST_CODE_NOT_SUPPORTED"
            )
            return None if request.oneway else not_supported(request)
        try:
            answer = handler(request)
        except rq.BadRequest as exc:
            answer = self._error(request, exc.code, exc.remark)
        except StoreUnavailable as exc:
            answer = self._error(
                request, ResponseCode.SERVICE_NOT_AVAILABLE, f"store unavailable: {exc}"
            )
        except Exception as exc:
            # A Java broker's request processor answers SYSTEM_ERROR for what it did not
            # foresee, and the connection (with its other requests, held pulls) lives on.
            log.exception("rocketmq %s: request code %d failed", self.remote, request.code)
            answer = self._error(request, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}")
        return None if request.oneway else answer

    def _error(self, request: Request, code: int, remark: str) -> bytes:
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        self.conn.protocol_error(f"{name} {remark}", name)
        return encode_response(
            request.opaque, code, remark=remark, serialize_type=request.serialize_type
        )

    def _store_failed(self, request: Request, exc: StoreUnavailable) -> bytes:
        """A send whose commit failed: the error a Java broker answers when it cannot
        store."""
        return self._error(request, ResponseCode.SERVICE_NOT_AVAILABLE, f"store unavailable: {exc}")

    # -- nameserver ---------------------------------------------------------------------------

    def _route(self, request: Request) -> bytes:
        topic = request.ext_fields.get("topic", "")
        # A route for any valid name: ali-ons never falls back to TBW102 and fails a send
        # at once on TOPIC_NOT_EXIST (notes 4.1). TBW102 is Java's template topic, which a
        # real nameserver does not know either.
        if not valid_topic(topic) or topic == "TBW102":
            raise rq.BadRequest(
                f"No topic route info in name server for the topic: {topic[:140]}",
                ResponseCode.TOPIC_NOT_EXIST,
            )
        return ok(request, body=self.server.route(topic))

    def _cluster_info(self, request: Request) -> bytes:
        return ok(request, body=self.server.cluster_info())
