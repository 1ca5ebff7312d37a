"""Read-only questions about the broker's queues, for everyone outside the broker.

Sessions, the HTTP layer and metrics ask here instead of reading a group's containers
(`ready`, `deferred`, `in_flight`, `buried`) or a topic's `backlog`: those are the
storage side's to reshape (a memory window over a disk queue, a Redis-backed queue) and
only this module and the broker itself may know their layout. Nothing here changes
anything, and what comes back is a value (frozen views, copies of messages): a caller
that acts holds a handle it got for acting (`Broker.topic`, `Topic.group`, its own
consumer's group), and the mutations are calls on those.

A *view* is what a reader looks at on a topic: one of its groups, or the topic itself
when its messages wait in the backlog for a first group (beanstalkd shows a tube in that
state with ready and delayed jobs).

Counts include what a durable store keeps past a group's memory window (its queue's
`spilled`, ready messages only); peeks and lists look at memory, whose window holds the
most urgent messages, so what they show is what would be delivered next.
"""

from __future__ import annotations

import copy
import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Final, Literal, cast

import trio

from gateway.broker.group import Group
from gateway.broker.journal import from_wall
from gateway.broker.members import Consumer
from gateway.broker.queues import LocalQueue
from gateway.broker.topic import Topic
from gateway.clients import ClientInfo
from gateway.model import DEFAULT_PRIORITY, Message

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.stores.base import Found

State = Literal["ready", "delayed", "reserved", "buried"]
View = Group | Topic

# beanstalkd's "urgent": pri < 1024, which is also the model's default priority
URGENT_BELOW: Final = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Counts:
    """Messages per state in one view. `ready` includes `spilled`."""

    ready: int
    delayed: int
    reserved: int
    buried: int
    urgent: int  # ready with priority < URGENT_BELOW (counted in memory only)
    spilled: int  # ready messages a durable store keeps on disk past the memory window

    def __add__(self, other: Counts) -> Counts:
        """Field by field, so that totals over many views are `sum(counts, start)`."""
        return Counts(
            self.ready + other.ready,
            self.delayed + other.delayed,
            self.reserved + other.reserved,
            self.buried + other.buried,
            self.urgent + other.urgent,
            self.spilled + other.spilled,
        )


