"""The durable store's index: its tables and the worker thread's side, applying the log's
records (reading them back is sqlite_read.py). Nothing here runs on the event loop but
`put_record`, which makes a publish's record.

Tables (docs/storage.md, "The index"):
* `batches`: one row per publish: where its bodies are, end to end (`ends`: where each
  one ends, uint32 native order), and the fields its messages share (timestamp, ttr,
  origin, reply_to, headers); `refs` counts the messages of it still queued in a group.
  The bodies stay in the log segment they were written to (`seg`, `off`, `size`, with
  their CRC-32C): the index holds where they are, not a copy. A batch a compaction moved
  out of an old segment, or one from a log written before format 3, holds its bodies
  (`bodies`, `seg` NULL).
* `runs`: a group's messages in runs of consecutive ids that share their per-group fields
  (priority, attempts, due time, state) and their batch: a publish of 100 into a group is
  one row, not 100. Keyed (group, priority, first id): the key is the paging order, and
  the runs of one (group, priority) never overlap. `gone` is a bitmap of the run's
  messages no longer in it (finished, or moved out by a change of their fields), `left`
  how many are; a run goes when `left` reaches 0. A delivery changes a message's attempts
  only, which the run notes beside it (`tries`: offset and attempts, uint32 pairs); any
  other change to one message of a run splits it around that message, which then has a
  run of its own. A run of one notes nothing: its attempts are its own column.
* Whatever removes messages lowers their batches' `refs` by their count, once per batch,
  and drops a batch none is left in.

Format 1 kept one `entries` row per (group, message); opening such a file turns each into
a run of one (`MIGRATE_1`). Format 2 held every batch's bodies; `MIGRATE_2` adds where
they are, and its batches keep their bodies.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from pickle import PickleBuffer
from typing import Any

from crc32c import crc32c

from gateway.model import Message, Publish
from gateway.stores.log import Bodies

# a publish's bodies in the log: segment, offset, the bodies themselves (a view of the
# frame, for their CRC-32C), where each body starts (from offset; None: end to end) and
# the bytes from offset to the end of the last; a batch row holds all but the bodies
Where = tuple[int, int, memoryview, bytes | None, int]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS topics (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, paused INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY, topic INTEGER NOT NULL, name TEXT,
    paused INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY, last INTEGER NOT NULL, ts INTEGER NOT NULL, ttr REAL NOT NULL,
    origin TEXT NOT NULL, reply_to TEXT, headers TEXT, header_block BLOB,
    bodies BLOB NOT NULL, ends BLOB NOT NULL, refs INTEGER NOT NULL, stamps BLOB,
    seg INTEGER, off INTEGER, size INTEGER, crc INTEGER, starts BLOB);
CREATE TABLE IF NOT EXISTS runs (
    grp INTEGER NOT NULL, priority INTEGER NOT NULL, id INTEGER NOT NULL, n INTEGER NOT NULL,
    batch INTEGER NOT NULL, attempts INTEGER NOT NULL, due REAL NOT NULL,
    state INTEGER NOT NULL, gone BLOB, left INTEGER NOT NULL, tries BLOB,
    PRIMARY KEY (grp, priority, id)) WITHOUT ROWID;
"""
MIGRATE_1 = """
BEGIN;
ALTER TABLE batches ADD COLUMN stamps BLOB;
DROP TRIGGER IF EXISTS entries_gone;
INSERT INTO runs SELECT grp, priority, id, 1, batch, attempts, due, state, NULL, 1, NULL
    FROM entries;
DROP TABLE entries;
DROP TABLE IF EXISTS seq;
COMMIT;
"""

# after any conversion: the segments queued bodies are in, oldest first
INDEXES = "CREATE INDEX IF NOT EXISTS batches_seg ON batches (seg) WHERE seg IS NOT NULL;"
MIGRATE_2 = """
BEGIN;
ALTER TABLE batches ADD COLUMN seg INTEGER;
ALTER TABLE batches ADD COLUMN off INTEGER;
ALTER TABLE batches ADD COLUMN size INTEGER;
ALTER TABLE batches ADD COLUMN crc INTEGER;
ALTER TABLE batches ADD COLUMN starts BLOB;
COMMIT;
"""

