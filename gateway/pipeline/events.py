"""The archive as a Spark DataFrame, filtered by time and topic (both jobs read it so)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gateway.archive.events import EVENTS
from gateway.pipeline.session import check_archive, glob_regex

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The segments' schema (gateway/archive/writer.py SCHEMA) in Spark's DDL: given rather than
# inferred, so that Spark reads no footer to plan and a segment with another schema fails
# loudly instead of widening the table.
SCHEMA_DDL = (
    "event STRING, time_ns BIGINT, id BIGINT, topic STRING, `group` STRING, "
    "producer STRING, consumer STRING, peer STRING, size BIGINT, attempts INT, "
    "priority BIGINT, publish_ns BIGINT, body BINARY"
)
__all__ = ["EVENTS", "SCHEMA_DDL", "ending_with", "load_events"]


def load_events(
    spark: SparkSession,
    archive: str | Path,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    topic: str | None = None,
    body: bool = False,
) -> DataFrame:
    """Every archived event with `since_ns <= time_ns < until_ns` of the topics matching
    the fnmatch pattern `topic`; the `body` column only when asked for."""
    from pyspark.sql import functions as F

    root = check_archive(archive).resolve()
    # Spark skips files and folders whose names start with "." or "_": the segments still
    # being written, or cut short by kill -9.
    df = spark.read.schema(SCHEMA_DDL).parquet(str(root))
    if not body:
        df = df.drop("body")
    if since_ns is not None:
        df = df.filter(F.col("time_ns") >= since_ns)
    if until_ns is not None:
        df = df.filter(F.col("time_ns") < until_ns)
    if topic is not None:
        df = df.filter(F.col("topic").rlike(glob_regex(topic)))
    return df


# Up to this many keys are sent to every executor (a broadcast join) to pick the rows of
# the messages concerned; past it Spark joins by shuffling both sides.
BROADCAST_KEYS = 2_000_000


def ending_with(events: DataFrame, event: str, keys: list[str], columns: list[str]) -> DataFrame:
    """Per `keys` (a message in a group, or a message), `keys` and `columns` of its last
    row, where that row's event is `event`.

    Only the messages that have an `event` row at all are grouped: they are picked first
    (few, usually: dead letters), so the shuffle moves their rows, not the archive.
    """
    from pyspark.sql import functions as F

    hits = events.filter(F.col("event") == event).select(*keys).distinct()
    if hits.count() <= BROADCAST_KEYS:
        hits = F.broadcast(hits)
    rows = events.join(hits, keys, "left_semi")
    fields = ["event", *(c for c in columns if c != "event")]
    last = rows.groupBy(*keys).agg(F.max_by(F.struct(*fields), "time_ns").alias("last"))
    return last.filter(F.col("last.event") == event).select(
        *keys, *(F.col(f"last.{c}").alias(c) for c in columns)
    )
