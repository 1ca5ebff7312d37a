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
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gateway.archive.tables import (
    DICTIONARY_COLUMNS,
    FILE_SCHEMA,
    SCHEMA,
    Entry,
    events_in,
    split,
    table,
)
from gateway.model import Message

log = logging.getLogger("gateway.archive")

__all__ = ["ROW_GROUP_ROWS", "SCHEMA", "Archive", "Recorder"]

_BODY = attrgetter("body")


# Rows per Parquet row group: large enough that the per-batch costs of building and
# encoding it (13 columns, their pages and statistics) are spread thin (measured: 8,192
# rows cost about 25% more per event than 32,768), small enough that the writer holds
# little besides the buffer (a row group of 200-byte bodies is about 8 MB in memory).
ROW_GROUP_ROWS = 32768
# How often the writer wakes with nothing to do, to rotate segments by age.
IDLE_WAKE_SECONDS = 0.5
_DAY_NS = 86_400 * 1_000_000_000

# Min/max statistics for the columns readers filter on (the report's and replay's
# --since/--until, --topic and --event), which lets them skip row groups; none for the
# rest (the ids' and publish times' cost a tenth of the writer's encoding time).
_STATISTICS = ["event", "time_ns", "topic", "group"]
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

    def published(self, messages: Iterable[Message], bodies: Sequence[bytes] | None = None) -> None:
        """One publish's messages (Topic.put's contract: ids consecutive, one timestamp,
        origin and priority, no attempts yet), and their bodies when the caller has them
        as a list (the broker does: one pass over the messages to fetch them costs more
        than the rest of this together): one buffer entry. The writer derives every
        column but the body from the first message and the count.

        The bodies are kept by reference, not copied or measured here: they are
        immutable bytes the broker holds anyway, and the writer joins a row group's
        bodies and takes their sizes in one C-level pass each. Copying them end to end
        here (and counting their sizes) cost the event loop several microseconds a
        publish, about a tenth of an MPUB's whole cost, in the copy, the size tuple and
        the page faults of a fresh allocation per publish."""
        msgs = messages if isinstance(messages, list) else list(messages)
        if not msgs:
            return
        raw = list(map(_BODY, msgs)) if bodies is None else bodies
        archive = self._archive
        room = self._limit - (archive.queued - archive.taken)
        n = len(msgs)
        if room < n:
            archive.dropped += n - max(room, 0)
            if room <= 0:
                return
            n = room
            raw = raw[:room]
        # attempts and priority as they are now (a release may change them before the
        # writer runs); one publish shares them. Scalars and the bodies, not the messages:
        # the cyclic GC walks nothing behind a waiting entry but the list of bodies,
        # whose bytes it does not track
        first = msgs[0]
        self._buffer.append(
            (
                time.time_ns(),
                n,
                self.topic,
                first.attempts,
                first.priority,
                raw,
                first.id,
                first.origin,
                first.timestamp,
            )
        )
        archive.queued += n
        # a row group's worth waits: wake the writer, once (set() takes a lock and
        # notifies; until the writer runs, every publish would do it again)
        if archive.queued - archive.taken >= ROW_GROUP_ROWS and not archive._wake.is_set():
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
            use_dictionary=DICTIONARY_COLUMNS,
            write_statistics=_STATISTICS,
            # values handed to a column's encoder per call: a row group at once, not the
            # default 1,024 (measured: the encoding costs about 12% less an event)
            write_batch_size=ROW_GROUP_ROWS,
            # Parquet's data page v2 (its levels stored apart from the compressed values):
            # about a fifth less encoding time than v1 (measured, lz4, 200-byte bodies);
            # Spark, parquet-mr and pyarrow all read it
            data_page_version="2.0",
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
        self.pending = 0  # taken, in the row group being filled (the writer's count)
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
        """Events recorded and not written yet: in the buffer, or taken by the writer
        into the row group it is filling."""
        return self.queued - self.taken + self.pending

    def recorder(self, topic: str) -> Recorder | None:
        """The recorder for `topic`, or None when the configured patterns leave it out."""
        if self.patterns and not any(fnmatch.fnmatchcase(topic, p) for p in self.patterns):
            return None
        return Recorder(self, topic)

    # -- life cycle ------------------------------------------------------------

    def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise OSError(f"archive.dir {self.directory}: not a directory") from None
        except OSError as exc:
            raise OSError(f"archive.dir {self.directory}: {exc.strerror or exc}") from None
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
        since = 0.0  # when the first of them was taken
        while True:
            self._wake.wait(IDLE_WAKE_SECONDS)
            self._wake.clear()
            closing = self._closing
            asked = self._flush_asked
            buffer = self._buffer
            if buffer and not pending:
                since = self._clock()
            while buffer:
                entry = buffer.popleft()
                n = events_in(entry)
                self.taken += n
                pending.append(entry)
                count += n
                while count >= ROW_GROUP_ROWS:
                    group, pending = split(pending, ROW_GROUP_ROWS)
                    count -= ROW_GROUP_ROWS
                    self._write(group)
                    since = self._clock()
            self.pending = count
            if pending and (closing or asked > self._flush_done):
                self._write(pending)
                pending, count = [], 0
            # Readers see a segment once it is closed; `segment_seconds` bounds how long
            # an event waits for that, counted from the segment's opening or, none open,
            # from the oldest event not written (a slow trickle fills no row group).
            segment = self._segment
            oldest = segment.opened if segment is not None else since
            if (segment is not None or pending) and (
                closing or self._clock() - oldest >= self.segment_seconds
            ):
                if pending:
                    self._write(pending)
                    pending, count = [], 0
                self._close_segment()
            self.pending = count
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
            events = table(entries, self.body)
            segment = self._segment
            if segment is not None and segment.day != day:
                self._close_segment()
                segment = None
            if segment is None:
                self._seq += 1
                segment = self._segment = _Segment(
                    self.directory, day, self._seq, self._clock(), self.compression
                )
            segment.writer.write_table(events, row_group_size=events.num_rows)
            self.written += events.num_rows
            if segment.size() >= self.segment_bytes:
                self._close_segment()
        except Exception as exc:  # the writer must outlive any one bad batch
            rows = sum(map(events_in, entries))
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