VERSION = 3  # PRAGMA user_version of this format
READY, BURIED = 0, 1
RAISE_CEILING = (
    "INSERT INTO meta VALUES ('id_ceiling', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"
)
# a run, as the code below reads it
COLS = "id, n, gone, left, batch, attempts, due, state, tries"
_HEAD = (
    f"SELECT {COLS} FROM runs WHERE grp = ? AND priority = ? AND id <= ? ORDER BY id DESC LIMIT 1"
)
_AFTER = (
    f"SELECT {COLS} FROM runs WHERE grp = ? AND priority = ? AND id > ? AND id <= ? ORDER BY id"
)
_INSERT = "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_BATCH = (
    "INSERT INTO batches (id, last, ts, ttr, origin, reply_to, headers, header_block, bodies,"
    " ends, refs, stamps, seg, off, size, crc, starts)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_GAP = 4096  # ids further apart than this are looked up in the index separately
_SPAN = 1 << 20  # a publish's bodies this far after the last ones' start another batch

# An op is a record of the log (gateway/stores/log.py): plain data, made on the event loop.
# ("P", gids, first_id, n, due, priority, attempts, fields, batch): one publish of n
# messages with consecutive ids into groups `gids`; `fields` is None when every message has
# (priority, attempts), else one (priority, attempts) per message; `batch` is the batch
# row's (ts, ttr, origin, reply_to, headers JSON, header_block, bodies end to end, ends or
# None for one message). The bodies are a `pickle.PickleBuffer` (the log writes them after
# the pickle: log.py); `locate` turns them into a `Where` once the frame is written.
# ("U", (priority, attempts, due, state, gid, priority_was, id)); ("E", gid, [priority,
# first, last, ...]): finishes, as runs of ids, flat (logs written before runs have ("D",
# gid, [(priority, id)])); ("A", gid, [(priority, id, attempts)]): deliveries, which
# change attempts only; or a structural one (see `_structural`).
Op = tuple[Any, ...]
_Update = tuple[Any, ...]  # the "U" tuple

# the segments queued bodies are in; the bytes of queued bodies in each segment before one
LIVE_BYTES = "SELECT seg, sum(size) FROM batches WHERE seg IS NOT NULL AND seg < ? GROUP BY seg"
OLDEST_PINNED = "SELECT min(seg) FROM batches WHERE seg IS NOT NULL"  # the partial index
_NEXT_PINNED = "SELECT min(seg) FROM batches WHERE seg > ?"
# meta: the log position the index holds up to, and the one the log was fsynced to then
LOG_KEYS = ("log_segment", "log_offset", "synced_segment", "synced_offset")
GET_LOG_POSITION = (
    "SELECT key, value FROM meta WHERE key IN"
    " ('log_segment', 'log_offset', 'synced_segment', 'synced_offset')"
)
SET_META = "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


def put_record(gids: tuple[int, ...], messages: Sequence[Message], due: float) -> Op:
    """The log record of one publish (event loop side: a join of the bodies and a few
    fields; a publish's messages share all but their bodies and ids)."""
    first = messages[0]
    n = len(messages)
    fields = None
    if n == 1:  # most publishes: one message, its fields the run's
        bodies = first.body if type(first.body) is bytes else bytes(first.body)
        ends = None
    else:
        if isinstance(messages, Publish):
            raw = messages.bodies
        else:
            fields = [(m.priority, m.attempts) for m in messages]
            if fields.count(fields[0]) == n:
                fields = None
            raw = [m.body for m in messages]
        bodies = b"".join(raw)
        ends = array("I", accumulate(map(len, raw))).tobytes()
    bodies = PickleBuffer(bodies)
    headers = json.dumps(first.headers) if first.headers else None
    block = first.header_block
    if block is not None and type(block) is not bytes:
        block = bytes(block)
    batch = (
        first.timestamp, first.ttr, first.origin, first.reply_to, headers, block, bodies, ends
    )  # fmt: skip
    return ("P", gids, first.id, n, due, first.priority, first.attempts, fields, batch)


def tries_of(blob: bytes) -> dict[int, int]:
    pairs = array("I")
    pairs.frombytes(blob)
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def tries_blob(counts: dict[int, int]) -> bytes | None:
    if not counts:
        return None
    pairs = array("I")
    for k in sorted(counts):
        pairs.extend((k, counts[k]))
    return pairs.tobytes()


