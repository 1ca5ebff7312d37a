"""Read-only questions about the broker's queues, for everyone outside the broker.

Sessions, the HTTP layer and metrics ask here instead of reading a group's containers
(`ready`, `deferred`, `in_flight`, `buried`) or a topic's `backlog`: those are the
storage side's to reshape (a memory window over a disk queue, a Redis-backed queue) and
only this module and the broker itself may know their layout. Nothing here changes
anything; mutations stay calls on Broker, Topic and Group.

A *view* is what a reader looks at on a topic: one of its groups, or the topic itself
when its messages wait in the backlog for a first group (beanstalkd shows a tube in that
state with ready and delayed jobs).

Counts include what a durable store keeps past a group's memory window (its queue's
`spilled`, ready messages only); peeks and lists look at memory, whose window holds the most urgent
messages, so what they show is what would be delivered next.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Final, Literal, cast

import trio

from gateway.broker.group import Group, InFlight
from gateway.broker.journal import from_wall
from gateway.broker.topic import Topic
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
    """Where a message is: its state, and the group holding it (None: the topic backlog)."""

    state: State
    message: Message
    topic: Topic
    group: Group | None
    # seconds to the deadline or due time, as a shared store (Redis) had it when the
    # message was found there (None: found here, the broker's own clock tells)
    left: float | None = None

    @property
    def view(self) -> View:
        return self.group if self.group is not None else self.topic


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer of a group as an operator sees it."""

    protocol: str  # the sink's metrics label: "nsq", "beanstalk", ... ("other" if none)
    address: str  # the peer's "host:port" ("" when the sink has none)
    in_flight: int
    ready: int  # the window: NSQ's RDY; beanstalkd: in_flight + 1 while a reserve waits


# -- topics and groups ---------------------------------------------------------------------


def topic(broker: Broker, name: str) -> Topic | None:
    """The topic `name` if it exists (never creates one: that is `Broker.topic`)."""
    return broker.topics.get(name)


def topics(broker: Broker, *, by_name: bool = False) -> list[Topic]:
    """Every topic, in creation order (beanstalkd's list-tubes order) or sorted by name."""
    if by_name:
        return sorted(broker.topics.values(), key=_name)
    return list(broker.topics.values())


def topic_names(broker: Broker, *, by_name: bool = False) -> list[str]:
    names = list(broker.topics)
    return sorted(names) if by_name else names


def group(t: Topic, name: str) -> Group | None:
    """The group `name` of topic `t` if it exists (never creates one: `Topic.group`)."""
    return t.groups.get(name)


def groups(t: Topic, *, by_name: bool = False) -> list[Group]:
    if by_name:
        return sorted(t.groups.values(), key=_name)
    return list(t.groups.values())


def consumers(g: Group) -> list[ConsumerInfo]:
    """The group's consumers, in the order they joined."""
    return [
        ConsumerInfo(
            getattr(c.sink, "protocol", "other"),
            getattr(c.sink, "remote", ""),
            c.in_flight,
            c.ready,
        )
        for c in g.consumers
    ]


def has_groups(t: Topic) -> bool:
    """True when the topic hands its messages to groups (else they wait in the backlog)."""
    return bool(t.groups)


def _name(item: Topic | Group) -> str:
    return item.name


# -- counts --------------------------------------------------------------------------------


def ready_count(g: Group) -> int:
    return g.depth


def spilled_count(g: Group) -> int:
    return g.queue.spilled


def delayed_count(g: Group) -> int:
    return len(g.deferred) + g.queue.stored_delayed


def reserved_count(g: Group) -> int:
    return len(g.in_flight)


def buried_count(g: Group) -> int:
    return len(g.buried) + g.queue.stored_buried


def urgent_count(g: Group) -> int:
    return g.ready.count_below(URGENT_BELOW)


def holds_messages(g: Group) -> bool:
    """True while the group keeps any message, in whatever state."""
    q = g.queue
    return bool(
        g.depth or g.deferred or g.buried or g.in_flight or q.stored_delayed or q.stored_buried
    )


def backlog_depth(t: Topic) -> int:
    """Messages waiting in the topic backlog, due or not (nsqd's topic depth)."""
    return t.depth


def counts(view: View, now: float | None = None) -> Counts:
    """Every state's count for a group, or for a topic backlog (ready and delayed only,
    split by deliver_at against `now`, the current time unless given)."""
    if isinstance(view, Group):
        return Counts(
            ready_count(view),
            delayed_count(view),
            reserved_count(view),
            buried_count(view),
            urgent_count(view),
            spilled_count(view),
        )
    ready, delayed = split_backlog(view, now)
    urgent = sum(1 for m in ready if m.priority < URGENT_BELOW)
    return Counts(len(ready), len(delayed), 0, 0, urgent, 0)


