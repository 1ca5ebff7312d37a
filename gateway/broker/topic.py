"""A topic: a named stream whose every message is copied to each of its groups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.archive.events import DELETED
from gateway.broker.group import Group
from gateway.broker.journal import NULL_JOURNAL
from gateway.broker.queues import BacklogWindow
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
        self.journal = NULL_JOURNAL if ephemeral else broker.messages_journal
        # A shared store decides which groups a publish goes to, atomically (other
        # gateways' groups count too), and keeps the backlog; its depth there, as last
        # refreshed (claims.py). Chosen by the journal, once.
        self.store_fans_out = self.journal.fans_out
        self.stored_backlog = 0
        self.stored_backlog_delayed = 0  # of which deferred
        # with a paging store, the backlog's memory window: what is past it stays on disk
        # (the journal's window is 0 for any other store, and for an ephemeral topic)
        self.window = BacklogWindow(self.journal.pager.window)
        # this topic's archive recorder; None when archiving is off or leaves it out
        archive = broker.archive
        self.archive = archive.recorder(name) if archive is not None else None

    def put(self, messages: list[Message], bodies: Sequence[bytes]) -> None:
        """One publish's messages (one priority and delay, ids ascending) and their
        bodies, as the publisher gave them."""
        if self.archive is not None:
            self.archive.published(messages, bodies)
        n = len(messages)
        self.message_count += n
        self.message_bytes += len(bodies[0]) if n == 1 else sum(map(len, bodies))
        if self.store_fans_out:
            self.journal.put(self, (), messages)
            local = [g for g in self.groups.values() if g.ephemeral]
            if local and not self.paused:
                self._fan_out(local, messages, fresh=True)
            for g in self.groups.values():
                if not g.ephemeral:
                    g.put(messages, fresh=True)  # counts, and claims if consumers wait
            return
        groups = self.groups
        if self.paused or not groups:
            self.journal.put(self, (), messages)
            self.backlog.extend(self.window.admit(len(self.backlog), messages))
            return
        if len(groups) == 1:  # the common case: no list to build, no copies to make
            (group,) = groups.values()
            self.journal.put(self, (group,), messages)
            group.put(messages, fresh=True)
            return
        # recorded once for every group (the body is stored once), before any group can
        # deliver one of them and record that
        every = list(groups.values())
        self.journal.put(self, every, messages)
        self._fan_out(every, messages, fresh=True)

    def _fan_out(
        self, groups: list[Group], messages: list[Message], *, fresh: bool = False
    ) -> None:
        if len(groups) == 1:  # the common case: no copies to make
            groups[0].put(messages, fresh=fresh)
            return
        # copy for every other group before any group sees them: a delivery changes attempts
        batches = [messages] + [[m.copy() for m in messages] for _ in groups[1:]]
        for group, batch in zip(groups, batches, strict=True):
            group.put(batch, fresh=fresh)

    def group(
        self, name: str, *, create: bool = True, ephemeral: bool = False, record: bool = True
    ) -> Group | None:
        """`record=False`: made by another gateway sharing the store (claims.py)."""
        group = self.groups.get(name)
        if group is None and create:
            group = Group(self, name, ephemeral=ephemeral, max_attempts=self.broker.max_attempts)
            adopt = self._adopts(group)
            self.groups[name] = group
            if len(self.groups) == 1 and self.broker.on_groups is not None:
                self.broker.on_groups(self.name, True)
            if record:
                group.journal.group_added(group)
            self.broker.names_changed(self.name, name, True)
            if adopt:
                backlog, self.backlog = self.backlog, []
                self.journal.backlog_fanned_out(self, [group])
                group.put(backlog)
                group.queue.adopt_spilled(*self.window.handed_over())
        return group

    def _adopts(self, group: Group) -> bool:
        """Whether `group`, new, takes the backlog: the first group does, as nsqd's first
        channel gets what its topic kept. A backlog partly on disk (past its memory window)
        waits for a group that can page it in: not an ephemeral one, which keeps nothing
        on disk."""
        if self.paused or not (self.backlog or self.window.spilled):
            return False
        if not self.window.spilled:
            return not self.groups
        return not group.ephemeral and all(g.ephemeral for g in self.groups.values())

    def delete_group(self, name: str) -> bool:
        group = self.groups.pop(name, None)
        if group is None:
            return False
        group.close()
        group.journal.group_dropped(group)
        if not self.groups and self.broker.on_groups is not None:
            self.broker.on_groups(self.name, False)
        if self.ephemeral and not self.groups:
            self.broker.delete_topic(self.name)
        return True

    def pause(self) -> None:
        self.paused = True
        self.journal.paused(self, None, True)

    def unpause(self) -> None:
        self.paused = False
        self.journal.paused(self, None, False)
        groups = list(self.groups.values())
        if self.window.spilled:  # partly on disk: for the groups that can page it in
            groups = [g for g in groups if not g.ephemeral]
        if (self.backlog or self.window.spilled) and groups:
            backlog, self.backlog = self.backlog, []
            self.journal.backlog_fanned_out(self, groups)
            self._fan_out(groups, backlog)
            spilled = self.window.handed_over()
            for group in groups:
                group.queue.adopt_spilled(*spilled)

    def delete_backlog(self, msg_id: int) -> Message | None:
        """Delete one message waiting in the backlog (beanstalkd delete of a job in a tube
        nobody watches yet); None when it is not there."""
        for i, msg in enumerate(self.backlog):
            if msg.id == msg_id:
                del self.backlog[i]
                if self.archive is not None:
                    self.archive.record(DELETED, msg, "")
                self.journal.removed(self, None, (msg,))
                return msg
        return None

    def withdraw(self, msg: Message) -> int:
        """Take back a message just published wherever it waits here, in the backlog (in
        memory or on disk past its window) or in the groups (ready, deferred or buried,
        in memory or on disk); a copy a consumer holds stays with it. How many copies."""
        removed = 0
        if self.delete_backlog(msg.id) is not None:
            removed += 1
        elif self.window.withdraw(msg):
            if self.archive is not None:
                self.archive.record(DELETED, msg, "")
            self.journal.removed(self, None, (msg,))
            removed += 1
        for group in self.groups.values():
            removed += group.delete(msg.id) or group.queue.withdraw_spilled(msg)
        return removed

    def empty(self) -> None:
        """Drop the topic-level backlog (nsqd /topic/empty); groups keep their messages."""
        self.backlog.clear()
        self.window.handed_over()
        self.journal.cleared(self, None)

    @property
    def depth(self) -> int:
        return len(self.backlog) + self.stored_backlog + self.window.spilled
