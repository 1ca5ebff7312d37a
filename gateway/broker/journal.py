"""The journal: the broker's one door to its store.

Every store call goes through here, and nothing else in the gateway calls the store: its
life cycle, every change to a queue that outlives the process (in the order it happens),
the group commit, ids, failure state and figures, a shared store's claims and reads. The
store's exception stops here: a failed call raises `StoreUnavailable`, the broker's own.
Ephemeral topics and groups (NSQ `#ephemeral`, NATS plain subscriptions) get
`NULL_JOURNAL`, which records nothing, so the queue code never asks "is this stored?".

The journal also picks each group's queue backend (`queue()`), once, when the group is
made: a local queue (queues.py) or, with a store several gateways share, a shared queue
(claims.py).

The broker keeps deadlines and deferrals on Trio's clock (tests drive it with MockClock);
the store keeps wall-clock times, because Trio's clock starts at a random offset in every
run. The conversion happens here, in both directions.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import trio

from gateway.broker.claims import MAX_LEASE, Claims, SharedQueue
from gateway.broker.errors import StoreUnavailable
from gateway.broker.queues import LocalQueue, Pager, Queue
from gateway.model import Message
from gateway.stores.base import (
    MIN_KEY,
    Found,
    GroupCounts,
    Key,
    SharedStore,
    Store,
    StoredState,
    StoreError,
    StoreStats,
)

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.broker.group import Group
    from gateway.broker.members import InFlight
    from gateway.broker.topic import Topic

T = TypeVar("T")

# ids are reserved in blocks, so that handing one out costs no store write, and a restart
# starts after the block: an id seen by a client is never handed out again. Reservations
# run a block ahead of use: a message may reach a consumer before its publish is
# committed, so the record that covers its id must have been written before, not with it.
ID_BLOCK = 1 << 16


def lease_until(deadline: float) -> float:
    """A delivery's deadline (broker clock; inf: none) as a shared store's claim keeps it:
    wall-clock, at most MAX_LEASE from now."""
    return to_wall(min(deadline, trio.current_time() + MAX_LEASE))


def to_wall(deliver_at: float) -> float:
    """A broker-clock time (0: now) as wall-clock seconds since the epoch (0: now)."""
    if deliver_at <= 0.0:
        return 0.0
    return deliver_at - trio.current_time() + time.time()


def from_wall(due: float) -> float:
    """A stored wall-clock due time as a broker-clock time (0: due already)."""
    if due <= 0.0:
        return 0.0
    left = due - time.time()
    return trio.current_time() + left if left > 0 else 0.0


def _unavailable(exc: StoreError) -> StoreUnavailable:
    unavailable = StoreUnavailable(str(exc))
    unavailable.__cause__ = exc
    return unavailable


async def _door(call: Awaitable[T]) -> T:
    """Await one store call; the store's exception becomes the broker's."""
    try:
        return await call
    except StoreError as exc:
        raise _unavailable(exc) from exc


def journal_for(broker: Broker, store: Store, window: int) -> Journal:
    """The broker's journal for `store`: the one place that asks whether the store is
    shared. `window`: a paging store's per-group memory window."""
    if isinstance(store, SharedStore) and store.shares:
        return SharedJournal(broker, store)
    return Journal(store, window if store.pages else 0)


@dataclass(slots=True, eq=False)
class Owed:
    """How many records so far must be durable before the reply to what made them: every
    put, and with a store several gateways share every change (what one gateway answered
    holds for the clients of all the others at once). A session reads `count` before and
    after a command: when it moved, the command's reply waits for the commit (the
    connection shell's reply gate). One integer compare per command."""

    count: int = 0


@dataclass(slots=True, eq=False)
class Recorder:
    """One group's door for the calls made on every message (a publish into this group
    alone, a delivery, a finish): the store's methods bound once, so that a hot path
    makes one call. A local store is told no deadline (its record says "ready, attempt
    counted"), so a local group's recorder has no time to convert."""

    # `due` already wall-clock: Journal.put converts it
    put: Callable[[Sequence[Message], float], None]
    delivered: Callable[[InFlight], None]
    delivered_all: Callable[[Iterable[InFlight]], None]
    # acknowledged, in their order (a consumer's batch of NSQ FINs read together, or one)
    finished_all: Callable[[Sequence[Message]], None]

    def touched(self, message: Message, deadline: float) -> None:
        """A delivery's deadline moved: a local store keeps none."""


