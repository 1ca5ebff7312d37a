"""The memory store: nothing survives the process, everything else of the contract holds.

It keeps its own copies of what it is told (never the broker's live `Message` objects),
so the contract suite and the broker tests catch a change that was never recorded, and
`open()` on a store that was used before (the broker restarting in the same process, as
tests do) gives back exactly what was recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.model import Message
from gateway.stores.base import (
    Delivery,
    GroupRecorder,
    Store,
    StoredGroup,
    StoredState,
    StoredTopic,
)

# What a durable store would write for one message in one group: the per-group fields as
# they are when recorded, beside the live message for the fields that never change after a
# publish (body, headers, timestamp, ttr, reply_to, origin). A tuple, not a Message copy:
# the memory store holds one per queued message and group.
_Record = tuple[Message, int, int, float]  # (message, attempts, priority, due)


class _Topic:
    __slots__ = ("backlog", "groups", "paused")

    def __init__(self) -> None:
        self.paused = False
        self.backlog: dict[int, _Record] = {}
        self.groups: dict[str, _Group] = {}


class _Group:
    __slots__ = ("buried", "messages", "paused")

    def __init__(self) -> None:
        self.paused = False
        self.messages: dict[int, _Record] = {}
        self.buried: set[int] = set()


def _restore(record: _Record) -> Message:
    msg, attempts, priority, due = record
    m = Message(
        msg.id,
        msg.topic,
        msg.body,
        msg.timestamp,
        msg.headers,
        attempts,
        priority,
        due,
        msg.ttr,
        msg.reply_to,
        msg.origin,
    )
    m.header_block = msg.header_block
    return m


class _Recorder(GroupRecorder):
    """A group's door bound to the store's record of it: a delivery or a finish is one
    dict operation, with no lookup by name."""

    __slots__ = ("_record",)

    def __init__(self, store: MemoryStore, topic: str, group: str) -> None:
        super().__init__(store, topic, group)
        self._record = store._group(store._topic(topic), group)

    def put(self, messages: Sequence[Message], due: float) -> None:
        records = self._record.messages
        for msg in messages:
            records[msg.id] = (msg, msg.attempts, msg.priority, due)
        store = self.store
        last = messages[-1].id  # ids ascend within a publish
        if last > store._last_id:  # type: ignore[attr-defined]
            store._last_id = last  # type: ignore[attr-defined]

    def delivered(self, delivery: Delivery) -> None:
        message = delivery.message
        g = self._record
        g.messages[message.id] = (message, message.attempts, message.priority, 0.0)
        if g.buried:
            g.buried.discard(message.id)

    def finished(self, message: Message) -> None:
        g = self._record
        g.messages.pop(message.id, None)
        if g.buried:
            g.buried.discard(message.id)


class MemoryStore(Store):
    """`forgets`: what `--store memory://` makes. The copies above serve the contract
    suite, the broker's tests and a broker reopened in the same process; a gateway's
    memory:// store is opened once and nothing ever reads it back, so there the broker
    records its messages nowhere (NULL_JOURNAL, as for ephemeral topics): no second record
    of every queued message, and a publish, delivery and acknowledgement each skip a
    store call."""

    durable = False

    def __init__(self, *, forgets: bool = False) -> None:
        self._topics: dict[str, _Topic] = {}
        self._last_id = 0
        self.forgets = forgets

    async def open(self, window: int = 0) -> StoredState:
        state = StoredState(last_id=self._last_id)
        for name, t in self._topics.items():
            st = StoredTopic(name, t.paused, backlog=_restored(t.backlog))
            for gname, g in t.groups.items():
                sg = StoredGroup(gname, g.paused)
                for msg in _restored(g.messages):
                    (sg.buried if msg.id in g.buried else sg.ready).append(msg)
                sg.ready.sort(key=_key)
                st.groups[gname] = sg
            state.topics[name] = st
        return state

    def _topic(self, topic: str) -> _Topic:
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = _Topic()
        return t

    def _group(self, t: _Topic, group: str) -> _Group:
        g = t.groups.get(group)
        if g is None:
            g = t.groups[group] = _Group()
        return g

    def put(
        self, topic: str, groups: Sequence[str], messages: Sequence[Message], due: float
    ) -> None:
        if not messages:
            return
        t = self._topic(topic)
        targets = [self._group(t, g).messages for g in groups] if groups else [t.backlog]
        for target in targets:
            for msg in messages:
                target[msg.id] = (msg, msg.attempts, msg.priority, due)
        last = messages[-1].id  # ids ascend within a publish
        if last > self._last_id:
            self._last_id = last

    def update(
        self,
        topic: str,
        group: str,
        message: Message,
        due: float = 0.0,
        *,
        buried: bool = False,
        priority_was: int | None = None,
        expect: str = "*",
    ) -> None:
        # every delivery lands here: the common case is two dict lookups and a tuple
        t = self._topics.get(topic)
        g = t.groups.get(group) if t is not None else None
        if g is None:
            g = self._group(self._topic(topic), group)
        g.messages[message.id] = (message, message.attempts, message.priority, due)
        if buried:
            g.buried.add(message.id)
        elif g.buried:
            g.buried.discard(message.id)

    def remove(self, topic: str, group: str | None, messages: Iterable[Message]) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        if group is None:
            for m in messages:
                t.backlog.pop(m.id, None)
            return
        g = t.groups.get(group)
        if g is None:
            return
        records, buried = g.messages, g.buried
        for m in messages:
            records.pop(m.id, None)
            if buried:
                buried.discard(m.id)

    def recorder(self, topic: str, group: str) -> GroupRecorder:
        return _Recorder(self, topic, group)

    def add_topic(self, topic: str) -> None:
        self._topic(topic)

    def add_group(self, topic: str, group: str) -> None:
        self._group(self._topic(topic), group)

    def fan_out_backlog(self, topic: str, groups: Sequence[str]) -> None:
        t = self._topic(topic)
        for name in groups:
            self._group(t, name).messages.update(t.backlog)
        t.backlog.clear()

    def drop_group(self, topic: str, group: str) -> None:
        t = self._topics.get(topic)
        if t is not None:
            t.groups.pop(group, None)

    def drop_topic(self, topic: str) -> None:
        self._topics.pop(topic, None)

    def clear(self, topic: str, group: str | None) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        if group is None:
            t.backlog.clear()
        elif (g := t.groups.get(group)) is not None:
            g.messages.clear()
            g.buried.clear()

    def set_paused(self, topic: str, group: str | None, paused: bool) -> None:
        t = self._topic(topic)
        if group is None:
            t.paused = paused
        else:
            self._group(t, group).paused = paused

    def reserve_ids(self, ceiling: int) -> None:
        if ceiling > self._last_id:
            self._last_id = ceiling

    def flush_now(self) -> bool:
        return True

    async def flush(self) -> None:
        # Accepted the moment it was recorded. No checkpoint here on purpose: a publish
        # path that awaits flush() must not yield to the scheduler for a memory store.
        return None


def _restored(records: dict[int, _Record]) -> list[Message]:
    return [_restore(records[i]) for i in sorted(records)]


def _key(msg: Message) -> tuple[int, int]:
    return (msg.priority, msg.id)
