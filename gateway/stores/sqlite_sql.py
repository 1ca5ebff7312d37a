"""The durable store's tables and the worker thread's side: writing a commit, reading
messages back. Nothing here runs on the event loop.

Tables (docs/storage.md, "The on-disk format"):
* `batches`: one row per publish, holding all of its bodies end to end (`ends`: where
  each one ends, uint32 native order) and the fields its messages share (timestamp, ttr,
  origin, reply_to, headers); `refs` counts the entries that still point at it.
* `entries`: one row per (group, message) with the per-group fields, keyed by (group,
  priority, id): the key is the paging order, so no second index has to be kept up to
  date on every publish. A change of priority moves the row (the caller names the
  priority it had).
* Whatever deletes entries drops a batch with its last entry (`_delete`): the deleted
  entries' batches come back from the DELETE itself and their `refs` go down once per
  batch, not once per entry as a trigger would (measured: an acknowledgement's share of
  a commit 5.0 -> 2.6 us; a million entries of a deleted group 2.0 -> 1.4 s).

A publish's entries in a group differ only by id, so they are written by one statement
that generates them (a recursive CTE): one step into SQLite per publish instead of one
per message, which is most of a commit's cost and, since every step releases and retakes
the GIL, most of what the writer thread takes from the event loop.
"""

from __future__ import annotations

import json
import sqlite3
from array import array
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from gateway.model import Message, Publish

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
    bodies BLOB NOT NULL, ends BLOB NOT NULL, refs INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    grp INTEGER NOT NULL, priority INTEGER NOT NULL, id INTEGER NOT NULL,
    batch INTEGER NOT NULL, attempts INTEGER NOT NULL, due REAL NOT NULL,
    state INTEGER NOT NULL,
    PRIMARY KEY (grp, priority, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seq (n INTEGER PRIMARY KEY);
WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i < 4095)
    INSERT OR IGNORE INTO seq SELECT i FROM k;
