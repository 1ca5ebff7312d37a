"""The store contract: what the broker records, and what it gets back after a restart.

The broker keeps the hot part of every queue in memory and is the only caller: every
store call goes through its journal (gateway/broker/journal.py), in the order things
happen. The recording methods are synchronous and cheap (a durable store only queues
them); `flush()` is the group-commit point the broker awaits before a publish is
acknowledged, so a durable store writes every call made since the last flush in one
transaction. `open()` returns the state those calls imply.

Rules every store keeps (the contract suite in tests/contract/ checks them):
* Times are wall-clock seconds since the epoch (`due`); 0 means "now". The broker converts
  its own clock at the boundary.
* What a store is told is copied when it is told: a later change to a live `Message`
  that was never recorded must not show after a restart.
* A body is stored once however many groups hold the message.
* Ids are never handed out twice: `reserve_ids` records a ceiling, and `open()` returns
  a `last_id` at or above every id recorded or reserved.
* In-flight deliveries are recorded as an `update` with the new attempts count; after a
  restart such a message is simply ready, and its next delivery shows attempts + 1.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import trio

from gateway.model import Message

# a ready message's place in its group: (priority, id)
Key = tuple[int, int]
MIN_KEY: Key = (-(1 << 63), -1)  # before every (priority, id)


class StoreError(Exception):
    """The store cannot record what it is told (disk full, I/O error). Publishes are
    refused with the protocol's own failure reply until writes succeed again."""


@dataclass
class StoredGroup:
    name: str
    paused: bool = False
    # ready and deferred (deliver_at = wall-clock due time > 0) messages in (priority, id)
    # order; with a paging store only the first `window` ready ones, the rest on disk
    ready: list[Message] = field(default_factory=list)
    buried: list[Message] = field(default_factory=list)
    spilled: int = 0  # ready messages left on disk, every one after `ready` in order


@dataclass
class StoredTopic:
    name: str
    paused: bool = False
    # published while no group existed (or while paused), in id order; with a paging store
    # only the first `window` ready ones in (priority, id) order and every deferred one
    backlog: list[Message] = field(default_factory=list)
    groups: dict[str, StoredGroup] = field(default_factory=dict)
    spilled: int = 0  # ready backlog messages left on disk, every one after the ready above


@dataclass
class StoredState:
    topics: dict[str, StoredTopic] = field(default_factory=dict)
    last_id: int = 0  # ids up to this one may have been handed out: start after it


# a commit of the durable store is one write to its log: microseconds into the page
# cache, milliseconds when the disk is busy, seconds on a struggling one
COMMIT_BUCKETS = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


@dataclass
class StoreStats:
    """Figures for /metrics (all zero for a store that keeps nothing on disk)."""

    # commits by duration, counted into COMMIT_BUCKETS as they happen (the last slot:
    # longer than every bound), and their total seconds: a fixed size, scraped or not
    commit_buckets: list[int] = field(default_factory=lambda: [0] * (len(COMMIT_BUCKETS) + 1))
    commit_sum: float = 0.0
    commits: int = 0
    fsyncs: int = 0
    write_errors: int = 0
    disk_bytes: int = 0
    messages_on_disk: int = 0


class Delivery(Protocol):
    """One delivery as the broker records it (its InFlight entry): the store reads its
    message only (a deadline crosses the boundary wall-clock, through `claimed`)."""

    message: Message


class GroupRecorder:
    """One group's calls made on every message (a publish into this group alone, a
    delivery, a finish), with the topic's and group's names bound once: the journal binds
    these methods into the group's recorder, so a hot path makes one call instead of a
    journal call and a store call that looks the group up by name. A store may return its
    own, bound to its record of the group (the memory store does)."""

    __slots__ = ("group", "store", "topic")

    def __init__(self, store: Store, topic: str, group: str) -> None:
        self.store = store
        self.topic = topic
        self.group = group

    def put(self, messages: Sequence[Message], due: float) -> None:
        """One publish's messages into this group alone (Store.put with one group)."""
        self.store.put(self.topic, (self.group,), messages, due)

    def delivered(self, delivery: Delivery) -> None:
        """Delivered: ready as far as the store knows, with the attempt counted, so that a
        crash now brings it back with attempts + 1 (a shared store's claims are `claimed`)."""
        self.store.update(self.topic, self.group, delivery.message, 0.0)

    def delivered_all(self, deliveries: Iterable[Delivery]) -> None:
        """`delivered` for each of a batch of deliveries to one consumer."""
        for d in deliveries:
            self.delivered(d)

    def finished(self, message: Message) -> None:
        """Acknowledged (NSQ FIN, beanstalkd delete of a reserved job)."""
        self.store.remove(self.topic, self.group, (message,))

    def finished_all(self, messages: Sequence[Message]) -> None:
        """`finished` for each of a consumer's batch of acknowledgements, in order."""
        for m in messages:
            self.finished(m)


