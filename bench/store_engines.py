"""Which embedded engine should hold the gateway's durable queues? A benchmark, not a test.

The candidates run the gateway's own workload on this machine's disk and one table compares
them (a row per figure, a column per engine):

* ``sqlite``         stdlib sqlite3, WAL, the intended schema: ``messages`` (the body once),
                     ``entries`` (one row per group, WITHOUT ROWID, PK (grp, id)), the paging
                     index ``entries(grp, priority, id)`` and the AFTER DELETE trigger that
                     drops a body with its last entry.
* ``sqlite-noidx``   the same without the paging index (what the index costs and buys).
* ``sqlite-notrig``  the same without the trigger: the broker, which holds every queue in
                     memory and so knows when a body's last group is done, deletes the message
                     row itself in the same transaction (what the trigger costs).
* ``sqlite-bare``    neither.
* ``apsw``           the full schema through apsw (it bundles its own, newer SQLite).
* ``lmdb``           bodies keyed by id (8-byte big-endian), entries keyed by
                     (grp, priority, id) big-endian so that a cursor pages in delivery order.
* ``log``            an append-only segment log written here (beanstalkd binlog / nsqd
                     diskqueue style): CRC32-framed records, one os.write per commit,
                     tombstones for deletes, an in-memory index rebuilt by replay at open.

Workloads, 200-byte bodies, one group unless said, about 1 message in 10 at an urgent
priority (so that (priority, id) order is not id order):

* group commit: publishes, 1, 10, 100 and 1000 per commit, with and without fsync:
  msgs/s (median of 3 runs on fresh stores) and the commit's p50/p99 (all runs pooled);
* steady state: each commit publishes 100 and acks the 100 oldest (10,000 queued), and
  the per-message cost of recording a delivery attempt (an executemany of 100 per commit);
* two groups: each body stored once with an entry in both; group 1 acks (the body stays),
  then group 2 acks (the body goes); the bodies left at the end must be 0;
* recovery with 1,000,000 queued (100,000 with --quick): open, (a) count per group,
  (b) the first 10,000 in (priority, id) order with their bodies, (c) a scan of every
  entry's id, priority and attempts. Once with the files evicted from the page cache
  (posix_fadvise DONTNEED), then the median of 3 warm runs;
* space: the files with everything queued, after acking everything, the growth when a
  tenth is published and acked again (is freed space reused?), and after the reclaim the
  engine needs (listed under the table).

Every engine call is timed with the transaction around it, as the store's flush would run
it; building the messages is not timed.

"no fsync" means written to the OS only: SQLite WAL with synchronous=NORMAL (the intended
setting; WAL commits do not sync, checkpoints do, and their cost is in the figures), LMDB
sync=False, the log without fdatasync. "fsync" means durable at each commit: SQLite
synchronous=FULL, LMDB sync=True (its default: it syncs data, then the meta page), the log
with one fdatasync per write.

apsw and lmdb are not project dependencies. A candidate whose module is missing is skipped
(the header says so); to measure them, run the script with a throwaway venv that has them:

    .venv/bin/python bench/store_engines.py             # ~2-3 min; apsw and lmdb skipped
    .venv/bin/python bench/store_engines.py --quick     # < 30 s, 100k queued for recovery
    python3 -m venv /tmp/engines && /tmp/engines/bin/pip install apsw lmdb
    /tmp/engines/bin/python bench/store_engines.py      # every candidate

Files go to a temporary directory under ``build/`` in the repository (``--dir`` to change),
removed at the end. That must be the real disk: tmpfs would make every fsync free, so the
script prints the filesystem it measured on and warns about tmpfs.
"""

from __future__ import annotations

import abc
import argparse
import collections
import gc
import importlib
import os
import platform
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent

BODY_SIZE = 200
TOPIC = 7
# Distinct bodies cycled through: enough that nothing can dedupe them, few enough to keep
# the generator out of the measurement.
BODIES = [os.urandom(BODY_SIZE) for _ in range(64)]
TS0 = 1_700_000_000_000_000_000

# A message as the broker hands it to the store: (id, topic, ts, priority, body).
Msg = tuple[int, int, int, int, bytes]
# A group entry as the broker knows it when it acks: (id, priority).
Entry = tuple[int, int]
T = TypeVar("T")


def priority_of(msg_id: int) -> int:
    """About 1 message in 10 is urgent (beanstalkd-style priorities); the rest have the default.

    Mixed priorities matter: with a single priority the (grp, id) primary key already is the
    delivery order and the paging index would be measured doing nothing.
    """
    return 100 if (msg_id * 2654435761) & 0xFF < 26 else 1024


def make_msgs(first_id: int, n: int) -> list[Msg]:
    return [
        (i, TOPIC, TS0 + i, priority_of(i), BODIES[i & 63]) for i in range(first_id, first_id + n)
    ]


def optional_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