class Journal:
    __slots__ = (
        *(
            "allocates_ids",
            "backend",
            "ceiling",
            "durable",
            "flush_waits",
            "forgets",
            "pager",
            "writes_on_loop",
        ),
        "reserved",
        *("owed", "store"),
    )

    # whether the store decides which groups a publish goes to, and keeps the topic's
    # backlog (a shared store: other gateways' groups count too)
    fans_out = False

    def __init__(self, store: Store, window: int = 0) -> None:
        self.store = store
        # the store's constants (see Store); a flush waits for a disk or a server if durable
        self.forgets = store.forgets if store else True
        self.durable = store.durable if store else False
        self.allocates_ids = store.allocates_ids if store else False
        self.flush_waits = store.flush_waits if store else False
        self.writes_on_loop = store.writes_on_loop if store else False
        # the last id reserved in the store, and a block below it the point past which
        # the next block is reserved; the broker compares each publish's last id with
        # `ceiling` before calling ids_used (one test instead of a call)
        self.reserved = 0
        self.ceiling = 0
        self.pager = Pager(window)
        # the broker-wide part of the stored groups' queues, whose task runs with the
        # broker: the pager here, the claimer with a shared store
        self.backend: Pager | Claims = self.pager
        self.owed = Owed()

    # -- the store's life cycle ------------------------------------------------

    async def open(self) -> StoredState:
        """What the store recorded (wall-clock times), with the ids' first block reserved
        and committed before any id is handed out (unless the store hands them out)."""
        state = await _door(self.store.open(self.pager.window))
        self.reserved = self.ceiling = state.last_id
        if not self.store.allocates_ids:
            self._reserve(state.last_id)
        await self.flush()
        return state

    def queue(self, group: Group) -> Queue:
        """A stored group's queue backend, chosen once, when the group is made."""
        return LocalQueue(group, self.pager)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The store's background work (a durable store's committer)."""
        await _door(self.store.run(task_status=task_status))

    async def flush(self) -> None:
        """The group-commit point: returns once every change so far is stored."""
        await _door(self.store.flush())

    def flush_now(self) -> bool:
        """`flush` where it needs no wait (Store.flush_now): True once every change so
        far is stored, False when `flush` must be awaited."""
        try:
            return self.store.flush_now()
        except StoreError as exc:
            raise _unavailable(exc) from exc

    async def close(self) -> None:
        await _door(self.store.close())

    @property
    def failed(self) -> StoreUnavailable | None:
        """Set while the store cannot write (publishes are refused)."""
        failed = self.store.failed
        return None if failed is None else _unavailable(failed)

    @property
    def where(self) -> str:
        return self.store.where

    def stats(self) -> StoreStats:
        return self.store.stats()

    # -- ids -------------------------------------------------------------------

    def take_ids(self, n: int) -> int:
        """The first of `n` new ids, from a store that hands them out."""
        try:
            return self.store.take_ids(n)
        except StoreError as exc:
            raise _unavailable(exc) from exc

    def ids_used(self, last_id: int) -> None:
        if last_id > self.ceiling:
            self._reserve(last_id)

    def _reserve(self, last_id: int) -> None:
        # two blocks past the last id used, the next reservation due after one: the ids
        # a publish takes were covered a block of ids earlier
        self.reserved = last_id + 2 * ID_BLOCK
        self.ceiling = last_id + ID_BLOCK
        self.store.reserve_ids(self.reserved)

    # -- messages --------------------------------------------------------------

    def put(self, topic: Topic, groups: Sequence[Group], messages: Sequence[Message]) -> None:
        """One publish's messages into `groups` (none: the topic's backlog). Ephemeral
        groups are left out; the body is stored once for all of the others."""
        if self.durable:
            self.owed.count += 1  # acknowledged once committed
        due = messages[0].deliver_at
        wall = to_wall(due) if due > 0.0 else 0.0
        if len(groups) == 1:  # the common case: the group's own door (a no-op if ephemeral)
            groups[0].recorder.put(messages, wall)
            return
        names = [g.name for g in groups if not g.ephemeral]
        if groups and not names:
            return
        self.store.put(topic.name, names, messages, wall)

    def changed(
        self,
        group: Group,
        message: Message,
        *,
        buried: bool = False,
        priority_was: int | None = None,
        expect: str = "*",
    ) -> None:
        """Attempts (a delivery), priority (then `priority_was` is the old one), delay or
        burial of one message changed. `expect` (a shared store): where the message must
        still be for the change to apply, "f" = claimed by this gateway (claims.py)."""
        self.store.update(
            group.topic.name,
            group.name,
            message,
            to_wall(message.deliver_at),
            buried=buried,
            priority_was=priority_was,
            expect=expect,
        )

    def recorder(self, group: Group) -> Recorder:
        """The group's door for its deliveries and finishes (see Recorder)."""
        rec = self.store.recorder(group.topic.name, group.name)
        return Recorder(rec.put, rec.delivered, rec.delivered_all, rec.finished_all)

    def removed(self, topic: Topic, group: Group | None, messages: Iterable[Message]) -> None:
        self.store.remove(topic.name, None if group is None else group.name, messages)

    async def load(self, group: Group, after: Key, limit: int) -> list[Message]:
        """Page in ready messages a durable store kept on disk, broker clock (due now)."""
        return await _door(self.store.load(group.topic.name, group.name, after, limit))

    async def find(self, where: Sequence[tuple[str, Sequence[str]]], msg_id: int) -> Found | None:
        """Message `msg_id` in the first (topic, groups) of `where` a shared store holds it
        in; wall-clock times as the store keeps them (query.py converts). A local store
        holds nothing the broker does not know of (what it keeps past a group's memory
        window, `find_spilled` reads)."""
        return None

    async def find_spilled(self, topic: str, group: str, msg_id: int) -> Message | None:
        """Message `msg_id` if it is ready on disk in a group ("": the topic's backlog),
        past the memory window (a paging store; LocalQueue.spilled_message)."""
        return await _door(self.store.find_ready(topic, group, msg_id))

    async def load_backlog(self, topic: Topic, limit: int) -> list[Message]:
        """The first ready messages of a topic's backlog in (priority, id) order, read from
        a paging store (a peek past an emptied memory window: BacklogWindow)."""
        return await _door(self.store.load(topic.name, "", MIN_KEY, limit))

    async def peek(self, topic: str, group: str, state: str, limit: int) -> list[Found]:
        return []

    async def adopt(self, name: str) -> None:
        """Make topic `name` here as a shared store has it, if another gateway made it
        (Broker.existing_topic). A local store has nothing the broker does not hold."""

    async def read_counts(self, topic: Topic) -> None:
        """A shared store's counts of `topic`'s groups, read now rather than as the last
        refresh left them (Broker.fresh_counts). A local store's counts are the broker's."""

    # -- topics and groups -----------------------------------------------------

    def topic_added(self, topic: Topic) -> None:
        self.store.add_topic(topic.name)

    def topic_dropped(self, topic: Topic) -> None:
        self.store.drop_topic(topic.name)

    def group_added(self, group: Group) -> None:
        self.store.add_group(group.topic.name, group.name)

    def group_dropped(self, group: Group) -> None:
        self.store.drop_group(group.topic.name, group.name)

    def backlog_fanned_out(self, topic: Topic, groups: Sequence[Group]) -> None:
        self.store.fan_out_backlog(topic.name, [g.name for g in groups if not g.ephemeral])

    def cleared(self, topic: Topic, group: Group | None) -> None:
        self.store.clear(topic.name, None if group is None else group.name)

    def paused(self, topic: Topic, group: Group | None, paused: bool) -> None:
        self.store.set_paused(topic.name, None if group is None else group.name, paused)


