"""Opening the durable store: the data dir's lock, the index's connection (its schema made
or converted), the log's records the index lacks replayed into it, and recovery of what
the index holds.

Runs on the store's worker thread, before anything is recorded.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.model import Message
from gateway.stores import sqlite_read as read
from gateway.stores import sqlite_segments as segs
from gateway.stores import sqlite_sql as sql
from gateway.stores.base import MIN_KEY, StoredGroup, StoredState, StoredTopic, StoreError
from gateway.stores.log import Bodies, Position, replay, segment_path, segments

# a frame written to the log: its records, its segment, where its bodies start in it
Written = tuple[list[tuple[Any, ...]], int, list[int]]

log = logging.getLogger("gateway.store")
_REPLAY_RECORDS = 50_000  # records per transaction when a restart replays the log


class TopicIds:
    """A topic's row id, its backlog's group id and its groups' ids, by name."""

    __slots__ = ("backlog", "groups", "id")

    def __init__(self, tid: int, backlog: int) -> None:
        self.id = tid
        self.backlog = backlog  # the group id of the topic's backlog
        self.groups: dict[str, int] = {}


def lock_data_dir(path: Path) -> int:
    """Take `<path>.lock` (flock, with the owner's pid in it); returns its descriptor.
    A data dir that cannot be made or written, or that another gateway holds, is a
    StoreError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except FileExistsError:  # mkdir met a file where the directory should be
        raise StoreError(f"data dir {path.parent}: not a directory") from None
    except OSError as exc:
        raise StoreError(f"data dir {path.parent}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StoreError(
            f"data dir {path.parent} is in use by another gateway (pid {holder}): {path} is locked"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    if not os.access(path.parent, os.W_OK):
        os.close(fd)
        raise StoreError(f"data dir {path.parent}: not writable")
    return fd


def connect(path: Path) -> sqlite3.Connection:
    """The index's one connection, its tables made (or a format 1 file converted)."""
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        # SQLite replays its committed frames and drops a torn tail (each frame carries a
        # checksum): nothing to do but say so
        log.warning(
            "store %s: the index's write-ahead log (%d bytes) was left by an unclean stop",
            path,
            wal.stat().st_size,
        )
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only takes on a new file
    # one connection, in one process that holds the data dir's lock anyway: no
    # shared-memory WAL index and no file locking on every transaction
    db.execute("PRAGMA locking_mode = EXCLUSIVE")
    db.execute("PRAGMA journal_mode = WAL")
    # the log makes acknowledgements durable; the index only has to stay whole (NORMAL:
    # its WAL is fsynced at checkpoints), and it is synced before any segment it holds
    # is deleted
    db.execute("PRAGMA synchronous = NORMAL")
    # the WAL file is cut back after checkpoints, so finished work gives space back
    db.execute("PRAGMA journal_size_limit = 16777216")
    db.execute("PRAGMA cache_size = -16384")  # 16 MB of page cache, not more
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if tables and version not in (1, 2, 3, sql.VERSION):
        db.close()
        raise StoreError(
            f"store {path}: format {version} is not this gateway's"
            f" ({sql.VERSION}); move the file aside to start with an empty store"
        )
    db.executescript(sql.SCHEMA)
    if tables and version == 1:
        db.executescript(sql.MIGRATE_1)
    if tables and version in (1, 2):
        db.executescript(sql.MIGRATE_2)
    if tables and version in (1, 2, 3):
        db.executescript(sql.MIGRATE_3)
        log.warning("store %s: converted from format %d to %d", path, version, sql.VERSION)
    db.executescript(sql.INDEXES)
    db.execute(f"PRAGMA user_version = {sql.VERSION}")
    return db