def locate(ops: list[Op], segment: int, starts: list[int]) -> list[Op]:
    """The records of one frame with each publish's bodies (out-of-band buffers, in the
    order the frame holds them, starting at `starts` of `segment`) replaced by where they
    are (index thread)."""
    if not starts:
        return ops
    out: list[Op] = []
    at = iter(starts)
    for op in ops:
        if op[0] == "P":
            batch = op[8]
            bodies = batch[6]
            if not isinstance(bodies, bytes):  # an out-of-band buffer (or its view)
                view = memoryview(bodies)
                where = (segment, next(at), view, None, view.nbytes)
                op = (*op[:8], (*batch[:6], where, batch[7]))
        out.append(op)
    return out


# -- applying the log's records ---------------------------------------------------


def apply(db: sqlite3.Connection, ops: list[Op]) -> int:
    """Apply records in order. The runs of puts, changes and finishes between two
    structural changes are applied together: puts, then changes, then finishes, which is
    the order every message goes through them. A message put and finished within such a
    run (published and finished before the index caught up) is never written, nor are its
    changes. Returns the change in the number of messages queued in the index."""
    delta = 0
    start = 0
    for k, op in enumerate(ops):
        if op[0] not in _RUN_KINDS:
            if k > start:
                delta += _segment(db, ops[start:k])
            delta += _structural(db, op)
            start = k + 1
    if start < len(ops):
        delta += _segment(db, ops[start:] if start else ops)
    return delta


_RUN_KINDS = frozenset(("P", "U", "D", "E", "A"))


def _segment(db: sqlite3.Connection, ops: list[Op]) -> int:
    """The publishes, changes and finishes between two structural changes."""
    puts: list[Op] = []
    updates: list[_Update] = []
    fins: dict[int, list[int]] = {}  # per group: its finishes as runs, flat (see `Op`)
    for op in ops:
        kind = op[0]
        if kind == "E" or kind == "D":
            gid = op[1]
            f = fins.get(gid)
            if f is None:
                f = fins[gid] = []
            if kind == "E":
                f += op[2]
            else:  # a log written before runs: (priority, id) pairs
                for p, i in op[2]:
                    f += (p, i, i)
    # a delivery of a message finished in the same run changes nothing the index keeps:
    # in a queue drained as it is read, that is nearly every delivery
    done: dict[int, set[int]] = {}
    for op in ops:
        kind = op[0]
        if kind == "P":
            puts.append(op)
        elif kind == "U":
            updates.append(op[1])
        elif kind == "A":
            gid = op[1]
            f = fins.get(gid)
            if f:
                ids = done.get(gid)
                if ids is None:
                    ids = done[gid] = _ids(f)
                updates += [(p, a, 0.0, READY, gid, p, i) for p, i, a in op[2] if i not in ids]
            else:
                updates += [(p, a, 0.0, READY, gid, p, i) for p, i, a in op[2]]
    return _run(db, puts, updates, fins, done)


def _ids(flat: list[int]) -> set[int]:
    """The ids of finishes as runs (flat: priority, first, last, ...)."""
    ids: set[int] = set()
    for k in range(0, len(flat), 3):
        ids.update(range(flat[k + 1], flat[k + 2] + 1))
    return ids


class _ByGroup:
    """Messages (of one group) keyed by id, with their ids sorted for range lookups."""

    __slots__ = ("ids", "items")

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}
        self.ids: list[int] = []

    def take(self, first: int, end: int) -> list[tuple[int, Any]]:
        """Remove and return those with ids in [first, end)."""
        ids = self.ids
        out = []
        for i in ids[bisect_left(ids, first) : bisect_left(ids, end)]:
            item = self.items.pop(i, None)
            if item is not None:
                out.append((i, item))
        return out


def _by_group(items: Iterable[tuple[int, int, Any]]) -> dict[int, _ByGroup]:
    groups: dict[int, _ByGroup] = {}
    for gid, i, item in items:
        g = groups.get(gid)
        if g is None:
            g = groups[gid] = _ByGroup()
        g.items[i] = item
    for g in groups.values():
        g.ids = sorted(g.items)
    return groups


