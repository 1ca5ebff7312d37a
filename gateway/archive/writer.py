"""The archive writer: lifecycle events in a bounded buffer, a thread writing Parquet.

The broker's hot paths hand events to a `Recorder` (one per archived topic), which appends
an entry to a bounded buffer and never blocks: one entry per publish however many
messages it carries (an MPUB costs the broker a few C-level passes, no Python loop), one
per other event. When the buffer is full the events are dropped and counted
(`Archive.dropped`). A writer thread drains the buffer, batches events into
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
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
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

# Rows per Parquet row group: large enough that the per-batch costs of building and
# encoding it (13 columns, their pages and statistics) are spread thin (measured: 8,192
# rows cost about 25% more per event than 32,768), small enough that the writer holds
# little besides the buffer (a row group of 200-byte bodies is about 8 MB in memory).
ROW_GROUP_ROWS = 32768
# How often the writer wakes with nothing to do, to rotate segments by age.
IDLE_WAKE_SECONDS = 0.5
_DAY_NS = 86_400 * 1_000_000_000

_ID, _BODY, _ORIGIN, _TIMESTAMP, _ATTEMPTS, _PRIORITY = (
    attrgetter(a) for a in ("id", "body", "origin", "timestamp", "attempts", "priority")
)

# one buffered event: (event, time_ns, message, topic, group, sink, attempts, priority)
Row = tuple[str, int, Message, str, str, Any, int, int]
# one publish's `published` events: (time_ns, messages, topic, attempts, priority, the
# bodies end to end, their sizes)
Batch = tuple[int, list[Message], str, int, int, bytes, list[int]]
Entry = Row | Batch
# Parquet settings: dictionaries for the columns that repeat (protocols, topics, peers),
# none for the body, which rarely repeats; no min/max statistics of bodies either.
_DICTIONARY = ["event", "topic", "group", "producer", "consumer", "peer"]
# The writer builds those columns as Arrow dictionary arrays (a publish's topic and
# publisher are one index repeated), which Parquet takes as they are instead of hashing
# every value again. The files' columns are Parquet strings all the same: Spark sees
# SCHEMA, and read.py casts back to it.
_STRINGS = pa.dictionary(pa.int32(), pa.string())
# The body column is written with 64-bit offsets: a row group's bodies may pass 2 GiB
# (32,768 bodies of up to nsqd's 1 MiB); Parquet stores the same byte arrays either way.
_BODIES = pa.large_binary()
FILE_SCHEMA = pa.schema(
    [
        pa.field(f.name, _STRINGS)
        if f.name in _DICTIONARY
        else pa.field(f.name, _BODIES)
        if f.name == "body"
        else f
        for f in SCHEMA
    ]
)
# Min/max statistics for the columns readers filter on (the report's --since/--until and
# --topic, replay's --event), which lets them skip row groups; none for the rest.
_STATISTICS = ["event", "time_ns", "id", "topic", "group", "publish_ns"]
# Parquet codecs the archive may be written with (`[archive] compression`)
COMPRESSIONS = ("zstd", "lz4", "snappy", "gzip", "none")


class Recorder:
    """One topic's door into the archive. Called on the broker's task; never blocks."""

    __slots__ = ("_archive", "_buffer", "_limit", "topic")

    def __init__(self, archive: Archive, topic: str) -> None:
        self._archive = archive
        self._buffer = archive._buffer
        self._limit = archive.buffer_limit
        self.topic = topic

    def published(self, messages: Iterable[Message]) -> None:
        """One publish's messages (Topic.put's contract: ids consecutive, one timestamp,
        origin and priority, no attempts yet): one buffer entry. The writer derives every
        column but the body from the first message and the count; the bodies are copied
        end to end here, while the publisher's frame is still in the CPU's cache (three
        C-level passes over the publish), so the writer never touches them one by one."""
        msgs = messages if isinstance(messages, list) else list(messages)
        if not msgs:
            return
        archive = self._archive
        room = self._limit - (archive.queued - archive.taken)
        if room < len(msgs):
            archive.dropped += len(msgs) - max(room, 0)
            if room <= 0:
                return
            msgs = msgs[:room]
        raw = list(map(_BODY, msgs))
        blob = b"" if archive.body == "none" else b"".join(raw)
        # attempts and priority as they are now (a release may change them before the
        # writer runs); one publish shares them
        first = msgs[0]
        self._buffer.append(
            (
                time.time_ns(),
                msgs,
                self.topic,
                first.attempts,
                first.priority,
                blob,
                list(map(len, raw)),
            )
        )
        archive.queued += len(msgs)
        if archive.queued - archive.taken >= ROW_GROUP_ROWS:
            archive._wake.set()

    def record(self, event: str, msg: Message, group: str, sink: object | None = None) -> None:
        """One event of a group's message; `sink`: the consumer's, where one is involved.
        Attempts and priority are taken now (they change later); the body never does."""
        archive = self._archive
        if archive.queued - archive.taken >= self._limit:
            archive.dropped += 1
            return
        self._buffer.append(
            (event, time.time_ns(), msg, self.topic, group, sink, msg.attempts, msg.priority)
        )
        archive.queued += 1
        if archive.queued - archive.taken == ROW_GROUP_ROWS:
            archive._wake.set()


class _Segment:
    def __init__(self, root: Path, day: int, seq: int, opened: float, compression: str) -> None:
        date = datetime.fromtimestamp(day * 86_400, UTC).date().isoformat()
        folder = root / f"date={date}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns()}-{seq:06d}.parquet"
        self.path = folder / name
        self.temporary = folder / f".{name}.inprogress"
        self.day = day
        self.opened = opened
        self.writer = pq.ParquetWriter(
            self.temporary,
            FILE_SCHEMA,
            compression=compression,
            use_dictionary=_DICTIONARY,
            write_statistics=_STATISTICS,
        )

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
        compression: str = "lz4",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        self.patterns = list(topics or [])
        self.body = body
        self.buffer_limit = buffer
        self.segment_bytes = segment_bytes
        self.segment_seconds = segment_seconds
        if compression not in COMPRESSIONS:
            raise ValueError(f"archive compression {compression!r}: not one of {COMPRESSIONS}")
        self.compression = compression
        self._clock = clock
        self._buffer: deque[Entry] = deque()
        # events appended (counted on the broker's thread) and taken by the writer (on its
        # own): their difference is what the buffer holds, with no lock
        self.queued = 0
        self.taken = 0
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
        return self.queued - self.taken

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
        pending: list[Entry] = []
        count = 0  # events in pending
        while True:
            self._wake.wait(IDLE_WAKE_SECONDS)
            self._wake.clear()
            closing = self._closing
            asked = self._flush_asked
            buffer = self._buffer
            while buffer:
                entry = buffer.popleft()
                n = 1 if len(entry) == 8 else len(entry[1])
                self.taken += n
                pending.append(entry)
                count += n
                while count >= ROW_GROUP_ROWS:
                    group, pending = _split(pending, ROW_GROUP_ROWS)
                    count -= ROW_GROUP_ROWS
                    self._write(group)
            if pending and (closing or asked > self._flush_done):
                self._write(pending)
                pending, count = [], 0
            segment = self._segment
            if segment is not None and (
                closing or self._clock() - segment.opened >= self.segment_seconds
            ):
                if pending:
                    self._write(pending)
                    pending, count = [], 0
                self._close_segment()
            if asked > self._flush_done:
                with self._flush_lock:
                    self._flush_done = asked
                    self._flush_lock.notify_all()
            if closing and not self._buffer:
                return

    def _write(self, entries: list[Entry]) -> None:
        """Entries into one row group per run of equal dates (a segment holds one date)."""
        runs: list[tuple[int, list[Entry]]] = []
        for entry in entries:
            day = (entry[1] if len(entry) == 8 else entry[0]) // _DAY_NS
            if runs and runs[-1][0] == day:
                runs[-1][1].append(entry)
            else:
                runs.append((day, [entry]))
        for day, run in runs:
            self._write_day(day, run)

    def _write_day(self, day: int, entries: list[Entry]) -> None:
        try:
            table = self._table(entries)
            segment = self._segment
            if segment is not None and segment.day != day:
                self._close_segment()
                segment = None
            if segment is None:
                self._seq += 1
                segment = self._segment = _Segment(
                    self.directory, day, self._seq, self._clock(), self.compression
                )
            segment.writer.write_table(table, row_group_size=table.num_rows)
            self.written += table.num_rows
            if segment.size() >= self.segment_bytes:
                self._close_segment()
        except Exception as exc:  # the writer must outlive any one bad batch
            rows = sum(1 if len(e) == 8 else len(e[1]) for e in entries)
            self.write_errors += 1
            self.failed += rows
            log.error("archive: writing %d events failed: %s", rows, exc)

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

    def _table(self, entries: list[Entry]) -> pa.Table:
        """One table of the entries in order: each run of publishes and each run of other
        events built column at a time, C-level where possible (zip, map, attrgetter, Arrow
        kernels): this runs on the writer thread but holds the GIL the broker needs."""
        tables = []
        start = 0
        for i in range(1, len(entries) + 1):
            if i == len(entries) or (len(entries[i]) == 8) != (len(entries[start]) == 8):
                run = entries[start:i]
                if len(run[0]) == 8:
                    tables.append(self._rows_table(run))  # type: ignore[arg-type]
                else:
                    tables.append(self._published_table(run))  # type: ignore[arg-type]
                start = i
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _bodies(self, raw: list[bytes]) -> tuple[pa.Array, pa.Array]:
        bodies = pa.array(raw, type=_BODIES)
        sizes = pc.binary_length(bodies).cast(pa.int64())
        return self._body_mode(bodies), sizes

    def _body_mode(self, bodies: pa.Array) -> pa.Array:
        """The body column as `[archive] body` asks: whole, none, or the first N bytes."""
        if self.body == "none":
            return pa.nulls(len(bodies), type=_BODIES)
        if self.body != "full":
            return pc.binary_slice(bodies, 0, int(self.body))
        return bodies

    def _published_table(self, batches: list[Batch]) -> pa.Table:
        """A run of publishes, column at a time: every column but the body comes from each
        publish's first message and its count (numpy repeats, no pass over the messages);
        the bodies are the publishes' copies joined, with offsets from their sizes."""
        times, groups, topics, attempts, priorities, blobs, sizes = zip(*batches, strict=True)
        firsts = [m[0] for m in groups]
        counts = np.fromiter(map(len, groups), np.int64, len(groups))
        n = int(counts.sum())
        # ids: each publish's first id, then consecutive
        starts = np.cumsum(counts) - counts
        ids = np.arange(n, dtype=np.int64) + np.repeat(
            np.fromiter(map(_ID, firsts), np.int64, len(firsts)) - starts, counts
        )
        origins = [o.partition(" ") for o in map(_ORIGIN, firsts)]
        lengths = np.fromiter(chain.from_iterable(sizes), np.int64, n)
        if self.body == "none":
            bodies = pa.nulls(n, type=_BODIES)
        else:
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            data = b"".join(blobs)
            bodies = pa.Array.from_buffers(
                _BODIES, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            )
            bodies = self._body_mode(bodies)
        empty = _repeat_strings(("",), counts[:1], n)
        columns = [
            _repeat_strings((PUBLISHED,), counts[:1], n),
            np.repeat(np.array(times, np.int64), counts),
            ids,
            _repeat_strings(topics, counts, n),
            empty,
            _repeat_strings([o[0] for o in origins], counts, n),
            empty,
            _repeat_strings([o[2] for o in origins], counts, n),
            lengths,
            np.repeat(np.array(attempts, np.int32), counts),
            np.repeat(np.array(priorities, np.int64), counts),
            np.repeat(np.fromiter(map(_TIMESTAMP, firsts), np.int64, len(firsts)), counts),
            bodies,
        ]
        return pa.Table.from_arrays(columns, schema=FILE_SCHEMA)

    def _rows_table(self, rows: list[Row]) -> pa.Table:
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
        bodies, sizes = self._bodies(list(map(_BODY, msgs)))
        columns = [
            pa.array(events, type=_STRINGS),
            pa.array(times, type=pa.int64()),
            pa.array(list(map(_ID, msgs)), type=pa.int64()),
            pa.array(topics, type=_STRINGS),
            pa.array(groups, type=_STRINGS),
            pa.array([split[o][0] for o in origins], type=_STRINGS),
            pa.array([sink_info[id(s)][0] for s in sinks], type=_STRINGS),
            pa.array(peers, type=_STRINGS),
            sizes,
            pa.array(attempts, type=pa.int32()),
            pa.array(priorities, type=pa.int64()),
            pa.array(list(map(_TIMESTAMP, msgs)), type=pa.int64()),
            bodies,
        ]
        return pa.Table.from_arrays(columns, schema=FILE_SCHEMA)


