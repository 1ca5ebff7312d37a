"""Sends: SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, and CONSUMER_SEND_MSG_BACK.

A send becomes one broker publish: the topic is the topic, the body is stored
uncompressed (so other protocols' consumers read the bytes the producer meant), the
properties become headers, a DELAY level becomes the publish delay. Its answer leaves
after the store commit that covers it, when the broker says it must (the session's
reply gate).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from gateway.model import Message
from gateway.protocols.rocketmq import requests as rq
from gateway.protocols.rocketmq.codec import ResponseCode, ok
from gateway.protocols.rocketmq.codes import SEND_V2_FIELDS, RequestCode
from gateway.protocols.rocketmq.events import Request, SerializeType
from gateway.protocols.rocketmq.mapping import (
    DELAY,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    RECONSUME_TIME,
    RETRY_PREFIX,
    RETRY_TOPIC,
    TRANSACTION_PREPARED,
    dlq_topic,
    header,
    headers_from_properties,
    inflate,
    int_header,
    retry_topic,
)
from gateway.protocols.rocketmq.message import (
    SYSFLAG_COMPRESSED,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    MalformedBody,
    decode_batch_body,
)

if TYPE_CHECKING:
    from gateway.protocols.rocketmq.server import RocketMQServer

# DefaultMQPushConsumer.maxReconsumeTimes: what a send-back without the field means
DEFAULT_MAX_RECONSUME_TIMES = 16
# A SUCCESS answer to a send, as encode_response writes it (keys in fastjson's order; the
# extFields MSG_REGION and TRACE_ON are what a Java broker adds, read but not required).
_SEND_OK_JSON = (
    '{{"code":0,"extFields":{{"msgId":"{}","queueId":"{}","queueOffset":"{}",'
    '"MSG_REGION":"DefaultRegion","TRACE_ON":"true"}},"flag":1,"language":"JAVA",'
    '"opaque":{},"version":409}}'
)
_FRAME_PREFIX = struct.Struct(">iI")  # total length, header word (JSON: the length)


class Producer:
    """A connection's sends; `origin` names the connection in what it publishes."""

    def __init__(self, server: RocketMQServer, origin: str) -> None:
        self.server = server
        self.origin = origin

    # -- SEND_MESSAGE / V2 / BATCH ------------------------------------------------------------

    def _send_fields(self, request: Request) -> Request:
        # Java sends batches with the V2 header too when sendSmartMsg is on (the default)
        if request.code == RequestCode.SEND_MESSAGE_V2 or "b" in request.ext_fields:
            fields = {SEND_V2_FIELDS.get(k, k): v for k, v in request.ext_fields.items()}
            return Request(request.code, request.opaque, request.flag, ext_fields=fields)
        return request

    def _body(self, request: Request, body: bytes, sys_flag: int) -> bytes:
        limit = self.server.max_message_size
        if len(body) > limit:
            raise rq.BadRequest(
                f"the message body size over max value, MAX: {limit}",
                ResponseCode.MESSAGE_ILLEGAL,
            )
        if sys_flag & SYSFLAG_COMPRESSED:
            try:
                body = inflate(body, limit)
            except ValueError as exc:  # BodyTooLarge too
                raise rq.BadRequest(str(exc), ResponseCode.MESSAGE_ILLEGAL) from None
        return body

    def _refuse_half_message(self, sys_flag: int, headers: list[tuple[str, str]]) -> None:
        """A transactional producer's half message (property TRAN_MSG, or the prepared
        sysFlag) is refused with NO_PERMISSION, as by a Java broker configured with
        rejectTransactionMessage: the gateway keeps no half messages to commit or roll back
        later, and publishing one at once would show consumers what the producer's
        transaction may still undo. The producer's send fails, so it knows."""
        prepared = (sys_flag & SYSFLAG_TRANSACTION_MASK) == SYSFLAG_TRANSACTION_PREPARED
        if prepared or (TRANSACTION_PREPARED, "true") in headers:
            raise rq.BadRequest(
                f"the broker[{self.server.advertised[0]}] sending transaction message is forbidden",
                ResponseCode.NO_PERMISSION,
            )

    def _delay(self, headers: list[tuple[str, str]]) -> float:
        level = 0
        for name, value in headers:
            if name == DELAY and value.isascii() and value.isdigit() and len(value) < 4:
                level = int(value)
        levels = self.server.delay_levels
        return levels[min(level, len(levels)) - 1] if level > 0 else 0.0

    def send_message(self, request: Request) -> bytes:
        fields = self._send_fields(request)
        topic = rq.topic(fields)
        sys_flag = rq.integer(fields, "sysFlag", 0)
        body = self._body(request, request.body, sys_flag)
        headers = headers_from_properties(fields.ext_fields.get("properties", ""))
        self._refuse_half_message(sys_flag, headers)
        reconsume = rq.integer(fields, "reconsumeTimes", 0)
        if topic.startswith(RETRY_PREFIX) and reconsume > 0:
            # ali-ons resends a failed message itself when CONSUMER_SEND_MSG_BACK failed,
            # counting in header fields j/l instead of properties (notes 6)
            limit = rq.integer(fields, "maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
            headers = [(k, v) for k, v in headers if k not in (RECONSUME_TIME, DELAY)]
            headers.append((RECONSUME_TIME, str(reconsume)))
            if reconsume > limit:
                return self._dead_letter_send(request, topic[len(RETRY_PREFIX) :], body, headers)
        messages, queue_id, offset = self._store(fields, topic, [body], headers)
        return self._send_result(request, messages, queue_id, offset)

    def send_batch(self, request: Request) -> bytes:
        fields = self._send_fields(request)
        topic = rq.topic(fields)
        sys_flag = rq.integer(fields, "sysFlag", 0)
        self._refuse_half_message(sys_flag, [])
        try:
            entries = decode_batch_body(request.body)
        except MalformedBody as exc:
            raise rq.BadRequest(str(exc), exc.code) from None
        if not entries:
            raise rq.BadRequest("the batch holds no message", ResponseCode.MESSAGE_ILLEGAL)
        bodies = [self._body(request, e.body, sys_flag) for e in entries]
        # one publish per run of entries with the same properties (a batch usually shares
        # one set), so ids and queue offsets stay in the batch's order
        runs: list[tuple[str, list[bytes]]] = []
        for entry, body in zip(entries, bodies, strict=True):
            if runs and runs[-1][0] == entry.properties:
                runs[-1][1].append(body)
            else:
                runs.append((entry.properties, [body]))
        stored: list[Message] = []
        first: tuple[int, int] | None = None
        for properties, run in runs:
            messages, queue_id, offset = self._store(
                fields, topic, run, headers_from_properties(properties)
            )
            stored += messages
            first = first or (queue_id, offset)
        assert first is not None
        return self._send_result(request, stored, *first)

    def _store(
        self,
        fields: Request,
        topic: str,
        bodies: list[bytes],
        headers: list[tuple[str, str]],
    ) -> tuple[list[Message], int, int]:
        """Publish; the messages, the queue they are in and the first one's queue offset."""
        server = self.server
        count = server.write_queues if not topic.startswith(RETRY_PREFIX) else 1
        queue_id = rq.integer(fields, "queueId", -1)
        # A group's feed may take the messages during publish() (a consumer with room):
        # the producer's queue choice must be known then, not recorded after.
        server.sending = (topic, self.origin, queue_id) if 0 <= queue_id < count else None
        try:
            messages, _ = server.broker.publish(
                topic,
                bodies,
                delay=self._delay(headers),
                headers=headers or None,
                origin=self.origin,
            )
        finally:
            server.sending = None
        if not 0 <= queue_id < count:
            queue_id = messages[0].id % count  # Java: a negative queue means "broker picks"
        return messages, queue_id, server.sent(topic, queue_id, messages)

    def _send_result(
        self, request: Request, messages: list[Message], queue_id: int, offset: int
    ) -> bytes:
        msg_ids = ",".join([self.server.msg_id(m.id) for m in messages])
        if request.serialize_type is SerializeType.JSON:
            # the answer to every send: formatted directly (hex ids and integers need no
            # JSON escaping), a third of a send's cost when it went through json.dumps
            header = _SEND_OK_JSON.format(msg_ids, queue_id, offset, request.opaque).encode()
            return _FRAME_PREFIX.pack(4 + len(header), len(header)) + header
        return ok(
            request,
            {
                "msgId": msg_ids,
                "queueId": queue_id,
                "queueOffset": offset,
                "MSG_REGION": "DefaultRegion",
                "TRACE_ON": "true",
            },
        )

    # -- retries and dead letters -------------------------------------------------------------

    def send_back(self, request: Request) -> bytes:
        """CONSUMER_SEND_MSG_BACK: a consumer failed a message (notes 6). A copy goes to
        `%RETRY%<group>` after the delay level's time, or, past maxReconsumeTimes, to
        `%DLQ%<group>`, buried. The original is acknowledged by the consumer's commit."""
        physical = rq.integer(request, "offset")
        group = rq.group(request, "group")
        delay_level = rq.integer(request, "delayLevel", 0)
        limit = rq.integer(request, "maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES)
        found = None
        for feed in self.server.group_feeds(group):
            message = feed.find(physical)
            if message is not None:
                found = (feed.topic, message)
                break
        if found is None:
            raise rq.BadRequest(f"look message by offset failed, {physical}")
        topic, message = found
        reconsume = int_header(message, RECONSUME_TIME)
        headers = [
            (k, v)
            for k, v in (message.headers or [])
            if k not in (RECONSUME_TIME, DELAY, MAX_RECONSUME_TIMES)
        ]
        if header(message, RETRY_TOPIC) is None and not topic.startswith(RETRY_PREFIX):
            headers.append((RETRY_TOPIC, topic))
        if header(message, ORIGIN_MESSAGE_ID) is None:
            origin_id = request.ext_fields.get("originMsgId") or self.server.msg_id(message.id)
            headers.append((ORIGIN_MESSAGE_ID, origin_id))
        headers.append((RECONSUME_TIME, str(reconsume + 1)))
        if reconsume >= limit or delay_level < 0:
            return self._dead_letter_send(request, group, message.body, headers)
        levels = self.server.delay_levels
        level = min(delay_level or 3 + reconsume, len(levels))
        headers.append((DELAY, str(level)))
        self.server.broker.publish(
            retry_topic(group),
            [message.body],
            delay=levels[level - 1],
            headers=headers,
            origin=self.origin,
        )
        return ok(request)

    def _dead_letter_send(
        self, request: Request, group: str, body: bytes, headers: list[tuple[str, str]]
    ) -> bytes:
        headers = [(k, v) for k, v in headers if k != DELAY]
        messages = self.server.dead_letter(group, body, headers, self.origin)
        if request.code == RequestCode.CONSUMER_SEND_MSG_BACK:
            return ok(request)
        offset = self.server.sent(dlq_topic(group), 0, messages)
        return self._send_result(request, messages, 0, offset)
