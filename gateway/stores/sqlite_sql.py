"""The durable store's index: its tables and the worker thread's side, applying the log's
records (the runs' side of it is sqlite_runs.py, the log segments' sqlite_segments.py;
reading back is sqlite_read.py; the records themselves are made in sqlite_records.py).
Nothing here runs on the event loop.

Tables (docs/storage.md, "The index"):
* `batches`: one row per publish: where its bodies are, end to end (`ends`: where each
  one ends, uint32 native order), and the fields its messages share (timestamp, ttr,
  origin, reply_to, headers; `stamps` and `origins` hold one per message where they
  differ); `refs` counts the messages of it still queued in a group. A batch with holes
  (the ids of other publishes between its own) reads a range of the log that holds
  others' bodies too: `own` is its own bodies' bytes (NULL: `size`).
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
they are, and its batches keep their bodies. Format 3 had no `origins` and no `own`: its
batches are each one origin's, without holes (`MIGRATE_3`).
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from itertools import accumulate, pairwise
from operator import itemgetter
from typing import Any

from crc32c import crc32c

from gateway.stores import sqlite_runs as runs
from gateway.stores.sqlite_records import Op  # a record of the log: its kinds, fields
from gateway.stores.sqlite_runs import READY

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
    seg INTEGER, off INTEGER, size INTEGER, crc INTEGER, starts BLOB, origins TEXT,
    own INTEGER);
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

MIGRATE_3 = """
BEGIN;
ALTER TABLE batches ADD COLUMN origins TEXT;
ALTER TABLE batches ADD COLUMN own INTEGER;
COMMIT;
"""

VERSION = 4  # PRAGMA user_version of this format
RAISE_CEILING = (
    "INSERT INTO meta VALUES ('id_ceiling', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"
)
_INSERT_BATCH = (
    "INSERT INTO batches (id, last, ts, ttr, origin, reply_to, headers, header_block, bodies,"
    " ends, refs, stamps, seg, off, size, crc, starts, origins, own)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_SPAN = 1 << 20  # a publish's bodies this far after the first ones' start another batch
_HOLES = 64  # at most so many ids of other publishes between two that join

_Update = tuple[Any, ...]  # the "U" tuple

# meta: the log position the index holds up to, and the one the log was fsynced to then
LOG_KEYS = ("log_segment", "log_offset", "synced_segment", "synced_offset")
GET_LOG_POSITION = (
    "SELECT key, value FROM meta WHERE key IN"
    " ('log_segment', 'log_offset', 'synced_segment', 'synced_offset')"
)
SET_META = "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


def apply(db: sqlite3.Connection, ops: list[Op], fence: tuple[int, int]) -> int:
    """Apply records in order. The runs of puts, changes and finishes between two
    structural changes are applied together: puts, then changes, then finishes, which is
    the order every message goes through them. A message put and finished within such a
    run (published and finished before the index caught up) is never written, nor are its
    changes. Returns the change in the number of messages queued in the index. Only
    publishes before `fence` join into batches (`_coalesced`)."""
    delta = 0
    start = 0
    for k, op in enumerate(ops):
        if op[0] not in _RUN_KINDS:
            if k > start:
                delta += _segment(db, ops[start:k], fence)
            delta += _structural(db, op)
            start = k + 1
    if start < len(ops):
        delta += _segment(db, ops[start:] if start else ops, fence)
    return delta


_RUN_KINDS = frozenset(("P", "U", "D", "E", "A", "AR"))


def _segment(db: sqlite3.Connection, ops: list[Op], fence: tuple[int, int]) -> int:
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
    # in a queue drained as it is read, that is nearly every delivery. The others are
    # applied per run of ids (runs.deliver), unless the same run of records changes their
    # group's messages otherwise (a publish into it, a change): then per message, in order
    done: dict[int, runs.Spans] = {}

    def finished(gid: int) -> runs.Spans | None:
        f = fins.get(gid)
        if not f:
            return None
        spans = done.get(gid)
        if spans is None:
            spans = done[gid] = runs.Spans(f)
        return spans

    ranged: dict[int, list[tuple[int, int, int, int]]] = {}
    mixed = {gid for op in ops if op[0] == "P" for gid in op[1]}
    mixed.update(op[1][4] for op in ops if op[0] == "U")
    for op in ops:
        kind = op[0]
        if kind == "P":
            puts.append(op)
        elif kind == "U":
            updates.append(op[1])
        elif kind == "AR":
            gid, flat = op[1], op[2]
            spans = finished(gid)
            if gid in mixed:
                updates += _deliveries(gid, flat, spans)
                continue
            ranges = ranged.setdefault(gid, [])
            for k in range(0, len(flat), 4):
                p, first, last, a = flat[k : k + 4]
                gaps = spans.gaps(first, last) if spans else [(first, last)]
                ranges += [(p, lo, hi, a) for lo, hi in gaps]
        elif kind == "A":  # a log written before runs
            gid = op[1]
            spans = finished(gid)
            rows = op[2] if spans is None else [r for r in op[2] if r[1] not in spans]
            updates += [(p, a, 0.0, READY, gid, p, i) for p, i, a in rows]
    for gid, ranges in list(ranged.items()):
        ranges.sort(key=_FIRST)
        if any(b[1] <= a[2] for a, b in pairwise(ranges)):
            # a message delivered twice in one run of records: per message, in order
            del ranged[gid]
            for op in ops:
                if op[0] == "AR" and op[1] == gid:
                    updates += _deliveries(gid, op[2], done.get(gid))
    if ranged:
        runs.deliver(db, ranged)  # no publish, change or finish here touches these
    return _run(db, puts, updates, fins, done, fence)


def _deliveries(gid: int, flat: list[int], spans: runs.Spans | None) -> list[_Update]:
    """A delivery record's runs as one change per message, those finished in the same run
    of records (`spans`) left out."""
    out: list[_Update] = []
    for k in range(0, len(flat), 4):
        p, first, last, a = flat[k : k + 4]
        ids = spans.outside(first, last) if spans else range(first, last + 1)
        out += [(p, a, 0.0, READY, gid, p, i) for i in ids]
    return out


_FIRST = itemgetter(1)


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
    done: dict[int, runs.Spans],
    fence: tuple[int, int],
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
                ids = done[gid] = runs.Spans(fins[gid])
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
        written = _put(db, puts, changed, gone, fence)
        latest = {(gid, i): u for gid, g in changed.items() for i, u in g.items.items()}
        for gid, g in gone.items():
            f = fins.setdefault(gid, [])
            for i, p in g.items.items():
                f += (p, i, i)
    if latest:
        runs.change(db, latest.values())
    removed = runs.finish(db, fins) if fins else 0
    return written - removed


def _put(
    db: sqlite3.Connection,
    puts: list[Op],
    changed: dict[int, _ByGroup],
    done: dict[int, _ByGroup],
    fence: tuple[int, int],
) -> int:
    """Write the publishes; those of their messages finished or changed in the same run
    are taken out of `done` and `changed` (never written; a change is a run of one).
    Returns how many messages were written."""
    if done:
        puts = _unfinished(puts, changed, done)
    batch_rows = []
    run_rows = []
    written = 0
    for (
        _,
        gids,
        first,
        n,
        due,
        priority,
        attempts,
        fields,
        batch,
        stamps,
        origins,
        holes,
    ) in _coalesced(puts, fence):
        end = first + n
        refs = 0
        for gid in gids:
            bits = holes  # the ids of other publishes between this one's: not its own
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
            refs += runs.pieces(run, bits, cuts, run_rows, counts)
        written += refs
        if refs:
            ts, ttr, origin, reply_to, headers, block, bodies, ends = batch
            own = None  # its bodies' bytes, where its range in the log holds others' too
            if type(bodies) is tuple:  # in the log: where, not a copy
                seg, off, view, starts, size = bodies
                bodies = b""
                crc = crc32c(view)
                if holes:
                    own = view.nbytes
                if ends is None:
                    ends = array("I", (view.nbytes,)).tobytes()
            else:  # a log written before format 3: the bodies, held here
                seg = off = crc = starts = None
                size = len(bodies)
                if ends is None:
                    ends = array("I", (size,)).tobytes()
            batch_rows.append(
                (first, end - 1, ts, ttr, origin, reply_to, headers, block, bodies, ends, refs,
                 stamps, seg, off, size, crc, starts, origins, own)
            )  # fmt: skip
    if batch_rows:
        db.executemany(_INSERT_BATCH, batch_rows)
    if run_rows:
        db.executemany(runs.INSERT, run_rows)
    return written


def _unfinished(
    puts: list[Op], changed: dict[int, _ByGroup], done: dict[int, _ByGroup]
) -> list[Op]:
    """The publishes with a message not finished in the same run. Those finished in every
    group (a queue drained as it fills: nearly all) are never written: their finishes and
    changes are taken out of `done` and `changed` here, before any joining or cutting."""
    kept: list[Op] = []
    for op in puts:
        gids, first, n = op[1], op[2], op[3]
        for gid in gids:
            d = done.get(gid)
            if d is None:
                break
            items = d.items
            if n == 1:
                if first not in items:
                    break
            elif any(i not in items for i in range(first, first + n)):
                break
        else:
            for gid in gids:
                items = done[gid].items
                c = changed.get(gid)
                for i in range(first, first + n):
                    del items[i]
                    if c is not None:
                        c.items.pop(i, None)
            continue
        kept.append(op)
    return kept


def _coalesced(puts: list[Op], fence: tuple[int, int]) -> list[Op]:
    """The publishes of one message each into the same groups with every field alike but
    the timestamp and the origin (a producer's PUBs one at a time, several producers'
    into one topic, greenstalk clients' puts into their tubes) joined into one: one batch
    row and one run per group instead of one of each per message. Their ids need not be
    consecutive: several producers into several topics interleave, and a run marks the
    ids between them as not its own (`holes`, as a run marks what was finished), up to
    _HOLES of them between two. Each comes back with its batch's timestamps (int64 each,
    or None when one is everyone's), its origins (a JSON list, or None when one is
    everyone's) and its holes (a bitmap of places, 0: none).

    Only publishes whose bodies are before `fence` join: the log's fsynced position, under
    a policy that promises what survives a power cut. After one, recovery drops a batch
    with bodies past the fsynced position it finds noted that are gone (sqlite_segments.
    drop_lost), and that position moves on after the batch is made: a batch of bodies all
    fsynced when it was made never holds one that a power cut can take, so none takes an
    acknowledged message with it."""
    out: list[Op] = []
    chains: dict[tuple[Any, ...], list[Op]] = {}  # open, by what their publishes share
    holding: dict[int, tuple[Any, ...]] = {}  # a group -> the open chain into it

    def close(key: tuple[Any, ...]) -> None:
        chain = chains.pop(key)
        for gid in chain[0][1]:
            holding.pop(gid, None)
        out.append(_joined(chain))

    for op in puts:
        batch = op[8]
        where = batch[6]
        # bodies in the log join only before the fence; bodies held here (a log written
        # before bodies stayed in it) always do
        single = op[3] == 1 and op[7] is None and (type(where) is not tuple or where[:2] < fence)
        if single:
            # groups, due, priority, attempts, ttr, reply-to, headers, header block (flat:
            # one tuple to build and hash per publish)
            key = (op[1], op[4], op[5], op[6], batch[1], batch[3], batch[4], batch[5])
            chain = chains.get(key)
            if chain is not None:
                last = chain[-1]
                if last[2] < op[2] <= last[2] + 1 + _HOLES and _joins(
                    chain[0][8][6], last[8][6], where
                ):
                    chain.append(op)
                    continue
        # an open chain into one of its groups ends first: a group's runs never overlap
        for gid in op[1]:
            k = holding.get(gid)
            if k is not None:
                close(k)
        if single:
            chains[key] = [op]
            for gid in op[1]:
                holding[gid] = key
        elif len(batch) > 8:  # publishes joined as they were recorded: stamps, origins
            out.append((*op[:8], batch[:8], *batch[8:], 0))
        else:
            out.append((*op, None, None, 0))
    for key in list(chains):
        close(key)
    return out


def _joined(chain: list[Op]) -> Op:
    """One publish of the chain's messages, with a place for every id from its first to
    its last: the ids of other publishes between them hold an empty body and are the
    batch's holes. Work per publish of the chain, and per place only to fill the holes
    in (several tubes in turn: most places are holes)."""
    head = chain[0]
    own = len(chain)
    if own == 1:
        return (*head, None, None, 0)
    first_id = head[2]
    n = chain[-1][2] - first_id + 1
    ts, ttr, origin, reply_to, headers, block, first = head[8][:7]
    places = None  # where each publish goes among the places, if there are holes
    holes = 0
    if own != n:
        places = [op[2] - first_id for op in chain]
        mask = 0
        for k in places:
            mask |= 1 << k
        holes = ((1 << n) - 1) ^ mask
    wheres = [op[8][6] for op in chain]
    if type(first) is tuple:  # in one segment: one range, read at once
        base = first[1]
        views = [w[2] for w in wheres]
        sizes = [v.nbytes for v in views]
        offsets = [w[1] - base for w in wheres]
        if places is None:
            at, lengths = offsets, sizes
        else:
            lengths = _spread(places, sizes, n, 0)
            at = [0] * n
            # a hole: an empty body where the publish before it ends
            for k, nxt, size, offset in zip(places, [*places[1:], n], sizes, offsets, strict=True):
                at[k] = offset
                if nxt > k + 1:
                    at[k + 1 : nxt] = [offset + size] * (nxt - k - 1)
        ends = array("I", accumulate(lengths)).tobytes()
        last = wheres[-1]
        span = last[1] + last[4] - base
        starts = array("I", at).tobytes() if holes or span != sum(sizes) else None
        joined = memoryview(b"".join(views))
        bodies: Any = (first[0], base, joined, starts, span)
    else:
        raw = wheres if places is None else _spread(places, wheres, n, b"")
        ends = array("I", accumulate(map(len, raw))).tobytes()
        bodies = b"".join(raw)
    times = [op[8][0] for op in chain]
    stamps = None
    if times.count(ts) != own:
        stamps = array("q", times if places is None else _spread(places, times, n, ts)).tobytes()
    froms = [op[8][2] for op in chain]
    origins = None
    if froms.count(origin) != own:
        origins = json.dumps(froms if places is None else _spread(places, froms, n, origin))
    batch = (ts, ttr, origin, reply_to, headers, block, bodies, ends)
    return (*head[:3], n, *head[4:8], batch, stamps, origins, holes)


def _spread(places: list[int], values: list[Any], n: int, hole: Any) -> list[Any]:
    """`values` at their `places` among n, `hole` at every other place."""
    out = [hole] * n
    for k, v in zip(places, values, strict=True):
        out[k] = v
    return out


def _joins(head: Any, last: Any, where: Any) -> bool:
    """Whether a publish's bodies (`where`) can join a chain whose first and last bodies
    are `head` and `last`: all held here, or all in one segment of the log, after the last
    (other frames' bytes may be between them: a batch notes where each body starts) and
    near enough the first to read at once. A chain's bodies are in log order, so after
    the last is after the first, and near the first is near the last: one test each."""
    if type(where) is tuple:
        return type(head) is tuple and where[0] == head[0] and last[1] < where[1] < head[1] + _SPAN
    return type(head) is not tuple


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
        return added - runs.drop_runs(db, "grp = ?", (backlog,))
    elif kind == "G-":
        gone = runs.drop_runs(db, "grp = ?", (op[1],))
        db.execute("DELETE FROM groups WHERE id = ?", (op[1],))
        return -gone
    elif kind == "T-":
        tid = op[1]
        gone = runs.drop_runs(db, "grp IN (SELECT id FROM groups WHERE topic = ?)", (tid,))
        db.execute("DELETE FROM groups WHERE topic = ?", (tid,))
        db.execute("DELETE FROM topics WHERE id = ?", (tid,))
        return -gone
    elif kind == "C":
        return -runs.drop_runs(db, "grp = ?", (op[1],))
    elif kind == "PT":
        db.execute("UPDATE topics SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "PG":
        db.execute("UPDATE groups SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "R":
        db.execute(RAISE_CEILING, (op[1],))
    else:  # pragma: no cover - a programming error, not input
        raise ValueError(f"unknown store op {kind!r}")
    return 0