apsw = optional_module("apsw")
lmdb = optional_module("lmdb")


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def evict_page_cache(path: Path) -> bool:
    """Drop the store's files from the page cache so that the next open reads the disk.

    fsync first: DONTNEED only drops clean pages. Per file, so nothing else on the machine
    is touched. Returns False where posix_fadvise is missing (the cold figure is then warm).
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in path.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


# -- the engines -------------------------------------------------------------------------


class Engine(abc.ABC):
    """One candidate store, opened on a directory. Open (or recover) happens in __init__.

    The broker keeps every queue in memory, so it always knows a message's priority and
    which groups still hold it; the calls pass that knowledge (``Entry`` priorities, the
    ``freed`` ids whose last group acked) so that an engine without a trigger or a
    secondary lookup can use it, as the real store would.
    """

    name: ClassVar[str]
    requires: ClassVar[str | None] = None  # optional module; the engine is skipped without it
    note: ClassVar[str] = ""

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.path = path
        self.fsync = fsync

    @abc.abstractmethod
    def begin(self) -> None: ...

    @abc.abstractmethod
    def commit(self) -> None: ...

    @abc.abstractmethod
    def publish(self, msgs: Sequence[Msg], groups: Sequence[int]) -> None: ...

    @abc.abstractmethod
    def ack(self, grp: int, entries: Sequence[Entry], freed: Sequence[int]) -> None: ...

    @abc.abstractmethod
    def set_attempts(self, grp: int, entries: Sequence[tuple[int, int, int]]) -> None:
        """(id, priority, attempts) for each delivered message."""

    @abc.abstractmethod
    def count_groups(self) -> dict[int, int]: ...

    @abc.abstractmethod
    def first(self, grp: int, n: int) -> list[tuple[int, int, int, bytes]]:
        """The first n (id, priority, attempts, body) in (priority, id) order."""

    @abc.abstractmethod
    def scan(self) -> int:
        """Read every entry's (id, priority, attempts); the rows read."""

    @abc.abstractmethod
    def bodies(self) -> int: ...

    @abc.abstractmethod
    def reclaim(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def index_bytes_per_msg(self, queued: int) -> float | None:
        """Python heap an open store needs per queued message; None: it pages from disk."""
        return None


SCHEMA = [
    "CREATE TABLE IF NOT EXISTS messages(id INTEGER PRIMARY KEY, topic INTEGER, ts INTEGER,"
    " body BLOB, meta BLOB, refs INTEGER)",
    "CREATE TABLE IF NOT EXISTS entries(grp INTEGER, id INTEGER, priority INTEGER,"
    " attempts INTEGER, due REAL, state INTEGER, PRIMARY KEY(grp, id)) WITHOUT ROWID",
]
INDEX = "CREATE INDEX IF NOT EXISTS entries_order ON entries(grp, priority, id)"
TRIGGER = """CREATE TRIGGER IF NOT EXISTS entries_release AFTER DELETE ON entries BEGIN
    UPDATE messages SET refs = refs - 1 WHERE id = OLD.id;
    DELETE FROM messages WHERE id = OLD.id AND refs <= 0;
END"""


class SqliteEngine(Engine):
    name = "sqlite"
    index = True
    trigger = True

    def __init__(self, path: Path, *, fsync: bool) -> None:
        super().__init__(path, fsync=fsync)
        path.mkdir(parents=True, exist_ok=True)
        self.db = self.connect(str(path / "store.db"))
        # auto_vacuum only takes effect before the first table exists; it is what lets the
        # file shrink later (incremental_vacuum) instead of keeping every freed page.
        self.q("PRAGMA auto_vacuum=INCREMENTAL")
        self.q("PRAGMA journal_mode=WAL")
        self.q(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
        for sql in SCHEMA:
            self.q(sql)
        if self.index:
            self.q(INDEX)
        if self.trigger:
            self.q(TRIGGER)
        assert self.q("PRAGMA auto_vacuum")[0][0] == 2, "auto_vacuum=INCREMENTAL not in force"

    def connect(self, filename: str) -> Any:
        # isolation_level=None: no implicit transactions, BEGIN/COMMIT are ours.
        return sqlite3.connect(filename, isolation_level=None)

    def q(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # list(): a statement such as PRAGMA incremental_vacuum only runs to completion
        # when every result row is stepped through.
        return list(self.db.execute(sql, params) if params else self.db.execute(sql))

    def begin(self) -> None:
        self.db.execute("BEGIN")

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def publish(self, msgs: Sequence[Msg], groups: Sequence[int]) -> None:
        refs = len(groups)
        self.db.executemany(
            "INSERT INTO messages(id, topic, ts, body, meta, refs) VALUES (?, ?, ?, ?, NULL, ?)",
            [(m[0], m[1], m[2], m[4], refs) for m in msgs],
        )
        for g in groups:
            self.db.executemany(
                "INSERT INTO entries(grp, id, priority, attempts, due, state)"
                " VALUES (?, ?, ?, 0, 0.0, 0)",
                [(g, m[0], m[3]) for m in msgs],
            )

    def ack(self, grp: int, entries: Sequence[Entry], freed: Sequence[int]) -> None:
        self.db.executemany(
            "DELETE FROM entries WHERE grp = ? AND id = ?", [(grp, e[0]) for e in entries]
        )
        if not self.trigger and freed:
            self.db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in freed])

    def set_attempts(self, grp: int, entries: Sequence[tuple[int, int, int]]) -> None:
        self.db.executemany(
            "UPDATE entries SET attempts = ? WHERE grp = ? AND id = ?",
            [(e[2], grp, e[0]) for e in entries],
        )

    def count_groups(self) -> dict[int, int]:
        return dict(self.q("SELECT grp, count(*) FROM entries GROUP BY grp"))

    def first(self, grp: int, n: int) -> list[tuple[int, int, int, bytes]]:
        return self.q(
            "SELECT e.id, e.priority, e.attempts, m.body FROM entries AS e"
            " JOIN messages AS m ON m.id = e.id"
            " WHERE e.grp = ? ORDER BY e.priority, e.id LIMIT ?",
            (grp, n),
        )

    def scan(self) -> int:
        rows = 0
        for _ in self.db.execute("SELECT id, priority, attempts FROM entries"):
            rows += 1
        return rows

    def bodies(self) -> int:
        return int(self.q("SELECT count(*) FROM messages")[0][0])

    def reclaim(self) -> None:
        # Freed pages stay in the file's freelist until incremental_vacuum moves them to the
        # end and truncates; in WAL mode that truncation only reaches the main file at the
        # checkpoint, and TRUNCATE also cuts the WAL itself back to zero bytes.
        self.incremental_vacuum()
        self.q("PRAGMA wal_checkpoint(TRUNCATE)")
        assert self.q("PRAGMA freelist_count")[0][0] == 0, "incremental_vacuum left pages"

    def incremental_vacuum(self) -> None:
        # Not execute(): the stdlib module steps a statement that has no result columns
        # once, and one step of incremental_vacuum frees one page. executescript steps it
        # to the end.
        self.db.executescript("PRAGMA incremental_vacuum;")

    def close(self) -> None:
        self.db.close()


class SqliteNoIndex(SqliteEngine):
    name = "sqlite-noidx"
    index = False


class SqliteNoTrigger(SqliteEngine):
    name = "sqlite-notrig"
    trigger = False


class SqliteBare(SqliteEngine):
    name = "sqlite-bare"
    index = False
    trigger = False


class ApswEngine(SqliteEngine):
    name = "apsw"
    requires = "apsw"

    def connect(self, filename: str) -> Any:
        assert apsw is not None
        return apsw.Connection(filename)

    def incremental_vacuum(self) -> None:
        self.q("PRAGMA incremental_vacuum")  # apsw steps every statement to the end


MSG_KEY = struct.Struct(">Q")  # big-endian so that byte order is id order
MSG_HDR = struct.Struct(">IqH")  # topic, ts, refs; the body follows
ENTRY_KEY = struct.Struct(">IIQ")  # grp, priority, id: a cursor walks delivery order
ENTRY_VAL = struct.Struct(">IdB")  # attempts, due, state
GRP_PREFIX = struct.Struct(">I")
ENTRY_NEW = ENTRY_VAL.pack(0, 0.0, 0)
LMDB_MAP_SIZE = 16 << 30  # address space only: the file grows as pages are written


class LmdbEngine(Engine):
    name = "lmdb"
    requires = "lmdb"

    def __init__(self, path: Path, *, fsync: bool) -> None:
        super().__init__(path, fsync=fsync)
        self.txn: Any = None
        self.open_env()

    def open_env(self) -> None:
        assert lmdb is not None
        # metasync follows sync: a durable commit in LMDB is two syncs (data pages, then the
        # meta page that publishes them), and that is what "fsync" measures here.
        self.env = lmdb.open(
            str(self.path), map_size=LMDB_MAP_SIZE, max_dbs=2, sync=self.fsync, metasync=self.fsync
        )
        self.msgs = self.env.open_db(b"messages")
        self.entries = self.env.open_db(b"entries")

    def begin(self) -> None:
        self.txn = self.env.begin(write=True)

    def commit(self) -> None:
        self.txn.commit()
        self.txn = None

    def publish(self, msgs: Sequence[Msg], groups: Sequence[int]) -> None:
        refs = len(groups)
        # append=True (MDB_APPEND): ids only grow, so each body goes at the right edge of
        # the B+tree without a search, as the real store would do it.
        self.txn.cursor(self.msgs).putmulti(
            [(MSG_KEY.pack(m[0]), MSG_HDR.pack(m[1], m[2], refs) + m[4]) for m in msgs],
            append=True,
        )
        cur = self.txn.cursor(self.entries)
        for g in groups:
            cur.putmulti([(ENTRY_KEY.pack(g, m[3], m[0]), ENTRY_NEW) for m in msgs])

    def ack(self, grp: int, entries: Sequence[Entry], freed: Sequence[int]) -> None:
        # No trigger: the broker knows when a body's last group acked (``freed``).
        delete = self.txn.delete
        for mid, prio in entries:
            delete(ENTRY_KEY.pack(grp, prio, mid), db=self.entries)
        for mid in freed:
            delete(MSG_KEY.pack(mid), db=self.msgs)

    def set_attempts(self, grp: int, entries: Sequence[tuple[int, int, int]]) -> None:
        self.txn.cursor(self.entries).putmulti(
            [(ENTRY_KEY.pack(grp, p, i), ENTRY_VAL.pack(a, 0.0, 0)) for i, p, a in entries]
        )

    def count_groups(self) -> dict[int, int]:
        # LMDB keeps counts per database, not per key prefix: counting a group is a key scan.
        counts: dict[int, int] = collections.Counter()
        with self.env.begin(db=self.entries) as txn:
            for key in txn.cursor().iternext(keys=True, values=False):
                counts[GRP_PREFIX.unpack_from(key)[0]] += 1
        return dict(counts)

    def first(self, grp: int, n: int) -> list[tuple[int, int, int, bytes]]:
        out: list[tuple[int, int, int, bytes]] = []
        with self.env.begin() as txn:
            cur = txn.cursor(self.entries)
            if not cur.set_range(GRP_PREFIX.pack(grp)):
                return out
            get = txn.get
            for key, val in cur:
                g, prio, mid = ENTRY_KEY.unpack(key)
                if g != grp or len(out) >= n:
                    break
                body = get(MSG_KEY.pack(mid), db=self.msgs)[MSG_HDR.size :]
                out.append((mid, prio, ENTRY_VAL.unpack(val)[0], body))
        return out

    def scan(self) -> int:
        rows = 0
        with self.env.begin(db=self.entries) as txn:
            for key, val in txn.cursor():
                ENTRY_KEY.unpack(key)
                ENTRY_VAL.unpack(val)
                rows += 1
        return rows

    def bodies(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self.msgs)["entries"])

    def reclaim(self) -> None:
        # LMDB never shrinks its file: freed pages go to a freelist that later commits
        # reuse. Giving space back takes a compacting copy, swapped in while closed.
        compact = self.path.with_name(self.path.name + ".compact")
        compact.mkdir()
        self.env.copy(str(compact), compact=True)
        self.env.close()
        os.replace(compact / "data.mdb", self.path / "data.mdb")
        shutil.rmtree(compact)
        self.open_env()

    def close(self) -> None:
        self.env.close()


