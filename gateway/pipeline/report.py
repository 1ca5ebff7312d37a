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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gateway.archive.events import ACKNOWLEDGED, BURIED, DELIVERED, EVENTS, PUBLISHED
from gateway.pipeline import command
from gateway.pipeline.events import ending_with, load_events
from gateway.pipeline.session import PipelineError, check_archive, one_line

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


# The tables, each one grouping set of one aggregation over the archive; the latency
# percentiles, for all but `throughput`, of a second one over the acknowledgements.
GROUPING_SETS = {
    "by_topic": ("topic",),
    "by_group": ("topic", "group"),
    "by_hour": ("hour", "topic"),
    "by_pair": ("producer", "consumer"),
    "throughput": ("time", "topic"),
}
_KEYS = ("topic", "group", "hour", "producer", "consumer", "time")


def _counts(F: Any) -> list[Column]:
    """Events by kind, bytes published, redeliveries, first deliveries (the flow)."""
    event = F.col("event")
    return [
        *(F.count(F.when(event == e, 1)).alias(e) for e in EVENTS),
        F.coalesce(F.sum(F.when(event == PUBLISHED, F.col("size"))), F.lit(0)).alias("bytes"),
        F.count(F.when((event == DELIVERED) & (F.col("attempts") > 1), 1)).alias("redelivered"),
        F.count(F.when((event == DELIVERED) & (F.col("attempts") == 1), 1)).alias("messages"),
        F.grouping_id(*_KEYS).alias("grouping"),
    ]


def compute(spark: SparkSession, events: DataFrame) -> Report:
    """Every table of the report from the archived events (without bodies), in four
    passes over the archive: its time span (one column); the counts, one aggregation with a
    grouping set per table; the latency percentiles, another over the acknowledgements;
    the dead letters."""
    from pyspark.sql import functions as F

    report = Report()
    first_ns, last_ns = events.agg(F.min("time_ns"), F.max("time_ns")).first()
    report.bucket_seconds = seconds = _bucket(first_ns, last_ns)
    keyed = events.withColumns(
        {
            "hour": F.timestamp_seconds(F.floor(F.col("time_ns") / (3600 * _NS)) * 3600),
            "time": F.timestamp_seconds(F.floor(F.col("time_ns") / (seconds * _NS)) * seconds),
        }
    )
    sets = [list(keys) for keys in GROUPING_SETS.values()]
    counts = keyed.groupingSets(sets, *_KEYS).agg(*_counts(F))
    counts = counts.withColumn(
        "redelivery_rate",
        F.when(F.col(DELIVERED) > 0, F.col("redelivered") / F.col(DELIVERED)).otherwise(0.0),
    )
    acks = keyed.filter(F.col("event") == ACKNOWLEDGED).withColumn(
        "latency_ms", (F.col("time_ns") - F.col("publish_ns")) / 1e6
    )
    latency = acks.groupingSets(sets[:-1], *_KEYS).agg(
        F.percentile_approx("latency_ms", list(PERCENTILES), ACCURACY).alias("latency"),
        F.grouping_id(*_KEYS).alias("grouping"),
    )
    latency = latency.select(
        *_KEYS,
        "grouping",
        *(F.col("latency")[i].alias(p) for i, p in enumerate(("p50", "p95", "p99"))),
    )
    all_counts, all_latency = _arrow(counts), _arrow(latency)
    for name, keys in GROUPING_SETS.items():
        table = _grouping_set(all_counts, keys)
        if name != "throughput":
            table = table.join(_grouping_set(all_latency, keys), list(keys), join_type="left outer")
        report.tables[name] = table.sort_by([(k, "ascending") for k in keys])
    report.events = sum(pc.sum(report.tables["by_topic"].column(e)).as_py() or 0 for e in EVENTS)
    # group "": publishes, and deletes from a topic's backlog; a pair needs a consumer
    by_group = report.tables["by_group"]
    by_group = by_group.filter(pc.not_equal(by_group.column("group"), ""))
    by_pair = report.tables["by_pair"]
    by_pair = by_pair.filter(pc.not_equal(by_pair.column("consumer"), ""))
    report.tables["flow"] = by_pair.filter(pc.greater(by_pair.column("messages"), 0)).select(
        ["producer", "consumer", "messages"]
    )
    report.tables["by_pair"] = by_pair.drop_columns(["messages"])
    report.tables["throughput"] = report.tables["throughput"].select(
        ["time", "topic", PUBLISHED, ACKNOWLEDGED]
    )

    # dead letters: the messages whose last event in their group is `buried`
    dead = ending_with(
        events.filter(F.col("group") != ""),
        BURIED,
        ["topic", "group", "id"],
        ["time_ns", "attempts", "producer", "size", "publish_ns"],
    ).withColumnRenamed("time_ns", "buried_ns")
    dead_letters = _arrow(dead.orderBy("topic", "group", "buried_ns"))
    report.tables["dead_letters"] = dead_letters
    per_group = Counter(
        zip(
            dead_letters.column("topic").to_pylist(),
            dead_letters.column("group").to_pylist(),
            strict=True,
        )
    )
    per_topic = Counter(dead_letters.column("topic").to_pylist())
    report.tables["by_group"] = _with_dead(by_group, per_group, ("topic", "group"))
    report.tables["by_topic"] = _with_dead(
        report.tables["by_topic"].drop_columns(["messages"]), per_topic, ("topic",)
    )
    report.tables["by_group"] = report.tables["by_group"].drop_columns(["messages"])
    report.tables["by_hour"] = report.tables["by_hour"].drop_columns(["messages"])
    return report


def _grouping_set(table: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The rows of one grouping set (grouping_id: a bit per key, set where the rows are
    not grouped by it), its keys first."""
    gid = sum(1 << (len(_KEYS) - 1 - i) for i, k in enumerate(_KEYS) if k not in keys)
    rows = table.filter(pc.equal(table.column("grouping"), gid))
    values = [n for n in table.column_names if n not in _KEYS and n != "grouping"]
    return rows.select([*keys, *values])


def _with_dead(table: pa.Table, dead: Counter[Any], keys: tuple[str, ...]) -> pa.Table:
    rows = zip(*(table.column(k).to_pylist() for k in keys), strict=True)
    values = [dead[key if len(keys) > 1 else key[0]] for key in rows]
    return table.append_column("dead_letters", pa.array(values, type=pa.int64()))


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


def run_command(args: argparse.Namespace) -> int:
    """The job from parsed arguments (command.py's): checked before Spark starts, its
    outcome in a few lines, an error in one."""
    log: Path = args.spark_log or args.out / "spark.log"
    try:
        since, until = command.times(args)
        check_archive(args.archive)
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PipelineError(f"--out {args.out}: {exc.strerror or exc}") from None
        spark = command.spark_session("gateway pipeline report", args, log)
    except PipelineError as exc:
        return command.fail(str(exc))
    try:
        options = Options(args.archive, args.out, since, until, args.topic)
        result, html = run(spark, options)
        print(f"spark application {spark.sparkContext.applicationId}")
        print(f"{result.events} events, {len(result.tables['by_topic'])} topics")
        print(f"report: {html.resolve()}")
        return 0
    except PipelineError as exc:
        return command.fail(str(exc))
    except Exception as exc:  # Spark's errors: one line here, the rest in its log
        return command.fail(f"report failed: {one_line(exc)} (Spark's log: {log})")
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """The job as spark-submit runs it (or `gateway pipeline report`, through cli.py)."""
    parser = argparse.ArgumentParser(prog="report.py", description=__doc__.split("\n\n")[0])
    command.add_report_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
