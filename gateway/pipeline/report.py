"""The traffic report: a PySpark job over the archive (docs/pipeline.md).

    spark-submit gateway/pipeline/report.py --archive DIR --out DIR [--since T] [--until T]
                 [--topic PATTERN]

Per topic, per group, per hour and per producer x consumer protocol pair: events of each
kind, bytes published, publish-to-acknowledge latency (p50, p95, p99 by Spark's
`percentile_approx`), the redelivery rate, the dead letters (messages whose last event in
their group is `buried`); the flow matrix of messages first delivered by producer and
consumer protocol; throughput over time. OUT gets `counts.json`, `latency.json`,
`tables/*.parquet` and `report.html` (charts.py).

The aggregates are collected to the driver and written there, so OUT is a local directory
of the machine running the driver, whatever the cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from gateway.archive.events import ACKNOWLEDGED, BURIED, DELIVERED, EVENTS, PUBLISHED
from gateway.pipeline.events import load_events

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

PERCENTILES = (0.5, 0.95, 0.99)
# percentile_approx's accuracy: relative error 1/ACCURACY of the rank (Spark's default).
ACCURACY = 10_000
# Throughput buckets, shortest first: the report takes the shortest that draws the span
# in at most MAX_BUCKETS points.
BUCKET_SECONDS = (1, 10, 60, 600, 3600, 21600, 86400)
MAX_BUCKETS = 240
_NS = 1_000_000_000


@dataclass
class Report:
    """What the job computed: small tables, already on the driver."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    bucket_seconds: int = 1
    events: int = 0

    def rows(self, name: str) -> list[dict[str, Any]]:
        return self.tables[name].to_pylist()


def _summary(F: Any, df: DataFrame) -> list[Column]:
    """The aggregate columns every table has: events by kind, bytes, redeliveries,
    latency percentiles (ms)."""
    event = F.col("event")
    latency_ms = (F.col("time_ns") - F.col("publish_ns")) / 1e6
    columns = [F.count(F.when(event == e, 1)).alias(e) for e in EVENTS]
    columns += [
        F.coalesce(F.sum(F.when(event == PUBLISHED, F.col("size"))), F.lit(0)).alias("bytes"),
        F.count(F.when((event == DELIVERED) & (F.col("attempts") > 1), 1)).alias("redelivered"),
        F.percentile_approx(
            F.when(event == ACKNOWLEDGED, latency_ms), list(PERCENTILES), ACCURACY
        ).alias("latency"),
    ]
    return columns


def _finish(F: Any, df: DataFrame) -> DataFrame:
    """The latency array as p50, p95, p99 columns; the redelivery rate."""
    return (
        df.withColumn("p50", F.col("latency")[0])
        .withColumn("p95", F.col("latency")[1])
        .withColumn("p99", F.col("latency")[2])
        .drop("latency")
        .withColumn(
            "redelivery_rate",
            F.when(F.col(DELIVERED) > 0, F.col("redelivered") / F.col(DELIVERED)).otherwise(0.0),
        )
    )