def replay_into(
    db: sqlite3.Connection,
    log_dir: Path,
    bodies: Bodies,
    apply: Callable[[list[Written], Position, Position], None],
) -> Position:
    """Check the bodies the index points at past the log's last fsync, then apply the
    log's records the index lacks (`apply`: frames, the position they end at and the one
    the log is fsynced to, one transaction); returns the position the index holds now."""
    rows = dict(db.execute(sql.GET_LOG_POSITION).fetchall())
    held: Position = (rows.get("log_segment", 0), rows.get("log_offset", 0))
    if not log_dir.is_dir():
        return held
    # what is on disk now is what the replay reads: fsynced first, so that the index
    # never holds more than a later power cut could leave of the log
    for number in segments(log_dir):
        fd = os.open(segment_path(log_dir, number), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    synced: Position = (rows.get("synced_segment", 0), rows.get("synced_offset", 0))
    lost = segs.drop_lost(db, bodies, synced)
    if lost:
        log.warning(
            "store %s: %d messages whose bodies were written after the log's last fsync"
            " are not in it (a power cut): dropped",
            log_dir,
            lost,
        )
    batch: list[Written] = []
    count = frames = 0
    for position, records, starts in replay(log_dir, held):
        batch.append((records, position[0], starts))
        count += len(records)
        held = position
        frames += 1
        if count >= _REPLAY_RECORDS:
            apply(batch, held, held)
            batch, count = [], 0
    if batch:
        apply(batch, held, held)
    if frames:
        log.warning(
            "store %s: %d writes of the log replayed into the index (an unclean stop)",
            log_dir,
            frames,
        )
    return held


@dataclass
class Recovered:
    state: StoredState
    topics: dict[str, TopicIds] = field(default_factory=dict)
    next_tid: int = 1
    next_gid: int = 1
    entries: int = 0  # entries on disk


def _queued(
    db: sqlite3.Connection, bodies: Bodies, topic: str, gid: int, limit: int
) -> tuple[list[Message], int]:
    """A group's (or a backlog's) first `limit` ready messages in (priority, id) order
    (all with -1) and every deferred one; how many ready ones are left on disk."""
    ready = read.select_ready(db, bodies, topic, gid, MIN_KEY, limit)
    spilled = read.count_ready(db, gid) - len(ready)
    ready += read.select(db, bodies, topic, "grp = ? AND state = 0 AND due > 0", (gid,))
    return ready, spilled


def recover(db: sqlite3.Connection, bodies: Bodies, window: int) -> Recovered:
    """Topics, groups and pause states; per group the first `window` ready messages in
    (priority, id) order (all with 0), the count of the rest, every deferred and every
    buried one; the same of the backlog of topics without a group (it has no buried one);
    the id to start after."""
    state = StoredState()
    found = Recovered(state)
    row = db.execute("SELECT value FROM meta WHERE key = 'id_ceiling'").fetchone()
    ceiling = row[0] if row else 0
    row = db.execute("SELECT max(last) FROM batches").fetchone()
    state.last_id = max(ceiling, row[0] or 0)
    names: dict[int, str] = {}
    for tid, name, paused in db.execute("SELECT id, name, paused FROM topics"):
        names[tid] = name
        state.topics[name] = StoredTopic(name, bool(paused))
        found.next_tid = max(found.next_tid, tid + 1)
    topics = found.topics
    for gid, tid, name, paused in db.execute("SELECT id, topic, name, paused FROM groups"):
        found.next_gid = max(found.next_gid, gid + 1)
        topic_name = names.get(tid)
        if topic_name is None:
            continue
        st = state.topics[topic_name]
        t = topics.get(topic_name)
        if t is None:
            t = topics[topic_name] = TopicIds(tid, 0)
        limit = window if window > 0 else -1
        if name is None:
            t.backlog = gid
            backlog, st.spilled = _queued(db, bodies, topic_name, gid, limit)
            st.backlog = sorted(backlog, key=lambda m: m.id)
            continue
        t.groups[name] = gid
        sg = st.groups[name] = StoredGroup(name, bool(paused))
        sg.ready, sg.spilled = _queued(db, bodies, topic_name, gid, limit)
        sg.buried = read.select(db, bodies, topic_name, "grp = ? AND state = 1", (gid,), by_id=True)
    found.entries = read.count_all(db)
    return found