"""
# Files written by earlier gateways kept `refs` with a trigger per deleted entry; this
# code keeps them itself, and both count the same, so a file moves either way between
# versions. (An earlier gateway makes the trigger again when it opens the file.)
DROP_TRIGGER = "DROP TRIGGER IF EXISTS entries_gone"

VERSION = 1  # PRAGMA user_version of this format
READY, BURIED = 0, 1
RAISE_CEILING = (
    "INSERT INTO meta VALUES ('id_ceiling', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"
)
_SELECT = "SELECT e.id, e.priority, e.attempts, e.due, e.batch FROM entries e WHERE "
_BATCH = (
    "SELECT ts, ttr, origin, reply_to, headers, header_block, bodies, ends"
    " FROM batches WHERE id = ?"
)
# a publish's entries in one group: n rows, ids first .. first + n - 1, numbered by the
# `seq` table (0..4095: a scan of it is cheaper than a recursive CTE) or, for a larger
# publish, by a recursive CTE
_SEQ = 4096
_PUT_RUN = "INSERT INTO entries SELECT ?, ?, ? + n, ?, ?, ?, 0 FROM seq WHERE n < ?"
_PUT_LONG_RUN = (
    "WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i < ? - 1)"
    " INSERT INTO entries SELECT ?, ?, ? + i, ?, ?, ?, 0 FROM k"
)

# An op is a record of the log (gateway/stores/log.py): plain data, made on the event loop.
# ("P", gids, first_id, n, due, priority, attempts, fields, batch): one publish of n
# messages with consecutive ids into groups `gids`; `fields` is None when every message has
# (priority, attempts), else one (priority, attempts) per message; `batch` is the batch
# row's (ts, ttr, origin, reply_to, headers JSON, header_block, bodies end to end, ends or
# None for one message). ("U", (priority, attempts, due, state, gid, priority_was, id)),
# ("D", gid, [(priority, id)]), ("A", gid, [(priority, id, attempts)]): deliveries, which
# change attempts only, or a structural one (see `_structural`).
Op = tuple[Any, ...]
_Put = tuple[Any, ...]

LOG_KEYS = ("log_segment", "log_offset")  # meta: the log position the index holds up to
GET_LOG_POSITION = "SELECT key, value FROM meta WHERE key IN ('log_segment', 'log_offset')"
SET_META = "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


def put_record(gids: tuple[int, ...], messages: Sequence[Message], due: float) -> Op:
    """The log record of one publish (event loop side: a join of the bodies and a few
    fields; a publish's messages share all but their bodies and ids)."""
    first = messages[0]
    n = len(messages)
    if isinstance(messages, Publish):
        fields = None
        raw = messages.bodies
    else:
        fields = [(m.priority, m.attempts) for m in messages]
        if fields.count(fields[0]) == n:
            fields = None
        raw = [m.body for m in messages]
    if n == 1:
        bodies = first.body if type(first.body) is bytes else bytes(first.body)
        ends = None
    else:
        bodies = b"".join(raw)
        ends = array("I", accumulate(map(len, raw))).tobytes()
    headers = json.dumps(first.headers) if first.headers else None
    block = first.header_block
    if block is not None and type(block) is not bytes:
        block = bytes(block)
    batch = (
        first.timestamp, first.ttr, first.origin, first.reply_to, headers, block, bodies, ends
    )  # fmt: skip
    return ("P", gids, first.id, n, due, first.priority, first.attempts, fields, batch)


def select(db: sqlite3.Connection, topic: str, where: str, args: tuple[Any, ...]) -> list[Message]:
    """The messages of the entries `where` selects, with their bodies cut out of their
    batches (each batch read once)."""
    batches: dict[int, tuple[Any, ...]] = {}
    out = []
    for mid, priority, attempts, due, batch in db.execute(_SELECT + where, args).fetchall():
        b = batches.get(batch)
        if b is None:
            row = db.execute(_BATCH, (batch,)).fetchone()
            ends = array("I")
            ends.frombytes(row[7])
            headers = [tuple(h) for h in json.loads(row[4])] if row[4] else None
            b = batches[batch] = (*row[:4], headers, row[5], row[6], ends)
        ts, ttr, origin, reply_to, headers, block, bodies, ends = b
        k = mid - batch
        body = bytes(bodies[ends[k - 1] if k else 0 : ends[k]])
        msg = Message(mid, topic, body, ts, headers, attempts, priority, due, ttr, reply_to, origin)
        msg.header_block = block
        out.append(msg)
    return out


def apply(db: sqlite3.Connection, ops: list[Op]) -> int:
    """Write a commit's ops in order. Runs of puts, updates and deletes between two
    structural changes go in one executemany each: puts, then updates, then deletes, which
    is the order every message goes through them. An entry put and deleted within the run
    (published and finished between two commits) is never written at all. Returns the
    change in the number of entries on disk."""
    delta = 0
    puts: list[_Put] = []
    updates: list[tuple[Any, ...]] = []
    deletes: list[tuple[int, int, int]] = []
    for op in ops:
        kind = op[0]
        if kind == "P":
            puts.append(op[1:])  # type: ignore[arg-type]
        elif kind == "U":
            updates.append(op[1])
        elif kind == "D":
            gid = op[1]
            deletes.extend([(gid, p, i) for p, i in op[2]])
        elif kind == "A":
            gid = op[1]
            updates.extend([(p, a, 0.0, READY, gid, p, i) for p, i, a in op[2]])
        else:
            if puts or updates or deletes:
                delta += _run(db, puts, updates, deletes)
                puts, updates, deletes = [], [], []
            delta += _structural(db, op)
    if puts or updates or deletes:
        delta += _run(db, puts, updates, deletes)
    return delta


def _run(
    db: sqlite3.Connection,
    puts: list[_Put],
    updates: list[tuple[Any, ...]],
    deletes: list[tuple[int, int, int]],
) -> int:
    gone = {(gid, i) for gid, _, i in deletes} if puts and deletes else None
    cancelled: set[tuple[int, int]] = set()
    batch_rows = []
    runs = []  # a publish's entries in one group, generated by one statement
    long_runs = []
    entry_rows = []  # entries one by one, where some of a publish's are not written
    written = 0
    for gids, first, n, due, priority, attempts, fields, batch in puts:
        ids = range(first, first + n)
        refs = 0
        for gid in gids:
            if gone is None or not any((gid, i) in gone for i in ids):
                if fields is None and n <= _SEQ:
                    runs.append((gid, priority, first, first, attempts, due, n))
                elif fields is None:
                    long_runs.append((n, gid, priority, first, first, attempts, due))
                else:
                    entry_rows += [
                        (gid, p, i, first, a, due) for i, (p, a) in zip(ids, fields, strict=True)
                    ]
                refs += n
                continue
            each = fields or [(priority, attempts)] * n
            for i, (p, a) in zip(ids, each, strict=True):
                if (gid, i) in gone:
                    cancelled.add((gid, i))  # never written: nothing to delete either
                else:
                    entry_rows.append((gid, p, i, first, a, due))
                    refs += 1
        written += refs
        if refs:
            ts, ttr, origin, reply_to, headers, block, bodies, ends = batch
            if ends is None:
                ends = array("I", (len(bodies),)).tobytes()
            batch_rows.append(
                (
                    first,
                    first + n - 1,
                    ts,
                    ttr,
                    origin,
                    reply_to,
                    headers,
                    block,
                    bodies,
                    ends,
                    refs,
                )
            )
    if batch_rows:
        db.executemany("INSERT INTO batches VALUES (?,?,?,?,?,?,?,?,?,?,?)", batch_rows)
    if runs:
        db.executemany(_PUT_RUN, runs)
    if long_runs:
        db.executemany(_PUT_LONG_RUN, long_runs)
    if entry_rows:
        db.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?,0)", entry_rows)
    if cancelled:
        # a delivery of a message put and finished in this same commit: nothing to update
        updates = [u for u in updates if (u[4], u[6]) not in cancelled]
        deletes = [d for d in deletes if (d[0], d[2]) not in cancelled]
    if len(updates) > 1:
        # one update per entry: the last one's fields, found where the first one looked
        latest: dict[tuple[int, int], tuple[Any, ...]] = {}
        for u in updates:
            key = (u[4], u[6])
            prev = latest.get(key)
            latest[key] = u if prev is None else (*u[:5], prev[5], u[6])
        updates = list(latest.values())
    if updates and deletes:
        # delivered and finished within one commit: the delete is all that is left to do
        # (unless the update moved the row to another priority, where the delete looks)
        finished = {(gid, i) for gid, _, i in deletes}
        updates = [u for u in updates if u[0] != u[5] or (u[4], u[6]) not in finished]
    if updates:
        # one statement per run of equal changes (a burst of first deliveries is one): a
        # step into SQLite per statement, not per message
        same: dict[tuple[Any, ...], list[int]] = {}
        for u in updates:
            same.setdefault(u[:6], []).append(u[6])
        db.executemany(
            "UPDATE entries SET priority=?, attempts=?, due=?, state=?"
            " WHERE grp=? AND priority=? AND id IN (SELECT value FROM json_each(?))",
            [(*key, json.dumps(ids)) for key, ids in same.items()],
        )
    removed = 0
    if deletes:
        by_key: dict[tuple[int, int], list[int]] = {}
        for gid, priority, i in deletes:
            by_key.setdefault((gid, priority), []).append(i)
        # consumers finish in about the order they were given: runs of consecutive ids
        # go in one statement each
        ranges = []
        for (gid, priority), ids in by_key.items():
            ids.sort()
            start = prev = ids[0]
            for i in ids:
                if i > prev + 1:
                    ranges.append((gid, priority, start, prev))
                    start = i
                prev = i
            ranges.append((gid, priority, start, prev))
        removed = _delete(db, "grp=? AND priority=? AND id BETWEEN ? AND ?", ranges)
    return written - removed