def _run(
    db: sqlite3.Connection,
    puts: list[Op],
    updates: list[_Update],
    fins: dict[int, list[int]],
    done: dict[int, set[int]],
) -> int:
    # one change per message: the last one's fields, and the priority the index has it
    # under (the first one's priority_was)
    latest: dict[tuple[int, int], _Update] = {}
    for u in updates:
        key = (u[4], u[6])
        prev = latest.get(key)
        latest[key] = u if prev is None else (*u[:5], prev[5], u[6])
    if latest and fins:
        # a message changed and finished here is finished where the index has it (under
        # the priority before the change), and the change is never written; where its
        # run says another priority, that finish finds nothing
        for gid, i in [key for key in latest if key[0] in fins]:
            ids = done.get(gid)
            if ids is None:
                ids = done[gid] = _ids(fins[gid])
            if i in ids:
                fins[gid] += (latest.pop((gid, i))[5], i, i)
    written = 0
    if puts:
        # messages published and finished or changed here: never written (or written as
        # changed); finishes are taken one by one within the publishes' ids only
        lo = min([op[2] for op in puts])
        hi = max([op[2] + op[3] for op in puts])
        finished: list[tuple[int, int, int]] = []
        for gid, f in fins.items():
            outside: list[int] = []
            for k in range(0, len(f), 3):
                p, a, b = f[k], f[k + 1], f[k + 2]
                if b < lo or a >= hi:
                    outside += (p, a, b)
                    continue
                finished += [(gid, i, p) for i in range(max(a, lo), min(b, hi - 1) + 1)]
                if a < lo:
                    outside += (p, a, lo - 1)
                if b >= hi:
                    outside += (p, hi, b)
            fins[gid] = outside
        changed = _by_group((gid, i, u) for (gid, i), u in latest.items()) if latest else {}
        gone = _by_group(finished) if finished else {}
        written = _put(db, puts, changed, gone)
        latest = {(gid, i): u for gid, g in changed.items() for i, u in g.items.items()}
        for gid, g in gone.items():
            f = fins.setdefault(gid, [])
            for i, p in g.items.items():
                f += (p, i, i)
    if latest:
        _change(db, latest.values())
    removed = _finish(db, fins) if fins else 0
    return written - removed


def _put(
    db: sqlite3.Connection,
    puts: list[Op],
    changed: dict[int, _ByGroup],
    done: dict[int, _ByGroup],
) -> int:
    """Write the publishes; those of their messages finished or changed in the same run
    are taken out of `done` and `changed` (never written; a change is a run of one).
    Returns how many messages were written."""
    batch_rows = []
    run_rows = []
    written = 0
    for _, gids, first, n, due, priority, attempts, fields, batch, stamps in _coalesced(puts):
        end = first + n
        refs = 0
        for gid in gids:
            bits = 0
            d = done.get(gid)
            if d is not None:
                for i, _p in d.take(first, end):  # finished already: never written
                    bits |= 1 << (i - first)
            cuts = []
            counts: dict[int, int] = {}
            c = changed.get(gid)
            if c is not None:
                for i, u in c.take(first, end):
                    if bits >> (i - first) & 1:
                        continue
                    if fields is None and u[0] == priority and u[2] == due and u[3] == READY:
                        counts[i - first] = u[1]  # a delivery: its attempts, noted in the run
                    else:
                        cuts.append(i)
                        row = (gid, u[0], i, 1, first, u[1], u[2], u[3], None, 1, None)
                        run_rows.append(row)
                        refs += 1
            if fields is not None:  # messages with their own fields: a run each
                for k, (p, a) in enumerate(fields):
                    if not bits >> k & 1 and first + k not in cuts:
                        run_rows.append((gid, p, first + k, 1, first, a, due, READY, None, 1, None))
                        refs += 1
                continue
            run = (gid, priority, first, n, first, attempts, due, READY)
            refs += _pieces(run, bits, cuts, run_rows, counts)
        written += refs
        if refs:
            ts, ttr, origin, reply_to, headers, block, bodies, ends = batch
            if type(bodies) is tuple:  # in the log: where, not a copy
                seg, off, view, starts, size = bodies
                bodies = b""
                crc = crc32c(view)
                if ends is None:
                    ends = array("I", (view.nbytes,)).tobytes()
            else:  # a log written before format 3: the bodies, held here
                seg = off = crc = starts = None
                size = len(bodies)
                if ends is None:
                    ends = array("I", (size,)).tobytes()
            batch_rows.append(
                (first, end - 1, ts, ttr, origin, reply_to, headers, block, bodies, ends, refs,
                 stamps, seg, off, size, crc, starts)
            )  # fmt: skip
    if batch_rows:
        db.executemany(_INSERT_BATCH, batch_rows)
    if run_rows:
        db.executemany(_INSERT, run_rows)
    return written


