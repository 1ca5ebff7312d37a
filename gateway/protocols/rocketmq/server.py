"""What every RocketMQ remoting connection of one gateway shares.

The gateway is the nameserver and the only broker, on one port: routes name the address
it advertises, so clients reuse the one connection for both roles (notes 3). Consumer
groups are broker groups, one per (topic, group); their queues and offsets live in the
group feeds (feed.py). Membership (which clientIDs are in a group, for rebalancing) is
kept here, tied to connections and refreshed by heartbeats.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio

from gateway.broker import Broker, Group
from gateway.metrics import Metrics
from gateway.model import Message
from gateway.protocols.rocketmq.feed import GroupFeed
from gateway.protocols.rocketmq.mapping import (
    DEFAULT_DELAY_LEVELS,
    dlq_topic,
    queue_count_of,
)
from gateway.protocols.rocketmq.message import offset_msg_id

if TYPE_CHECKING:
    from gateway.protocols.rocketmq.consume import Consumer
    from gateway.protocols.rocketmq.session import RocketMQSession

log = logging.getLogger("gateway.rocketmq")

# Queue choices of RocketMQ producers remembered for the feeds (message id -> queue);
# past this many the oldest are forgotten and such messages go by id like any other.
_QUEUE_HINTS: Final = 65536
# Queue locks kept at most (orderly consumers'; one per group, topic and queue). Past it
# the expired ones go, and while it is still full a queue nobody holds is not granted.
_MAX_LOCKS: Final = 65536


@dataclass
class Member:
    consumer: Consumer  # of the client's connection
    seen: float  # trio clock of the last heartbeat


@dataclass
class RocketMQServer:
    broker: Broker
    metrics: Metrics
    read_queues: int = 4
    write_queues: int = 4
    max_frame_size: int = 16777216
    max_header_size: int = 1048576
    max_message_size: int = 4194304  # the broker's and producers' maxMessageSize
    max_suspend: float = 20.0  # seconds a pull may be held (clients give up after 30)
    group_window: int = 4096  # messages one (topic, group) holds between pull and commit
    client_timeout: float = 120.0  # a member without heartbeat this long is dropped
    # an orderly consumer's queue lock not renewed this long may go to another client
    # (the Java broker's rocketmq.broker.rebalance.lockMaxLiveTime)
    queue_lock_seconds: float = 60.0
    max_output_bytes: int = 4 * 1024 * 1024  # stop reading while this much waits to go
    delay_levels: tuple[float, ...] = DEFAULT_DELAY_LEVELS
    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    advertised: tuple[str, int] = ("127.0.0.1", 9876)
    sessions: set[RocketMQSession] = field(default_factory=set)
    feeds: dict[tuple[str, str], GroupFeed] = field(default_factory=dict)
    members: dict[str, dict[str, Member]] = field(default_factory=dict)
    # (group, topic, queue id) -> (clientID holding it, trio clock of its last renewal)
    locks: dict[tuple[str, str, int], tuple[str, float]] = field(default_factory=dict)
    # the groups of BROADCASTING clients, one per client (broadcast_group)
    broadcasting: set[str] = field(default_factory=set)
    queue_hints: OrderedDict[int, int] = field(default_factory=OrderedDict)
    # (topic, origin, queue) of a send being published now (produce.py): its messages'
    # queue before sent() records it
    sending: tuple[str, str, int] | None = None
    send_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    _msg_id_prefix: str = ""
    _msg_id_for: tuple[str, int] | None = None

    @property
    def address(self) -> str:
        host, port = self.advertised
        return f"{host}:{port}"

    def msg_id(self, message_id: int) -> str:
        """The offset msgId of a message (notes 7.4): the same as offset_msg_id, with the
        store address part made once rather than parsed on every send."""
        if self._msg_id_for != self.advertised:
            host, port = self.advertised
            self._msg_id_prefix = offset_msg_id(host, port, 0)[:-16]
            self._msg_id_for = self.advertised
        return f"{self._msg_id_prefix}{message_id:016X}"

    # -- nameserver ---------------------------------------------------------------------------

    def queue_count(self, topic: str) -> int:
        return queue_count_of(topic, self.read_queues)

    def route(self, topic: str) -> bytes:
        """TopicRouteData with standard JSON keys, which every client reads (notes 5)."""
        reads = self.queue_count(topic)
        writes = queue_count_of(topic, self.write_queues)
        return json.dumps(
            {
                "brokerDatas": [
                    {
                        "brokerAddrs": {"0": self.address},
                        "brokerName": self.broker_name,
                        "cluster": self.cluster_name,
                    }
                ],
                "filterServerTable": {},
                "queueDatas": [
                    {
                        "brokerName": self.broker_name,
                        "perm": 6,
                        "readQueueNums": reads,
                        "topicSysFlag": 0,
                        "writeQueueNums": writes,
                    }
                ],
            },
            separators=(",", ":"),
        ).encode()

    def cluster_info(self) -> bytes:
        return json.dumps(
            {
                "brokerAddrTable": {
                    self.broker_name: {
                        "brokerAddrs": {"0": self.address},
                        "brokerName": self.broker_name,
                        "cluster": self.cluster_name,
                    }
                },
                "clusterAddrTable": {self.cluster_name: [self.broker_name]},
            },
            separators=(",", ":"),
        ).encode()

    # -- producers ----------------------------------------------------------------------------

    def sent(self, topic: str, queue_id: int, messages: list[Message]) -> int:
        """Record a producer's queue choice; the queue offset its send result reports (the
        count of RocketMQ sends to that queue of the topic, as a producer sees it)."""
        hints = self.queue_hints
        for msg in messages:
            hints[msg.id] = queue_id
        while len(hints) > _QUEUE_HINTS:
            hints.popitem(last=False)
        key = (topic, queue_id)
        first = self.send_offsets.get(key, 0)
        self.send_offsets[key] = first + len(messages)
        return first

    def queue_of(self, message: Message) -> int:
        """The queue a message goes to in every group's feed: its producer's choice, or by
        id (round robin for one publisher) for messages from other protocols."""
        hint = self.queue_hints.get(message.id)
        if hint is not None:
            return hint
        sending = self.sending  # a send whose messages are being published right now
        if sending is not None and (message.topic, message.origin) == sending[:2]:
            return sending[2]
        return message.id

    # -- consumer groups ----------------------------------------------------------------------

    def feed(self, topic: str, group: str) -> GroupFeed:
        """The (topic, group) feed, made (with the broker group) if it is not there."""
        key = (topic, group)
        feed = self.feeds.get(key)
        if feed is not None and not feed.closed:
            return feed
        broker_group = self.broker.group(topic, group, ephemeral=group in self.broadcasting)
        feed = GroupFeed(
            broker_group,
            topic,
            self.queue_count(topic),
            self.group_window,
            self.advertised,
            self.queue_of,
        )
        self.feeds[key] = feed
        self._describe(group)
        return feed

    def existing_feed(self, topic: str, group: str) -> GroupFeed | None:
        feed = self.feeds.get((topic, group))
        if feed is None:
            return None
        if feed.closed:
            del self.feeds[(topic, group)]
            return None
        return feed

    def topic_feeds(self, topic: str) -> list[GroupFeed]:
        return [f for (t, _), f in list(self.feeds.items()) if t == topic and not f.closed]

    def group_feeds(self, group: str) -> list[GroupFeed]:
        return [f for (_, g), f in list(self.feeds.items()) if g == group and not f.closed]

    def join(self, group: str, client_id: str, consumer: Consumer) -> bool:
        """A heartbeat: True when the client is new to the group."""
        members = self.members.setdefault(group, {})
        now = trio.current_time()
        member = members.get(client_id)
        if member is not None and member.consumer is consumer:
            member.seen = now
            return False
        members[client_id] = Member(consumer, now)
        self._describe(group)
        return True

    def leave(self, group: str, client_id: str) -> bool:
        members = self.members.get(group)
        if not members or members.pop(client_id, None) is None:
            return False
        if not members:
            del self.members[group]
            if group in self.broadcasting:
                self._drop_broadcast(group)
        self._describe(group)
        return True

    def broadcast_group(self, group: str, client_id: str) -> str:
        """The group through which a BROADCASTING consumer's client reads `group`: one of
        its own, `<group>@<clientID>`, so that every client of the group gets every
        message. Such a client keeps its offsets itself and commits none, so its pulls
        acknowledge what they pass (a broadcast message is not retried). Its broker groups
        are ephemeral: nothing is kept for a client that is gone, and they go with it."""
        name = f"{group}@{client_id}"
        self.broadcasting.add(name)
        return name

    def broadcasts(self, group: str) -> bool:
        """Whether clients read `group` BROADCASTING (each through a group of its own)."""
        prefix = f"{group}@"
        return any(name.startswith(prefix) for name in self.broadcasting)

    def _drop_broadcast(self, group: str) -> None:
        self.broadcasting.discard(group)
        for key in [k for k in self.feeds if k[1] == group]:
            self.feeds.pop(key).close()  # its ephemeral broker group goes with it

    def client_ids(self, group: str) -> list[str]:
        """Live members; those silent past client_timeout are dropped first."""
        members = self.members.get(group)
        if not members:
            return []
        cutoff = trio.current_time() - self.client_timeout
        for client_id in [c for c, m in members.items() if m.seen < cutoff]:
            self.leave(group, client_id)
        return sorted(self.members.get(group, {}))

    def lock_queues(self, group: str, client_id: str, queues: list[tuple[str, int]]) -> list[bool]:
        """LOCK_BATCH_MQ: for each (topic, queue id), whether `client_id` holds it for
        `group` now. A queue is granted (and its lock renewed) when nobody holds it, when
        this client does, or when its holder has not renewed it for queue_lock_seconds, as
        the Java broker's RebalanceLockManager does: an orderly consumer pulls only the
        queues it holds, so one queue is consumed by one client at a time, also while a
        rebalance moves it. A closed connection does not release its locks (its client may
        come back under the same id); they expire."""
        now = trio.current_time()
        locks = self.locks
        granted = []
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            held = locks.get(key)
            if held is None:
                if len(locks) >= _MAX_LOCKS:
                    self._drop_expired_locks(now)
                ok = len(locks) < _MAX_LOCKS
            else:
                ok = held[0] == client_id or self._expired(held, now)
            if ok:
                locks[key] = (client_id, now)
            granted.append(ok)
        return granted

    def unlock_queues(self, group: str, client_id: str, queues: list[tuple[str, int]]) -> None:
        """UNLOCK_BATCH_MQ: release the queues `client_id` holds among these."""
        for topic, queue_id in queues:
            key = (group, topic, queue_id)
            held = self.locks.get(key)
            if held is not None and held[0] == client_id:
                del self.locks[key]

    def _expired(self, held: tuple[str, float], now: float) -> bool:
        return now - held[1] > self.queue_lock_seconds

    def _drop_expired_locks(self, now: float) -> None:
        for key in [k for k, held in self.locks.items() if self._expired(held, now)]:
            del self.locks[key]

    def consumers_of(self, group: str) -> set[Consumer]:
        return {m.consumer for m in self.members.get(group, {}).values()}

    def _describe(self, group: str) -> None:
        # what the admin page and /stats show as the consumer's address: its clients
        ids = ",".join(sorted(self.members.get(group, {})))
        for feed in self.group_feeds(group):
            feed.remote = ids

    # -- dead letters -------------------------------------------------------------------------

    def dead_letter(
        self, group: str, body: bytes, headers: list[tuple[str, str]], origin: str
    ) -> list[Message]:
        """Publish to `%DLQ%<group>` and bury it in that topic's group `group`, where the
        admin page (and a kick) finds it. The group is made first, so it gets the message
        whatever other groups the topic has; one a reader of it took already is left to it."""
        dlq = self.broker.group(dlq_topic(group), group)
        messages, _ = self.broker.publish(dlq_topic(group), [body], headers=headers, origin=origin)
        for msg in messages:
            # buried as it is, not delivered first: the archive shows no delivery
            dlq.bury_ready(msg.id)
        return messages

    def dead_letter_group(self, group: str) -> Group | None:
        topic = self.broker.topic(dlq_topic(group), create=False)
        return topic.group(group, create=False) if topic is not None else None
