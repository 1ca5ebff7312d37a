"""The durable store's index, read back: the messages of runs, with their bodies cut out of
their batches (read from the log segment they were written to, their CRC checked, or
from the batch row a compaction moved them into). Runs on the store's worker thread (a
page-in) or while it opens (recovery). The tables are described in sqlite_sql.py."""

from __future__ import annotations

import json
import sqlite3
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from gateway.model import Message
from gateway.stores.log import Bodies
from gateway.stores.sqlite_runs import COLS, tries_of
from gateway.stores.sqlite_segments import batch_bodies

_FIELDS = (
    "ts, ttr, origin, reply_to, headers, header_block, bodies, ends, stamps,"
    " seg, off, size, crc, starts, origins"
)
_BATCH = f"SELECT {_FIELDS} FROM batches WHERE id = ?"
_MANY = 500  # batch rows asked for in one query (SQLite allows 32766 parameters)


class _Batches:
    """The batches one read needs, each read once: its shared fields and bodies."""

    def __init__(self, db: sqlite3.Connection, log: Bodies) -> None:
        self.db = db
        self.log = log
        self.cache: dict[int, tuple[Any, ...]] = {}

    def get(self, batch: int) -> tuple[Any, ...]:
        b = self.cache.get(batch)
        if b is None:
            b = self.cache[batch] = self._made(self.db.execute(_BATCH, (batch,)).fetchone())
        return b

    def fetch(self, ids: Iterable[int]) -> None:
        """Read these batches ahead with a query per _MANY of them, not one each (a page-in
        of 5,000 messages published 100 at a time needs 50)."""
        cache = self.cache
        missing = list({b for b in ids if b not in cache})  # a batch may hold several runs
        for k in range(0, len(missing), _MANY):
            chunk = missing[k : k + _MANY]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT id, {_FIELDS} FROM batches WHERE id IN ({marks})"
            for row in self.db.execute(query, chunk).fetchall():
                cache[row[0]] = self._made(row[1:])

    def _made(self, row: Sequence[Any]) -> tuple[Any, ...]:
        bodies = row[6] if row[9] is None else batch_bodies(self.log, *row[9:14], row[7])
        ends = array("I")
        ends.frombytes(row[7])
        headers = [tuple(h) for h in json.loads(row[4])] if row[4] else None
        stamps = None
        if row[8]:
            stamps = array("q")
            stamps.frombytes(row[8])
        origins = json.loads(row[14]) if row[14] else None  # one per message, if they differ
        return (*row[:4], headers, row[5], bodies, ends, stamps, origins)


def _expand(
    batches: _Batches,
    topic: str,
    priority: int,
    run: Sequence[Any],
    out: list[Message],
    from_id: int = 0,
    limit: int = -1,
) -> None:
    """The messages of one run still in it (from `from_id` on), appended to `out` until it
    holds `limit` (-1: all)."""
    start, n, gone, _left, batch, attempts, due, _state, tries = run
    bits = int.from_bytes(gone, "little") if gone else 0
    counts = tries_of(tries) if tries else None
    ts, ttr, origin, reply_to, headers, block, bodies, ends, stamps, origins = batches.get(batch)
    base = start - batch  # the run's first message's place in its batch
    first = max(from_id - start, 0)
    if not bits and not counts and not stamps and not origins and not due:
        # the common run (a page-in of a backlog): its messages differ in id and body
        # only, built without a call per message
        stop = n if limit < 0 else min(n, first + limit - len(out))
        lo, hi = base + first, base + stop
        out += Message.run(
            start + first,
            topic,
            bodies,
            ends[lo - 1 : hi] if lo else [0, *ends[:hi]],
            ts,
            headers,
            attempts,
            priority,
            ttr,
            reply_to,
            origin,
            block,
        )
        return
    for k in range(first, n):
        if bits >> k & 1:
            continue
        j = base + k
        body = bodies[ends[j - 1] if j else 0 : ends[j]]
        a = counts.get(k, attempts) if counts else attempts
        stamp = stamps[j] if stamps else ts
        came = origins[j] if origins else origin
        msg = Message(start + k, topic, body, stamp, headers, a, priority, due, ttr, reply_to, came)
        msg.header_block = block
        out.append(msg)
        if len(out) == limit:
            return


def select(
    db: sqlite3.Connection,
    log: Bodies,
    topic: str,
    where: str,
    args: tuple[Any, ...],
    *,
    by_id: bool = False,
) -> list[Message]:
    """Every message of the runs `where` selects, in key order (`by_id`: in id order)."""
    batches = _Batches(db, log)
    out: list[Message] = []
    rows = db.execute(f"SELECT priority, {COLS} FROM runs WHERE {where}", args).fetchall()
    batches.fetch(row[5] for row in rows)
    for row in rows:
        _expand(batches, topic, row[0], row[1:], out)
    if by_id:
        out.sort(key=lambda m: m.id)
    return out


def select_ready(
    db: sqlite3.Connection,
    log: Bodies,
    topic: str,
    gid: int,
    after: tuple[int, int],
    limit: int,
) -> list[Message]:
    """Up to `limit` (-1: all) of a group's ready messages, due now, from (priority, id)
    `after` on, in that order: the run holding `after`, then the runs after it."""
    batches = _Batches(db, log)
    out: list[Message] = []
    priority, first = after
    head = db.execute(
        f"SELECT {COLS} FROM runs WHERE grp = ? AND priority = ? AND id <= ?"
        " AND state = 0 AND due = 0 ORDER BY id DESC LIMIT 1",
        (gid, priority, first),
    ).fetchone()
    if head is not None and head[0] + head[1] > first:
        _expand(batches, topic, priority, head, out, first, limit)
    if len(out) == limit:
        return out
    cursor = db.execute(
        f"SELECT priority, {COLS} FROM runs WHERE grp = ? AND (priority, id) > (?, ?)"
        " AND state = 0 AND due = 0 ORDER BY grp, priority, id",
        (gid, priority, first),
    )
    # the runs the limit reaches (each holds `left` messages), then their batches at once
    runs = []
    need = limit - len(out)
    for row in cursor:
        runs.append(row)
        need -= row[4]
        if limit >= 0 and need <= 0:
            break
    cursor.close()
    batches.fetch(row[5] for row in runs)
    for row in runs:
        _expand(batches, topic, row[0], row[1:], out, 0, limit)
        if len(out) == limit:
            break
    return out


def find_ready(
    db: sqlite3.Connection, log: Bodies, topic: str, gid: int, msg_id: int
) -> Message | None:
    """Message `msg_id` if it is ready in the group and due now, else None: the run that
    holds its id, whatever its priority (a scan of the group's runs: an operator's lookup
    by id, not a hot path)."""
    batches = _Batches(db, log)
    rows = db.execute(
        f"SELECT priority, {COLS} FROM runs WHERE grp = ? AND id <= ? AND id + n > ?"
        " AND state = 0 AND due = 0",
        (gid, msg_id, msg_id),
    ).fetchall()
    for row in rows:
        out: list[Message] = []
        _expand(batches, topic, row[0], row[1:], out, msg_id, 1)
        if out and out[0].id == msg_id:
            return out[0]
    return None


def count_ready(db: sqlite3.Connection, gid: int) -> int:
    return db.execute(
        "SELECT coalesce(sum(left), 0) FROM runs WHERE grp = ? AND state = 0 AND due = 0", (gid,)
    ).fetchone()[0]


def count_all(db: sqlite3.Connection) -> int:
    return db.execute("SELECT coalesce(sum(left), 0) FROM runs").fetchone()[0]
