"""The durable store's index and the log segments queued bodies stay in (bitcask's layout,
docs/storage.md "Bodies stay in the log"), on the index's worker thread: where a written
frame put a publish's bodies (`locate`), reading them back with their CRC checked
(`batch_bodies`), which segments hold queued bodies (`pinned`), deleting the segments the
index no longer needs (`retire`), moving the few long-lived bodies out of an old segment
(`compact`), and recovery's check of the bodies written after the log's last fsync
(`drop_lost`).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from array import array

from crc32c import crc32c

from gateway.stores.log import Bodies, Log, segment_path
from gateway.stores.sqlite_records import Op

log = logging.getLogger("gateway.store")


# the segments queued bodies are in; the bytes of queued bodies in each segment before one
# a batch with holes counts its own bytes only (`own`), not the others' its range spans
LIVE_BYTES = (
    "SELECT seg, sum(coalesce(own, size)) FROM batches"
    " WHERE seg IS NOT NULL AND seg < ? GROUP BY seg"
)
OLDEST_PINNED = "SELECT min(seg) FROM batches WHERE seg IS NOT NULL"  # the partial index
_NEXT_PINNED = "SELECT min(seg) FROM batches WHERE seg > ?"


def locate(ops: list[Op], segment: int, starts: list[int]) -> list[Op]:
    """The records of one frame with each publish's bodies (out-of-band buffers, in the
    order the frame holds them, starting at `starts` of `segment`) replaced by where they
    are (index thread)."""
    if not starts:
        return ops
    out: list[Op] = []
    append = out.append
    at = iter(starts)
    for op in ops:
        if op[0] == "P":
            batch = op[8]
            bodies = batch[6]
            if type(bodies) is not bytes:  # an out-of-band buffer (or its view)
                view = memoryview(bodies)
                where = (segment, next(at), view, None, view.nbytes)
                op = (*op[:8], (*batch[:6], where, *batch[7:]))
        append(op)
    return out


def retire(
    db: sqlite3.Connection, log_: Log, bodies: Bodies, held: int, keep: set[int] | None = None
) -> None:
    """Delete the segments before `held` (the index holds their records) but those queued
    bodies are in (`keep`, else every one from the oldest queued body on)."""
    if keep is None:
        oldest = db.execute(OLDEST_PINNED).fetchone()[0]
        if oldest is not None:
            held = min(held, oldest)
        keep = set()
    gone = [n for n in log_.on_disk() if n < held and n not in keep]
    if gone:
        # the index must keep what the deleted segments held through a power cut:
        # a checkpoint fsyncs its WAL, then its file
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        log_.delete(gone)
        bodies.forget(gone)


def compact(db: sqlite3.Connection, log_: Log, bodies: Bodies, held: int, large: int) -> None:
    """Delete the segments before `held` that no queued body is in; then, while the log is
    larger than `large` bytes, move the bodies still queued in the first old segment that
    is mostly finished into their rows, and delete it: a few long-lived messages
    (deferred, buried, a slow group) must not keep whole segments (bitcask's merge; a
    segment per call bounds the work)."""
    retire(db, log_, bodies, held, pinned(db))
    on_disk = log_.on_disk()
    if len(on_disk) < 2 or log_.size() < large:
        return
    live = dict(db.execute(LIVE_BYTES, (log_.segment,)))
    for number in on_disk:
        size = live.get(number)
        if size is None:
            continue
        with contextlib.suppress(OSError):
            if 2 * size < segment_path(log_.directory, number).stat().st_size:
                _move(db, bodies, number)
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                log_.delete([number])
                bodies.forget([number])
                log.info("store log segment %d compacted: %d bytes moved", number, size)
                return


def _move(db: sqlite3.Connection, log: Bodies, segment: int) -> None:
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