def _repeat_strings(values: list[str] | tuple[str, ...], counts: np.ndarray, n: int) -> pa.Array:
    """Each of `values` repeated its count of times, as a dictionary array: indices
    repeated by numpy, each distinct string once (an MPUB's publisher is one index)."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 1:
        indices = np.zeros(n, np.int32)
    else:
        index = {v: i for i, v in enumerate(distinct)}
        codes = np.fromiter(map(index.__getitem__, values), np.int32, len(values))
        indices = np.repeat(codes, counts)
    return pa.DictionaryArray.from_arrays(indices, pa.array(distinct, pa.string()))


def _split(entries: list[Entry], rows: int) -> tuple[list[Entry], list[Entry]]:
    """The first `rows` events of `entries`, and the rest (a publish cut where needed)."""
    head: list[Entry] = []
    for i, entry in enumerate(entries):
        n = 1 if len(entry) == 8 else len(entry[1])
        if n <= rows:
            head.append(entry)
            rows -= n
            if rows == 0:
                return head, entries[i + 1 :]
            continue
        t, msgs, topic, attempts, priority, blob, sizes = entry  # type: ignore[misc]
        cut = sum(sizes[:rows]) if blob else 0
        head.append((t, msgs[:rows], topic, attempts, priority, blob[:cut], sizes[:rows]))
        rest = (t, msgs[rows:], topic, attempts, priority, blob[cut:], sizes[rows:])
        return head, [rest, *entries[i + 1 :]]
    return head, []