def _coalesced(puts: list[Op]) -> list[Op]:
    """The publishes, those of one message each that follow one another (ids, groups and
    every field alike but the timestamp: a producer's PUBs one at a time, or several
    producers' into one topic) joined into one: one batch row and one run per group
    instead of one of each per message. Each comes back with its batch's timestamps
    (int64 each, or None when one is everyone's)."""
    out: list[Op] = []
    chain: list[Op] = []

    def close() -> None:
        if len(chain) == 1:
            out.append((*chain[0], None))
        else:
            head = chain[0]
            ts, ttr, origin, reply_to, headers, block, first = head[8][:7]
            raw = [op[8][6] for op in chain]
            if type(first) is tuple:  # in one segment: one range, read at once
                views = [where[2] for where in raw]
                ends = array("I", accumulate(v.nbytes for v in views)).tobytes()
                base = first[1]
                starts = array("I", [where[1] - base for where in raw])
                span = raw[-1][1] + raw[-1][4] - base
                gaps = span != sum(v.nbytes for v in views)
                joined = memoryview(b"".join(views))
                bodies: Any = (first[0], base, joined, starts.tobytes() if gaps else None, span)
            else:
                ends = array("I", accumulate(map(len, raw))).tobytes()
                bodies = b"".join(raw)
            times = [op[8][0] for op in chain]
            stamps = array("q", times).tobytes() if times.count(ts) != len(times) else None
            batch = (ts, ttr, origin, reply_to, headers, block, bodies, ends)
            out.append((*head[:3], len(chain), *head[4:8], batch, stamps))
        chain.clear()

    for op in puts:
        if chain:
            last = chain[-1]
            if (
                op[3] == 1
                and op[2] == last[2] + 1
                and op[1] == last[1]
                and op[4:8] == last[4:8]
                and op[8][1:6] == last[8][1:6]
                and _adjacent(last[8][6], op[8][6])
            ):
                chain.append(op)
                continue
            close()
        if op[3] == 1 and op[7] is None:
            chain.append(op)
        else:
            out.append((*op, None))
    if chain:
        close()
    return out


def compact(db: sqlite3.Connection, log: Bodies, segment: int) -> None:
    """Move the bodies of every batch in `segment` into its row (one transaction)."""
    rows = db.execute(
        "SELECT id, off, size, crc, starts, ends FROM batches WHERE seg = ?", (segment,)
    ).fetchall()
    moved = [(batch_bodies(log, segment, *row[1:]), row[0]) for row in rows]
    db.execute("BEGIN")
    try:
        db.executemany(
            "UPDATE batches SET bodies = ?, seg = NULL, starts = NULL WHERE id = ?", moved
        )
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


def pinned(db: sqlite3.Connection) -> set[int]:
    """The segments queued bodies are in: one index lookup per segment, not a scan."""
    out: set[int] = set()
    seg = db.execute(OLDEST_PINNED).fetchone()[0]
    while seg is not None:
        out.add(seg)
        seg = db.execute(_NEXT_PINNED, (seg,)).fetchone()[0]
    return out


def drop_lost(db: sqlite3.Connection, log: Bodies, synced: tuple[int, int]) -> int:
    """Drop the batches whose bodies are past `synced` (the log was fsynced up to there
    when the index last changed) and are not in the log as written: a power cut took them
    (so they were never acknowledged under "always", and within the last interval under
    an interval policy). Returns how many messages went with them."""
    seg, off = synced
    lost = []
    for row in db.execute(
        "SELECT id, seg, off, size, crc, starts, ends FROM batches"
        " WHERE seg > ? OR (seg = ? AND off + size > ?)",
        (seg, seg, off),
    ).fetchall():
        batch = row[0]
        try:
            batch_bodies(log, *row[1:])
        except OSError:
            lost.append((batch,))
    if not lost:
        return 0
    db.execute("BEGIN")
    gone = sum(
        db.execute("SELECT coalesce(sum(left), 0) FROM runs WHERE batch = ?", b).fetchone()[0]
        for b in lost
    )
    db.executemany("DELETE FROM runs WHERE batch = ?", lost)
    db.executemany("DELETE FROM batches WHERE id = ?", lost)
    db.execute("COMMIT")
    return gone