class _ClaimRecorder(Recorder):
    """A shared store's: a delivery keeps this gateway's claim until its deadline."""

    __slots__ = ("_finished_all", "_group", "_of", "_owed", "_put", "_store", "_topic")

    def __init__(self, store: SharedStore, of: Group, owed: Owed) -> None:
        topic, group = of.topic.name, of.name
        self._store, self._topic, self._group, self._owed = store, topic, group, owed
        self._of = of  # its queue, made after this, knows the leases of its claims
        rec = store.recorder(topic, group)
        self._put, self._finished_all = rec.put, rec.finished_all
        super().__init__(self._put_owed, self._delivered, self._delivered_all, self._finish_all)

    def _put_owed(self, messages: Sequence[Message], due: float) -> None:
        self._owed.count += 1
        self._put(messages, due)

    def _finish_all(self, messages: Sequence[Message]) -> None:
        self._owed.count += len(messages)
        self._finished_all(messages)

    def _delivered(self, entry: InFlight) -> None:
        self._delivered_all((entry,))

    def _delivered_all(self, entries: Iterable[InFlight]) -> None:
        queue = self._of.queue
        assert isinstance(queue, SharedQueue)
        # a delivery whose claim already lasts that long writes nothing
        for entry in queue.uncovered(entries):
            self._owed.count += 1
            self._store.claimed(
                self._topic, self._group, entry.message, lease_until(entry.deadline)
            )

    def touched(self, message: Message, deadline: float) -> None:
        self._owed.count += 1
        self._store.touched(self._topic, self._group, message, lease_until(deadline))