REC_HDR = struct.Struct("<II")  # payload length, zlib.crc32(payload)
PUT = struct.Struct("<BQIqIB")  # type 1, id, topic, ts, priority, group count; groups, body
DEL = struct.Struct("<BHIQ")  # type 2, grp, priority, id: a tombstone
UPD = struct.Struct("<BHIQI")  # type 3, grp, priority, id, attempts
GRP = struct.Struct("<H")
T_PUT, T_DEL, T_UPD = 1, 2, 3
SEGMENT_BYTES = 64 << 20


class LogEngine(Engine):
    """Length-prefixed, CRC32-checked records appended to numbered segment files.

    The index lives in memory and is rebuilt by replaying every segment at open:

    * ``loc[id]``: one int packing segment, offset and record length (to pread the body) and
      the count of groups still holding the message (the trigger's job, done here);
    * ``groups[grp][priority][id] = attempts``: dicts keep insertion order and ids grow, so
      iterating priorities in order and each dict in order is (priority, id) order.

    Space comes back by deleting whole segments: the oldest ones while they hold no live
    message. A tombstone always follows the record it kills, so deleting a prefix of
    segments never resurrects anything.
    """

    name = "log"

    def __init__(self, path: Path, *, fsync: bool) -> None:
        super().__init__(path, fsync=fsync)
        path.mkdir(parents=True, exist_ok=True)
        self.loc: dict[int, int] = {}
        self.groups: dict[int, dict[int, dict[int, int]]] = {}
        self.live: dict[int, int] = collections.Counter()  # segment -> live messages
        self.readers: dict[int, int] = {}
        segments = self.segments()
        for seg in segments:
            self.replay(seg)
        self.seg = segments[-1] if segments else 1
        self.fd = os.open(self.seg_path(self.seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.off = os.fstat(self.fd).st_size
        self.buf: list[bytes] = []
        self.buflen = 0

    def seg_path(self, seg: int) -> Path:
        return self.path / f"{seg:08d}.log"

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.path.glob("*.log"))

    def replay(self, seg: int) -> None:
        data = self.seg_path(seg).read_bytes()
        view = memoryview(data)
        loc, groups, crc32 = self.loc, self.groups, zlib.crc32
        put_unpack, rec_unpack, grp_unpack = PUT.unpack_from, REC_HDR.unpack_from, GRP.unpack_from
        queues: dict[tuple[int, int], dict[int, int]] = {}  # saves two lookups per record
        pos, end = 0, len(data)
        live = 0
        while pos + REC_HDR.size <= end:
            size, crc = rec_unpack(data, pos)
            start, stop = pos + REC_HDR.size, pos + REC_HDR.size + size
            if stop > end or crc32(view[start:stop]) != crc:
                # A torn write at the tail: drop it, as beanstalkd and nsqd do.
                os.truncate(self.seg_path(seg), pos)
                break
            kind = data[start]
            if kind == T_PUT:
                _, mid, _topic, _ts, prio, ngroups = put_unpack(data, start)
                gpos = start + PUT.size
                for _ in range(ngroups):
                    g = grp_unpack(data, gpos)[0]
                    gpos += 2
                    queue = queues.get((g, prio))
                    if queue is None:
                        queue = queues[g, prio] = groups.setdefault(g, {}).setdefault(prio, {})
                    queue[mid] = 0
                loc[mid] = seg << 56 | pos << 28 | (stop - pos) << 8 | ngroups
                live += 1
            elif kind == T_DEL:
                _, g, prio, mid = DEL.unpack_from(data, start)
                self.forget(g, prio, mid)
            elif kind == T_UPD:
                _, g, prio, mid, attempts = UPD.unpack_from(data, start)
                by_prio = groups.get(g, {}).get(prio)
                if by_prio is not None and mid in by_prio:
                    by_prio[mid] = attempts
            pos = stop
        self.live[seg] += live

    def forget(self, grp: int, prio: int, mid: int) -> None:
        by_prio = self.groups.get(grp, {}).get(prio)
        if by_prio is None or by_prio.pop(mid, None) is None:
            return  # its PUT was in a segment already deleted
        v = self.loc[mid] - 1
        if v & 0xFF:
            self.loc[mid] = v
        else:
            del self.loc[mid]
            self.live[v >> 56] -= 1

    def begin(self) -> None:
        # Rotate between commits so that a batch never straddles two segments.
        if self.off >= SEGMENT_BYTES:
            self.rotate()

    def rotate(self) -> None:
        os.close(self.fd)
        self.seg += 1
        self.fd = os.open(self.seg_path(self.seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.off = 0
        if self.fsync:
            self.sync_dir()

    def sync_dir(self) -> None:
        # A new or deleted segment is durable only once its directory entry is.
        dfd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def append(self, payload: bytes) -> int:
        self.buf.append(REC_HDR.pack(len(payload), zlib.crc32(payload)))
        self.buf.append(payload)
        size = REC_HDR.size + len(payload)
        self.buflen += size
        return size

    def commit(self) -> None:
        data = b"".join(self.buf)
        view = memoryview(data)
        written = 0
        while written < len(data):  # os.write may be partial
            written += os.write(self.fd, view[written:])
        if self.fsync:
            os.fdatasync(self.fd)
        self.off += len(data)
        self.buf.clear()
        self.buflen = 0

    def publish(self, msgs: Sequence[Msg], groups: Sequence[int]) -> None:
        gbytes = b"".join(GRP.pack(g) for g in groups)
        ngroups = len(groups)
        by_group = [self.groups.setdefault(g, {}) for g in groups]
        seg_bits = self.seg << 56
        loc, append, pack = self.loc, self.append, PUT.pack
        for mid, topic, ts, prio, body in msgs:
            pos = self.off + self.buflen
            size = append(pack(T_PUT, mid, topic, ts, prio, ngroups) + gbytes + body)
            loc[mid] = seg_bits | pos << 28 | size << 8 | ngroups
            for by_prio in by_group:
                queue = by_prio.get(prio)
                if queue is None:
                    queue = by_prio[prio] = {}
                queue[mid] = 0
        self.live[self.seg] += len(msgs)

    def ack(self, grp: int, entries: Sequence[Entry], freed: Sequence[int]) -> None:
        # ``freed`` is not needed: loc carries each message's count of groups.
        append, pack, forget = self.append, DEL.pack, self.forget
        for mid, prio in entries:
            append(pack(T_DEL, grp, prio, mid))
            forget(grp, prio, mid)

    def set_attempts(self, grp: int, entries: Sequence[tuple[int, int, int]]) -> None:
        by_prio = self.groups[grp]
        append, pack = self.append, UPD.pack
        for mid, prio, attempts in entries:
            append(pack(T_UPD, grp, prio, mid, attempts))
            by_prio[prio][mid] = attempts

    def count_groups(self) -> dict[int, int]:
        return {g: sum(map(len, by_prio.values())) for g, by_prio in self.groups.items()}

    def read_body(self, mid: int) -> bytes:
        v = self.loc[mid]
        seg, pos, size = v >> 56, (v >> 28) & 0xFFFFFFF, (v >> 8) & 0xFFFFF
        fd = self.readers.get(seg)
        if fd is None:
            fd = self.readers[seg] = os.open(self.seg_path(seg), os.O_RDONLY)
        rec = os.pread(fd, size, pos)
        ngroups = rec[REC_HDR.size + PUT.size - 1]
        return rec[REC_HDR.size + PUT.size + 2 * ngroups :]

    def first(self, grp: int, n: int) -> list[tuple[int, int, int, bytes]]:
        out: list[tuple[int, int, int, bytes]] = []
        by_prio = self.groups.get(grp, {})
        for prio in sorted(by_prio):
            for mid, attempts in by_prio[prio].items():
                if len(out) >= n:
                    return out
                out.append((mid, prio, attempts, self.read_body(mid)))
        return out

    def scan(self) -> int:
        # Already in memory: the replay at open was the full scan.
        rows = 0
        for by_prio in self.groups.values():
            for queue in by_prio.values():
                for _mid, _attempts in queue.items():
                    rows += 1
        return rows

    def bodies(self) -> int:
        return len(self.loc)

    def reclaim(self) -> None:
        for seg in self.segments():
            if self.live[seg] > 0:
                break
            if seg == self.seg:
                self.rotate()  # even the segment being written is all dead
            fd = self.readers.pop(seg, None)
            if fd is not None:
                os.close(fd)
            self.seg_path(seg).unlink()
            del self.live[seg]
        if self.fsync:
            self.sync_dir()

    def close(self) -> None:
        os.close(self.fd)
        for fd in self.readers.values():
            os.close(fd)
        self.readers.clear()

    def index_bytes_per_msg(self, queued: int) -> float | None:
        # Counted object by object (sys.getsizeof: dict tables and int objects) rather than
        # with tracemalloc around a replay, which takes ~15x the replay's time. The ids are
        # the same int objects in loc and in the group dicts (one unpack feeds both), so
        # they count once; attempts below 257 are Python's cached small ints and cost nothing.
        size = sys.getsizeof
        total = size(self.loc) + size(self.groups) + size(self.live)
        total += sum(size(mid) + size(v) for mid, v in self.loc.items())
        for by_prio in self.groups.values():
            total += size(by_prio) + sum(size(queue) for queue in by_prio.values())
        return total / queued


ENGINES: list[type[Engine]] = [
    SqliteEngine,
    SqliteNoIndex,
    SqliteNoTrigger,
    SqliteBare,
    ApswEngine,
    LmdbEngine,
    LogEngine,
]


# -- the workloads -----------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    quick: bool
    batches: tuple[int, ...]
    cell_seconds: float  # time budget of one group-commit cell (engine x sync x batch)
    cell_max_msgs: int
    warmup_commits: int
    min_commits: int
    mixed_depth: int  # messages queued before the steady state starts
    mixed_batch: int
    mixed_seconds: float
    recovery_n: int  # messages queued for the recovery and space figures
    build_batch: int
    drain_batch: int
    reuse_n: int  # republished after deleting everything: does the engine reuse the space?
    page_n: int
    repeats: int


FULL = Config(
    quick=False,
    batches=(1, 10, 100, 1000),
    cell_seconds=0.5,
    cell_max_msgs=300_000,
    warmup_commits=2,
    min_commits=20,
    mixed_depth=10_000,
    mixed_batch=100,
    mixed_seconds=0.8,
    recovery_n=1_000_000,
    build_batch=1000,
    drain_batch=10_000,
    reuse_n=100_000,
    page_n=10_000,
    repeats=3,
)
QUICK = Config(
    quick=True,
    batches=(1, 10, 100, 1000),
    cell_seconds=0.06,
    cell_max_msgs=30_000,
    warmup_commits=1,
    min_commits=5,
    mixed_depth=2_000,
    mixed_batch=100,
    mixed_seconds=0.1,
    recovery_n=100_000,
    build_batch=1000,
    drain_batch=10_000,
    reuse_n=10_000,
    page_n=10_000,
    repeats=3,
)


def pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


class Store:
    """An engine plus the broker's side: the id counter and the queue in publish order."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.next_id = 1
        self.queue: collections.deque[Entry] = collections.deque()

    def batch(self, n: int) -> list[Msg]:
        msgs = make_msgs(self.next_id, n)
        self.next_id += n
        return msgs

    def timed_commit(self, work: Callable[[Engine], None]) -> float:
        eng = self.engine
        t0 = time.perf_counter()
        eng.begin()
        work(eng)
        eng.commit()
        return time.perf_counter() - t0

    def fill(self, n: int, batch: int, groups: Sequence[int] = (1,)) -> float:
        elapsed = 0.0
        while n > 0:
            msgs = self.batch(min(batch, n))
            elapsed += self.timed_commit(lambda e, m=msgs: e.publish(m, groups))
            self.queue.extend((m[0], m[3]) for m in msgs)
            n -= len(msgs)
        return elapsed

    def take(self, n: int) -> list[Entry]:
        return [self.queue.popleft() for _ in range(min(n, len(self.queue)))]


class Bench:
    def __init__(self, root: Path, cfg: Config) -> None:
        self.root = root
        self.cfg = cfg
        self.serial = 0

    def fresh(self, cls: type[Engine], *, fsync: bool) -> Store:
        self.serial += 1
        return Store(cls(self.root / f"{cls.name}-{self.serial}", fsync=fsync))

    def discard(self, store: Store) -> None:
        store.engine.close()
        shutil.rmtree(store.engine.path, ignore_errors=True)

    def group_commit(self, cls: type[Engine], *, fsync: bool, batch: int) -> list[float]:
        """One run of publishes, `batch` per commit, on a fresh store: each commit's time."""
        cfg = self.cfg
        store = self.fresh(cls, fsync=fsync)
        try:
            store.fill(cfg.warmup_commits * batch, batch)  # file creation, first pages
            lat: list[float] = []
            deadline = time.perf_counter() + cfg.cell_seconds / cfg.repeats
            while len(lat) < cfg.min_commits or (
                time.perf_counter() < deadline and len(lat) * batch < cfg.cell_max_msgs
            ):
                msgs = store.batch(batch)
                lat.append(store.timed_commit(lambda e, m=msgs: e.publish(m, (1,))))
            return lat
        finally:
            self.discard(store)

    def mixed(self, cls: type[Engine], *, fsync: bool) -> float:
        """Steady state, msgs/s: each commit publishes a batch and acks as many older ones."""
        cfg = self.cfg
        store = self.fresh(cls, fsync=fsync)
        try:
            store.fill(cfg.mixed_depth, 1000)
            elapsed, done = 0.0, 0
            deadline = time.perf_counter() + cfg.mixed_seconds / cfg.repeats
            while done < cfg.mixed_batch * cfg.min_commits or time.perf_counter() < deadline:
                msgs = store.batch(cfg.mixed_batch)
                old = store.take(cfg.mixed_batch)
                freed = [e[0] for e in old]

                def work(
                    e: Engine,
                    msgs: list[Msg] = msgs,
                    old: list[Entry] = old,
                    freed: list[int] = freed,
                ) -> None:
                    e.publish(msgs, (1,))
                    e.ack(1, old, freed)

                elapsed += store.timed_commit(work)
                store.queue.extend((m[0], m[3]) for m in msgs)
                done += len(msgs)
            assert store.engine.count_groups() == {1: cfg.mixed_depth}
            return done / elapsed
        finally:
            self.discard(store)

    def delivery_record(self, cls: type[Engine]) -> float:
        """Seconds per message to record a delivery attempt (an executemany per batch)."""
        cfg = self.cfg
        store = self.fresh(cls, fsync=False)
        try:
            store.fill(cfg.mixed_depth, 1000)
            entries = list(store.queue)
            elapsed, done, attempts = 0.0, 0, 0
            deadline = time.perf_counter() + cfg.mixed_seconds / cfg.repeats
            while done < cfg.mixed_batch * cfg.min_commits or time.perf_counter() < deadline:
                attempts += 1
                at = (done % len(entries)) // cfg.mixed_batch * cfg.mixed_batch
                batch = [(i, p, attempts) for i, p in entries[at : at + cfg.mixed_batch]]
                elapsed += store.timed_commit(lambda e, b=batch: e.set_attempts(1, b))
                done += len(batch)
            return elapsed / done
        finally:
            self.discard(store)

    def two_groups(self, cls: type[Engine]) -> tuple[float, float, float, int]:
        """Body once, an entry in groups 1 and 2; group 1 acks, then group 2 acks (frees).

        (publish msgs/s, s/msg of group 1's ack, s/msg of group 2's ack, bodies left).
        """
        cfg = self.cfg
        store = self.fresh(cls, fsync=False)
        try:
            pub = ack1 = ack2 = 0.0
            done = 0
            deadline = time.perf_counter() + cfg.mixed_seconds / cfg.repeats
            while done < cfg.mixed_batch * cfg.min_commits or time.perf_counter() < deadline:
                msgs = store.batch(cfg.mixed_batch)
                entries = [(m[0], m[3]) for m in msgs]
                ids = [m[0] for m in msgs]
                pub += store.timed_commit(lambda e, m=msgs: e.publish(m, (1, 2)))
                ack1 += store.timed_commit(lambda e, x=entries: e.ack(1, x, []))
                ack2 += store.timed_commit(lambda e, x=entries, f=ids: e.ack(2, x, f))
                done += len(msgs)
            return done / pub, ack1 / done, ack2 / done, store.engine.bodies()
        finally:
            self.discard(store)

    def recovery_and_space(self, cls: type[Engine]) -> dict[str, Any]:
        cfg = self.cfg
        n = cfg.recovery_n
        out: dict[str, Any] = {}
        store = self.fresh(cls, fsync=False)
        path = store.engine.path
        try:
            out["build"] = n / store.fill(n, cfg.build_batch)
            entries = list(store.queue)
            next_id = store.next_id
            store.engine.close()

            def recover() -> tuple[float, ...]:
                gc.collect()
                t0 = time.perf_counter()
                eng = cls(path, fsync=False)
                t1 = time.perf_counter()
                counts = eng.count_groups()
                t2 = time.perf_counter()
                page = eng.first(1, cfg.page_n)
                t3 = time.perf_counter()
                rows = eng.scan()
                t4 = time.perf_counter()
                eng.close()
                assert counts == {1: n} and rows == n, (counts, rows)
                assert [r[:2] for r in page] == expected_page, "paging order"
                return t1 - t0, t2 - t1, t3 - t2, t4 - t3

            expected_page = sorted(entries, key=lambda e: (e[1], e[0]))[: cfg.page_n]
            out["cold_evicted"] = evict_page_cache(path)
            out["cold"] = sum(recover())
            warm = [recover() for _ in range(cfg.repeats)]
            for i, key in enumerate(("open", "count", "first", "scan")):
                out[key] = statistics.median(w[i] for w in warm)

            eng = cls(path, fsync=False)
            store = Store(eng)
            store.next_id = next_id
            store.queue.extend(entries)
            out["index_mem"] = eng.index_bytes_per_msg(n)
            out["queued"] = dir_size(path)

            drain = 0.0
            while store.queue:
                old = store.take(cfg.drain_batch)
                ids = [e[0] for e in old]
                drain += store.timed_commit(lambda e, x=old, f=ids: e.ack(1, x, f))
            out["drain"] = n / drain
            assert eng.bodies() == 0
            out["deleted"] = dir_size(path)

            # Republish a tenth and delete it again: an engine that reuses freed space
            # does not grow; an append-only one grows by the records and the tombstones.
            store.fill(cfg.reuse_n, cfg.build_batch)
            while store.queue:
                old = store.take(cfg.drain_batch)
                ids = [e[0] for e in old]
                store.timed_commit(lambda e, x=old, f=ids: e.ack(1, x, f))
            out["reuse_growth"] = dir_size(path) - out["deleted"]
            out["before_reclaim"] = dir_size(path)

            t0 = time.perf_counter()
            store.engine.reclaim()
            out["reclaim_s"] = time.perf_counter() - t0
            out["reclaimed"] = dir_size(path)
            return out
        finally:
            self.discard(store)


# -- the machine -------------------------------------------------------------------------


def filesystem_of(path: Path) -> tuple[str, str, str]:
    """(mount point, filesystem type, device) holding path, from /proc/mounts."""
    best = ("?", "?", "?")
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    real = str(path.resolve())
    for line in mounts:
        dev, mnt, fstype, *_ = line.split()
        mnt = mnt.replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and (best[0] == "?" or len(mnt) >= len(best[0])):
            best = (mnt, fstype, dev)
    return best


def fsync_latency(root: Path, rounds: int) -> dict[str, tuple[float, float]]:
    """The disk's own price of durability, before any engine adds its own work."""
    out: dict[str, tuple[float, float]] = {}
    path = root / "fsync-probe"
    for label, size, sync in (
        ("append 200 B + fdatasync", 200, os.fdatasync),
        ("append 4 KiB + fsync", 4096, os.fsync),
    ):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        data = b"x" * size
        lat = []
        try:
            for _ in range(rounds):
                t0 = time.perf_counter()
                os.write(fd, data)
                sync(fd)
                lat.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
        out[label] = (pct(lat, 0.5), pct(lat, 0.99))
    path.unlink()
    return out


# -- output ------------------------------------------------------------------------------


def rate(v: float | None) -> str:
    if v is None:
        return "-"
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if v >= limit:
            return f"{v / limit:.3g}{suffix}"
    return f"{v:.0f}"


def dur(seconds: float | None) -> str:
    """Seconds, 3 significant digits, in us, ms or s."""
    if seconds is None:
        return "-"
    for limit, scale, unit in ((1e-3, 1e6, "us"), (1.0, 1e3, "ms")):
        if seconds < limit and round(seconds * scale, 1) < 999.5:
            return f"{seconds * scale:.3g}{unit}"
    return f"{seconds:.3g}s"


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f}M"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    body = [list(r) for r in rows]
    cells = [r for r in body if len(r) > 1]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    for r in body:
        out.append(r[0] if len(r) == 1 else line(r))  # a lone cell is a section title
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under 30 s")
    parser.add_argument(
        "--dir", type=Path, default=REPO_ROOT / "build", help="parent of the temporary directory"
    )
    parser.add_argument("--only", help="comma-separated engine names (default: all)")
    parser.add_argument("--recovery-n", type=int, help="messages queued for recovery/space")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.recovery_n:
        cfg = Config(**{**cfg.__dict__, "recovery_n": args.recovery_n})

    wanted = set(args.only.split(",")) if args.only else None
    engines: list[type[Engine]] = []
    skipped: list[str] = []
    for cls in ENGINES:
        if wanted is not None and cls.name not in wanted:
            continue
        if cls.requires and optional_module(cls.requires) is None:
            skipped.append(
                f"{cls.name} (module {cls.requires!r} not installed in {sys.executable})"
            )
            continue
        engines.append(cls)

    args.dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="store-engines-", dir=args.dir))
    started = time.perf_counter()
    try:
        mnt, fstype, dev = filesystem_of(root)
        tmp_mnt, tmp_type, _ = filesystem_of(Path(tempfile.gettempdir()))
        versions = [f"python {platform.python_version()}", f"sqlite3 {sqlite3.sqlite_version}"]
        if apsw is not None:
            versions.append(f"apsw {apsw.apswversion()} (SQLite {apsw.sqlite_lib_version()})")
        if lmdb is not None:
            versions.append(
                f"py-lmdb {lmdb.__version__} (LMDB {'.'.join(map(str, lmdb.version()))})"
            )
        print(f"store engines: {'quick' if cfg.quick else 'full'} run, {os.cpu_count()} CPUs")
        print("  " + ", ".join(versions))
        print(f"  files in {root} on {fstype} ({dev} at {mnt});", end=" ")
        print(f"{tempfile.gettempdir()} is {tmp_type} at {tmp_mnt}")
        if fstype in ("tmpfs", "ramfs"):
            print("  WARNING: a memory filesystem: fsync costs nothing there; use --dir")
        for label, (p50, p99) in fsync_latency(root, 100 if cfg.quick else 300).items():
            print(f"  disk: {label}: p50 {dur(p50)}, p99 {dur(p99)}")
        for s in skipped:
            print(f"  skipped: {s}")
        print(flush=True)

        bench = Bench(root, cfg)
        names = [cls.name for cls in engines]
        results: dict[str, dict[str, str]] = {cls.name: {} for cls in engines}
        order: list[str] = []

        def put(row: str, name: str, value: str) -> None:
            if row not in order:
                order.append(row)
            results[name][row] = value

        def rounds(run: Callable[[type[Engine]], T]) -> dict[str, list[T]]:
            # Round-robin, not engine after engine: this machine is shared, and a burst of
            # load from elsewhere then lands on one run of several engines instead of on
            # every run of one engine.
            out: dict[str, list[T]] = {cls.name: [] for cls in engines}
            for _ in range(cfg.repeats):
                for cls in engines:
                    out[cls.name].append(run(cls))
            return out

        def progress(section: str, since: float) -> None:
            print(f"  {section}: {time.perf_counter() - since:.1f} s", flush=True)

        t0 = time.perf_counter()
        for name in names:
            put("group commit, 1 group, 200 B bodies", name, "")
        for fsync in (False, True):
            mode = "fsync" if fsync else "no fsync"
            for batch in cfg.batches:
                runs = rounds(
                    lambda cls, f=fsync, b=batch: bench.group_commit(cls, fsync=f, batch=b),
                )
                for name, lats in runs.items():
                    # msgs/s of the median run; latency percentiles over every commit.
                    mps = statistics.median(len(lat) * batch / sum(lat) for lat in lats)
                    pooled = [x for lat in lats for x in lat]
                    p50, p99 = pct(pooled, 0.50), pct(pooled, 0.99)
                    put(f"  {mode}, {batch}/commit: msgs/s", name, rate(mps))
                    put(f"  {mode}, {batch}/commit: commit p50/p99", name, f"{dur(p50)}/{dur(p99)}")
        progress("group commit", t0)

        t0 = time.perf_counter()
        for name in names:
            put("steady state (publish + ack)", name, "")
        for fsync in (False, True):
            mode = "fsync" if fsync else "no fsync"
            mixed = rounds(lambda cls, f=fsync: bench.mixed(cls, fsync=f))
            for name, values in mixed.items():
                row = f"  {mode}, {cfg.mixed_batch}+{cfg.mixed_batch}/commit: msgs/s"
                put(row, name, rate(statistics.median(values)))
        delivery = rounds(bench.delivery_record)
        for name, values in delivery.items():
            row = f"  attempts update, {cfg.mixed_batch}/commit: per msg"
            put(row, name, dur(statistics.median(values)))
        two = rounds(bench.two_groups)
        for name, runs2 in two.items():
            pub, ack1, ack2 = (statistics.median(r[i] for r in runs2) for i in range(3))
            put("two groups (body once, no fsync)", name, "")
            put(f"  publish, {cfg.mixed_batch}/commit: msgs/s", name, rate(pub))
            put("  ack per msg: group 1 / group 2 (frees)", name, f"{dur(ack1)}/{dur(ack2)}")
            put("  bodies left after both acks", name, str(max(r[3] for r in runs2)))
        progress("steady state, attempts, two groups", t0)

        for cls in engines:
            t0 = time.perf_counter()
            name = cls.name
            r = bench.recovery_and_space(cls)
            n = cfg.recovery_n
            put(f"recovery, {n:,} queued", name, "")
            put(f"  build, {cfg.build_batch}/commit no fsync: msgs/s", name, rate(r["build"]))
            cold = "cold" if r["cold_evicted"] else "cold?"
            put(f"  {cold}: open+count+first {cfg.page_n:,}+scan", name, dur(r["cold"]))
            put("  open", name, dur(r["open"]))
            put("  (a) count per group", name, dur(r["count"]))
            put(f"  (b) first {cfg.page_n:,} in (priority, id) + bodies", name, dur(r["first"]))
            put("  (c) full scan: id, priority, attempts", name, dur(r["scan"]))
            mem = r["index_mem"]
            put("  heap index per queued msg", name, "on disk" if mem is None else f"{mem:.0f} B")
            put(f"space, {n:,} queued", name, "")
            put("  file size, queued", name, mib(r["queued"]))
            put(f"  drain by acks, {cfg.drain_batch}/commit: msgs/s", name, rate(r["drain"]))
            put("  file size, all deleted", name, mib(r["deleted"]))
            put(f"  growth on republish+delete {cfg.reuse_n:,}", name, mib(r["reuse_growth"]))
            put("  reclaim time", name, dur(r["reclaim_s"]))
            put("  file size after reclaim", name, mib(r["reclaimed"]))
            progress(f"recovery and space, {name}", t0)

        rows = []
        for row in order:
            cells = [results[nm].get(row, "-") for nm in names]
            rows.append([row] if not any(cells) else [row, *cells])
        print()
        print(table(["workload", *names], rows))
        print()
        print("no fsync: sqlite synchronous=NORMAL (WAL checkpoints still fsync: see the p99),")
        print("  lmdb sync=False, log write only. fsync: sqlite synchronous=FULL, lmdb sync and")
        print("  metasync (two syncs a commit), log one fdatasync a commit.")
        print("noise: sqlite and sqlite-notrig do the same work in the publish-only rows (group")
        print("  commit, build); their difference there is this run's noise.")
        print("reclaim: sqlite/apsw: PRAGMA incremental_vacuum + wal_checkpoint(TRUNCATE), online")
        print("  (needs auto_vacuum=INCREMENTAL from creation); lmdb: none in place, freed pages")
        print("  are reused, shrinking needs a compacting copy (env.copy(compact=True)) swapped in")
        print("  while closed; log: unlink the oldest segments with no live message, online.")
        print("heap index: the log's in-memory index after replay (dict tables and int objects,")
        print("  sys.getsizeof); SQLite and LMDB page from disk and need none. The log's open is")
        print("  its replay of every segment, so its (c) only walks memory.")
        print(f"total {time.perf_counter() - started:.0f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
