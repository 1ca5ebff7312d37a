"""The archive writer: lifecycle events in a bounded buffer, a thread writing Parquet.

The broker's hot paths hand events to a `Recorder` (one per archived topic), which appends
a tuple to a bounded buffer and never blocks: when the buffer is full the event is dropped
and counted (`Archive.dropped`). A writer thread drains the buffer, batches events into
Parquet row groups and writes them to segments partitioned hive-style by the event's UTC
date (`date=YYYY-MM-DD/part-<ns>-<seq>.parquet`), rotating a segment once it holds
`segment_bytes` or has been open `segment_seconds`.

A segment is written under a temporary name starting with "." and renamed to its final
name only once closed (its Parquet footer written). Readers (`read.py`, pyarrow datasets,
Spark) skip names starting with "." or "_", so a segment cut short by kill -9 is never
taken for a finished one; what it held is lost, as is whatever waited in the buffer.
`close()` (the gateway's clean stop) writes everything buffered and closes the open
segment.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gateway.archive.events import PUBLISHED
from gateway.model import Message

log = logging.getLogger("gateway.archive")


# Times are int64 nanoseconds, not Parquet TIMESTAMP(NANOS), which Spark cannot read.
SCHEMA = pa.schema(
    [
        ("event", pa.string()),
        ("time_ns", pa.int64()),
        ("id", pa.int64()),
        ("topic", pa.string()),
        ("group", pa.string()),
        ("producer", pa.string()),
        ("consumer", pa.string()),
        ("peer", pa.string()),
        ("size", pa.int64()),
        ("attempts", pa.int32()),
        ("priority", pa.int64()),
        ("publish_ns", pa.int64()),
        ("body", pa.binary()),
    ]
)

# Rows per Parquet row group: large enough to compress well, small enough that the writer
# holds little besides the buffer (the row group is built in memory).
ROW_GROUP_ROWS = 8192
# How often the writer wakes with nothing to do, to rotate segments by age.
IDLE_WAKE_SECONDS = 0.5
_DAY_NS = 86_400 * 1_000_000_000

_ID, _BODY, _ORIGIN, _TIMESTAMP = (attrgetter(a) for a in ("id", "body", "origin", "timestamp"))

# one buffered event: (event, time_ns, message, topic, group, sink, attempts, priority)
Row = tuple[str, int, Message, str, str, Any, int, int]


class Recorder:
    """One topic's door into the archive. Called on the broker's task; never blocks."""

    __slots__ = ("_archive", "_buffer", "_limit", "topic")

    def __init__(self, archive: Archive, topic: str) -> None:
        self._archive = archive
        self._buffer = archive._buffer
        self._limit = archive.buffer_limit
        self.topic = topic

    def published(self, messages: Iterable[Message]) -> None:
        buffer = self._buffer
        now = time.time_ns()
        topic = self.topic
        for msg in messages:
            if len(buffer) >= self._limit:
                self._archive.dropped += 1
                continue
            buffer.append((PUBLISHED, now, msg, topic, "", None, msg.attempts, msg.priority))
        if len(buffer) >= ROW_GROUP_ROWS:
            self._archive._wake.set()

    def record(self, event: str, msg: Message, group: str, sink: object | None = None) -> None:
        """One event of a group's message; `sink`: the consumer's, where one is involved.
        Attempts and priority are taken now (they change later); the body never does."""
        buffer = self._buffer
        if len(buffer) >= self._limit:
            self._archive.dropped += 1
            return
        buffer.append(
            (event, time.time_ns(), msg, self.topic, group, sink, msg.attempts, msg.priority)
        )
        if len(buffer) == ROW_GROUP_ROWS:
            self._archive._wake.set()


class _Segment:
    def __init__(self, root: Path, day: int, seq: int, opened: float) -> None:
        date = datetime.fromtimestamp(day * 86_400, UTC).date().isoformat()
        folder = root / f"date={date}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns()}-{seq:06d}.parquet"
        self.path = folder / name
        self.temporary = folder / f".{name}.inprogress"
        self.day = day
        self.opened = opened
        self.writer = pq.ParquetWriter(self.temporary, SCHEMA, compression="zstd")

    def size(self) -> int:
        return os.path.getsize(self.temporary)

    def close(self) -> None:
        self.writer.close()
        os.replace(self.temporary, self.path)


class Archive:
    """The buffer, the writer thread and its counters. `start()` once, `close()` once."""

    def __init__(
        self,
        directory: str | Path,
        *,
        topics: list[str] | None = None,
        body: str | int = "full",
        buffer: int = 100_000,
        segment_bytes: int = 128 * 1024 * 1024,
        segment_seconds: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        self.patterns = list(topics or [])
        self.body = body
        self.buffer_limit = buffer
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        self._clock = clock
        self._buffer: deque[Row] = deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._segment: _Segment | None = None
        self._seq = 0
        self._flush_lock = threading.Condition()
        self._flush_asked = 0
        self._flush_done = 0
        # counters, read by the metrics collector
        self.written = 0  # events in finished or open segments
        # events dropped because the buffer was full (counted on the broker's thread), and
        # because writing them failed (on the writer's): two counters, no lock
        self.dropped = 0
        self.failed = 0
        self.segments = 0  # segments closed and renamed to their final name
        self.write_errors = 0

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def recorder(self, topic: str) -> Recorder | None:
        """The recorder for `topic`, or None when the configured patterns leave it out."""
        if self.patterns and not any(fnmatch.fnmatchcase(topic, p) for p in self.patterns):
            return None
        return Recorder(self, topic)

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="archive-writer", daemon=True)
        self._thread.start()

    def flush(self, timeout: float = 30.0) -> bool:
        """Write everything buffered so far to the open segment (not closing it) and check
        rotation; returns once the writer has done so. For tests and the metrics."""
        with self._flush_lock:
            self._flush_asked += 1
            target = self._flush_asked
            self._wake.set()
            return self._flush_lock.wait_for(lambda: self._flush_done >= target, timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Write everything buffered, close the open segment, stop the thread (blocking:
        call it from a worker thread in async code)."""
        if self._thread is None:
            return
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        self._thread = None

    # -- the writer thread -----------------------------------------------------

    def _run(self) -> None:
        pending: list[Row] = []
        while True:
            self._wake.wait(IDLE_WAKE_SECONDS)
            self._wake.clear()
            closing = self._closing
            asked = self._flush_asked
            buffer = self._buffer
            while buffer:
                pending.append(buffer.popleft())
                if len(pending) >= ROW_GROUP_ROWS:
                    self._write(pending)
                    pending = []
            if pending and (closing or asked > self._flush_done):
                self._write(pending)
                pending = []
            segment = self._segment
            if segment is not None and (
                closing or self._clock() - segment.opened >= self.segment_seconds
            ):
                if pending:
                    self._write(pending)
                    pending = []
                self._close_segment()
            if asked > self._flush_done:
                with self._flush_lock:
                    self._flush_done = asked
                    self._flush_lock.notify_all()
            if closing and not self._buffer:
                return

    def _write(self, rows: list[Row]) -> None:
        """Rows into row groups, one per run of equal dates (a segment holds one date)."""
        start = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or rows[i][1] // _DAY_NS != rows[start][1] // _DAY_NS:
                self._write_day(rows[start:i])
                start = i

    def _write_day(self, rows: list[Row]) -> None:
        day = rows[0][1] // _DAY_NS
        try:
            segment = self._segment
            if segment is not None and segment.day != day:
                self._close_segment()
                segment = None
            if segment is None:
                self._seq += 1
                segment = self._segment = _Segment(self.directory, day, self._seq, self._clock())
            segment.writer.write_table(self._table(rows), row_group_size=len(rows))
            self.written += len(rows)
            if segment.size() >= self.segment_bytes:
                self._close_segment()
        except Exception as exc:  # the writer must outlive any one bad batch
            self.write_errors += 1
            self.failed += len(rows)
            log.error("archive: writing %d events failed: %s", len(rows), exc)

    def _close_segment(self) -> None:
        segment, self._segment = self._segment, None
        if segment is None:
            return
        try:
            segment.close()
            self.segments += 1
        except (OSError, pa.ArrowException) as exc:
            self.write_errors += 1
            log.error("archive: closing %s failed: %s", segment.path, exc)

    def _table(self, rows: list[Row]) -> pa.Table:
        # Column at a time, C-level where possible (zip, map, attrgetter, Arrow kernels):
        # this runs on the writer thread but holds the GIL the broker needs.
        events, times, msgs, topics, groups, sinks, attempts, priorities = zip(*rows, strict=True)
        origins = list(map(_ORIGIN, msgs))
        split = {o: o.partition(" ") for o in set(origins)}
        # by identity: a sink need not be hashable
        sink_info = {
            id(s): ("", "") if s is None else (getattr(s, "protocol", ""), getattr(s, "remote", ""))
            for s in sinks
        }
        peers = [
            sink_info[id(s)][1] or "" if s is not None else (split[o][2] if e == PUBLISHED else "")
            for e, o, s in zip(events, origins, sinks, strict=True)
        ]
        bodies = pa.array(list(map(_BODY, msgs)), type=pa.binary())
        sizes = pc.binary_length(bodies).cast(pa.int64())
        if self.body == "none":
            bodies = pa.nulls(len(rows), type=pa.binary())
        elif self.body != "full":
            bodies = pc.binary_slice(bodies, 0, int(self.body))
        columns = [
            pa.array(events, type=pa.string()),
            pa.array(times, type=pa.int64()),
            pa.array(list(map(_ID, msgs)), type=pa.int64()),
            pa.array(topics, type=pa.string()),
            pa.array(groups, type=pa.string()),
            pa.array([split[o][0] for o in origins], type=pa.string()),
            pa.array([sink_info[id(s)][0] for s in sinks], type=pa.string()),
            pa.array(peers, type=pa.string()),
            sizes,
            pa.array(attempts, type=pa.int32()),
            pa.array(priorities, type=pa.int64()),
            pa.array(list(map(_TIMESTAMP, msgs)), type=pa.int64()),
            bodies,
        ]
        return pa.Table.from_arrays(columns, schema=SCHEMA)
