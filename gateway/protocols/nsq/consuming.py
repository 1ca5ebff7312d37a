"""The consuming side of an NSQ connection: SUB, the deliveries the broker hands it (with
nsqd's output buffering), and FIN, REQ and TOUCH (a mixin of NSQSession, which holds the
state these methods read and set)."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

import trio

from gateway.broker import Consumer, Group, Outcome
from gateway.model import Message
from gateway.protocols.nsq import events as ev
from gateway.protocols.nsq.codec import OK_FRAME, error_frame, message_header
from gateway.protocols.nsq.names import is_ephemeral

if TYPE_CHECKING:
    from gateway.metrics import Metrics
    from gateway.protocols.nsq.server import NSQServer

_NOT_IN_FLIGHT = b"ID not in flight"
_NOT_OWNER = b"client does not own message"


def _parse_id(raw: bytes) -> int | None:
    """Message ids are 16 lowercase hex digits; anything else is simply not in flight."""
    try:
        value = int(raw, 16)
    except ValueError:
        return None
    return value if b"%016x" % value == raw else None


class Consuming:
    """The session's SUB, deliveries, FIN, REQ and TOUCH (see NSQSession for the
    attributes)."""

    server: NSQServer
    group: Group | None
    consumer: Consumer | None
    sample_rate: int
    msg_timeout: float
    output_buffer_size: int
    output_buffer_timeout: float
    message_count: int
    finish_count: int
    requeue_count: int
    _out: list[bytes]
    _pending: int
    _holding: bool
    _wake: trio.Event
    _flush_at: float
    _timer_scope: trio.CancelScope | None
    _metrics: Metrics

    if TYPE_CHECKING:  # Handshake's (not a stub at run time, which would shadow it)

        async def _check_auth(self, cmd: str, topic: str, channel: str) -> None: ...

    async def _sub(self, event: ev.Sub) -> None:
        await self._check_auth("SUB", event.topic, event.channel)
        group = self.server.broker.group(
            event.topic,
            event.channel,
            ephemeral_topic=is_ephemeral(event.topic),
            ephemeral=is_ephemeral(event.channel),
        )
        self.group = group
        self.consumer = group.attach(self, self.msg_timeout)
        self._out.append(OK_FRAME)

    def _fins(self, msg_ids: list[bytes]) -> None:
        group = self.group
        consumer = self.consumer
        assert group is not None
        finish = group.finish
        done = 0
        for raw in msg_ids:
            msg_id = _parse_id(raw)
            outcome = (
                Outcome.NOT_IN_FLIGHT if msg_id is None else finish(consumer, msg_id, pump=False)
            )
            if outcome:
                self._out.append(self._failed(b"E_FIN_FAILED FIN", raw, outcome))
            else:
                done += 1
        self.finish_count += done

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
            self._out.append(self._failed(b"E_REQ_FAILED REQ", event.msg_id, outcome))
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
            self._out.append(self._failed(b"E_TOUCH_FAILED TOUCH", event.msg_id, outcome))

    def _failed(self, prefix: bytes, msg_id: bytes, outcome: Outcome) -> bytes:
        reason = _NOT_OWNER if outcome is Outcome.NOT_OWNER else _NOT_IN_FLIGHT
        text = b"%s %s failed %s" % (prefix, msg_id, reason)
        self._metrics.protocol_error("nsq", text)
        return error_frame(text)

    # -- delivery (called by the broker, synchronously) --------------------------

    def deliver(self, message: Message, consumer: Consumer) -> bool:
        # sample_rate N: nsqd drops about (99-N)% of this client's messages for the channel
        if self.sample_rate and random.randrange(100) > self.sample_rate:
            return False
        # header and body go separately: the writer's join copies the body once
        body = message.body
        out = self._out
        out.append(message_header(len(body), message.timestamp, message.attempts, message.id))
        out.append(body)
        self._pending += 34 + len(body)
        self.message_count += 1
        if not self._holding and self._send_deliveries(consumer):
            self._wake.set()  # from another task: the writer sends them
        return True

    def _send_deliveries(self, consumer: Consumer) -> bool:
        """Whether queued deliveries go out now, as nsqd's messagePump decides: when they
        fill output_buffer_size, or the client's window is full (it waits for them);
        otherwise output_buffer_timeout after the first at the latest (the timer is set
        here), or with the next reply to a command. A stream of single publishes thus
        reaches a busy consumer in one write per buffer, not one write per message, and
        FINs, which nsqd does not answer, do not flush either."""
        if (
            self._pending >= self.output_buffer_size
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
