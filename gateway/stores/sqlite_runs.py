"""The durable store's index: the `runs` table's side of applying the log (sqlite_sql.py),
on the index's worker thread. Taking finished messages out of their runs, per run of ids;
changing one message of a run (which splits it); releasing the batches none is left in.
The tables are described in sqlite_sql.py.
"""

from __future__ import annotations

import sqlite3
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

READY, BURIED = 0, 1
# a run, as the code below reads it
COLS = "id, n, gone, left, batch, attempts, due, state, tries"
_HEAD = (
    f"SELECT {COLS} FROM runs WHERE grp = ? AND priority = ? AND id <= ? ORDER BY id DESC LIMIT 1"
)
_AFTER = (
    f"SELECT {COLS} FROM runs WHERE grp = ? AND priority = ? AND id > ? AND id <= ? ORDER BY id"
)
INSERT = "INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_GAP = 4096  # ids further apart than this are looked up in the index separately
_Update = tuple[Any, ...]  # a change: (priority, attempts, due, state, gid, priority_was, id)


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


class Spans:
    """The ids of finishes (flat runs: priority, first, last, ...) as sorted disjoint
    spans: whether an id is among them, and which ids of a span they leave out, found by
    bisection rather than a set of every id (a page of FINs is a run or a few, its
    deliveries a run)."""

    __slots__ = ("firsts", "lasts")

    def __init__(self, flat: list[int]) -> None:
        spans = _merged(list(zip(flat[1::3], flat[2::3], strict=True))) if flat else []
        self.firsts = [first for first, _ in spans]
        self.lasts = [last for _, last in spans]

    def __contains__(self, i: int) -> bool:
        k = bisect_right(self.firsts, i) - 1
        return k >= 0 and i <= self.lasts[k]

    def gaps(self, first: int, last: int) -> list[tuple[int, int]]:
        """The spans (first, last) of the ids from `first` to `last` in no span."""
        firsts, lasts = self.firsts, self.lasts
        out: list[tuple[int, int]] = []
        k = max(bisect_right(firsts, first) - 1, 0)
        i = first
        while i <= last:
            while k < len(firsts) and lasts[k] < i:
                k += 1
            if k == len(firsts) or firsts[k] > last:
                out.append((i, last))
                break
            if firsts[k] > i:
                out.append((i, firsts[k] - 1))
            i = lasts[k] + 1
        return out

    def outside(self, first: int, last: int) -> list[int]:
        """The ids from `first` to `last` in no span."""
        return [i for lo, hi in self.gaps(first, last) for i in range(lo, hi + 1)]


# -- applying the log's records ---------------------------------------------------


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


def finish(db: sqlite3.Connection, fins: dict[int, list[int]]) -> int:
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
    release(db, released)
    return removed


def deliver(db: sqlite3.Connection, ranged: dict[int, list[tuple[int, int, int, int]]]) -> None:
    """Deliveries as ranges of ids (per group: priority, first, last, attempts; no id in
    two of them), applied per run, not per message: a run they cover whole takes the
    attempts in its own column; a run they cover in part notes them per message (its
    tries), as `change` does; a message the index keeps in another state (buried,
    deferred) is a `change`."""
    by_key: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for gid, ranges in ranged.items():
        for p, first, last, a in ranges:
            by_key.setdefault((gid, p, a), []).append((first, last))
    # per run: its columns, and the masks of its messages delivered with each attempts
    hit: dict[tuple[int, int, int], tuple[list[Any], list[tuple[int, int]]]] = {}
    for (gid, priority, a), spans in by_key.items():
        for run, mask in _spanned(db, gid, priority, spans):
            old = int.from_bytes(run[2], "little") if run[2] else 0
            if mask & ~old:
                entry = hit.setdefault((gid, priority, run[0]), (run, []))
                entry[1].append((mask & ~old, a))
    whole = []
    noted = []
    others: list[_Update] = []
    for (gid, priority, start), (run, masks) in hit.items():
        n, gone, due, state, tries = run[1], run[2], run[6], run[7], run[8]
        old = int.from_bytes(gone, "little") if gone else 0
        if state != READY or due:
            others += [
                (priority, a, 0.0, READY, gid, priority, start + k)
                for mine, a in masks
                for k in _bits(mine)
            ]
        elif len(masks) == 1 and masks[0][0] | old == (1 << n) - 1:  # all left in the run
            whole.append((masks[0][1], gid, priority, start))
        else:
            counts = tries_of(tries) if tries else {}
            for mine, a in masks:
                for k in _bits(mine):
                    counts[k] = a
            noted.append((tries_blob(counts), gid, priority, start))
    if whole:
        db.executemany(
            "UPDATE runs SET attempts = ?, tries = NULL WHERE grp = ? AND priority = ? AND id = ?",
            whole,
        )
    if noted:
        db.executemany("UPDATE runs SET tries = ? WHERE grp = ? AND priority = ? AND id = ?", noted)
    if others:
        change(db, others)


def _bits(mask: int) -> Iterator[int]:
    """The places of a mask's set bits, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def change(db: sqlite3.Connection, changes: Iterable[_Update]) -> None:
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
            pieces((gid, was, start, n, batch, attempts, due, state), bits, moving, inserts, counts)
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
        db.executemany(INSERT, inserts)


def pieces(
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


def release(db: sqlite3.Connection, released: dict[int, int]) -> None:
    """Each batch's `refs` goes down by its count; a batch none is left in goes."""
    if released:
        rows = [(count, batch) for batch, count in released.items()]
        db.executemany("DELETE FROM batches WHERE refs <= ? AND id = ?", rows)
        db.executemany("UPDATE batches SET refs = refs - ? WHERE id = ?", rows)


def drop_runs(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> int:
    """Delete the runs `where` selects (whole groups); returns how many messages went."""
    released = dict(
        db.execute(f"SELECT batch, sum(left) FROM runs WHERE {where} GROUP BY batch", args)
    )
    db.execute(f"DELETE FROM runs WHERE {where}", args)
    release(db, released)
    return sum(released.values())
