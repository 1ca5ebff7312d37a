"""What every beanstalkd connection of one gateway shares, and how tubes map onto topics.

A tube is a topic. Its beanstalkd view is one group of that topic (`beanstalk.group` in the
settings, shared by every beanstalkd worker), created by the workers: `watch` and the
commands that act on jobs by tube. Producers (`use`, `put`) create only the topic, as NSQ
producers do, so a beanstalkd producer feeding NSQ consumers leaves no copy behind in a
group nobody reads. Until a topic has any group, its messages wait in the topic backlog,
and the beanstalkd view reads that backlog.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.broker import Broker, Group, Topic, query
from gateway.metrics import Metrics

if TYPE_CHECKING:
    from gateway.protocols.beanstalk.session import BeanstalkSession

DEFAULT_TUBE = "default"


@dataclass
class BeanstalkServer:
    broker: Broker
    metrics: Metrics
    group_name: str = "beanstalk"
    max_job_size: int = 65535  # beanstalkd -z; its default is 2^16 - 1
    default_ttr: int = 60  # seconds, for messages published without one (NSQ, NATS)
    turn_budget: float = 0.00002  # seconds of commands per connection between yields
    max_errors_in_a_row: int = 100  # protocol errors before the connection is closed
    draining: bool = False  # beanstalkd's SIGUSR1: every put answers DRAINING
    sessions: set[BeanstalkSession] = field(default_factory=set)
    commands: Counter[str] = field(default_factory=Counter)  # cmd-* of `stats`
    total_connections: int = 0
    tube_deletes: Counter[str] = field(default_factory=Counter)  # cmd-delete per tube
    tube_pauses: Counter[str] = field(default_factory=Counter)  # cmd-pause-tube per tube
    using: Counter[str] = field(default_factory=Counter)
    watching: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.time)
    # `stats` id: random per process, and starting with a hex letter so that YAML and
    # pheanstalk read it as a string
    instance_id: str = field(default_factory=lambda: "a" + secrets.token_hex(8)[1:])

    def report_bytes(self) -> None:
        """Sessions count their bytes in batches; a scrape wants them now."""
        for session in self.sessions:
            session.report_bytes()

    def start(self) -> None:
        """beanstalkd always has the `default` tube, with its workers' group: made once the
        store is open, and only when the beanstalkd listener runs (a group is interest a
        NATS cluster hears about)."""
        self.ensure_tube(DEFAULT_TUBE)

    # -- tubes ------------------------------------------------------------------

    def ensure_tube(self, tube: str) -> Topic:
        topic = self.broker.topic(tube, create=False)
        if topic is None:
            topic = self.broker.topic(tube)
            assert topic is not None
            if tube == DEFAULT_TUBE:
                self.worker_group(tube)
        return topic

    def group(self, tube: str, *, create: bool = False) -> Group | None:
        """The tube's beanstalkd group. With `create`, it is made when the topic has no
        group at all (it then takes the backlog); a topic already read by other groups
        (NSQ channels) gets one only from `watch`."""
        topic = self.broker.topic(tube, create=create)
        if topic is None:
            return None
        group = topic.group(self.group_name, create=False)
        if group is None and create and not topic.groups:
            group = topic.group(self.group_name)
        return group

    def worker_group(self, tube: str) -> Group:
        """The group a `watch` joins, made whatever other groups the topic has."""
        topic = self.broker.topic(tube)
        assert topic is not None
        group = topic.group(self.group_name)
        assert group is not None
        return group

    def view(self, tube: str) -> Group | Topic | None:
        """What beanstalkd clients see of a tube: its group, or the backlog of a topic
        that has no group yet; None for a topic read only by other groups."""
        topic = self.broker.topic(tube, create=False)
        return self._view_of(topic) if topic is not None else None

    def _view_of(self, topic: Topic) -> Group | Topic | None:
        group = topic.group(self.group_name, create=False)
        if group is not None:
            return group
        return topic if not topic.groups else None

    def tube_names(self) -> list[str]:
        return [name for name in query.topic_names(self.broker) if _beanstalk_name(name)]

    def release_tube(self, tube: str) -> None:
        """A connection stopped using or watching `tube`: delete it if nothing holds it."""
        if tube == DEFAULT_TUBE or self.using[tube] or self.watching[tube]:
            return
        topic = self.broker.topic(tube, create=False)
        if topic is None or topic.store_fans_out:
            # other gateways publish to it (a store they share): their workers may use
            # the tube, and jobs may reach it from there at any moment: it stays
            return
        group = topic.group(self.group_name, create=False)
        if group is not None:
            if group.consumers or query.holds_messages(group):
                return
            if set(group.by_protocol) - {"beanstalk"}:
                # an NSQ channel named like the workers' group (docs/semantics.md) that
                # an NSQ consumer used: nsqd keeps a channel its consumers left
                return
            topic.delete_group(self.group_name)
        if not topic.groups and not topic.depth and not topic.deleted:
            self.broker.delete_topic(tube)
            self.tube_deletes.pop(tube, None)
            self.tube_pauses.pop(tube, None)

    # -- jobs by id -----------------------------------------------------------------

    def find_job(self, job_id: int) -> query.Located | None:
        """A job in any tube: its state, the message, and the group (or topic backlog)."""
        return query.locate_in(self.broker, job_id, self._job_view)

    async def find_shared_job(self, job_id: int) -> query.Located | None:
        """`find_job`, and with a shared store (Redis) also what another gateway holds,
        deferred or buried."""
        return await query.find(self.broker, job_id, self._job_view)

    def _job_view(self, topic: Topic) -> Group | Topic | None:
        # a groupless topic's backlog is a tube only under a name beanstalkd clients can use
        view = self._view_of(topic)
        if isinstance(view, Topic) and not _beanstalk_name(topic.name):
            return None
        return view

    # -- process facts for `stats` ------------------------------------------------------

    @property
    def pid(self) -> int:
        return os.getpid()


_NAME_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-+/;.$_()")


def _beanstalk_name(name: str) -> bool:
    raw = name.encode()
    return 0 < len(raw) <= 200 and raw[0] != 0x2D and all(b in _NAME_CHARS for b in raw)
