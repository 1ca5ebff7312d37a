"""Consumers: heartbeats and membership, offsets, and PULL_MESSAGE with long polling.

A consumer group's queues and offsets are its feeds' (feed.py). Membership is the
server's: the clientIDs heartbeats name, tied to their connection (a closed connection
leaves its groups at once, as the Java broker's channel listener does).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from gateway.protocols.rocketmq import requests as rq
from gateway.protocols.rocketmq.codec import ResponseCode, encode_request, encode_response, ok
from gateway.protocols.rocketmq.codes import (
    PULL_COMMIT_OFFSET,
    PULL_SUBSCRIPTION,
    PULL_SUSPEND,
    RequestCode,
)
from gateway.protocols.rocketmq.events import Request
from gateway.protocols.rocketmq.feed import GroupFeed, PullResult
from gateway.protocols.rocketmq.mapping import (
    Subscription,
    parse_subscription,
    valid_group,
    valid_topic,
)

if TYPE_CHECKING:
    from gateway.connection import Connection
    from gateway.protocols.rocketmq.server import RocketMQServer

_PULL_CODES = {
    "found": (ResponseCode.SUCCESS, "FOUND"),
    "none": (ResponseCode.PULL_NOT_FOUND, "NO_NEW_MESSAGE"),
    "retry": (ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE"),
    "moved": (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_MOVED"),
}
MAX_PULL_COUNT = 1024  # a pull's maxMsgNums is capped to this (ali-ons and Java ask 32)
# Pulls one connection may have held at once (clients hold one per queue they own); past
# it a pull with nothing to return is answered PULL_NOT_FOUND at once.
MAX_HELD = 1024


def _version(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


class Consumer:
    """A connection's consumer side: the groups its clients joined, its held pulls and
    what it tells its clients unasked. `answer` is the session's: a pull held for the
    first heartbeat is answered then as any request is."""

    def __init__(
        self, server: RocketMQServer, conn: Connection, answer: Callable[[Request], bytes | None]
    ) -> None:
        self.server = server
        self.conn = conn
        self._answer = answer
        self._registered: set[tuple[str, str]] = set()  # (consumer group, clientID)
        # consumer group -> the group its BROADCASTING client reads through (server.py)
        self._broadcast: dict[str, str] = {}
        # set by the connection's first heartbeat, then None
        self._heartbeat_seen: trio.Event | None = trio.Event()
        self.held_pulls = 0
        self._next_opaque = 0  # for requests the gateway sends (NOTIFY_CONSUMER_IDS_CHANGED)

    def _send(self, frame: bytes) -> None:
        """Queue a frame and write it now if the socket takes it (from any task)."""
        conn = self.conn
        conn.out.append(frame)
        conn.pending += len(frame)
        if not conn.sending:  # else the writer in progress sends it after its current write
            conn.write_queued()

    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        assert self.conn.nursery is not None
        self.conn.nursery.start_soon(task)

    # -- membership ---------------------------------------------------------------------------

    def heartbeat(self, request: Request) -> bytes:
        try:
            data = json.loads(request.body.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            raise rq.BadRequest("heartbeat body is not JSON") from None
        if not isinstance(data, dict):
            raise rq.BadRequest("heartbeat body is not a map")
        client_id = data.get("clientID")
        if not isinstance(client_id, str) or not client_id:
            raise rq.BadRequest("heartbeat without clientID")
        consumers = data.get("consumerDataSet") or []
        for consumer in consumers if isinstance(consumers, list) else []:
            if isinstance(consumer, dict):
                self._register(client_id, consumer)
        if self._heartbeat_seen is not None:
            self._heartbeat_seen.set()  # the pulls that waited for it go on
            self._heartbeat_seen = None
        return ok(request)

    def _register(self, client_id: str, consumer: dict[str, Any]) -> None:
        group = consumer.get("groupName")
        if not isinstance(group, str) or not valid_group(group):
            return
        model = consumer.get("messageModel")  # by name (Java, ali-ons) or ordinal (C++)
        if model == "BROADCASTING" or (type(model) is int and model == 0):
            own = self.server.broadcast_group(group, client_id)
            self._broadcast[group] = own
            group = own
        subscriptions = consumer.get("subscriptionDataSet") or []
        for sub in subscriptions if isinstance(subscriptions, list) else []:
            if not isinstance(sub, dict):
                continue
            topic = sub.get("topic")
            if not isinstance(topic, str) or not valid_topic(topic):
                continue
            feed = self.server.feed(topic, group)
            expression = sub.get("subString")
            self._subscribe(
                feed,
                parse_subscription(
                    expression if isinstance(expression, str) else "*",
                    _version(sub.get("subVersion")),
                ),
            )
        self._registered.add((group, client_id))
        if self.server.join(group, client_id, self):
            self._members_changed(group)

    @staticmethod
    def _subscribe(feed: GroupFeed, subscription: Subscription) -> None:
        if subscription.version >= feed.subscription.version:
            feed.subscription = subscription

    def _members_changed(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED to the group's other clients: Java rebalances at
        once (ali-ons ignores it and rebalances on its 10 s timer)."""
        for consumer in self.server.consumers_of(group):
            if consumer is not self:
                consumer.notify(group)

    def notify(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED, a oneway request to the client."""
        self._next_opaque += 1
        ext = {"consumerGroup": group}
        code = RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
        self._send(encode_request(code, self._next_opaque, ext_fields=ext, oneway=True))

    def unregister(self, request: Request) -> bytes:
        client_id = request.ext_fields.get("clientID", "")
        group = request.ext_fields.get("consumerGroup", "")
        group = self._broadcast.pop(group, group)
        if group:
            self._registered.discard((group, client_id))
            if self.server.leave(group, client_id):
                self._members_changed(group)
        return ok(request)

    def leave_all(self) -> None:
        for group, client_id in self._registered:
            if self.server.members.get(group, {}).get(client_id) is not None:
                member = self.server.members[group][client_id]
                if member.consumer is self and self.server.leave(group, client_id):
                    self._members_changed(group)
        self._registered.clear()

    def consumer_list(self, request: Request) -> bytes:
        group = rq.text(request, "consumerGroup")
        ids = self.server.client_ids(self._broadcast.get(group, group))
        if not ids:
            raise rq.BadRequest(f"no consumer for this group, {group[:260]}")
        body = json.dumps({"consumerIdList": ids}, separators=(",", ":")).encode()
        return ok(request, body=body)

    def lock(self, request: Request) -> bytes:
        """LOCK_BATCH_MQ (orderly consumers, every 20 s and on rebalance): the queues this
        client now holds among those asked for (server.lock_queues)."""
        group, client_id, asked = self._lock_request(request)
        granted = self.server.lock_queues(group, client_id, [q for q, _ in asked])
        held = [mq for (_, mq), given in zip(asked, granted, strict=True) if given]
        body = json.dumps({"lockOKMQSet": held}, separators=(",", ":")).encode()
        return ok(request, body=body)

    def unlock(self, request: Request) -> bytes:
        """UNLOCK_BATCH_MQ: a client lets go of queues (after a rebalance took them)."""
        group, client_id, asked = self._lock_request(request)
        self.server.unlock_queues(group, client_id, [q for q, _ in asked])
        return ok(request)

    def _lock_request(
        self, request: Request
    ) -> tuple[str, str, list[tuple[tuple[str, int], dict[str, Any]]]]:
        """A (un)lock body, {"consumerGroup", "clientId", "mqSet": [{"topic", "brokerName",
        "queueId"}]}: the group, the client and each well-formed queue with the object that
        named it (answered as sent). A queue of no valid topic or out of its topic's range
        is left out: never granted."""
        try:
            data = json.loads(request.body.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise rq.BadRequest("the lock request body is not a JSON object")
        group = rq.group_name(data.get("consumerGroup"))
        client_id = data.get("clientId")
        if not isinstance(client_id, str) or not client_id:
            raise rq.BadRequest("the lock request names no clientId")
        mqs = data.get("mqSet")
        asked = []
        for mq in mqs if isinstance(mqs, list) else []:
            if not isinstance(mq, dict):
                continue
            topic, queue_id = mq.get("topic"), mq.get("queueId")
            if (
                isinstance(topic, str)
                and valid_topic(topic)
                and type(queue_id) is int
                and 0 <= queue_id < self.server.queue_count(topic)
            ):
                asked.append(((topic, queue_id), mq))
        return group, client_id, asked

    # -- offsets ------------------------------------------------------------------------------

    def _group(self, request: Request) -> str:
        """The request's consumer group, or the group this connection's BROADCASTING
        client reads it through."""
        group = rq.group(request, "consumerGroup")
        return self._broadcast.get(group, group)

    def _queue_feed(self, request: Request) -> tuple[GroupFeed | None, int]:
        topic = rq.topic(request)
        group = self._group(request)
        queue_id = rq.queue_id(request, topic, self.server.queue_count(topic))
        return self.server.existing_feed(topic, group), queue_id

    def query_offset(self, request: Request) -> bytes:
        feed, queue_id = self._queue_feed(request)
        if feed is None:
            raise rq.BadRequest(
                "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
                ResponseCode.QUERY_NOT_FOUND,
            )
        # The oldest entry not acknowledged: every pulled but uncommitted message is
        # pulled again by whoever takes the queue over (at least once).
        return ok(request, {"offset": feed.queues[queue_id].min_offset})

    def update_offset(self, request: Request) -> bytes:
        feed, queue_id = self._queue_feed(request)
        offset = rq.integer(request, "commitOffset")
        # ali-ons commits -1 for queues it has not consumed from (notes 4.3)
        if feed is not None and offset >= 0:
            feed.commit(queue_id, offset)
        return ok(request)

    def _offsets(self, request: Request) -> list[tuple[GroupFeed, int]]:
        """The queue in every group's feed of the topic (these requests name no group), or
        in its own feed for a BROADCASTING client (which starts from the maximum offset:
        its own, not another group's, or it would be moved back and wait for a rebalance)."""
        topic = rq.topic(request)
        queue_id = rq.queue_id(request, topic, self.server.queue_count(topic))
        server = self.server
        own = [server.existing_feed(topic, group) for group in self._broadcast.values()]
        feeds = [f for f in own if f is not None] or server.topic_feeds(topic)
        return [(feed, queue_id) for feed in feeds]

    def max_offset(self, request: Request) -> bytes:
        logs = [feed.queues[q] for feed, q in self._offsets(request)]
        return ok(request, {"offset": max((lg.next_offset for lg in logs), default=0)})

    def min_offset(self, request: Request) -> bytes:
        logs = [feed.queues[q] for feed, q in self._offsets(request)]
        return ok(request, {"offset": min((lg.min_offset for lg in logs), default=0)})

    def search_offset(self, request: Request) -> bytes:
        timestamp = rq.integer(request, "timestamp")
        logs = [feed.queues[q] for feed, q in self._offsets(request)]
        offsets = [lg.offset_at(timestamp) for lg in logs]
        return ok(request, {"offset": min(offsets, default=0)})

    def earliest_time(self, request: Request) -> bytes:
        stamps = [
            feed.queues[q].entries[0].message.timestamp // 1_000_000
            for feed, q in self._offsets(request)
            if feed.queues[q].entries
        ]
        return ok(request, {"timestamp": min(stamps, default=0)})

    # -- PULL_MESSAGE -------------------------------------------------------------------------

    def pull(self, request: Request) -> bytes | None:
        server = self.server
        topic = rq.topic(request)
        group = self._group(request)
        queue_id = rq.queue_id(request, topic, server.queue_count(topic))
        offset = rq.integer(request, "queueOffset")
        count = max(1, min(rq.integer(request, "maxMsgNums", 32), MAX_PULL_COUNT))
        sys_flag = rq.integer(request, "sysFlag", 0)
        kind = request.ext_fields.get("expressionType", "TAG")
        if kind.upper() != "TAG":
            raise rq.BadRequest(
                f"the gateway filters by tag only, not by {kind[:20]}",
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            )
        if self._heartbeat_seen is not None and server.broadcasts(group):
            # a BROADCASTING group, from a connection whose client has not said who it is
            # (one that reconnected: its next heartbeat comes within 30 s); whose group
            # to read is known only then
            return self._pull_before_heartbeat(request, offset, sys_flag)
        if sys_flag & PULL_SUBSCRIPTION:
            feed = server.feed(topic, group)
            self._subscribe(
                feed,
                parse_subscription(
                    request.ext_fields.get("subscription"),
                    rq.integer(request, "subVersion", 0),
                ),
            )
            subscription = parse_subscription(request.ext_fields.get("subscription"))
        else:
            # Java's default: the subscription is the group's latest heartbeat's (notes 4.2)
            existing = server.existing_feed(topic, group)
            if existing is None:
                raise rq.BadRequest(
                    f"the consumer's subscription not exist, group: {group}, topic: {topic}",
                    ResponseCode.SUBSCRIPTION_NOT_EXIST,
                )
            feed = existing
            subscription = feed.subscription
        if sys_flag & PULL_COMMIT_OFFSET:
            commit = rq.integer(request, "commitOffset", -1)
            if commit >= 0:
                feed.commit(queue_id, commit)
        elif group in server.broadcasting:
            feed.commit(queue_id, offset)  # it has what it pulled before (server.py)
        result = feed.pull(queue_id, offset, count, subscription)
        if result.status == "none" and sys_flag & PULL_SUSPEND and self.held_pulls < MAX_HELD:
            hold = self._hold_seconds(request)
            if hold > 0:
                until = trio.current_time() + hold
                self._spawn(
                    lambda: self._hold(request, feed, queue_id, offset, count, subscription, until)
                )
                return None
        return self._pull_answer(request, feed, queue_id, result)

    def _pull_before_heartbeat(self, request: Request, offset: int, sys_flag: int) -> bytes | None:
        """Held until the connection's first heartbeat, then answered as any pull is; past
        the suspend time without one (or at once, for a pull that may not be held),
        PULL_NOT_FOUND, and the client pulls again."""
        seen = self._heartbeat_seen
        hold = self._hold_seconds(request)
        if seen is None or not sys_flag & PULL_SUSPEND or hold <= 0 or self.held_pulls >= MAX_HELD:
            return _not_found(request, offset)

        async def wait() -> None:
            self.held_pulls += 1
            try:
                with trio.move_on_after(hold):
                    await seen.wait()
            finally:
                self.held_pulls -= 1
            answer = self._answer(request) if seen.is_set() else _not_found(request, offset)
            if answer is not None:
                self._send(answer)

        self._spawn(wait)
        return None

    def _hold_seconds(self, request: Request) -> float:
        """How long a pull may be held: its suspendTimeoutMillis, at most max_suspend."""
        suspend = rq.integer(request, "suspendTimeoutMillis", 15000) / 1000
        return min(max(suspend, 0.0), self.server.max_suspend)

    async def _hold(
        self,
        request: Request,
        feed: GroupFeed,
        queue_id: int,
        offset: int,
        count: int,
        subscription: Subscription,
        until: float,
    ) -> None:
        """A long poll: answered when its queue gets a message, or at `until` with
        PULL_NOT_FOUND (every client pulls again at once)."""
        log = feed.queues[queue_id]
        result = PullResult("none", offset)
        self.held_pulls += 1
        try:
            with trio.move_on_at(until):
                while not feed.closed:
                    wake = log.wake  # taken before the look, so no arrival is missed
                    result = feed.pull(queue_id, offset, count, subscription)
                    if result.status != "none":
                        break
                    await wake.wait()
        finally:
            self.held_pulls -= 1
        self._send(self._pull_answer(request, feed, queue_id, result))

    def _pull_answer(
        self, request: Request, feed: GroupFeed, queue_id: int, result: PullResult
    ) -> bytes:
        log = feed.queues[queue_id]
        return _pull_frame(request, result, log.min_offset, log.next_offset)


def _pull_frame(request: Request, result: PullResult, low: int, high: int) -> bytes:
    """A pull's answer: its status, where to pull next, the queue's offsets, the records."""
    code, remark = _PULL_CODES[result.status]
    ext = {
        "suggestWhichBrokerId": 0,
        "nextBeginOffset": result.next_offset,
        "minOffset": low,
        "maxOffset": high,
    }
    return encode_response(
        request.opaque,
        code,
        remark=remark,
        ext_fields=ext,
        body=b"".join(result.records),
        serialize_type=request.serialize_type,
    )


def _not_found(request: Request, offset: int) -> bytes:
    """PULL_NOT_FOUND with no feed behind it: the client pulls from `offset` again."""
    return _pull_frame(request, PullResult("none", offset), offset, offset)