def _delete(db: sqlite3.Connection, where: str, params: list[tuple[Any, ...]]) -> int:
    """Delete the entries `where` selects, once per row of `params`; returns how many
    went. Each batch's `refs` goes down by its count of them, and a batch none points at
    any more goes (its bodies with it). The counts come from one grouped read before the
    delete: a step into SQLite per batch, not per entry, as a DELETE ... RETURNING takes
    (and each step releases and retakes the GIL)."""
    released: dict[int, int] = {}
    get = released.get
    count = f"SELECT batch, count(*) FROM entries WHERE {where} GROUP BY batch"
    delete = f"DELETE FROM entries WHERE {where}"
    n = 0
    for args in params:
        for batch, k in db.execute(count, args):
            released[batch] = get(batch, 0) + k
            n += k
        db.execute(delete, args)
    if released:
        rows = [(count, batch) for batch, count in released.items()]
        db.executemany("DELETE FROM batches WHERE refs <= ? AND id = ?", rows)
        db.executemany("UPDATE batches SET refs = refs - ? WHERE id = ?", rows)
    return n


def _structural(db: sqlite3.Connection, op: Op) -> int:
    """One change to topics or groups; returns the change in entries on disk."""
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
            # every copy holds its batch; the backlog's own entries let go below
            db.execute(
                "UPDATE batches SET refs = refs + ? * (SELECT count(*) FROM entries e"
                " WHERE e.grp = ? AND e.batch = batches.id)"
                " WHERE id IN (SELECT batch FROM entries WHERE grp = ?)",
                (len(gids), backlog, backlog),
            )
            for gid in gids:
                added += db.execute(
                    "INSERT INTO entries SELECT ?, priority, id, batch, attempts, due, state"
                    " FROM entries WHERE grp = ?",
                    (gid, backlog),
                ).rowcount
        return added - _delete(db, "grp = ?", [(backlog,)])
    elif kind == "G-":
        gone = _delete(db, "grp = ?", [(op[1],)])
        db.execute("DELETE FROM groups WHERE id = ?", (op[1],))
        return -gone
    elif kind == "T-":
        tid = op[1]
        gone = _delete(db, "grp IN (SELECT id FROM groups WHERE topic = ?)", [(tid,)])
        db.execute("DELETE FROM groups WHERE topic = ?", (tid,))
        db.execute("DELETE FROM topics WHERE id = ?", (tid,))
        return -gone
    elif kind == "C":
        return -_delete(db, "grp = ?", [(op[1],)])
    elif kind == "PT":
        db.execute("UPDATE topics SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "PG":
        db.execute("UPDATE groups SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "R":
        db.execute(RAISE_CEILING, (op[1],))
    else:  # pragma: no cover - a programming error, not input
        raise ValueError(f"unknown store op {kind!r}")
    return 0
