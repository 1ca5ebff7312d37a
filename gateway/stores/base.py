"""The store contract: what the broker records, and what it gets back after a restart.

The broker keeps every queue in memory and is the only reader on the hot path; a store is
the durable record behind it. The broker calls the recording methods synchronously, in the
order things happen, and awaits `flush()` before it acknowledges a publish to a client:
that is the group-commit point, so a durable store may collect every call made since the
last flush into one transaction. `open()` returns the state those calls imply.

Ephemeral topics and groups (NSQ `#ephemeral`, NATS plain subscriptions) never reach the
store. In-flight deliveries are not recorded: after a restart they are ready again, which
is the at-least-once promise.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from gateway.model import Message


@dataclass
class StoredGroup:
    name: str
    paused: bool = False
    ready: list[Message] = field(default_factory=list)  # includes deferred (deliver_at > 0)
    buried: list[Message] = field(default_factory=list)


@dataclass
class StoredTopic:
    name: str
    paused: bool = False
    backlog: list[Message] = field(default_factory=list)  # published before any group existed
    groups: dict[str, StoredGroup] = field(default_factory=dict)


@dataclass
class StoredState:
    topics: dict[str, StoredTopic] = field(default_factory=dict)
    last_id: int = 0  # the largest message id ever handed out


class Store(abc.ABC):
    durable: ClassVar[bool] = False

    @abc.abstractmethod
    async def open(self) -> StoredState:
        """Recover the recorded state. Called once, before anything is recorded."""

    @abc.abstractmethod
    def put(self, topic: str, group: str | None, messages: Sequence[Message]) -> None:
        """New messages for a group (`None`: the topic's backlog, no group exists yet)."""

    @abc.abstractmethod
    def update(self, topic: str, group: str, message: Message, *, buried: bool = False) -> None:
        """A message's per-group fields changed (attempts, priority, deliver_at, buried)."""

    @abc.abstractmethod
    def remove(self, topic: str, group: str | None, ids: Iterable[int]) -> None:
        """Messages acknowledged or deleted."""

    @abc.abstractmethod
    def add_topic(self, topic: str) -> None: ...

    @abc.abstractmethod
    def add_group(self, topic: str, group: str, *, adopt_backlog: bool) -> None:
        """A group was created; with `adopt_backlog` it takes over the topic's backlog."""

    @abc.abstractmethod
    def drop_group(self, topic: str, group: str) -> None: ...

    @abc.abstractmethod
    def drop_topic(self, topic: str) -> None: ...

    @abc.abstractmethod
    def clear(self, topic: str, group: str | None) -> None:
        """Empty a group's queue (or the topic backlog): ready, deferred and buried."""

    @abc.abstractmethod
    def set_paused(self, topic: str, group: str | None, paused: bool) -> None: ...

    @abc.abstractmethod
    async def flush(self) -> None:
        """Return once everything recorded so far is accepted (on disk, for a durable store)."""

    async def close(self) -> None:
        """Flush and release resources."""
        await self.flush()
