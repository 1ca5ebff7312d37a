"""The memory store: nothing survives the process, everything else of the contract holds.

It keeps the same per-group maps a durable store would, so the contract suite exercises
the broker's recording calls against it, and `open()` on a store that was used before
(the broker restarting in the same process, as tests do) gives the state back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.model import Message
from gateway.stores.base import Store, StoredGroup, StoredState, StoredTopic


class _Topic:
    __slots__ = ("backlog", "groups", "paused")

    def __init__(self) -> None:
        self.paused = False
        self.backlog: dict[int, Message] = {}
        self.groups: dict[str, _Group] = {}


class _Group:
    __slots__ = ("buried", "messages", "paused")

    def __init__(self) -> None:
        self.paused = False
        self.messages: dict[int, Message] = {}
        self.buried: set[int] = set()


class MemoryStore(Store):
    durable = False

    def __init__(self) -> None:
        self._topics: dict[str, _Topic] = {}
        self._last_id = 0

    async def open(self) -> StoredState:
        state = StoredState(last_id=self._last_id)
        for name, t in self._topics.items():
            st = StoredTopic(name, t.paused, backlog=sorted(t.backlog.values(), key=_by_id))
            for gname, g in t.groups.items():
                sg = StoredGroup(gname, g.paused)
                for msg in sorted(g.messages.values(), key=_by_id):
                    (sg.buried if msg.id in g.buried else sg.ready).append(msg)
                st.groups[gname] = sg
            state.topics[name] = st
        return state

    def _topic(self, topic: str) -> _Topic:
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = _Topic()
        return t

    def put(self, topic: str, group: str | None, messages: Sequence[Message]) -> None:
        if not messages:
            return
        t = self._topics.get(topic) or self._topic(topic)
        target = t.backlog if group is None else self._group(t, group).messages
        if len(messages) == 1:
            target[messages[0].id] = messages[0]
        else:
            target.update(zip(map(_by_id, messages), messages, strict=True))
        last = messages[-1].id  # ids ascend within a publish
        if last > self._last_id:
            self._last_id = last

    def _group(self, t: _Topic, group: str) -> _Group:
        g = t.groups.get(group)
        if g is None:
            g = t.groups[group] = _Group()
        return g

    def update(self, topic: str, group: str, message: Message, *, buried: bool = False) -> None:
        g = self._group(self._topic(topic), group)
        g.messages[message.id] = message
        if buried:
            g.buried.add(message.id)
        else:
            g.buried.discard(message.id)

    def remove(self, topic: str, group: str | None, ids: Iterable[int]) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        if group is None:
            for i in ids:
                t.backlog.pop(i, None)
            return
        g = t.groups.get(group)
        if g is None:
            return
        for i in ids:
            g.messages.pop(i, None)
            g.buried.discard(i)

    def add_topic(self, topic: str) -> None:
        self._topic(topic)

    def add_group(self, topic: str, group: str, *, adopt_backlog: bool) -> None:
        t = self._topic(topic)
        g = self._group(t, group)
        if adopt_backlog:
            g.messages.update(t.backlog)
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

    async def flush(self) -> None:
        # Accepted the moment it was recorded. No checkpoint here on purpose: a publish
        # path that awaits flush() must not yield to the scheduler for a memory store.
        return None


def _by_id(msg: Message) -> int:
    return msg.id