def compute(spark: SparkSession, events: DataFrame) -> Report:
    """Every table of the report from the archived events (without bodies)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        report = Report()
        summary = _summary(F, events)
        # dead letters: the messages whose last event in their group is `buried`
        last = (
            events.filter(F.col("group") != "")
            .groupBy("topic", "group", "id")
            .agg(
                F.max_by("event", "time_ns").alias("last_event"),
                F.max("time_ns").alias("last_ns"),
                F.max_by("attempts", "time_ns").alias("attempts"),
                F.first("producer").alias("producer"),
                F.first("size").alias("size"),
                F.first("publish_ns").alias("publish_ns"),
            )
        )
        dead = last.filter(F.col("last_event") == BURIED).drop("last_event")
        dead = dead.withColumnRenamed("last_ns", "buried_ns").persist()
        dead_by_topic = dead.groupBy("topic").agg(F.count("*").alias("dead_letters"))
        dead_by_group = dead.groupBy("topic", "group").agg(F.count("*").alias("dead_letters"))

        by_topic = _finish(F, events.groupBy("topic").agg(*summary))
        by_topic = by_topic.join(dead_by_topic, "topic", "left").fillna(0, ["dead_letters"])
        by_group = _finish(
            F, events.filter(F.col("group") != "").groupBy("topic", "group").agg(*summary)
        )
        by_group = by_group.join(dead_by_group, ["topic", "group"], "left").fillna(
            0, ["dead_letters"]
        )
        hour = F.timestamp_seconds(F.floor(F.col("time_ns") / (3600 * _NS)) * 3600)
        by_hour = _finish(F, events.groupBy(hour.alias("hour"), "topic").agg(*summary))
        by_pair = _finish(
            F,
            events.filter(F.col("consumer") != "").groupBy("producer", "consumer").agg(*summary),
        )
        flow = (
            events.filter((F.col("event") == DELIVERED) & (F.col("attempts") == 1))
            .groupBy("producer", "consumer")
            .agg(F.count("*").alias("messages"))
        )

        report.tables["by_topic"] = _arrow(by_topic.orderBy("topic"))
        span = report.tables["by_topic"]
        report.events = int(sum(sum(span.column(e).to_pylist()) for e in EVENTS))
        first_last = events.agg(F.min("time_ns"), F.max("time_ns")).first()
        report.bucket_seconds = _bucket(first_last[0], first_last[1])
        bucket = F.floor(F.col("time_ns") / (report.bucket_seconds * _NS)) * report.bucket_seconds
        throughput = events.groupBy(F.timestamp_seconds(bucket).alias("time"), "topic").agg(
            F.count(F.when(F.col("event") == PUBLISHED, 1)).alias(PUBLISHED),
            F.count(F.when(F.col("event") == ACKNOWLEDGED, 1)).alias(ACKNOWLEDGED),
        )
        report.tables["by_group"] = _arrow(by_group.orderBy("topic", "group"))
        report.tables["by_hour"] = _arrow(by_hour.orderBy("hour", "topic"))
        report.tables["by_pair"] = _arrow(by_pair.orderBy("producer", "consumer"))
        report.tables["flow"] = _arrow(flow.orderBy("producer", "consumer"))
        report.tables["throughput"] = _arrow(throughput.orderBy("time", "topic"))
        report.tables["dead_letters"] = _arrow(dead.orderBy("topic", "group", "buried_ns"))
        dead.unpersist()
        return report
    finally:
        events.unpersist()


def _arrow(df: DataFrame) -> pa.Table:
    return df.toArrow()


def _bucket(first_ns: int | None, last_ns: int | None) -> int:
    if first_ns is None or last_ns is None:
        return BUCKET_SECONDS[0]
    span = (last_ns - first_ns) / _NS
    for seconds in BUCKET_SECONDS:
        if span / seconds <= MAX_BUCKETS:
            return seconds
    return BUCKET_SECONDS[-1]


def counts(report: Report) -> list[dict[str, Any]]:
    """counts.json: one object per topic."""
    keys = ("topic", *EVENTS, "bytes", "redelivered", "redelivery_rate", "dead_letters")
    return [{k: row[k] for k in keys} for row in report.rows("by_topic")]


def latency(report: Report) -> list[dict[str, Any]]:
    """latency.json: publish-to-acknowledge percentiles per topic, in milliseconds (null
    for a topic with nothing acknowledged)."""
    return [
        {
            "topic": r["topic"],
            "acknowledged": r[ACKNOWLEDGED],
            **{p: r[p] for p in ("p50", "p95", "p99")},
        }
        for r in report.rows("by_topic")
    ]


def write(report: Report, out: Path, *, title: str) -> Path:
    """Everything into OUT; returns report.html's path."""
    from gateway.pipeline.charts import render_html

    tables = out / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    for name, table in report.tables.items():
        pq.write_table(table, tables / f"{name}.parquet")
    (out / "counts.json").write_text(json.dumps(counts(report), indent=1) + "\n")
    (out / "latency.json").write_text(json.dumps(latency(report), indent=1) + "\n")
    html = out / "report.html"
    html.write_text(render_html(report, title=title))
    return html


@dataclass
class Options:
    archive: Path
    out: Path
    since_ns: int | None = None
    until_ns: int | None = None
    topic: str | None = None


def run(spark: SparkSession, options: Options) -> tuple[Report, Path]:
    """The job on `spark`: read, compute, write. Returns the report and report.html."""
    events = load_events(
        spark,
        options.archive,
        since_ns=options.since_ns,
        until_ns=options.until_ns,
        topic=options.topic,
    )
    report = compute(spark, events)
    title = f"Gateway traffic: {options.archive}"
    if options.topic:
        title += f" (topics {options.topic})"
    return report, write(report, options.out, title=title)


def main(argv: Sequence[str] | None = None) -> int:
    """The job as spark-submit runs it (or `gateway pipeline report`, through cli.py)."""
    from gateway.pipeline.cli import add_report_arguments, run_report

    parser = argparse.ArgumentParser(prog="report.py", description=__doc__.split("\n\n")[0])
    add_report_arguments(parser)
    return run_report(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