class Store(abc.ABC):
    durable: ClassVar[bool] = False
    # True when `open()` may leave ready messages on disk (StoredGroup.spilled) for the
    # broker to page in with `load()`; a store without paging returns everything
    pages: ClassVar[bool] = False
    where: str = "memory"  # for log lines: the file or URL
    # True when several gateways share the queues (a SharedStore whose URL says so): the
    # broker's journal then claims ready messages from it (gateway/broker/claims.py)
    shares: bool = False
    # True when the store hands out message ids (`take_ids`), unique across gateways
    allocates_ids: ClassVar[bool] = False
    # True when opening it means reaching a server, which may take a while (it is
    # retried for --store-wait seconds): the HTTP listeners answer probes meanwhile. A
    # local store opens first, so that a data dir it refuses ends the start before any
    # listener binds.
    connects: ClassVar[bool] = False
    # True when nothing recorded could ever be read back (memory:// in a gateway: the
    # process is all it has): topics and groups then record their messages nowhere
    forgets: bool = False

    failed: StoreError | None = None  # set while writes fail; cleared when they succeed

    @abc.abstractmethod
    async def open(self, window: int = 0) -> StoredState:
        """Recover the recorded state. Called once, before anything is recorded. A paging
        store returns at most `window` ready (not deferred) messages per group."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background work (a durable store's committer). Runs until cancelled."""
        task_status.started()

    async def load(self, topic: str, group: str, after: Key, limit: int) -> list[Message]:
        """Ready (not deferred, not buried) messages of a group ("": the topic's backlog)
        with (priority, id) >= `after`, in that order, at most `limit` (a paging store;
        others have none)."""
        return []

    async def find_ready(self, topic: str, group: str, msg_id: int) -> Message | None:
        """Message `msg_id` if it is ready in the group, as `load` would read it (a paging
        store's lookup of one message past the memory window; others have none)."""
        return None

    @abc.abstractmethod
    def put(
        self, topic: str, groups: Sequence[str], messages: Sequence[Message], due: float
    ) -> None:
        """One publish's messages (ids ascending), in each of `groups` (empty: the topic's
        backlog, no group exists yet). `due`: wall-clock delivery time, 0 = now."""

    @abc.abstractmethod
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
        """A message's per-group fields changed: attempts (a delivery), priority (then
        `priority_was` is the one last recorded), `due` (a requeue with a delay) or burial
        (`buried`; False also means kicked). `expect`: where a store shared by several
        gateways must still find the message for the change to apply ("*": anywhere);
        a store with one owner ignores it."""

    @abc.abstractmethod
    def remove(self, topic: str, group: str | None, messages: Iterable[Message]) -> None:
        """Messages acknowledged or deleted (`group` None: from the topic's backlog). Their
        priority is the one last recorded."""

    def recorder(self, topic: str, group: str) -> GroupRecorder:
        """The hot-path door of one group (created when the broker makes the group, after
        add_group)."""
        return GroupRecorder(self, topic, group)

    def opening_problem(self) -> str | None:
        """While `open()` runs: what keeps it from returning yet (a server it cannot
        reach and keeps trying), for /ready; None when nothing is known."""
        return None

    @abc.abstractmethod
    def add_topic(self, topic: str) -> None: ...

    @abc.abstractmethod
    def add_group(self, topic: str, group: str) -> None: ...

    @abc.abstractmethod
    def fan_out_backlog(self, topic: str, groups: Sequence[str]) -> None:
        """The topic's backlog goes to these groups (the first group created takes it; an
        unpaused topic hands it to all its groups); the backlog is then empty."""

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
    def reserve_ids(self, ceiling: int) -> None:
        """Ids up to `ceiling` may be handed out: never start below it after a restart."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Return once everything recorded so far is accepted (written to the operating
        system, or fsynced with fsync = "always", for a durable store). Raises StoreError
        when it cannot be written."""

    # whether `flush` usually waits (a disk's fsync, a server): a session then lets what
    # the client has already sent join a batch before its commit
    flush_waits: bool = False
    # whether `flush_now` settles by writing to the operating system on the event loop
    # (the durable store's interval and "never" policies): the broker then makes that one
    # write per pass of the scheduler for every connection at once (broker/pass_end.py)
    writes_on_loop: bool = False

    def flush_now(self) -> bool:
        """`flush` without waiting, where the store can: True once everything recorded
        so far is accepted (the durable store's interval and "never" policies: one write
        to the operating system); False when it would have to wait (an fsync, a server),
        and then `flush` is awaited. Raises StoreError as `flush` does."""
        return False

    def take_ids(self, n: int) -> int:
        """The first of `n` consecutive new ids (a store that `allocates_ids`)."""
        raise NotImplementedError

    def stats(self) -> StoreStats:
        return StoreStats()

    async def close(self) -> None:
        """Flush and release resources."""
        await self.flush()