class SharedJournal(Journal):
    """The door to a store several gateways share: its claims, kicks and reads too."""

    __slots__ = ("claims", "shared_store")

    fans_out = True

    def __init__(self, broker: Broker, store: SharedStore) -> None:
        super().__init__(store, 0)  # the store keeps every stored group's queue: no paging
        self.shared_store = store
        self.backend = self.claims = Claims(broker, self)
        store.on_notify = self.claims.notified

    def queue(self, group: Group) -> Queue:
        return SharedQueue(group, self.claims, self)

    def recorder(self, group: Group) -> Recorder:
        return _ClaimRecorder(self.shared_store, group, self.owed)

    async def claim(self, group: Group, n: int, lease: float) -> tuple[list[Message], float | None]:
        """Up to `n` of the group's most urgent ready messages, claimed here for `lease`
        seconds, and when (broker clock) something else of the group becomes due, if
        anything does. The claim rides behind everything recorded before it."""
        claim = self.shared_store.claim(group.topic.name, group.name, n, lease)
        msgs, due, _expired = await _door(claim)
        if not due:
            return msgs, None
        return msgs, trio.current_time() + max(due - time.time(), 0.0)

    async def claim_id(self, group: Group, msg_id: int, lease: float) -> Message | None:
        """One particular message claimed for a delivery here (beanstalkd reserve-job)."""
        self.owed.count += 1
        return await _door(self.shared_store.claim_id(group.topic.name, group.name, msg_id, lease))

    async def kick(self, group: Group, n: int) -> tuple[int, list[Message]]:
        """Up to `n` buried (or deferred) messages ready again now; how many there were,
        and which when the group is archived."""
        archived = group.archive is not None
        self.owed.count += 1
        return await _door(
            self.shared_store.kick(group.topic.name, group.name, n, messages=archived)
        )

    async def find(self, where: Sequence[tuple[str, Sequence[str]]], msg_id: int) -> Found | None:
        return await _door(self.shared_store.find(where, msg_id))

    async def peek(self, topic: str, group: str, state: str, limit: int) -> list[Found]:
        return await _door(self.shared_store.peek(topic, group, state, limit))

    async def registry(self) -> dict[str, tuple[bool, dict[str, bool]]]:
        """Every topic, its pause and its groups with theirs, as all gateways made them,
        read after everything recorded here is written."""
        await self.flush()
        return await _door(self.shared_store.registry())

    async def adopt(self, name: str) -> None:
        await self.claims.adopt(name)

    async def read_counts(self, topic: Topic) -> None:
        await self.claims.read_counts([topic])

    async def registered(self, name: str) -> tuple[bool, dict[str, bool]] | None:
        """Topic `name`'s entry of the registry (see `registry`), None if unknown."""
        return await _door(self.shared_store.registered(name))

    async def holding(self, topics: Sequence[str]) -> set[str]:
        return await _door(self.shared_store.holding(topics))

    async def counts(self, topics: Sequence[tuple[str, Sequence[str]]]) -> list[list[GroupCounts]]:
        return await _door(self.shared_store.counts(topics))


def _owing(call: Callable[..., None]) -> Callable[..., None]:
    def owing(self: Journal, *args: object, **kwargs: object) -> None:
        self.owed.count += 1
        call(self, *args, **kwargs)

    return owing


# the calls that record a change (but a put): a shared store's every change is owed before
# its reply (see Owed), puts count in put()
_CHANGES = (
    *("changed", "removed", "topic_added", "topic_dropped", "group_added", "group_dropped"),
    *("backlog_fanned_out", "cleared", "paused"),
)
for _call in _CHANGES:
    setattr(SharedJournal, _call, _owing(getattr(Journal, _call)))


class _NullJournal(Journal):
    """For ephemeral topics and groups: records nothing (every recording call is a no-op,
    set below), and its groups' queues are in memory only."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]

    def recorder(self, group: Group) -> Recorder:
        return _NULL_RECORDER

    async def load(self, group: Group, after: Key, limit: int) -> list[Message]:
        return []


def _nothing(*args: object, **kwargs: object) -> None:
    pass


for _call in ("put", "ids_used", *_CHANGES):
    setattr(_NullJournal, _call, _nothing)

_NULL_RECORDER = Recorder(_nothing, _nothing, _nothing, _nothing)

NULL_JOURNAL: Journal = _NullJournal()
