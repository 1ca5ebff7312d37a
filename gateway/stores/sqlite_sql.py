"""The durable store's tables and the worker thread's side: writing a commit, reading
messages back. Nothing here runs on the event loop.

Tables (docs/storage.md, "The on-disk format"):
* `batches`: one row per publish, holding all of its bodies end to end and the fields its
  messages share (timestamp, ttr, origin, reply_to, headers); `refs` counts the entries
  that still point at it. One row per publish instead of one per message halves the rows
  an MPUB writes, which is most of a commit's cost.
* `entries`: one row per (group, message) with the per-group fields, keyed by (group,
  priority, id): the key is the paging order, so no second index has to be kept up to
  date on every publish. A change of priority moves the row (the caller names the
  priority it had).
* A trigger drops a batch with its last entry.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from gateway.model import Message

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
    bodies BLOB NOT NULL, refs INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    grp INTEGER NOT NULL, priority INTEGER NOT NULL, id INTEGER NOT NULL,
    batch INTEGER NOT NULL, off INTEGER NOT NULL, len INTEGER NOT NULL,
    attempts INTEGER NOT NULL, due REAL NOT NULL, state INTEGER NOT NULL,
    PRIMARY KEY (grp, priority, id)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS entries_gone AFTER DELETE ON entries BEGIN
    UPDATE batches SET refs = refs - 1 WHERE id = OLD.batch;
    DELETE FROM batches WHERE id = OLD.batch AND refs <= 0;
END;
"""

READY, BURIED = 0, 1
RAISE_CEILING = (
    "INSERT INTO meta VALUES ('id_ceiling', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"
)
_SELECT = (
    "SELECT e.id, e.priority, e.attempts, e.due, b.ts, b.ttr,"
    " substr(b.bodies, e.off + 1, e.len), b.origin, b.reply_to, b.headers, b.header_block"
    " FROM entries e JOIN batches b ON b.id = e.batch WHERE "
)

# An op is a tuple queued on the event loop: ("P", gids, messages, due, [(priority,
# attempts)]), ("U", (priority, attempts, due, state, gid, priority_was, id)),
# ("D", gid, [(priority, id)]), or a structural one (see `_structural`).
Op = tuple[Any, ...]
_Put = tuple[tuple[int, ...], Sequence[Message], float, list[tuple[int, int]]]


def select(db: sqlite3.Connection, topic: str, where: str, args: tuple[Any, ...]) -> list[Message]:
    return [_message(row, topic) for row in db.execute(_SELECT + where, args)]


def _message(row: tuple[Any, ...], topic: str) -> Message:
    mid, priority, attempts, due, ts, ttr, body, origin, reply_to, headers, block = row
    msg = Message(
        mid,
        topic,
        body if body.__class__ is bytes else bytes(body or b""),
        ts,
        [tuple(h) for h in json.loads(headers)] if headers else None,  # type: ignore[misc]
        attempts,
        priority,
        due,
        ttr,
        reply_to,
        origin,
    )
    msg.header_block = block
    return msg


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
    entry_rows = []
    last_id = 0
    for gids, msgs, due, fields in puts:
        first = msgs[0]
        refs = 0
        off = 0
        for m, (priority, attempts) in zip(msgs, fields, strict=True):
            size = len(m.body)
            for gid in gids:
                if gone is not None and (gid, m.id) in gone:
                    cancelled.add((gid, m.id))  # never written: nothing to delete either
                    continue
                entry_rows.append((gid, priority, m.id, first.id, off, size, attempts, due))
                refs += 1
            off += size
        last = msgs[-1].id
        last_id = max(last_id, last)
        if refs:
            bodies = first.body if len(msgs) == 1 else b"".join([m.body for m in msgs])
            headers = json.dumps(first.headers) if first.headers else None
            batch_rows.append(
                (first.id, last, first.timestamp, first.ttr, first.origin, first.reply_to,
                 headers, first.header_block, bodies, refs)
            )  # fmt: skip
    if batch_rows:
        db.executemany("INSERT INTO batches VALUES (?,?,?,?,?,?,?,?,?,?)", batch_rows)
    if last_id:
        # the largest id ever stored, kept after its message is gone: ids never repeat
        db.execute(RAISE_CEILING, (last_id,))
    if entry_rows:
        db.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,0)", entry_rows)
    if cancelled:
        # a delivery of a message put and finished in this same commit: nothing to update
        updates = [u for u in updates if (u[4], u[6]) not in cancelled]
        deletes = [d for d in deletes if (d[0], d[2]) not in cancelled]
    if updates:
        db.executemany(
            "UPDATE entries SET priority=?, attempts=?, due=?, state=?"
            " WHERE grp=? AND priority=? AND id=?",
            updates,
        )
    removed = 0
    if deletes:
        removed = db.executemany(
            "DELETE FROM entries WHERE grp=? AND priority=? AND id=?", deletes
        ).rowcount
    return len(entry_rows) - removed


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
            # every copy holds its batch; the backlog's own entries let go when deleted
            db.execute(
                "UPDATE batches SET refs = refs + ? * (SELECT count(*) FROM entries e"
                " WHERE e.grp = ? AND e.batch = batches.id)"
                " WHERE id IN (SELECT batch FROM entries WHERE grp = ?)",
                (len(gids), backlog, backlog),
            )
            for gid in gids:
                added += db.execute(
                    "INSERT INTO entries SELECT ?, priority, id, batch, off, len, attempts,"
                    " due, state FROM entries WHERE grp = ?",
                    (gid, backlog),
                ).rowcount
        return added - db.execute("DELETE FROM entries WHERE grp = ?", (backlog,)).rowcount
    elif kind == "G-":
        gone = db.execute("DELETE FROM entries WHERE grp = ?", (op[1],)).rowcount
        db.execute("DELETE FROM groups WHERE id = ?", (op[1],))
        return -gone
    elif kind == "T-":
        tid = op[1]
        gone = db.execute(
            "DELETE FROM entries WHERE grp IN (SELECT id FROM groups WHERE topic = ?)", (tid,)
        ).rowcount
        db.execute("DELETE FROM groups WHERE topic = ?", (tid,))
        db.execute("DELETE FROM topics WHERE id = ?", (tid,))
        return -gone
    elif kind == "C":
        return -db.execute("DELETE FROM entries WHERE grp = ?", (op[1],)).rowcount
    elif kind == "PT":
        db.execute("UPDATE topics SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "PG":
        db.execute("UPDATE groups SET paused = ? WHERE id = ?", (op[2], op[1]))
    elif kind == "R":
        db.execute(RAISE_CEILING, (op[1],))
    else:  # pragma: no cover - a programming error, not input
        raise ValueError(f"unknown store op {kind!r}")
    return 0
