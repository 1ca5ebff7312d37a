"""The durable embedded store: SQLite in WAL mode, one transaction per group commit.

Why SQLite (docs/storage.md has the figures): a B-tree gives the two things a queue on disk
needs besides appending, paging a group's ready messages in (priority, id) order and
reclaiming the space of finished ones, without an index of our own in memory; WAL mode
makes a commit one sequential append to the log. The recording calls only queue small
tuples on the event loop; a committer task hands everything queued since its last commit
to a worker thread, which writes it in one transaction (group commit), so disk I/O never
runs on the event loop and many publishes share one write and one fsync.

fsync policy (beanstalkd's -f): "always" is synchronous=FULL (the WAL is fsynced at every
commit, before any publish in it is acknowledged); an interval in ms is synchronous=NORMAL
(every commit is written to the OS before its publishes are acknowledged, so kill -9 loses
nothing) plus an fsync of the WAL at least that often; "never" leaves it to the OS.

The tables and the thread's side of writing and reading are in sqlite_sql.py. A topic's
backlog is a group row without a name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import trio

from gateway.model import Message, Publish
from gateway.stores import sqlite_sql as sql
from gateway.stores.base import (
    Key,
    Store,
    StoredState,
    StoreError,
    StoreStats,
)
from gateway.stores.sqlite_open import TopicIds, lock_data_dir, recover
from gateway.stores.worker import Worker

log = logging.getLogger("gateway.store")

FsyncPolicy = Literal["always", "never"] | int

_RETRY_FIRST, _RETRY_MAX = 0.05, 2.0  # seconds between retries of a failed commit
_VACUUM_PAGES = 2048  # pages given back per maintenance pass (8 MB at 4 KiB)
_MAINTAIN_IDLE, _MAINTAIN_BUSY = 10.0, 1.0  # seconds between maintenance passes
_BACKGROUND_DELAY = 0.005  # seconds records nobody awaits may wait for company


class SQLiteStore(Store):
    durable = True
    pages = True

    def __init__(self, path: str | os.PathLike[str], *, fsync: FsyncPolicy = 50) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        self.fsync = fsync
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._wal_fd: int | None = None
        self._topics: dict[str, TopicIds] = {}
        self._next_tid = 1
        self._next_gid = 1
        self._ops: list[tuple[Any, ...]] = []
        self._recorded = 0  # ops recorded so far
        self._committed = 0  # ops written so far
        self._wake = trio.Event()
        self._committed_event = trio.Event()
        self._worker = Worker(f"store {self.path.name}")  # all of the connection's work
        self._unsynced = False
        self._committing = False
        self._write_done: list[tuple[Any, ...]] | None = None  # the last ops written
        self._last_fsync = 0.0
        self._stats = StoreStats()
        self._id_ceiling = 0

    # -- opening ---------------------------------------------------------------

    async def open(self, window: int = 0) -> StoredState:
        try:
            return await self._worker.run(self._open_sync, window)
        except BaseException:
            self._worker.stop()
            raise

    def _open_sync(self, window: int) -> StoredState:
        self._lock()
        wal = Path(f"{self.path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            # a crash left a log behind: SQLite replays its committed frames and drops a
            # torn tail (each frame carries a checksum), so nothing is to be done but say so
            log.warning(
                "store %s: recovering from a write-ahead log of %d bytes left by an unclean stop",
                self.path,
                wal.stat().st_size,
            )
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only takes on a new file
            # one connection, in one process that holds the data dir's lock anyway: no
            # shared-memory WAL index and no file locking on every transaction
            db.execute("PRAGMA locking_mode = EXCLUSIVE")
            db.execute("PRAGMA journal_mode = WAL")
            sync = {"always": "FULL", "never": "OFF"}.get(str(self.fsync), "NORMAL")
            db.execute(f"PRAGMA synchronous = {sync}")
            # the WAL file is cut back after checkpoints, so finished work gives space back
            db.execute("PRAGMA journal_size_limit = 16777216")
            db.execute("PRAGMA cache_size = -16384")  # 16 MB of page cache, not more
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables and version != sql.VERSION:
                raise StoreError(
                    f"store {self.path}: format {version} is not this gateway's"
                    f" ({sql.VERSION}); move the file aside to start with an empty store"
                )
            db.executescript(sql.SCHEMA)
            db.execute(sql.DROP_TRIGGER)
            db.execute(f"PRAGMA user_version = {sql.VERSION}")
            self._db = db
            return self._recover(db, window)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store {self.path}: cannot open: {exc}") from exc

    def _lock(self) -> None:
        self._lock_fd = lock_data_dir(self.path)

    def _recover(self, db: sqlite3.Connection, window: int) -> StoredState:
        found = recover(db, window)
        self._topics = found.topics
        self._next_tid, self._next_gid = found.next_tid, found.next_gid
        self._id_ceiling = found.state.last_id
        for t in self._topics.values():
            if t.backlog == 0:  # a topic whose backlog row is missing: make one
                t.backlog = self._new_gid()
                self._ops.append(("G+", t.backlog, t.id, None))
                self._recorded += 1
        self._stats.messages_on_disk = found.entries
        self._stats.disk_bytes = self._disk_bytes()
        return found.state

    # -- recording (event loop, synchronous, cheap) ----------------------------

    def _record(self, op: tuple[Any, ...]) -> None:
        if not self._ops:
            self._wake.set()
        self._ops.append(op)
        self._recorded += 1

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
        # the per-group fields as they are now (a delivery may change them before the
        # commit; that change is recorded on its own). One publish's are all alike: it is
        # recorded before any group can deliver one of them.
        if isinstance(messages, Publish):
            fields = [(messages[0].priority, messages[0].attempts)] * len(messages)
        else:
            fields = [(m.priority, m.attempts) for m in messages]
        self._record(("P", gids, messages, due, fields))

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
        state = sql.BURIED if buried else sql.READY
        priority = message.priority
        was = priority if priority_was is None else priority_was
        self._record(("U", (priority, message.attempts, due, state, gid, was, message.id)))

    def remove(self, topic: str, group: str | None, messages: Iterable[Message]) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        gid = t.backlog if group is None else t.groups.get(group)
        if gid is not None:
            self._record(("D", gid, [(m.priority, m.id) for m in messages]))

    def add_topic(self, topic: str) -> None:
        if topic not in self._topics:
            self._add_topic(topic)

    def _add_topic(self, topic: str) -> TopicIds:
        tid = self._next_tid
        self._next_tid += 1
        t = self._topics[topic] = TopicIds(tid, self._new_gid())
        self._record(("T+", tid, topic, t.backlog))
        return t

    def add_group(self, topic: str, group: str) -> None:
        t = self._topics.get(topic) or self._add_topic(topic)
        if group not in t.groups:
            self._add_group(t, group)

    def _add_group(self, t: TopicIds, group: str) -> int:
        gid = t.groups[group] = self._new_gid()
        self._record(("G+", gid, t.id, group))
        return gid

    def fan_out_backlog(self, topic: str, groups: Sequence[str]) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        gids = tuple([t.groups.get(g) or self._add_group(t, g) for g in groups])
        self._record(("F", t.backlog, gids))

    def drop_group(self, topic: str, group: str) -> None:
        t = self._topics.get(topic)
        if t is not None and (gid := t.groups.pop(group, None)) is not None:
            self._record(("G-", gid))

    def drop_topic(self, topic: str) -> None:
        t = self._topics.pop(topic, None)
        if t is not None:
            self._record(("T-", t.id))

    def clear(self, topic: str, group: str | None) -> None:
        t = self._topics.get(topic)
        if t is None:
            return
        gid = t.backlog if group is None else t.groups.get(group)
        if gid is not None:
            self._record(("C", gid))

    def set_paused(self, topic: str, group: str | None, paused: bool) -> None:
        t = self._topics.get(topic) or self._add_topic(topic)
        if group is None:
            self._record(("PT", t.id, int(paused)))
        else:
            gid = t.groups.get(group) or self._add_group(t, group)
            self._record(("PG", gid, int(paused)))

    def reserve_ids(self, ceiling: int) -> None:
        if ceiling > self._id_ceiling:
            self._id_ceiling = ceiling
            self._record(("R", ceiling))

    # -- committing ------------------------------------------------------------

    async def flush(self) -> None:
        # Group commit, leader style: the first flusher with nothing being written writes
        # everything recorded so far; those who come while it writes wait for the next
        # commit, which then carries all of their records at once.
        target = self._recorded
        while self._committed < target:
            if self.failed is not None:
                raise self.failed
            if self._committing:
                await self._committed_event.wait()
            else:
                await self._commit()
        # no checkpoint when there is nothing to wait for: the publish hot path

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background commits (records nobody awaits), the fsync timer of an interval
        policy, and space reclaim."""
        task_status.started()
        retry = _RETRY_FIRST
        interval = self.fsync / 1000 if isinstance(self.fsync, int) else None
        next_maintenance = trio.current_time() + _MAINTAIN_IDLE
        while True:
            if not self._ops:
                wake_at = next_maintenance
                if interval is not None and self._unsynced:
                    # the WAL must reach the disk within the interval of the first commit
                    # it has not fsynced yet
                    wake_at = min(
                        wake_at,
                        trio.current_time()
                        + max(0.0, self._last_fsync + interval - time.monotonic()),
                    )
                with trio.move_on_at(wake_at):
                    await self._wake.wait()
                self._wake = trio.Event()
            if self._ops and not self._committing:
                # records nobody waits for (finishes, deliveries): let a few milliseconds'
                # worth gather into one commit; a publish's flush commits at once anyway
                await trio.sleep(_BACKGROUND_DELAY)
            if self._committing:
                await self._committed_event.wait()
            elif self._ops:
                if await self._commit():
                    retry = _RETRY_FIRST
                else:
                    await trio.sleep(retry)  # a failing disk: try again, backing off
                    retry = min(retry * 2, _RETRY_MAX)
                    continue
            if (
                interval is not None
                and self._unsynced
                and time.monotonic() - self._last_fsync >= interval
            ):
                with contextlib.suppress(OSError):
                    await self._in_thread(self._fsync_wal)
            if trio.current_time() >= next_maintenance:
                freed = False
                with contextlib.suppress(sqlite3.Error, OSError):
                    freed = await self._in_thread(self._maintain)
                # while there is much to give back, a slice every second
                next_maintenance = trio.current_time() + (
                    _MAINTAIN_BUSY if freed else _MAINTAIN_IDLE
                )

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await self._worker.run(fn, *args)

    async def _commit(self) -> bool:
        ops, self._ops = self._ops, []
        upto = self._recorded
        started = time.perf_counter()
        self._committing = True
        try:
            # not abandoned on cancel: a commit that started always finishes
            await self._in_thread(self._write, ops)
        except BaseException as exc:
            if self._write_done is not ops:
                self._ops[:0] = ops  # not written: kept, in order, for the next try
            if not isinstance(exc, sqlite3.Error | OSError):
                raise  # cancelled before the thread started: someone else commits them
            self._stats.write_errors += 1
            first = self.failed is None
            self.failed = StoreError(f"store {self.path}: write failed: {exc}")
            if first:
                log.error("%s; publishes are refused until writes succeed again", self.failed)
            return False
        finally:
            self._committing = False
            self._wake_flushers()
        if self.failed is not None:
            log.warning("store %s: writes succeed again", self.path)
            self.failed = None
        self._stats.commit_seconds.append(time.perf_counter() - started)
        self._stats.commits += 1
        if self.fsync == "always":
            self._stats.fsyncs += 1
        self._committed = upto
        return True

    def _wake_flushers(self) -> None:
        event, self._committed_event = self._committed_event, trio.Event()
        event.set()

    # -- the worker thread's side ------------------------------------------------

    def _write(self, ops: list[tuple[Any, ...]]) -> None:
        db = self._db
        assert db is not None
        if db.in_transaction:
            # a failed write whose ROLLBACK failed too (an I/O error): its changes are
            # kept in _ops and come again; without this, every BEGIN would fail for ever
            db.execute("ROLLBACK")
        db.execute("BEGIN")
        try:
            delta = sql.apply(db, ops)
            db.execute("COMMIT")
            self._write_done = ops
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self._unsynced = self.fsync != "always" and self.fsync != "never"
        self._stats.messages_on_disk += delta

    def _fsync_wal(self) -> None:
        if self._wal_fd is None:
            try:
                self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY)
            except FileNotFoundError:
                return
        os.fsync(self._wal_fd)
        self._last_fsync = time.monotonic()
        self._unsynced = False
        self._stats.fsyncs += 1

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
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(f"{self.path}{suffix}").st_size
        return total

    async def load(self, topic: str, group: str, after: Key, limit: int) -> list[Message]:
        # what was spilled may still be only recorded: the read must see it
        await self.flush()
        t = self._topics.get(topic)
        gid = t.groups.get(group) if t is not None else None
        if gid is None:
            return []
        where = (
            "e.grp = ? AND (e.priority, e.id) >= (?, ?) AND e.state = 0 AND e.due = 0"
            " ORDER BY e.grp, e.priority, e.id LIMIT ?"
        )
        db = self._db
        assert db is not None
        args = (gid, after[0], after[1], limit)
        return await self._in_thread(sql.select, db, topic, where, args)

    def stats(self) -> StoreStats:
        stats = self._stats
        self._stats = StoreStats(
            commits=stats.commits,
            fsyncs=stats.fsyncs,
            write_errors=stats.write_errors,
            disk_bytes=stats.disk_bytes,
            messages_on_disk=stats.messages_on_disk,
        )
        return stats

    async def close(self) -> None:
        """Write what is left (a few tries while the disk fails), then close. Raises
        StoreError naming what could not be written."""
        try:
            if self._db is None:
                return
            retry = _RETRY_FIRST
            for _ in range(4):
                while self._committing:
                    await self._committed_event.wait()
                if not self._ops or await self._commit():
                    break
                await trio.sleep(retry)
                retry *= 2
            lost = len(self._ops)
            await self._in_thread(self._close_sync)
            self._worker.stop()
            if lost:
                raise StoreError(f"store {self.path}: {lost} changes could not be written")
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _close_sync(self) -> None:
        db = self._db
        self._db = None
        if db is None:
            return
        with contextlib.suppress(sqlite3.Error):
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        db.close()
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
