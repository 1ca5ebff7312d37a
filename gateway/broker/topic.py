"""A topic: a named stream whose every message is copied to each of its groups."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.broker.group import Group
from gateway.model import Message

if TYPE_CHECKING:
    from gateway.broker.broker import Broker


class Topic:
    def __init__(self, broker: Broker, name: str, *, ephemeral: bool = False) -> None:
        self.broker = broker
        self.name = name
        self.ephemeral = ephemeral
        self.paused = False
        self.deleted = False
        self.groups: dict[str, Group] = {}
        # Messages published while no group exists (or while paused) wait here; the first
        # group created takes them all, as nsqd hands them to the first channel.
        self.backlog: list[Message] = []
        self.message_count = 0
        self.message_bytes = 0
        self.published_by: dict[str, int] = {}  # publisher protocol -> messages
        self._store = None if ephemeral else broker.store

    def put(self, messages: list[Message]) -> None:
        """One publish's messages (one priority and delay, ids ascending)."""
        self.message_count += len(messages)
        self.message_bytes += sum([len(m.body) for m in messages])
        if self.paused or not self.groups:
            self.backlog.extend(messages)
            if self._store is not None:
                self._store.put(self.name, None, messages)
            return
        self._fan_out(messages, fresh=True)

    def _fan_out(self, messages: list[Message], *, fresh: bool = False) -> None:
        if len(self.groups) == 1:  # the common case: no copies to make
            for group in self.groups.values():
                if group._store is not None:
                    group._store.put(self.name, group.name, messages)
                group.put(messages, fresh=fresh)
            return
        groups = list(self.groups.values())
        # copy for every other group before any group sees them: a delivery changes attempts
        batches = [messages] + [[m.copy() for m in messages] for _ in groups[1:]]
        for group, batch in zip(groups, batches, strict=True):
            if group._store is not None:
                group._store.put(self.name, group.name, batch)
            group.put(batch, fresh=fresh)

    def group(self, name: str, *, create: bool = True, ephemeral: bool = False) -> Group | None:
        group = self.groups.get(name)
        if group is None and create:
            group = Group(self, name, ephemeral=ephemeral, max_attempts=self.broker.max_attempts)
            adopt = not self.groups and bool(self.backlog) and not self.paused
            self.groups[name] = group
            if len(self.groups) == 1 and self.broker.on_groups is not None:
                self.broker.on_groups(self.name, True)
            if group._store is not None:
                group._store.add_group(self.name, name, adopt_backlog=adopt)
            if adopt:
                backlog, self.backlog = self.backlog, []
                group.put(backlog)
        return group

    def delete_group(self, name: str) -> bool:
        group = self.groups.pop(name, None)
        if group is None:
            return False
        group.close()
        if group._store is not None:
            group._store.drop_group(self.name, name)
        if not self.groups and self.broker.on_groups is not None:
            self.broker.on_groups(self.name, False)
        if self.ephemeral and not self.groups:
            self.broker.delete_topic(self.name)
        return True

    def pause(self) -> None:
        self.paused = True
        if self._store is not None:
            self._store.set_paused(self.name, None, True)

    def unpause(self) -> None:
        self.paused = False
        if self._store is not None:
            self._store.set_paused(self.name, None, False)
        if self.backlog and self.groups:
            backlog, self.backlog = self.backlog, []
            if self._store is not None:
                self._store.remove(self.name, None, [m.id for m in backlog])
            self._fan_out(backlog)

    def delete_backlog(self, msg_id: int) -> Message | None:
        """Delete one message waiting in the backlog (beanstalkd delete of a job in a tube
        nobody watches yet); None when it is not there."""
        for i, msg in enumerate(self.backlog):
            if msg.id == msg_id:
                del self.backlog[i]
                if self._store is not None:
                    self._store.remove(self.name, None, (msg_id,))
                return msg
        return None

    def empty(self) -> None:
        """Drop the topic-level backlog (nsqd /topic/empty); groups keep their messages."""
        self.backlog.clear()
        if self._store is not None:
            self._store.clear(self.name, None)

    @property
    def depth(self) -> int:
        return len(self.backlog)