# -- the backlog: the one ready/delayed selection ----------------------------------------------


def _due(msg: Message, now: float) -> bool:
    # deliver_at is on the broker's (Trio) clock; 0.0 means "now"
    return msg.deliver_at <= now


def split_backlog(t: Topic, now: float | None = None) -> tuple[list[Message], list[Message]]:
    """The backlog as (ready, delayed), each in publish order."""
    if now is None:
        now = trio.current_time()
    ready: list[Message] = []
    delayed: list[Message] = []
    for msg in t.backlog:
        (ready if _due(msg, now) else delayed).append(msg)
    return ready, delayed


def backlog_state(msg: Message, now: float | None = None) -> State:
    """The state of a message waiting in a backlog."""
    return "ready" if _due(msg, trio.current_time() if now is None else now) else "delayed"


# -- peeks -----------------------------------------------------------------------------------


def _urgency(msg: Message) -> tuple[int, int]:
    return msg.priority, msg.id


def _due_order(msg: Message) -> tuple[float, int]:
    return msg.deliver_at, msg.id


def peek_ready(view: View, now: float | None = None) -> Message | None:
    """The ready message delivered next: lowest (priority, id)."""
    if isinstance(view, Group):
        return view.ready.peek()
    ready, _ = split_backlog(view, now)
    return min(ready, key=_urgency, default=None)


def peek_delayed(view: View, now: float | None = None) -> Message | None:
    """The delayed message due first: lowest (deliver_at, id)."""
    if isinstance(view, Group):
        return view.deferred[0][2] if view.deferred else None
    _, delayed = split_backlog(view, now)
    return min(delayed, key=_due_order, default=None)


def peek_buried(view: View) -> Message | None:
    """The oldest buried message (the one a kick takes first); a backlog buries none."""
    if isinstance(view, Group) and view.buried:
        return next(iter(view.buried.values()))
    if isinstance(view, Group) and view.queue.stored_buried_head is not None:
        return view.queue.stored_buried_head  # a shared store's, as last refreshed
    return None


# -- lists (the admin page) ------------------------------------------------------------------


def first_ready(g: Group, limit: int) -> list[Message]:
    """Up to `limit` ready messages in delivery order (lowest (priority, id) first)."""
    return heapq.nsmallest(limit, g.ready, key=_urgency)


def first_delayed(g: Group, limit: int) -> list[Message]:
    """Up to `limit` delayed messages, the soonest due first."""
    # heap entries are (deliver_at, id, msg); ids are unique, so msg is never compared
    return [entry[2] for entry in heapq.nsmallest(limit, g.deferred)]


def first_buried(g: Group, limit: int) -> list[Message]:
    """Up to `limit` buried messages, oldest burial first."""
    return list(islice(g.buried.values(), max(0, limit)))


# -- one message -----------------------------------------------------------------------------


def locate(view: View, msg_id: int, now: float | None = None) -> Located | None:
    """Where message `msg_id` is in a group (any state) or in a topic backlog."""
    if isinstance(view, Group):
        found = view.find(msg_id)
        if found is None:
            return None
        return Located(cast(State, found[0]), found[1], view.topic, view)
    for msg in view.backlog:
        if msg.id == msg_id:
            return Located(backlog_state(msg, now), msg, view, None)
    return None


def locate_in(
    broker: Broker, msg_id: int, view_of: Callable[[Topic], View | None]
) -> Located | None:
    """Look for `msg_id` in each topic's view as `view_of` picks it (None: skip the
    topic), topics in creation order; the first hit wins."""
    for t in broker.topics.values():
        view = view_of(t)
        if view is not None:
            found = locate(view, msg_id)
            if found is not None:
                return found
    return None


def reservation(g: Group, msg_id: int) -> InFlight | None:
    """The delivery holding `msg_id` in flight (its consumer and deadline), if any."""
    return g.in_flight.get(msg_id)


def time_left(found: Located, now: float | None = None) -> float:
    """Seconds until a reserved message's deadline or a delayed one's due time; 0 for the
    other states and for a time already past."""
    if found.left is not None:
        return found.left
    if now is None:
        now = trio.current_time()
    if found.state == "reserved" and found.group is not None:
        entry = found.group.in_flight.get(found.message.id)
        left = entry.deadline - now if entry is not None else 0.0
    elif found.state == "delayed":
        left = found.message.deliver_at - now
    else:
        left = 0.0
    return max(0.0, left)