NO_COUNTS: Final = Counts(0, 0, 0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Located:
    """Where a message is, as found: its state, a copy of it, the names of its topic and
    group (None: the topic backlog), and the seconds to its deadline or due time."""

    state: State
    message: Message
    topic: str
    group: str | None
    left: float
    # found in a store, not in this gateway's memory: a shared one (Redis), or a durable
    # one past the memory window
    stored: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer of a group as an operator sees it."""

    protocol: str  # the sink's metrics label: "nsq", "beanstalk", ... ("other" if none)
    address: str  # the peer's "host:port" ("" when the sink has none)
    in_flight: int
    ready: int  # the window: NSQ's RDY; beanstalkd: in_flight + 1 while a reserve waits
    client: ClientInfo | None  # the session's figures (asked for with clients=True)


@dataclass(frozen=True, slots=True)
class GroupView:
    """One group's figures at the moment it was asked."""

    topic: str
    name: str
    counts: Counts
    paused: bool  # by an operator, or a beanstalkd pause-tube still running
    pause_left: float  # seconds a beanstalkd pause-tube still holds (0: none)
    pause_length: int  # seconds that pause was set for
    message_count: int
    finish_count: int
    requeue_count: int
    timeout_count: int
    by_protocol: dict[str, tuple[int, ...]]  # consumer protocol -> stats.COUNTS
    consumers: tuple[ConsumerInfo, ...]


@dataclass(frozen=True, slots=True)
class TopicView:
    """One topic's figures at the moment it was asked."""

    name: str
    paused: bool
    shared: bool  # other gateways publish to it (a store they share decides the fan-out)
    backlog: int  # messages waiting for a first group, due or not (nsqd's topic depth)
    message_count: int
    message_bytes: int
    published_by: dict[str, int]  # publisher protocol -> messages
    groups: tuple[str, ...]  # in creation order
    spilled: int = 0  # of the backlog, kept on disk only past the memory window


# -- topics and groups ---------------------------------------------------------------------


def topic_names(broker: Broker, *, by_name: bool = False) -> list[str]:
    """Every topic's name, in creation order (beanstalkd's list-tubes order) or sorted."""
    names = list(broker.topics)
    return sorted(names) if by_name else names


def group_names(broker: Broker, topic: str, *, by_name: bool = False) -> list[str]:
    t = broker.topics.get(topic)
    names = list(t.groups) if t is not None else []
    return sorted(names) if by_name else names


def has_groups(broker: Broker, topic: str) -> bool:
    """True when the topic exists and hands its messages to groups (else they wait in its
    backlog)."""
    t = broker.topics.get(topic)
    return t is not None and bool(t.groups)


def topic(broker: Broker, name: str) -> TopicView | None:
    """The topic `name` if it exists (never creates one: that is `Broker.topic`)."""
    t = broker.topics.get(name)
    if t is None:
        return None
    return TopicView(
        t.name,
        t.paused,
        t.store_fans_out,
        t.depth,
        t.message_count,
        t.message_bytes,
        dict(t.published_by),
        tuple(t.groups),
        t.window.spilled,
    )


def topics(broker: Broker, *, by_name: bool = False) -> list[TopicView]:
    return [v for v in map(partial(topic, broker), topic_names(broker, by_name=by_name)) if v]


def group(
    broker: Broker, topic: str, name: str, *, clients: bool = False, now: float | None = None
) -> GroupView | None:
    """The group `name` of `topic` if it exists (never creates one: `Topic.group`); with
    `clients`, each consumer's session figures too (its ClientInfo)."""
    t = broker.topics.get(topic)
    g = t.groups.get(name) if t is not None else None
    if g is None:
        return None
    if now is None:
        now = trio.current_time()
    timed = g.pause_until > now
    return GroupView(
        topic,
        g.name,
        counts(g),
        g.is_paused(now),
        g.pause_until - now if timed else 0.0,
        g.pause_length if timed else 0,
        g.message_count,
        g.finish_count,
        g.requeue_count,
        g.timeout_count,
        {protocol: tuple(c) for protocol, c in g.by_protocol.items()},
        tuple(_consumer(c, clients) for c in g.consumers),
    )


def groups(
    broker: Broker, topic: str, *, by_name: bool = False, clients: bool = False
) -> list[GroupView]:
    now = trio.current_time()
    names = group_names(broker, topic, by_name=by_name)
    return [v for n in names if (v := group(broker, topic, n, clients=clients, now=now))]


def _consumer(c: Consumer, clients: bool) -> ConsumerInfo:
    sink = c.sink
    info_of = getattr(sink, "client_info", None) if clients else None
    return ConsumerInfo(
        getattr(sink, "protocol", "other"),
        getattr(sink, "remote", ""),
        c.in_flight,
        c.ready,
        info_of() if info_of is not None else None,
    )


# -- counts --------------------------------------------------------------------------------


def counts(view: View, now: float | None = None) -> Counts:
    """Every state's count for a group, or for a topic backlog (ready and delayed only,
    split by deliver_at against `now`, the current time unless given)."""
    if isinstance(view, Group):
        q = view.queue
        return Counts(
            view.depth,
            len(view.deferred) + q.stored_delayed,
            len(view.in_flight),
            len(view.buried) + q.stored_buried,
            view.ready.count_below(URGENT_BELOW),
            q.spilled,
        )
    ready, delayed = _split_backlog(view, now)
    urgent = sum(1 for m in ready if m.priority < URGENT_BELOW)
    stored_delayed = view.stored_backlog_delayed  # a shared store's, as last read
    spilled = view.window.spilled  # a paging store's, past the memory window
    return Counts(
        len(ready) + view.stored_backlog - stored_delayed + spilled,
        len(delayed) + stored_delayed,
        0,
        0,
        urgent,
        spilled,
    )


def holds_messages(g: Group) -> bool:
    """True while the group keeps any message, in whatever state."""
    q = g.queue
    return bool(
        g.depth or g.deferred or g.buried or g.in_flight or q.stored_delayed or q.stored_buried
    )


def retired_counts(broker: Broker) -> dict[tuple[str, str], dict[str, tuple[int, ...]]]:
    """Per (topic, group) of deleted groups, per consumer protocol, their last counts
    (stats.COUNTS order): a metrics counter continues from them; ("", "") sums the rest."""
    return {k: {p: tuple(c) for p, c in v.items()} for k, v in broker.retired_counts.items()}


def retired_published(broker: Broker) -> dict[str, dict[str, int]]:
    """Per deleted topic, per publisher protocol, the messages it had been published."""
    return {name: dict(v) for name, v in broker.retired_published.items()}


# -- the backlog: the one ready/delayed selection ----------------------------------------------


def _split_backlog(t: Topic, now: float | None = None) -> tuple[list[Message], list[Message]]:
    """The backlog as (ready, delayed), each in publish order (deliver_at is on the
    broker's Trio clock; 0.0 means now)."""
    if now is None:
        now = trio.current_time()
    ready: list[Message] = []
    delayed: list[Message] = []
    for msg in t.backlog:
        (ready if msg.deliver_at <= now else delayed).append(msg)
    return ready, delayed


# -- peeks and lists -------------------------------------------------------------------------


def _urgency(msg: Message) -> tuple[int, int]:
    return msg.priority, msg.id


def _due_order(msg: Message) -> tuple[float, int]:
    return msg.deliver_at, msg.id


def spilled(g: Group) -> int:
    """Ready messages of a group a durable store keeps on disk past the memory window:
    ready for a consumer all the same (the pager brings them in)."""
    return g.queue.spilled


def ready_head(g: Group) -> tuple[int, int] | None:
    """(priority, id) of the ready message delivered next: what a beanstalkd reserve
    over several tubes compares, asked per tube and per reserve, so no copy is made."""
    head = g.ready.peek()
    return (head.priority, head.id) if head is not None else None


def _first_here(view: View, state: State, limit: int) -> list[Message]:
    """Up to `limit` messages of a view in `state`, in the order they leave it, from
    memory (a window holds the most urgent)."""
    if not isinstance(view, Group):
        if state == "buried":
            return []
        ready, delayed = _split_backlog(view)
        if state == "ready":
            return heapq.nsmallest(limit, ready, key=_urgency)
        return heapq.nsmallest(limit, delayed, key=_due_order)
    if state == "ready":
        if limit == 1:  # a peek: the head, without a pass over the queue
            head = view.ready.peek()
            return [head] if head is not None else []
        return heapq.nsmallest(limit, view.ready, key=_urgency)
    if state == "delayed":
        # heap entries are (deliver_at, id, msg); ids are unique, so msg is never compared
        return [entry[2] for entry in heapq.nsmallest(limit, view.deferred)]
    msgs = list(islice(view.buried.values(), max(0, limit)))
    head = view.queue.stored_buried_head  # a shared store's, as last refreshed
    return msgs if msgs or head is None else [head]


def _copy(msg: Message) -> Message:
    """A value: what a reader gets of a message, which the broker may change after."""
    got = copy.copy(msg)
    if msg.stats is not None:
        got.stats = copy.copy(msg.stats)
    return got


# -- one message -----------------------------------------------------------------------------


def locate(view: View, msg_id: int, now: float | None = None) -> Located | None:
    """Where message `msg_id` is in a group (any state) or in a topic backlog."""
    if now is None:
        now = trio.current_time()
    if isinstance(view, Group):
        found = view.find(msg_id)
        if found is None:
            return None
        state, msg = cast(State, found[0]), found[1]
        left = 0.0
        if state == "reserved":
            left = view.in_flight[msg_id].deadline - now
        elif state == "delayed":
            left = msg.deliver_at - now
        return Located(state, _copy(msg), view.topic.name, view.name, max(0.0, left))
    for msg in view.backlog:
        if msg.id == msg_id:
            left = max(0.0, msg.deliver_at - now)
            return Located("delayed" if left else "ready", _copy(msg), view.name, None, left)
    return None


def _views(broker: Broker, view_of: Callable[[Topic], View | None]) -> Iterator[View]:
    return (view for t in broker.topics.values() if (view := view_of(t)) is not None)


def locate_in(
    broker: Broker, msg_id: int, view_of: Callable[[Topic], View | None]
) -> Located | None:
    """Look for `msg_id` in each topic's view as `view_of` picks it (None: skip the
    topic), topics in creation order; the first hit wins."""
    return _locate_any(_views(broker, view_of), msg_id)


def _locate_any(views: Iterable[View], msg_id: int) -> Located | None:
    return next((got for v in views if (got := locate(v, msg_id)) is not None), None)


def deadline(g: Group, msg_id: int, consumer: Consumer) -> float | None:
    """The deadline of `msg_id` if `consumer` holds it, else None. A float, not a view:
    each beanstalkd command on a held job and each message of a RocketMQ pull asks."""
    entry = g.in_flight.get(msg_id)
    return entry.deadline if entry is not None and entry.consumer is consumer else None


# -- a shared store (Redis): what other gateways hold, defer or bury -------------------
#
# With a shared store a group here keeps only what this gateway claimed; the rest of the
# queue is in Redis, where any gateway may have it in flight, deferred or buried. These
# ask the broker's journal, which asks the store; with a local store they answer from
# memory like the functions above, so a caller needs no second path.


def _stored(view: View) -> tuple[str, str] | None:
    """(topic, group) in a shared store for a view ("" is the topic backlog), or None."""
    if isinstance(view, Group):
        return (view.topic.name, view.name) if view.queue.elsewhere else None
    return (view.name, "") if view.store_fans_out and not view.groups else None


def _located(found: Found, topic: str, group: str | None) -> Located:
    msg = found.message
    left = 0.0
    if found.state in ("reserved", "delayed") and found.at > 0:
        left = max(0.0, found.at - time.time())
        if found.state == "delayed":
            msg.deliver_at = from_wall(found.at)
    return Located(cast(State, found.state), msg, topic, group, left, stored=True)


async def find_in(broker: Broker, view: View, msg_id: int) -> Located | None:
    """`locate`, then the shared store: message `msg_id` in one view, in any state."""
    return await _find(broker, [view], msg_id)


async def find(
    broker: Broker, msg_id: int, view_of: Callable[[Topic], View | None]
) -> Located | None:
    """`locate_in`, then the shared store: one round trip over every topic's view."""
    return await _find(broker, list(_views(broker, view_of)), msg_id)


async def _find(broker: Broker, views: list[View], msg_id: int) -> Located | None:
    found = _locate_any(views, msg_id)
    if found is not None:
        return found
    for v in views:
        # a ready message a local durable store keeps on disk past the memory window
        if isinstance(v, Group) and isinstance(v.queue, LocalQueue) and v.queue.spilled:
            msg = await v.queue.spilled_message(msg_id)
            if msg is not None:
                return Located("ready", msg, v.topic.name, v.name, 0.0, stored=True)
        elif isinstance(v, Topic) and v.window.spilled:
            msg = await broker.journal.find_spilled(v.name, "", msg_id)
            if msg is not None and v.window.spilled and not v.groups:
                return Located("ready", msg, v.name, None, 0.0, stored=True)
    where = dict(stored for v in views if (stored := _stored(v)) is not None)
    if not where:
        return None
    hit = await broker.journal.find([(t, [g]) for t, g in where.items()], msg_id)
    return _located(hit, hit.topic, where[hit.topic] or None) if hit is not None else None


async def first(broker: Broker, view: View, state: State, limit: int) -> list[Message]:
    """Up to `limit` messages of a view in `state` (ready, delayed, buried), in the order
    they leave it: the peeks and the admin page's lists, shared store included."""
    where = _stored(view)
    if where is None:
        here = [_copy(m) for m in _first_here(view, state, limit)]
        # memory holds the most urgent of a backlog; past its window, the rest is on disk
        if state != "ready" or len(here) >= limit:
            return here
        if isinstance(view, Group):  # after every one in memory: those past its window
            return here + [_copy(m) for m in await view.queue.spilled_first(limit - len(here))]
        if view.window.spilled:
            ids = {m.id for m in here}
            disk = [m for m in await broker.journal.load_backlog(view, limit) if m.id not in ids]
            here = heapq.nsmallest(limit, [*here, *disk], key=_urgency)
        return here
    found = await broker.journal.peek(where[0], where[1], state, limit)
    msgs = [_located(f, where[0], None).message for f in found]
    if state == "ready" and isinstance(view, Group) and view.ready:
        # claimed here and not delivered yet: still ready, and maybe the most urgent
        here = [_copy(m) for m in _first_here(view, "ready", limit)]
        msgs = heapq.nsmallest(limit, [*msgs, *here], key=_urgency)
    return msgs


async def peek(broker: Broker, view: View, state: State) -> Message | None:
    """The message of a view that leaves `state` next (beanstalkd peek-ready,
    peek-delayed, peek-buried), shared store included."""
    got = await first(broker, view, state, 1)
    return got[0] if got else None
