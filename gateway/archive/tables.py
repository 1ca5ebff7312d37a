"""The archive's tables: buffered events into Arrow tables shaped for its Parquet files.

Runs on the writer thread, but holds the GIL the broker needs, so every column is built
C-level where possible (numpy repeats, zip, map, attrgetter, Arrow kernels): a publish's
columns come from its first message and its count, never from a pass over its messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.archive.events import PUBLISHED
from gateway.model import Message

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

_ID, _BODY, _ORIGIN, _TIMESTAMP = (attrgetter(a) for a in ("id", "body", "origin", "timestamp"))

# one buffered event: (event, time_ns, message, topic, group, sink, attempts, priority)
Row = tuple[str, int, Message, str, str, Any, int, int]
# one publish's `published` events: (time_ns, how many, topic, attempts, priority, their
# bodies, the first message's id, origin and publish time; the ids of one publish are
# consecutive)
Batch = tuple[int, int, str, int, int, Sequence[bytes], int, str, int]
Entry = Row | Batch
# Parquet settings: dictionaries for the columns that repeat (protocols, topics, peers),
# none for the body, which rarely repeats; no min/max statistics of bodies either.
DICTIONARY_COLUMNS = ["event", "topic", "group", "producer", "consumer", "peer"]
# The writer builds those columns as Arrow dictionary arrays (a publish's topic and
# publisher are one index repeated), which Parquet takes as they are instead of hashing
# every value again. The files' columns are Parquet strings all the same: Spark sees
# SCHEMA, and read.py casts back to it.
_STRINGS = pa.dictionary(pa.int32(), pa.string())
# The body column is written with 64-bit offsets: a row group's bodies may pass 2 GiB
# (32,768 bodies of up to nsqd's 1 MiB); Parquet stores the same byte arrays either way.
_BODIES = pa.large_binary()
# Every column but the body (null when `body = "none"`) is written REQUIRED: no value of
# theirs is ever null, and an optional column costs the writer a definition level per
# value (measured with data page v2, below: a fifth of the Parquet encoding time).
# Readers lose nothing: Spark reads every Parquet column as nullable, and read.py reads
# with SCHEMA, so segments written before and after this mix in one archive.
FILE_SCHEMA = pa.schema(
    [
        pa.field(f.name, _STRINGS, nullable=False)
        if f.name in DICTIONARY_COLUMNS
        else pa.field(f.name, _BODIES)
        if f.name == "body"
        else f.with_nullable(False)
        for f in SCHEMA
    ]
)


def table(entries: list[Entry], body: str | int) -> pa.Table:
    """One table of the entries in order: each run of publishes and each run of other
    events built column at a time, C-level where possible (zip, map, attrgetter, Arrow
    kernels): this runs on the writer thread but holds the GIL the broker needs."""
    tables = []
    start = 0
    for i in range(1, len(entries) + 1):
        if i == len(entries) or (len(entries[i]) == 8) != (len(entries[start]) == 8):
            run = entries[start:i]
            if len(run[0]) == 8:
                tables.append(_rows_table(run, body))  # type: ignore[arg-type]
            else:
                tables.append(_published_table(run, body))  # type: ignore[arg-type]
            start = i
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _bodies(raw: list[bytes], body: str | int) -> tuple[pa.Array, pa.Array]:
    bodies = pa.array(raw, type=_BODIES)
    sizes = pc.binary_length(bodies).cast(pa.int64())
    return _body_mode(bodies, body), sizes


def _body_mode(bodies: pa.Array, body: str | int) -> pa.Array:
    """The body column as `[archive] body` asks: whole, none, or the first N bytes."""
    if body == "none":
        return pa.nulls(len(bodies), type=_BODIES)
    if body != "full":
        return pc.binary_slice(bodies, 0, int(body))
    return bodies


def _published_table(batches: list[Batch], body: str | int) -> pa.Table:
    """A run of publishes, column at a time: every column but the body comes from each
    publish's first message and its count (numpy repeats, no pass over the messages);
    the bodies are joined end to end and measured in one C-level pass each."""
    times, ns, topics, attempts, priorities, raws, first_ids, origins_, published = zip(
        *batches, strict=True
    )
    counts = np.array(ns, np.int64)
    n = int(counts.sum())
    # ids: each publish's first id, then consecutive
    starts = np.cumsum(counts) - counts
    ids = np.arange(n, dtype=np.int64) + np.repeat(np.array(first_ids, np.int64) - starts, counts)
    origins = [o.partition(" ") for o in origins_]
    flat = list(chain.from_iterable(raws))
    lengths = np.fromiter(map(len, flat), np.int64, n)
    if body == "none":
        bodies = pa.nulls(n, type=_BODIES)
    else:
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = pa.py_buffer(b"".join(flat))
        bodies = pa.Array.from_buffers(_BODIES, n, [None, pa.py_buffer(offsets), data])
        bodies = _body_mode(bodies, body)
    # one array of zeros serves as the indices of every column with one value in this
    # table (Arrow arrays never change): one allocation, not one per column
    zeros = pa.array(np.zeros(n, np.int32))
    empty = _repeat_strings(("",), counts[:1], zeros)
    columns = [
        _repeat_strings((PUBLISHED,), counts[:1], zeros),
        np.repeat(np.array(times, np.int64), counts),
        ids,
        _repeat_strings(topics, counts, zeros),
        empty,
        _repeat_strings([o[0] for o in origins], counts, zeros),
        empty,
        _repeat_strings([o[2] for o in origins], counts, zeros),
        lengths,
        np.repeat(np.array(attempts, np.int32), counts),
        np.repeat(np.array(priorities, np.int64), counts),
        np.repeat(np.array(published, np.int64), counts),
        bodies,
    ]
    return pa.Table.from_arrays(columns, schema=FILE_SCHEMA)


def _rows_table(rows: list[Row], body: str | int) -> pa.Table:
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
    bodies, sizes = _bodies(list(map(_BODY, msgs)), body)
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


def _repeat_strings(
    values: list[str] | tuple[str, ...], counts: np.ndarray, zeros: pa.Array
) -> pa.Array:
    """Each of `values` repeated its count of times, as a dictionary array: indices
    repeated by numpy, each distinct string once (an MPUB's publisher is one index);
    `zeros`, as many zeros as the counts add up to, the indices when all are one."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) == 1:
        indices = zeros
    else:
        index = {v: i for i, v in enumerate(distinct)}
        codes = np.fromiter(map(index.__getitem__, values), np.int32, len(values))
        indices = pa.array(np.repeat(codes, counts))
    return pa.DictionaryArray.from_arrays(indices, pa.array(distinct, pa.string()))


def events_in(entry: Entry) -> int:
    """How many events one buffered entry holds."""
    return 1 if len(entry) == 8 else entry[1]  # type: ignore[return-value]


def split(entries: list[Entry], rows: int) -> tuple[list[Entry], list[Entry]]:
    """The first `rows` events of `entries`, and the rest (a publish cut where needed)."""
    head: list[Entry] = []
    for i, entry in enumerate(entries):
        n = events_in(entry)
        if n <= rows:
            head.append(entry)
            rows -= n
            if rows == 0:
                return head, entries[i + 1 :]
            continue
        t, _, topic, attempts, priority, raw, first, origin, published = entry  # type: ignore[misc]
        shared = (topic, attempts, priority)
        head.append((t, rows, *shared, raw[:rows], first, origin, published))
        rest = (t, n - rows, *shared, raw[rows:], first + rows, origin, published)
        return head, [rest, *entries[i + 1 :]]
    return head, []