def retired_counts(broker: Broker) -> dict[tuple[str, str], dict[str, list[int]]]:
    """Per (topic, group) of deleted groups, per consumer protocol, their last counts
    (stats.COUNTS order): a metrics counter continues from them; ("", "") sums the rest."""
    return broker.retired_counts


def retired_published(broker: Broker) -> dict[str, dict[str, int]]:
    """Per deleted topic, per publisher protocol, the messages it had been published."""
    return broker.retired_published


# -- a shared store (Redis): what other gateways hold, defer or bury -------------------
#
# With a shared store a group here keeps only what this gateway claimed; the rest of the
# queue is in Redis, where any gateway may have it in flight, deferred or buried. These
# ask the broker's journal, which asks the store; with a local store they answer from
# memory like the functions above, so a caller needs no second path.


def shared(broker: Broker) -> bool:
    """True when the queues are in a store several gateways share (Redis)."""
    return broker.journal.fans_out


def _stored(view: View) -> tuple[str, str] | None:
    """(topic, group) in a shared store for a view ("" is the topic backlog), or None."""
    if isinstance(view, Group):
        return (view.topic.name, view.name) if view.queue.elsewhere else None
    return (view.name, "") if view.store_fans_out and not view.groups else None


def _located(found: Found, t: Topic, g: Group | None) -> Located:
    msg = found.message
    left = 0.0
    if found.state in ("reserved", "delayed") and found.at > 0:
        left = max(0.0, found.at - time.time())
        if found.state == "delayed":
            msg.deliver_at = from_wall(found.at)
    return Located(cast(State, found.state), msg, t, g, left)


async def find_in(broker: Broker, view: View, msg_id: int) -> Located | None:
    """`locate`, then the shared store: message `msg_id` in one view, in any state."""
    found = locate(view, msg_id)
    where = _stored(view)
    if found is not None or where is None:
        return found
    hit = await broker.journal.find([(where[0], [where[1]])], msg_id)
    if hit is None:
        return None
    t = view.topic if isinstance(view, Group) else view
    return _located(hit, t, view if isinstance(view, Group) else None)


async def find(
    broker: Broker, msg_id: int, view_of: Callable[[Topic], View | None]
) -> Located | None:
    """`locate_in`, then the shared store: one round trip over every topic's view."""
    found = locate_in(broker, msg_id, view_of)
    if found is not None or not shared(broker):
        return found
    views: dict[str, View] = {}
    where: list[tuple[str, list[str]]] = []
    for t in broker.topics.values():
        view = view_of(t)
        stored = _stored(view) if view is not None else None
        if view is not None and stored is not None:
            views[t.name] = view
            where.append((stored[0], [stored[1]]))
    hit = await broker.journal.find(where, msg_id) if where else None
    if hit is None:
        return None
    view = views[hit.topic]
    t = view.topic if isinstance(view, Group) else view
    return _located(hit, t, view if isinstance(view, Group) else None)


async def first(broker: Broker, view: View, state: State, limit: int) -> list[Message]:
    """Up to `limit` messages of a view in `state` (ready, delayed, buried), in the order
    they leave it: the peeks and the admin page's lists, shared store included."""
    where = _stored(view)
    if where is None:
        if state == "ready":
            if isinstance(view, Group):
                return first_ready(view, limit)
            return heapq.nsmallest(limit, split_backlog(view)[0], key=_urgency)
        if state == "delayed":
            if isinstance(view, Group):
                return first_delayed(view, limit)
            return heapq.nsmallest(limit, split_backlog(view)[1], key=_due_order)
        return first_buried(view, limit) if isinstance(view, Group) else []
    found = await broker.journal.peek(where[0], where[1], state, limit)
    msgs = [_located(f, broker.topics[where[0]], None).message for f in found]
    if state == "ready" and isinstance(view, Group) and view.ready:
        # claimed here and not delivered yet: still ready, and maybe the most urgent
        msgs = heapq.nsmallest(limit, [*msgs, *first_ready(view, limit)], key=_urgency)
    return msgs


async def peek(broker: Broker, view: View, state: State) -> Message | None:
    """The message of a view that leaves `state` next (beanstalkd peek-ready,
    peek-delayed, peek-buried), shared store included."""
    if _stored(view) is None:  # the heads, without a pass over the queues
        if state == "ready":
            return peek_ready(view)
        return peek_delayed(view) if state == "delayed" else peek_buried(view)
    got = await first(broker, view, state, 1)
    return got[0] if got else None