def batch_bodies(
    log: Bodies, seg: int, off: int, size: int, crc: int, starts: bytes | None, ends: bytes
) -> bytes:
    """A batch's bodies end to end, read from the log (`size` bytes from `off`; `starts`:
    where each starts, when other bytes are between them). OSError if they are not what
    was written."""
    data = log.read(seg, off, size)
    if starts is not None:
        at = array("I")
        at.frombytes(starts)
        stops = array("I")
        stops.frombytes(ends)
        view = memoryview(data)
        data = b"".join(
            [view[a : a + e - b] for a, b, e in zip(at, [0, *stops[:-1]], stops, strict=True)]
        )
    if crc32c(data) != crc:
        raise OSError(f"store log segment {seg}: the bodies at {off} fail their CRC")
    return data


def _adjacent(before: Any, after: Any) -> bool:
    """Whether two publishes' bodies can be one batch's: both held here, or both in one
    segment of the log, the second after the first (other frames' bytes may be between
    them: a batch notes where each body starts), not too far to read at once."""
    if type(before) is tuple:
        return (
            type(after) is tuple
            and after[0] == before[0]
            and before[1] < after[1] < before[1] + _SPAN
        )
    return type(after) is not tuple


def _covering(db: sqlite3.Connection, gid: int, priority: int, ids: list[int]) -> list[list[Any]]:
    """The runs of (group, priority) that hold `ids` (ascending), in id order, as lists
    of their columns (`COLS`), each read once."""
    found: dict[int, list[Any]] = {}
    k = 0
    while k < len(ids):
        lo = ids[k]
        j = k
        while j + 1 < len(ids) and ids[j + 1] - ids[j] <= _GAP:
            j += 1
        head = db.execute(_HEAD, (gid, priority, lo)).fetchone()
        if head is not None and head[0] + head[1] > lo:
            found.setdefault(head[0], list(head))
        for row in db.execute(_AFTER, (gid, priority, lo, ids[j])):
            found.setdefault(row[0], list(row))
        k = j + 1
    return [found[start] for start in sorted(found)]


def _assign(runs: list[list[Any]], ids: list[int]) -> dict[int, list[int]]:
    """Which of `runs` (ascending, disjoint) holds each of `ids` (ascending), by the run's
    first id; an id no run's range holds is left out. One pass over both."""
    out: dict[int, list[int]] = {}
    k = 0
    count = len(runs)
    for i in ids:
        while k < count and runs[k][0] + runs[k][1] <= i:
            k += 1
        if k == count:
            break
        start = runs[k][0]
        if i >= start:
            held = out.get(start)
            if held is None:
                out[start] = [i]
            else:
                held.append(i)
    return out


def _holding(
    db: sqlite3.Connection, gid: int, priority: int, ids: list[int]
) -> Iterator[tuple[list[Any], list[int]]]:
    """Each run of (group, priority) that holds some of `ids`, with those ids (ascending)."""
    ids.sort()
    runs = _covering(db, gid, priority, ids)
    held = _assign(runs, ids)
    for run in runs:
        mine = held.get(run[0])
        if mine:
            yield run, mine