@dataclass(frozen=True, slots=True)
class Found:
    """One message as a shared store has it in one group ("" for the topic's backlog)."""

    topic: str
    group: str
    state: str  # ready, delayed, reserved, buried
    at: float  # wall clock: the claim's deadline (reserved) or the due time (delayed); 0
    owner: str  # the gateway holding the claim ("" unless reserved)
    message: Message


# per group of a shared store: ready, deferred, claimed, buried, the oldest buried message
GroupCounts = tuple[int, int, int, int, Message | None]


class SharedStore(Store):
    """A store several gateways may share (Redis): with `shares`, it is the authority for
    every stored group's queue, and the broker's journal claims ready messages from it
    instead of keeping them. All times are wall-clock seconds since the epoch."""

    # shares: called with a topic whose messages were made ready (by any gateway)
    on_notify: Callable[[str], None] | None = None

    @abc.abstractmethod
    async def claim(
        self, topic: str, group: str, n: int, lease: float
    ) -> tuple[list[Message], float, int]:
        """Claim up to `n` ready messages of a group, most urgent first, for `lease`
        seconds. Returns them, when something else becomes due (0: nothing), and how many
        claims had expired."""

    @abc.abstractmethod
    async def claim_id(self, topic: str, group: str, msg_id: int, lease: float) -> Message | None:
        """Claim one particular message (whatever its state) unless another gateway holds it."""

    @abc.abstractmethod
    def claimed(self, topic: str, group: str, message: Message, deadline: float) -> None:
        """A claimed message was delivered: it stays claimed until `deadline`."""

    @abc.abstractmethod
    def touched(self, topic: str, group: str, message: Message, deadline: float) -> None:
        """A delivery's deadline moved (TOUCH)."""

    @abc.abstractmethod
    async def kick(
        self, topic: str, group: str, n: int, *, messages: bool = False
    ) -> tuple[int, list[Message]]:
        """Up to `n` buried (none buried: deferred) messages ready again; how many, and
        with `messages` which."""

    @abc.abstractmethod
    async def find(self, where: Sequence[tuple[str, Sequence[str]]], msg_id: int) -> Found | None:
        """Message `msg_id` in the first of `where`'s (topic, groups) that holds it."""

    @abc.abstractmethod
    async def peek(self, topic: str, group: str, state: str, limit: int) -> list[Found]:
        """The first `limit` messages of a group in `state`, in the order they leave it."""

    @abc.abstractmethod
    async def registry(self) -> dict[str, tuple[bool, dict[str, bool]]]:
        """Every topic, its pause, and its groups with theirs."""

    @abc.abstractmethod
    async def registered(self, name: str) -> tuple[bool, dict[str, bool]] | None:
        """One topic's pause and its groups with theirs, as `registry` has them; None if
        no gateway made it."""

    @abc.abstractmethod
    async def holding(self, topics: Sequence[str]) -> set[str]:
        """Those of `topics` that have messages in the store."""

    @abc.abstractmethod
    async def counts(self, topics: Sequence[tuple[str, Sequence[str]]]) -> list[list[GroupCounts]]:
        """For each (topic, groups), per group its counts ("" first: the backlog)."""
