"""The Redis store: the queues live in Redis, so several gateways can share them.

Recording stays synchronous and cheap, as the contract asks: each call appends one
function call (FCALL of the library in redis_lua.py) to a list, consecutive removes or
updates of one group merged into one call. `flush()` sends everything recorded so far in
one pipeline: one round trip however many publishes, finishes and deliveries it carries.
Whoever flushes while a pipeline is on the wire waits for the next one, which then carries
everyone's records (group commit, as the durable store does). A background committer sends
what nobody waits for (finishes, deliveries) within a couple of milliseconds.

Two modes (the URL's `shared=`):
* shared (the default): Redis is the authority. The broker keeps no ready queue of its own
  (`shares`); it claims messages for consumers with room (`claim`), deliveries carry a
  deadline in Redis (`claimed`, `touched`), and any gateway returns expired claims to ready.
* not shared: one gateway owns the data, exactly like the durable store (the broker pages
  a bounded window in, `load`).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

import trio

from gateway.model import Message
from gateway.stores.base import (
    Found,
    GroupCounts,
    GroupRecorder,
    Key,
    SharedStore,
    StoredGroup,
    StoredState,
    StoredTopic,
    StoreError,
)
from gateway.stores.redis_cluster_wire import SlotsMoved
from gateway.stores.redis_codec import (
    IDS_KEY,
    NOTIFY,
    TOPICS_KEY,
    batches,
    hex_id,
    pack_batch,
    run_batches,
    topic_key,
    unpack_flat,
    unpack_runs,
)
from gateway.stores.redis_flights import Flights
from gateway.stores.redis_link import RedisLink
from gateway.stores.redis_reads import SharedReads
from gateway.stores.redis_url import RedisTarget

log = logging.getLogger("gateway.store")

# ids are taken from Redis in blocks (INCRBY), so that handing one out costs nothing and
# two gateways never hand out the same one; the next block is fetched ahead
ID_BLOCK = 1 << 16
# how long a claimed message that is not delivered yet stays claimed (it is delivered at
# once: this bounds what a gateway that dies between claim and delivery holds back)
CLAIM_LEASE = 30.0
# pipelines on the wire at once (redis_flights.py): enough to keep Redis busy while the
# gateway prepares the next, few enough that a publish waits for at most a few others
PIPELINES_IN_FLIGHT = 4
_COMMIT_DELAY = 0.002  # records nobody awaits are sent this soon
_RETRY_MIN, _RETRY_MAX = 0.05, 2.0
_MOVED_TRIES = 5  # a pipeline the Cluster's slots failed is sent so often before it fails
_HEALTH_EVERY = 1.0

# one recorded call: (function, topic prefix, arguments); removes and updates of one group
# are merged while they are consecutive
_Op = tuple[str, str, list[Any]]
_MERGED = frozenset({"gw_remove", "gw_update", "gw_touch"})
# a merged call's arguments, at most: one script call holds Redis while it runs
_MERGE_MAX = 8192


_ID = attrgetter("id")
_URGENCY = attrgetter("priority", "id")


class _Recorder(GroupRecorder):
    """A group's recorder with its topic's key made once: finishes, the one call made for
    every message a consumer acknowledges, are appended to the pending remove."""

    __slots__ = ("_key",)

    store: RedisStore

    def __init__(self, store: RedisStore, topic: str, group: str) -> None:
        super().__init__(store, topic, group)
        self._key = topic_key(topic)

    def finished_all(self, messages: Sequence[Message]) -> None:
        """A consumer's batch of FINs (or one): their ids added to the group's pending
        remove at once (`_record_at`'s merge, inline for the hot path; a remove holds at
        most _MERGE_MAX arguments)."""
        store = self.store
        key, group = self._key, self.group
        ids = [m.id for m in messages]
        while ids:
            pending = store._pending
            if pending:
                fn, p, args = pending[-1]
                room = _MERGE_MAX - len(args)
                if fn == "gw_remove" and p == key and args[0] == group and not args[1] and room > 0:
                    args += ids[:room]
                    ids = ids[room:]
                    store._recorded += 1
                    if not store._woken:
                        store._woken = True
                        store._wake.set()
                    continue
            take, ids = ids[: _MERGE_MAX - 2], ids[_MERGE_MAX - 2 :]
            store._record_at("gw_remove", key, [group, "", *take])


def _on_wire(op: _Op) -> _Op:
    """A call as it is sent: the ids of a remove (numbers, as recorded and merged) as runs
    of consecutive ids. A consumer's finishes come mostly in id order, so a batch of
    hundreds is a few arguments, and Redis handles a run as one."""
    fn, key, args = op
    if fn != "gw_remove":
        return op
    return fn, key, [*args[:2], *_runs(sorted(args[2:]))]


def _runs(ids: list[int]) -> list[str]:
    """Sorted ids as gw_remove takes them: "first:last" (hex) for each run of consecutive
    ids, one id alone as itself."""
    out: list[str] = []
    first = prev = ids[0]
    for i in ids[1:]:
        if i != prev + 1 and i != prev:
            out.append(f"{first:016x}:{prev:016x}" if prev != first else f"{first:016x}")
            first = i
        prev = i
    out.append(f"{first:016x}:{prev:016x}" if prev != first else f"{first:016x}")
    return out


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


class RedisStore(SharedStore):
    connects = True
    durable = True
    pages = True
    allocates_ids = True
    flush_waits = True  # a round trip to Redis

    def __init__(self, target: RedisTarget, *, wait: float = math.inf) -> None:
        self.target = target
        self.shares = target.shared
        self.where = f"Redis at {target.address}"
        self.link = RedisLink(target, wait=wait)
        self.reads = SharedReads(self.link, flush=self.flush)
        # a name of its own (whose claims are whose, whose puts were applied): random
        # bits, not the process's, which twin containers may share
        self.owner = f"{int(time.time() * 1000):x}-{secrets.token_hex(6)}"
        self._pending: list[_Op] = []
        self._notifying: set[str] = set()  # topics with a notification in _pending
        self._recorded = 0  # calls recorded so far
        # pipelines on the wire, several at once: each connection keeps them in order
        self._flights = Flights(PIPELINES_IN_FLIGHT)
        self._wake = trio.Event()
        self._woken = False  # _wake set since the commit loop took it (for the hot path)
        self._block = (1, 0)  # next id, last id of the current block
        self._next_block: tuple[int, int] | None = None
        self._block_wanted = trio.Event()
        self._top_id = 0  # the highest id this store handed out or was told about

    # -- opening ---------------------------------------------------------------

    async def open(self, window: int = 0) -> StoredState:
        await self.link.connect()
        try:
            return await self._read_state(window)
        except StoreError:
            raise
        except Exception as exc:  # lost between connecting and reading: one line, no trace
            raise StoreError(f"{self.where}: reading the queues: {exc}") from None

    async def _read_state(self, window: int) -> StoredState:
        client = self.link.client
        hi = int(await client.incrby(IDS_KEY, ID_BLOCK))
        self._block = (hi - ID_BLOCK + 1, hi)
        self._top_id = hi - ID_BLOCK
        state = StoredState(last_id=hi - ID_BLOCK)
        registry = await client.hgetall(TOPICS_KEY)
        for raw_name, paused in sorted(registry.items()):
            name = raw_name.decode()
            state.topics[name] = await self._open_topic(name, paused == b"1", window)
        return state

    async def _open_topic(self, name: str, paused: bool, window: int) -> StoredTopic:
        client = self.link.client
        p = topic_key(name)
        topic = StoredTopic(name, paused)
        groups = await client.hgetall(p + "groups")
        if self.shares:
            # ready messages are claimed, not loaded; deferred and buried ones stay in
            # Redis too (every gateway sees the same; claims.py reads their counts)
            for raw_group, g_paused in sorted(groups.items()):
                topic.groups[raw_group.decode()] = StoredGroup(raw_group.decode(), g_paused == b"1")
            return topic
        size = window if window > 0 else -1
        # the backlog as a group's queue: the first `window` ready ones, the rest counted,
        # and every deferred one (due times kept)
        spilled, ready, deferred, _buried, _claimed = await client.fcall(
            "gw_snapshot", [p], ["", size]
        )
        topic.spilled = int(spilled)
        topic.backlog = unpack_flat(name, ready) + unpack_flat(name, deferred, with_due=True)
        for raw_group, g_paused in sorted(groups.items()):
            gname = raw_group.decode()
            snap = await client.fcall("gw_snapshot", [p], [gname, size])
            group = StoredGroup(gname, g_paused == b"1")
            spilled, ready, deferred, buried, _claimed = snap
            if not self.shares:
                group.spilled = int(spilled)
                group.ready = unpack_flat(name, ready)
                group.ready += unpack_flat(name, deferred, with_due=True)
                group.buried = unpack_flat(name, buried)
            topic.groups[gname] = group
        return topic

    # -- ids -------------------------------------------------------------------

    def take_ids(self, n: int) -> int:
        """The first of `n` consecutive ids no gateway has handed out (the broker's id
        allocator when `allocates_ids`). Raises StoreError when no block is at hand."""
        first, last = self._block
        if first + n - 1 > last:
            nxt = self._next_block
            if nxt is None or nxt[0] + n - 1 > nxt[1]:
                self._block_wanted.set()
                raise StoreError(f"{self.where}: no message ids at hand (Redis unreachable?)")
            first, last = nxt
            self._next_block = None
        self._block = (first + n, last)
        if self._next_block is None and (last - first) < ID_BLOCK // 2:
            self._block_wanted.set()
        if first + n - 1 > self._top_id:
            self._top_id = first + n - 1
        return first

    async def _fetch_blocks(self) -> None:
        while True:
            await self._block_wanted.wait()
            self._block_wanted = trio.Event()
            if self._next_block is not None:
                continue
            try:
                hi = int(await self.link.client.incrby(IDS_KEY, ID_BLOCK))
            except Exception as exc:  # the link reports; try again when asked
                log.debug("%s: id block: %s", self.where, exc)
                await trio.sleep(_RETRY_MIN)
                self._block_wanted.set()
                continue
            self._next_block = (hi - ID_BLOCK + 1, hi)

    # -- recording -------------------------------------------------------------

    def _record(self, fn: str, topic: str, args: list[Any]) -> None:
        self._record_at(fn, topic_key(topic), args)

    def _record_at(self, fn: str, p: str, args: list[Any]) -> None:
        """Record one call on topic key `p`; removes, updates and touches of one group
        merge with the call recorded just before when it is the same."""
        pending = self._pending
        if fn in _MERGED and pending:
            last_fn, last_p, last_args = pending[-1]
            same = last_fn == fn and last_p == p and last_args[:2] == args[:2]
            if same and len(last_args) < _MERGE_MAX:
                last_args.extend(args[2:])
                self._recorded += 1
                self._wake.set()
                return
        pending.append((fn, p, args))
        self._recorded += 1
        self._wake.set()

    def put(
        self, topic: str, groups: Sequence[str], messages: Sequence[Message], due: float
    ) -> None:
        if not messages:
            return
        # shared: Redis resolves the groups (-1), atomically with the put, and tells the
        # gateways waiting for the topic, if any (the last argument)
        where = [-1] if self.shares else [len(groups), *groups]
        told = f"{self.owner} {topic}" if self.shares and due <= 0.0 else ""
        for run in batches(messages):  # one publish is one batch: one argument per batch
            first = run[0]
            first_id = hex_id(first.id)
            # The blob goes in a plain HSET just before the call, not through the script
            # (copying it into Lua costs Redis several times what the call does). Applied
            # without the call (the connection lost between them, the gateway then gone),
            # it stays unreferenced: a leak of one batch, never a message.
            self._pending.append(("hset", topic_key(topic) + "m", [first_id, pack_batch(run)]))
            self._record(
                "gw_put",
                topic,
                [
                    _ms(due),
                    first.attempts,
                    first.priority,
                    *where,
                    first_id,
                    hex_id(run[-1].id),
                    "",
                    told,
                    self.owner,  # applied once, should the pipeline be sent again
                ],
            )
        if told and self.on_notify is not None:
            self.on_notify(topic)  # this gateway's claimer, at once
        last = messages[-1].id
        if last > self._top_id:
            # ids this store did not hand out (a caller numbering its own): never below them
            self._top_id = last
            self._pending.append(("gw_raise_ids", IDS_KEY, [last]))

    def _notify(self, topic: str) -> None:
        if not self.shares:
            return
        # this gateway's claimer at once (its claim goes behind this record, in order),
        # not through Redis: "<owner> <topic>" on the channel, and each skips its own
        if self.on_notify is not None:
            self.on_notify(topic)
        # once per topic per pipeline for the others: they claim everything ready anyway
        if topic not in self._notifying:
            self._notifying.add(topic)
            self._pending.append(("publish", NOTIFY, [f"{self.owner} {topic}"]))

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
        state = "b" if buried else ("d" if due > 0.0 else "r")
        self._record(
            "gw_update",
            topic,
            [
                group,
                self.owner,
                hex_id(message.id),
                message.attempts,
                message.priority,
                state,
                _ms(due),
                expect,
            ],
        )
        if state == "r" and self.shares:
            self._notify(topic)

    def claimed(self, topic: str, group: str, message: Message, deadline: float) -> None:
        """Shared: a claimed message was delivered; it stays claimed until `deadline`
        (wall clock). Its attempt was counted by the claim."""
        self._record("gw_touch", topic, [group, self.owner, hex_id(message.id), _ms(deadline)])

    def touched(self, topic: str, group: str, message: Message, deadline: float) -> None:
        self._record("gw_touch", topic, [group, self.owner, hex_id(message.id), _ms(deadline)])

    def recorder(self, topic: str, group: str) -> GroupRecorder:
        return _Recorder(self, topic, group)

    def opening_problem(self) -> str | None:
        return self.link.problem

    def remove(self, topic: str, group: str | None, messages: Iterable[Message]) -> None:
        # ids as numbers: consecutive removes of a group merge into one call, whose ids
        # are sent as runs (_on_wire)
        ids = list(map(_ID, messages))
        if ids:
            self._record("gw_remove", topic, [group or "", "", *ids])

    def add_topic(self, topic: str) -> None:
        self._pending.append(("hsetnx", TOPICS_KEY, [topic, 0]))
        self._recorded += 1

    def add_group(self, topic: str, group: str) -> None:
        self._record("gw_add_group", topic, [group, 1 if self.shares else 0])

    def fan_out_backlog(self, topic: str, groups: Sequence[str]) -> None:
        self._record("gw_fan_out", topic, list(groups))
        self._notify(topic)

    def drop_group(self, topic: str, group: str) -> None:
        self._record("gw_drop_group", topic, [group])

    def drop_topic(self, topic: str) -> None:
        self._record("gw_drop_topic", topic, [])
        self._pending.append(("hdel", TOPICS_KEY, [topic]))

    def clear(self, topic: str, group: str | None) -> None:
        self._record("gw_clear", topic, [group or ""])

    def set_paused(self, topic: str, group: str | None, paused: bool) -> None:
        flag = 1 if paused else 0
        if group is None:
            self._pending.append(("hset", TOPICS_KEY, [topic, flag]))
            if self.shares:
                self._pending.append(("gw_topic_paused", topic_key(topic), [flag]))
        else:
            self._pending.append(("hset", topic_key(topic) + "groups", [group, flag]))
        self._recorded += 1
        if not paused:
            self._notify(topic)

    def reserve_ids(self, ceiling: int) -> None:
        if ceiling > self._top_id:
            self._top_id = ceiling
            self._pending.append(("gw_raise_ids", IDS_KEY, [ceiling]))
            self._recorded += 1

    # -- writing ---------------------------------------------------------------

    async def flush(self) -> None:
        mine = self._recorded
        flights = self._flights
        if flights.written >= mine and self.failed is None:
            return
        while flights.written < mine:
            if flights.submitted >= mine:
                await flights.changed()  # on the wire: wait for its answer
            else:
                await self._write()  # raises StoreError when it cannot be written

    async def _write(self, read: _Op | None = None) -> Any:
        """Send what is recorded as one pipeline, behind those already on the wire, and
        wait until it counts as written; `read`: one more call at the end of the same
        pipeline, whose reply is returned (a claim rides with the records before it).
        A pipeline that failed because a Cluster's slots moved is sent again at once, on
        the slot map read again (redis_cluster_wire.py), a few times before its callers
        see the error."""
        attempt = 1
        while True:
            try:
                return await self._write_once(read)
            except SlotsMoved as exc:
                if attempt == _MOVED_TRIES:
                    self._failing(exc)
                    raise
                # a slot being migrated answers TRYAGAIN until it is done: not in a spin
                await trio.sleep(_RETRY_MIN * (attempt - 1))
                attempt += 1

    async def _write_once(self, read: _Op | None) -> Any:
        flights = self._flights
        while flights.full:
            await flights.changed()
        try:
            await self.link.prepare()
        except StoreError as exc:
            self._failing(exc)
            raise
        while flights.full:  # a pipeline may have been sent meanwhile
            await flights.changed()
        # from here to link.send nothing awaits: the order of the records is the order on
        # the wire
        ops, self._pending = self._pending, []
        self._notifying = set()
        if not ops and read is None:
            return None
        seq = flights.start(self._recorded, ops)
        replies: tuple[Any, ...] = ()
        error: StoreError | None = None
        # shielded: a cancelled caller would leave this pipeline unanswered and every
        # later write waiting on it (the connection's own timeouts bound the wait)
        with trio.CancelScope(shield=True):
            try:
                wire = [_on_wire(op) for op in ops]
                replies = await self.link.send(wire if read is None else [*wire, read])
            except StoreError as exc:
                error = exc
        back = flights.answered(seq, error)
        if back:
            self._pending[:0] = back  # kept, in order, for the retry
        cause = await flights.verdict(seq)
        if cause is not None:
            if isinstance(cause, SlotsMoved):
                # this pipeline, or one before it, met slots that moved: sent again
                raise SlotsMoved(str(cause))
            error = error or StoreError(f"{self.where}: a write before this one failed")
            self._failing(error)
            raise error
        if self.failed is not None:
            log.warning("%s: writes succeed again", self.where)
            self.failed = None
        return replies[-1] if read is not None else None

    def _failing(self, error: StoreError) -> None:
        if self.failed is None:
            log.error("%s: writes fail, publishes are refused: %s", self.where, error)
        self.failed = error

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fetch_blocks)
            if self.shares:
                nursery.start_soon(self.link.listen, NOTIFY, self._notified)
            nursery.start_soon(self._watch)
            task_status.started()
            await self._commit_loop()

    async def _watch(self) -> None:
        """Redis lost while nothing is written: publishes are refused and /ready says 503
        from the first failed ping until one succeeds (the client reconnects by itself)."""
        while True:
            await trio.sleep(_HEALTH_EVERY)
            if await self.link.ping():
                if self.failed is not None and not self._pending:
                    log.warning("%s: reachable again", self.where)
                    self.failed = None
                elif self._pending:
                    self._wake.set()
            elif self.failed is None:
                self.failed = StoreError(f"{self.where}: not answering")
                log.error("%s: not answering; publishes are refused until it is back", self.where)

    def _notified(self, data: bytes) -> None:
        owner, _, topic = data.decode().partition(" ")
        if self.on_notify is not None and owner != self.owner:
            self.on_notify(topic)

    async def _commit_loop(self) -> None:
        backoff = _RETRY_MIN
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._woken = False
            await trio.sleep(_COMMIT_DELAY)
            while self._pending:
                try:
                    await self._write()
                    backoff = _RETRY_MIN
                except StoreError:
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, _RETRY_MAX)

    # -- reading ---------------------------------------------------------------

    async def load(self, topic: str, group: str, after: Key, limit: int) -> list[Message]:
        await self.flush()
        start = f"{after[0]:08x}{after[1]:016x}" if after[0] >= 0 else "0"
        try:
            flat = await self.link.client.fcall(
                "gw_load", [topic_key(topic)], [group, start, limit]
            )
        except Exception as exc:
            raise StoreError(f"{self.where}: {exc}") from exc
        return unpack_flat(topic, flat)

    async def find_ready(self, topic: str, group: str, msg_id: int) -> Message | None:
        """A ready message past a group's memory window, by id (beanstalkd's peek, delete
        and reserve-job of a job however deep its tube is): the shared mode's lookup."""
        found = await self.reads.find([(topic, [group])], msg_id)
        return found.message if found is not None and found.state == "ready" else None

    async def claim(
        self, topic: str, group: str, n: int, lease: float = CLAIM_LEASE
    ) -> tuple[list[Message], float, int]:
        """Shared: claim up to `n` ready messages of a group, most urgent first (due
        deferred messages and expired claims are made ready first). Returns them, the
        wall-clock time something else becomes due (0: nothing), and how many claims
        had expired."""
        op = ("gw_claim", topic_key(topic), [group, n, _ms(time.time()), _ms(lease), self.owner])
        # after everything recorded before, in the same round trip
        nxt, expired, singles, runs = await self._write(op)
        msgs: list[Message] = []
        if runs:
            # the bodies, read in a second step: a claim's batches stay while it holds them
            batches = run_batches(runs)
            blobs = await self._write(("hmget", topic_key(topic) + "m", batches))
            msgs = unpack_runs(topic, runs, dict(zip(batches, blobs, strict=True)))
        if singles:  # requeued, promoted or kicked ones: in (priority, id) order with the rest
            msgs += unpack_flat(topic, singles)
            msgs.sort(key=_URGENCY)
        return msgs, (int(nxt) / 1000.0 if int(nxt) > 0 else 0.0), int(expired)

    async def claim_id(self, topic: str, group: str, msg_id: int, lease: float) -> Message | None:
        """Shared: claim one particular message for a delivery here (beanstalkd
        reserve-job), whatever its state, unless another gateway holds it. Its attempt is
        counted."""
        op = (
            "gw_claim_id",
            topic_key(topic),
            [group, hex_id(msg_id), _ms(time.time()), _ms(lease), self.owner],
        )
        flat = await self._write(op)  # after everything recorded before, like `claim`
        if not flat:
            return None
        (msg,) = unpack_flat(topic, flat)
        return msg

    async def counts(self, topics: Sequence[tuple[str, Sequence[str]]]) -> list[list[GroupCounts]]:
        """Shared: for each (topic, groups), per group (ready, deferred, claimed, buried,
        the oldest buried message) as Redis has them; one pipeline for all topics."""
        ops = [("gw_counts", topic_key(t), list(groups)) for t, groups in topics]
        replies = await self.link.pipeline(ops)
        out = []
        for (topic, _), rows in zip(topics, replies, strict=True):
            per_group = []
            for r, d, f, b, head in rows:
                first = unpack_flat(topic, head)
                per_group.append((int(r), int(d), int(f), int(b), first[0] if first else None))
            out.append(per_group)
        return out

    async def kick(
        self, topic: str, group: str, n: int, *, messages: bool = False
    ) -> tuple[int, list[Message]]:
        """Shared: up to `n` buried (or, none buried, deferred) messages ready again, in
        order after everything recorded; how many there were, and with `messages` which."""
        reply = await self._write(("gw_kick", topic_key(topic), [group, n, int(messages)]))
        kicked = unpack_flat(topic, reply) if messages else []
        count = len(kicked) if messages else int(reply)
        if count:
            self._notify(topic)  # with the next pipeline: the others claim them
            self._wake.set()
        return count, kicked

    # single messages, queue heads and the registry: redis_reads.py

    async def find(self, where: Sequence[tuple[str, Sequence[str]]], msg_id: int) -> Found | None:
        return await self.reads.find(where, msg_id)

    async def peek(self, topic: str, group: str, state: str, limit: int) -> list[Found]:
        return await self.reads.peek(topic, group, state, limit)

    async def registry(self) -> dict[str, tuple[bool, dict[str, bool]]]:
        return await self.reads.registry()

    async def registered(self, name: str) -> tuple[bool, dict[str, bool]] | None:
        return await self.reads.registered(name)

    async def holding(self, topics: Sequence[str]) -> set[str]:
        return await self.reads.holding(topics)

    @property
    def healthy(self) -> bool:
        return self.failed is None and self.link.up

    async def close(self) -> None:
        try:
            with trio.move_on_after(5):
                await self.flush()
        finally:
            await self.link.close()