def _spanned(
    db: sqlite3.Connection, gid: int, priority: int, spans: list[tuple[int, int]]
) -> Iterator[tuple[list[Any], int]]:
    """Each run of (group, priority) that holds ids of `spans` (first, last), with the
    mask of those ids in it."""
    spans = _merged(spans)
    found: dict[int, list[Any]] = {}
    k = 0
    while k < len(spans):  # spans close together: one range scan of the index
        lo = spans[k][0]
        j = k
        while j + 1 < len(spans) and spans[j + 1][0] - spans[j][1] <= _GAP:
            j += 1
        head = db.execute(_HEAD, (gid, priority, lo)).fetchone()
        if head is not None and head[0] + head[1] > lo:
            found.setdefault(head[0], list(head))
        for row in db.execute(_AFTER, (gid, priority, lo, spans[j][1])):
            found.setdefault(row[0], list(row))
        k = j + 1
    k = 0
    for start in sorted(found):
        run = found[start]
        end = start + run[1]  # past the run's last id
        while k < len(spans) and spans[k][1] < start:
            k += 1
        mask = 0
        j = k
        while j < len(spans) and spans[j][0] < end:
            a, b = max(spans[j][0], start), min(spans[j][1], end - 1)
            mask |= ((1 << (b - a + 1)) - 1) << (a - start)
            j += 1
        if mask:
            yield run, mask


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` (first, last) sorted, the overlapping and adjacent ones joined."""
    spans.sort()
    out = [spans[0]]
    for a, b in spans[1:]:
        pa, pb = out[-1]
        if a <= pb + 1:
            if b > pb:
                out[-1] = (pa, b)
        else:
            out.append((a, b))
    return out


def _finish(db: sqlite3.Connection, fins: dict[int, list[int]]) -> int:
    """Take finished messages (per group, runs of ids: priority, first, last, flat) out of
    their runs; returns how many were found. A consumer finishes in about the order of
    delivery: a page of finishes is a run or a few, and this works per run, not per id."""
    by_key: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for gid, f in fins.items():
        for k in range(0, len(f), 3):
            by_key.setdefault((gid, f[k]), []).append((f[k + 1], f[k + 2]))
    released: dict[int, int] = {}
    updates = []
    drops = []
    removed = 0
    for (gid, priority), spans in by_key.items():
        for run, mask in _spanned(db, gid, priority, spans):
            start, n, gone, left, batch = run[:5]
            old = int.from_bytes(gone, "little") if gone else 0
            b = mask & ~old  # those still in the run
            k = b.bit_count()
            if not k:
                continue
            removed += k
            released[batch] = released.get(batch, 0) + k
            if left == k:
                drops.append((gid, priority, start))
            else:
                bits = (old | b).to_bytes((n + 7) // 8, "little")
                updates.append((bits, left - k, gid, priority, start))
    if drops:
        db.executemany("DELETE FROM runs WHERE grp = ? AND priority = ? AND id = ?", drops)
    if updates:
        db.executemany(
            "UPDATE runs SET gone = ?, left = ? WHERE grp = ? AND priority = ? AND id = ?",
            updates,
        )
    _release(db, released)
    return removed


def _change(db: sqlite3.Connection, changes: Iterable[_Update]) -> None:
    """Messages whose fields changed: a run of one is changed (or moved, for another
    priority) in place; a longer run is split around each changed message, which gets a
    run of its own."""
    by_key: dict[tuple[int, int], dict[int, _Update]] = {}
    for u in changes:
        by_key.setdefault((u[4], u[5]), {})[u[6]] = u
    drops = []
    inserts: list[tuple[Any, ...]] = []
    in_place = []
    noted = []
    for (gid, was), ups in by_key.items():
        for run, mine in _holding(db, gid, was, list(ups)):
            start, n, gone, _left, batch, attempts, due, state, tries = run
            bits = int.from_bytes(gone, "little") if gone else 0
            out = [i for i in mine if not bits >> (i - start) & 1] if bits else mine
            if not out:
                continue
            if n == 1:  # a run of one: changed where it is, or moved to its new priority
                u = ups[start]
                if u[0] == was:
                    in_place.append((u[1], u[2], u[3], gid, was, start))
                else:
                    drops.append((gid, was, start))
                    inserts.append((gid, u[0], start, 1, batch, u[1], u[2], u[3], None, 1, None))
                continue
            counts = tries_of(tries) if tries else {}
            moving = []
            for i in out:
                u = ups[i]
                if u[0] == was and u[2] == due and u[3] == state:
                    counts[i - start] = u[1]  # attempts only (a delivery): noted in the run
                else:
                    moving.append(i)
                    inserts.append((gid, u[0], i, 1, batch, u[1], u[2], u[3], None, 1, None))
            if not moving:
                noted.append((tries_blob(counts), gid, was, start))
                continue
            drops.append((gid, was, start))
            _pieces(
                (gid, was, start, n, batch, attempts, due, state), bits, moving, inserts, counts
            )
    if in_place:
        db.executemany(
            # a run of one that was cut from a longer one may still carry its noted count
            "UPDATE runs SET attempts = ?, due = ?, state = ?, tries = NULL"
            " WHERE grp = ? AND priority = ? AND id = ?",
            in_place,
        )
    if noted:
        db.executemany("UPDATE runs SET tries = ? WHERE grp = ? AND priority = ? AND id = ?", noted)
    if drops:
        db.executemany("DELETE FROM runs WHERE grp = ? AND priority = ? AND id = ?", drops)
    if inserts:
        db.executemany(_INSERT, inserts)


def _pieces(
    run: tuple[Any, ...],
    bits: int,
    cuts: list[int],
    rows: list[tuple[Any, ...]],
    counts: dict[int, int] | None = None,
) -> int:
    """The rows of a run (its key and fields, `bits` gone, `counts` its noted attempts)
    without the messages `cuts` (ascending), which leave it: the pieces between them,
    appended to `rows`, so that the runs of a (group, priority) never overlap. Returns how
    many messages they hold."""
    gid, priority, start, n, batch, attempts, due, state = run
    held = 0
    piece = start
    for cut in [*cuts, start + n]:
        size = cut - piece
        if size > 0:
            pbits = bits >> (piece - start) & ((1 << size) - 1)
            left = size - pbits.bit_count()
            if left:
                gone = pbits.to_bytes((size + 7) // 8, "little") if pbits else None
                at = piece - start
                tries = None
                count = attempts
                if size == 1:  # a run of one keeps its attempts in its own column
                    count = counts.get(at, attempts) if counts else attempts
                elif counts:
                    tries = tries_blob(
                        {k - at: a for k, a in counts.items() if at <= k < at + size}
                    )
                row = (gid, priority, piece, size, batch, count, due, state, gone, left, tries)
                rows.append(row)
                held += left
        piece = cut + 1
    return held


def _release(db: sqlite3.Connection, released: dict[int, int]) -> None:
    """Each batch's `refs` goes down by its count; a batch none is left in goes."""
    if released:
        rows = [(count, batch) for batch, count in released.items()]
        db.executemany("DELETE FROM batches WHERE refs <= ? AND id = ?", rows)
        db.executemany("UPDATE batches SET refs = refs - ? WHERE id = ?", rows)


def _drop_runs(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> int:
    """Delete the runs `where` selects (whole groups); returns how many messages went."""
    released = dict(
        db.execute(f"SELECT batch, sum(left) FROM runs WHERE {where} GROUP BY batch", args)
    )
    db.execute(f"DELETE FROM runs WHERE {where}", args)
    _release(db, released)
    return sum(released.values())


def _structural(db: sqlite3.Connection, op: Op) -> int:
    """One change to topics or groups; returns the change in messages queued."""
    kind = op[0]
    if kind == "T+":
        _, tid, name, backlog = op
        db.execute("INSERT INTO topics (id, name) VALUES (?, ?)", (tid, name))
        db.execute("INSERT INTO groups (id, topic, name) VALUES (?, ?, NULL)", (backlog, tid))
    elif kind == "G+":
        _, gid, tid, name = op
        db.execute("INSERT INTO groups (id, topic, name) VALUES (?, ?, ?)", (gid, tid, name))
    elif kind == "F":
        _, backlog, gids = op
        added = 0
        if gids:
            # every copy holds its batch; the backlog's own runs let go below
            db.execute(
                "UPDATE batches SET refs = refs + ? * (SELECT sum(left) FROM runs r"
                " WHERE r.grp = ? AND r.batch = batches.id)"
                " WHERE id IN (SELECT batch FROM runs WHERE grp = ?)",
                (len(gids), backlog, backlog),
            )
            for gid in gids:
                db.execute(
                    "INSERT INTO runs SELECT ?, priority, id, n, batch, attempts, due, state,"
                    " gone, left, tries FROM runs WHERE grp = ?",
                    (gid, backlog),
                )
                added += db.execute(
                    "SELECT coalesce(sum(left), 0) FROM runs WHERE grp = ?", (gid,)
                ).fetchone()[0]
        return added - _drop_runs(db, "grp = ?", (backlog,))
    elif kind == "G-":
        gone = _drop_runs(db, "grp = ?", (op[1],))
        db.execute("DELETE FROM groups WHERE id = ?", (op[1],))
        return -gone
    elif kind == "T-":
        tid = op[1]
        gone = _drop_runs(db, "grp IN (SELECT id FROM groups WHERE topic = ?)", (tid,))
        db.execute("DELETE FROM groups WHERE topic = ?", (tid,))
        db.execute("DELETE FROM topics WHERE id = ?", (tid,))
        return -gone
    elif kind == "C":
        return -_drop_runs(db, "grp = ?", (op[1],))
    elif kind == "PT":
        db.execute("UPDATE topics SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "PG":
        db.execute("UPDATE groups SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "R":
        db.execute(RAISE_CEILING, (op[1],))
    else:  # pragma: no cover - a programming error, not input
        raise ValueError(f"unknown store op {kind!r}")
    return 0
