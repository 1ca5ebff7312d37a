"""The durable embedded store: an append-only log written on the event loop, and a SQLite
index brought up to date from it in the background.

The write path (docs/storage.md): the recording calls append small tuples of plain data,
the log's records, on the event loop. A flush encodes everything recorded during one pass
of the scheduler, by every connection, into one frame and writes it to the log with one
`os.write()` (log.py); only then do that pass's acknowledgements leave. A write to the page
cache is a memory copy, so the acknowledgement path has no thread hop and killing the
process loses nothing acknowledged.

fsync policy (beanstalkd's -f, Redis's appendfsync): an interval in ms (the default, 50)
fsyncs the log on a thread of its own at least that often; "always" answers a publish only
after the fsync that covers it (group commit: every flush waiting at that moment shares
one, and the event loop keeps serving meanwhile); "never" leaves it to the OS.

The index (SQLite in WAL mode; the tables and the thread's side are in sqlite_sql.py) is
what deep queues page from and what recovery starts from. A worker thread applies the
log's records to it many at a time (a message published and finished before its records
reach the index is never written there), each transaction noting the log position it
holds up to; segments it holds, once it is synced, are deleted. Recovery: the index, then
the log after that position, replayed into it; a torn tail is cut at the last good record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import trio

from gateway.model import Message
from gateway.stores import sqlite_read as read
from gateway.stores import sqlite_segments as segs
from gateway.stores import sqlite_sql as sql
from gateway.stores.base import (
    COMMIT_BUCKETS,
    Delivery,
    GroupRecorder,
    Key,
    Store,
    StoredState,
    StoreError,
    StoreStats,
)
from gateway.stores.fsync import Fsyncs
from gateway.stores.log import Bodies, Log, Position, encode, segments
from gateway.stores.sqlite_open import (
    TopicIds,
    Written,
    connect,
    lock_data_dir,
    recover,
    replay_into,
)
from gateway.stores.sqlite_records import Pending, add_deliveries, add_finishes
from gateway.stores.sqlite_runs import BURIED, READY
from gateway.stores.sqlite_tail import Tail, taken_position
from gateway.stores.worker import Worker

log = logging.getLogger("gateway.store")
T = TypeVar("T")  # what a read on the index's thread returns

FsyncPolicy = Literal["always", "never"] | int

_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0  # seconds between retries of a failed write
_VACUUM_PAGES = 2048  # pages given back per maintenance pass (8 MB at 4 KiB)
_MAINTAIN_IDLE, _MAINTAIN_BUSY = 10.0, 1.0  # seconds between maintenance passes
_MAINTAIN_QUIET = 1.0  # seconds without an index update before a maintenance pass
_BACKGROUND_DELAY = 0.005  # seconds records nobody awaits may wait for company
_BACKGROUND_IDLE = 0.05  # the same while flushes keep writing them first (_write_loop)
# the log's size from which old segments mostly finished are compacted, and how often
# (seconds) the segments before the oldest queued body are looked at for that
_COMPACT_FROM = 64 * 1024 * 1024
_COMPACT_EVERY = 30.0


class SQLiteStore(Store):
    durable = True
    pages = True

    def __init__(self, path: str | os.PathLike[str], *, fsync: FsyncPolicy = 50) -> None:
        self.flush_waits = fsync == "always"  # otherwise one write on the event loop
        self.writes_on_loop = fsync != "always"
        self.path = Path(path)
        self.log_dir = Path(f"{self.path}-log")
        self.where = str(self.path)
        self.fsync = fsync
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._log: Log | None = None
        self._bodies = Bodies(self.log_dir)  # the index thread's reads of queued bodies
        self._topics: dict[str, TopicIds] = {}
        self._next_tid = 1
        self._next_gid = 1
        self._id_ceiling = 0
        self._pending = Pending()  # recorded, not yet in the log
        self._unapplied = Tail()  # in the log, not yet in the index
        self._applying = False
        self._applied_at = 0.0  # Trio clock: the last update of the index
        self._apply_done: object = None  # the last records the index thread applied
        self._applied_event = trio.Event()
        self._apply_wake = trio.Event()
        self._log_failed: StoreError | None = None
        self._index_failed: StoreError | None = None
        self._worker = Worker(f"store {self.path.name}")  # the index's connection
        self._fsyncs = Fsyncs(
            f"store {self.path.name} fsync", self._fsync_failed, lambda: self.failed
        )
        self._stats = StoreStats()

    # -- opening ---------------------------------------------------------------

    async def open(self, window: int = 0) -> StoredState:
        try:
            return await self._worker.run(self._open_sync, window)
        except BaseException:
            self._worker.stop()
            raise

    def _open_sync(self, window: int) -> StoredState:
        self._lock()
        try:
            db = self._db = connect(self.path)
            held = replay_into(db, self.log_dir, self._bodies, self._apply_sync)
            state = self._recover(db, window)
            # a new segment on every start, numbered past the index's position: positions
            # only grow, even where a power cut left the log shorter than the index
            on_disk = segments(self.log_dir) if self.log_dir.is_dir() else []
            first = max([held[0], *on_disk]) + 1
            self._log = Log(self.log_dir, first)
            # the index holds every segment on disk: those no queued body is in can go
            segs.retire(db, self._log, self._bodies, first, segs.pinned(db))
            self._fsyncs.log = self._log
            self._fsyncs.start_at((first, 0))
            self._unapplied.position = (first, 0)
            self._stats.disk_bytes = self._disk_bytes()
            return state
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store {self.path}: cannot open: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"store {self.path}: cannot open its log: {exc}") from exc

    def _lock(self) -> None:
        self._lock_fd = lock_data_dir(self.path)

    def _recover(self, db: sqlite3.Connection, window: int) -> StoredState:
        found = recover(db, self._bodies, window)
        self._topics = found.topics
        self._next_tid, self._next_gid = found.next_tid, found.next_gid
        self._id_ceiling = found.state.last_id
        for t in self._topics.values():
            if t.backlog == 0:  # a topic whose backlog row is missing: make one
                t.backlog = self._new_gid()
                self._pending.add(("G+", t.backlog, t.id, None))
        self._stats.messages_on_disk = found.entries
        return found.state

    # -- recording (event loop, synchronous, cheap) ----------------------------

    def _new_gid(self) -> int:
        gid = self._next_gid
        self._next_gid += 1
        return gid

    def put(
        self, topic: str, groups: Sequence[str], messages: Sequence[Message], due: float
    ) -> None:
        if not messages:
            return
        t = self._topics.get(topic) or self._add_topic(topic)
        if groups:
            gids = tuple([t.groups.get(g) or self._add_group(t, g) for g in groups])
        else:
            gids = (t.backlog,)
        if messages[-1].id > self._id_ceiling:
            # ids past every reservation (a caller that reserves none): the largest one
            # is kept after its message is gone, so that ids never repeat
            self.reserve_ids(messages[-1].id)
        # the per-group fields as they are now: a delivery that changes them before the
        # write is recorded on its own
        self._pending.publish(gids, messages, due)

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
        t = self._topics.get(topic)
        gid = t.groups.get(group) if t is not None else None
        if gid is None:
            return  # deleted with its topic or group (as in remove)
        state = BURIED if buried else READY
        priority = message.priority
        was = priority if priority_was is None else priority_was
        self._pending.add(("U", (priority, message.attempts, due, state, gid, was, message.id)))

    def remove(self, topic: str, group: str | None, messages: Iterable[Message]) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        gid = t.backlog if group is None else t.groups.get(group)
        if gid is not None:
            self._removed(gid, messages if isinstance(messages, Sequence) else list(messages))

    def _removed(self, gid: int, messages: Sequence[Message]) -> None:
        # a run of finishes in one group between other records is one record, and its
        # consecutive ids one run (a consumer finishes in about the order of delivery)
        add_finishes(self._pending.running("E", gid), messages)

    def _delivered(self, gid: int, deliveries: Iterable[Delivery]) -> None:
        # ("AR", gid, [priority, first, last, attempts, ...]): first deliveries and the
        # like, which change a message's attempts only; a run of them in one group is one
        # record, a window of consecutive ids one run of it
        add_deliveries(self._pending.running("AR", gid), deliveries)

    def recorder(self, topic: str, group: str) -> GroupRecorder:
        return _Recorder(self, topic, group)

    def gid(self, topic: str, group: str) -> int | None:
        t = self._topics.get(topic)
        return t.groups.get(group) if t is not None else None

    def add_topic(self, topic: str) -> None:
        if topic not in self._topics:
            self._add_topic(topic)

    def _add_topic(self, topic: str) -> TopicIds:
        tid = self._next_tid
        self._next_tid += 1
        t = self._topics[topic] = TopicIds(tid, self._new_gid())
        self._pending.add(("T+", tid, topic, t.backlog))
        return t

    def add_group(self, topic: str, group: str) -> None:
        t = self._topics.get(topic) or self._add_topic(topic)
        if group not in t.groups:
            self._add_group(t, group)

    def _add_group(self, t: TopicIds, group: str) -> int:
        gid = t.groups[group] = self._new_gid()
        self._pending.add(("G+", gid, t.id, group))
        return gid

    def fan_out_backlog(self, topic: str, groups: Sequence[str]) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        gids = tuple([t.groups.get(g) or self._add_group(t, g) for g in groups])
        self._pending.add(("F", t.backlog, gids))

    def drop_group(self, topic: str, group: str) -> None:
        t = self._topics.get(topic)
        if t is not None and (gid := t.groups.pop(group, None)) is not None:
            self._pending.add(("G-", gid))

    def drop_topic(self, topic: str) -> None:
        t = self._topics.pop(topic, None)
        if t is not None:
            self._pending.add(("T-", t.id))

    def clear(self, topic: str, group: str | None) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        gid = t.backlog if group is None else t.groups.get(group)
        if gid is not None:
            self._pending.add(("C", gid))

    def set_paused(self, topic: str, group: str | None, paused: bool) -> None:
        t = self._topics.get(topic) or self._add_topic(topic)
        if group is None:
            self._pending.add(("PT", t.id, int(paused)))
        else:
            gid = t.groups.get(group) or self._add_group(t, group)
            self._pending.add(("PG", gid, int(paused)))

    def reserve_ids(self, ceiling: int) -> None:
        if ceiling > self._id_ceiling:
            self._id_ceiling = ceiling
            self._pending.add(("R", ceiling))

    # -- the write path: the log, on the event loop ----------------------------

    @property  # type: ignore[override]
    def failed(self) -> StoreError | None:
        """Set while the log or the index cannot be written: publishes are refused."""
        return self._log_failed or self._index_failed

    def _write_pending(self) -> None:
        """Write every record not yet in the log, or raise why it cannot be."""
        if self._pending.ops:
            if self.failed is not None:
                raise self.failed
            self._write()
            if self._pending.ops:
                assert self.failed is not None
                raise self.failed

    def flush_now(self) -> bool:
        if self.fsync == "always":
            return not self._pending.ops and self._fsyncs.all_synced
        self._write_pending()
        return True

    async def flush(self) -> None:
        # The first flusher that finds records not yet in the log writes every record
        # made so far, by every connection, with one write, at once: no thread and no
        # checkpoint on the acknowledgement path. Connections that answer from a task of
        # their own (the reply gate's commits) flush a pass after their records were made,
        # so the first of them writes what all of them recorded in that pass, and the rest
        # find it written.
        self._write_pending()
        if self.fsync == "always" and not self._fsyncs.all_synced:
            await self._fsyncs.through(self._fsyncs.written)
        # no checkpoint when there is nothing to wait for: the publish hot path

    def _write(self) -> None:
        """Everything recorded so far, in one frame, with one write (event loop)."""
        pending = self._pending
        if not pending.ops:
            return
        assert self._log is not None
        started = time.perf_counter()
        ops = pending.frame()
        frame = encode(ops)
        try:
            position = self._log.write(frame)
        except OSError as exc:
            self._stats.write_errors += 1
            first = self._log_failed is None
            self._log_failed = StoreError(f"store {self.path}: write failed: {exc}")
            if first:
                log.error("%s; publishes are refused until writes succeed again", self.failed)
            return
        pending.written()
        self._fsyncs.wrote(position)
        if self._unapplied.wrote(ops, frame, position):
            self._apply_wake.set()
        seconds = time.perf_counter() - started
        stats = self._stats
        stats.commit_buckets[bisect_left(COMMIT_BUCKETS, seconds)] += 1
        stats.commit_sum += seconds
        stats.commits += 1
        if self._log_failed is not None:
            log.warning("store %s: writes succeed again", self.path)
            self._log_failed = None

    def _fsync_failed(self, exc: OSError) -> None:
        self._stats.write_errors += 1
        first = self._log_failed is None
        self._log_failed = StoreError(f"store {self.path}: fsync failed: {exc}")
        if first:
            log.error("%s; publishes are refused until writes succeed again", self.failed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The store's background work: writing records nobody awaits (finishes,
        deliveries), the fsync timer of an interval policy, and the index."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop)
            if isinstance(self.fsync, int) and not isinstance(self.fsync, bool):
                nursery.start_soon(self._fsyncs.run_interval, self.fsync / 1000)
            nursery.start_soon(self._index_loop)
            task_status.started()

    async def _write_loop(self) -> None:
        retry = _RETRY_FIRST
        delay = _BACKGROUND_DELAY
        while True:
            pending = self._pending
            if not pending.ops:
                await pending.wake.wait()
            pending.wake = trio.Event()
            # records nobody waits for: let a few milliseconds' worth gather into one
            # write; a failing disk: back off. While publishes' flushes write them first
            # (they write every record made so far), the loop looks less often: each look
            # is a timer, and a timer every few milliseconds cost a tenth of the rate of
            # PUBs one at a time. A record then waits for the next flush, or at most
            # _BACKGROUND_IDLE.
            await trio.sleep(delay if self._log_failed is None else retry)
            if pending.ops:
                self._write()
                delay = _BACKGROUND_DELAY
            else:
                delay = _BACKGROUND_IDLE
            retry = _RETRY_FIRST if self._log_failed is None else min(retry * 2, _RETRY_MAX)

    # -- the index: brought up to date from the log, off the event loop ------------

    async def _index_loop(self) -> None:
        retry = _RETRY_FIRST
        next_maintenance = trio.current_time() + _MAINTAIN_IDLE
        next_compaction = trio.current_time() + _COMPACT_EVERY
        while True:
            wake_at = min(next_maintenance, next_compaction)
            if self._unapplied:
                wake_at = min(wake_at, self._unapplied.due)
            with trio.move_on_at(wake_at):
                await self._apply_wake.wait()
            self._apply_wake = trio.Event()
            tail = self._unapplied
            if tail and not self._applying and (tail.full or trio.current_time() >= tail.due):
                # what is fsynced: its publishes join into batches (the rest, a pass later)
                upto = None if self.fsync == "never" else self._fsyncs.synced
                if await self._apply(upto):
                    retry = _RETRY_FIRST
                else:
                    await trio.sleep(retry)  # a failing disk: try again, backing off
                    retry = min(retry * 2, _RETRY_MAX)
                    continue
            now = trio.current_time()
            if now >= next_compaction:
                with contextlib.suppress(sqlite3.Error, OSError):
                    await self._worker.run(self._compact)
                next_compaction = trio.current_time() + _COMPACT_EVERY
            if now >= next_maintenance:
                if self._unapplied or now - self._applied_at < _MAINTAIN_QUIET:
                    # giving pages back moves them about in the file: not while traffic
                    # keeps the index busy (SQLite reuses the free pages meanwhile)
                    next_maintenance = now + _MAINTAIN_BUSY
                    continue
                freed = False
                with contextlib.suppress(sqlite3.Error, OSError):
                    freed = await self._worker.run(self._maintain)
                # while there is much to give back, a slice every second
                next_maintenance = trio.current_time() + (
                    _MAINTAIN_BUSY if freed else _MAINTAIN_IDLE
                )

    async def _apply(self, upto: Position | None = None) -> bool:
        """Apply everything the log holds that the index lacks (`upto`: the frames that
        end there or before, if any do), in one transaction."""
        if self._applying:
            await self._applied_event.wait()
            return self._index_failed is None
        taken = self._unapplied.take(upto)
        frames, position = taken[0], taken_position(taken)
        self._applying = True
        try:
            # not abandoned on cancel: an apply that started always finishes
            await self._worker.run(self._apply_sync, frames, position, self._fsyncs.synced)
        except BaseException as exc:
            if self._apply_done is not frames:  # not applied: kept, in order, for a retry
                self._unapplied.give_back(taken)
            if not isinstance(exc, sqlite3.Error | OSError):
                raise
            self._stats.write_errors += 1
            first = self._index_failed is None
            self._index_failed = StoreError(f"store {self.path}: index write failed: {exc}")
            if first:
                log.error("%s; publishes are refused until writes succeed again", self.failed)
            return False
        finally:
            self._applying = False
            self._applied_at = trio.current_time()
            event, self._applied_event = self._applied_event, trio.Event()
            event.set()
        if self._index_failed is not None:
            log.warning("store %s: index writes succeed again", self.path)
            self._index_failed = None
        return True

    def _apply_sync(self, frames: list[Written], position: Position, synced: Position) -> None:
        """The index thread's side: one transaction with the frames' records, the log
        position they end at and the one the log was fsynced to (recovery checks the
        bodies past it: sqlite.open); then the segments before the oldest queued body that
        the index now holds go, once it is synced."""
        db = self._db
        assert db is not None
        if db.in_transaction:
            # a failed apply whose ROLLBACK failed too (an I/O error): its records are
            # kept and come again; without this, every BEGIN would fail for ever
            db.execute("ROLLBACK")
        ops = [op for records, seg, starts in frames for op in segs.locate(records, seg, starts)]
        db.execute("BEGIN")
        try:
            # what a power cut cannot take joins into batches ("never": all; _coalesced)
            fence = position if self.fsync == "never" else synced
            delta = sql.apply(db, ops, fence)
            db.executemany(sql.SET_META, zip(sql.LOG_KEYS, (*position, *synced), strict=True))
            db.execute("COMMIT")
            self._apply_done = frames
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self._stats.messages_on_disk += delta
        if self._log is not None:
            # the common case, cheap: the segments before every queued body (`_compact`
            # finds the others, every 30 s)
            segs.retire(db, self._log, self._bodies, position[0])

    def _compact(self) -> None:
        """Segments no queued body is in, and compaction (sqlite_segments.compact)."""
        if self._log is not None and self._db is not None:
            held = dict(self._db.execute(sql.GET_LOG_POSITION).fetchall()).get("log_segment", 0)
            segs.compact(self._db, self._log, self._bodies, held, _COMPACT_FROM)

    def _maintain(self) -> bool:
        """Give finished messages' pages back to the file system, a bounded amount at a
        time (SQLite reuses free pages anyway; this shrinks the file after a backlog)."""
        db = self._db
        assert db is not None
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        if free > _VACUUM_PAGES // 4:
            # executescript: sqlite3's execute() steps a statement that returns no rows
            # once, and incremental_vacuum frees one page per step
            db.executescript(f"PRAGMA incremental_vacuum({_VACUUM_PAGES});")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        self._stats.disk_bytes = self._disk_bytes()
        return free > _VACUUM_PAGES // 4

    def _disk_bytes(self) -> int:
        total = self._log.size() if self._log is not None else 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(f"{self.path}{suffix}").st_size
        return total

    async def caught_up(self) -> None:
        """Return once the index holds everything recorded so far (everything written,
        and nothing left to apply: no counter to spin on if an apply adds nothing)."""
        await self.flush()
        while self._unapplied or self._applying:
            if not await self._apply():
                assert self.failed is not None
                raise self.failed

    async def load(self, topic: str, group: str, after: Key, limit: int) -> list[Message]:
        got = await self._read(topic, group, read.select_ready, after, limit)
        return got or []

    async def find_ready(self, topic: str, group: str, msg_id: int) -> Message | None:
        return await self._read(topic, group, read.find_ready, msg_id)

    async def _read(self, topic: str, group: str, reader: Callable[..., T], *args: Any) -> T | None:
        """`reader(db, bodies, topic, gid, *args)` on the index's thread for a group, or
        the topic's backlog for group "" (None if there is none). What was spilled may be
        only in the log so far: the read must see its put, and the finish of a message in
        memory that sorts after the spilled ones (a less urgent one delivered before they
        came) must keep the read from loading it again; so the index catches up first."""
        await self.caught_up()
        t = self._topics.get(topic)
        gid = None if t is None else t.backlog if group == "" else t.groups.get(group)
        if gid is None:
            return None
        db = self._db
        assert db is not None
        return await self._worker.run(reader, db, self._bodies, topic, gid, *args)

    def stats(self) -> StoreStats:
        stats = self._stats
        stats.fsyncs = self._fsyncs.count
        return stats

    async def close(self) -> None:
        """Write what is left to the log and the index (a few tries while the disk
        fails), then close; the log is emptied once the index holds it all. Raises
        StoreError naming what could not be written."""
        try:
            if self._db is None:
                return
            retry = _RETRY_FIRST
            for _ in range(4):
                with contextlib.suppress(StoreError):
                    # fsynced first: only that joins into batches (sqlite_sql._coalesced)
                    await self.flush()
                    await self._fsyncs.through(self._fsyncs.written)
                    await self.caught_up()
                if not self._pending.ops and not self._unapplied:
                    break
                self._log_failed = self._index_failed = None  # try again
                await trio.sleep(retry)
                retry *= 2
            lost = len(self._pending.ops)
            await self._worker.run(self._close_sync, not self._unapplied)
            self._worker.stop()
            self._fsyncs.stop()
            if lost:
                raise StoreError(f"store {self.path}: {lost} changes could not be written")
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _close_sync(self, indexed: bool) -> None:
        db, self._db = self._db, None
        log_, self._log = self._log, None
        pinned: set[int] | None = None
        if db is not None:
            with contextlib.suppress(sqlite3.Error, OSError):
                if log_ is not None and indexed:
                    # the segments left hold queued bodies: on disk, and the index says so
                    synced = log_.sync()
                    db.executemany(sql.SET_META, zip(sql.LOG_KEYS[2:], synced, strict=True))
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                pinned = segs.pinned(db)
            db.close()
        self._bodies.close()
        if log_ is not None:
            if indexed and pinned is not None:
                # the index holds every record, checkpointed: what is left of the log is
                # the segments queued bodies are in
                log_.close()
                log_.remove(pinned)
            else:
                with contextlib.suppress(OSError):
                    log_.sync()
                log_.close()


class _Recorder(GroupRecorder):
    """A group's hot-path door bound to its id in the index (looked up once, at the first
    call: the broker makes a group's recorder before it records the group): a delivery or
    a finish is one call that extends the last record when it is this group's of the same
    kind."""

    __slots__ = ("_gid", "_sqlite")

    def __init__(self, store: SQLiteStore, topic: str, group: str) -> None:
        super().__init__(store, topic, group)
        self._sqlite = store
        self._gid: int | None = None

    def _bound(self) -> int | None:
        if self._gid is None:
            self._gid = self._sqlite.gid(self.topic, self.group)
        return self._gid

    def delivered(self, delivery: Delivery) -> None:
        if (gid := self._gid or self._bound()) is not None:
            self._sqlite._delivered(gid, (delivery,))

    def delivered_all(self, deliveries: Iterable[Delivery]) -> None:
        if (gid := self._gid or self._bound()) is not None:
            self._sqlite._delivered(gid, deliveries)

    def finished_all(self, messages: Sequence[Message]) -> None:
        """A consumer's batch of FINs (or one): one finish record, extended."""
        if (gid := self._gid or self._bound()) is not None:
            self._sqlite._removed(gid, messages)
