"""Replay: publish archived messages again, a PySpark job (docs/pipeline.md).

    spark-submit gateway/pipeline/replay.py --archive DIR --topic T --event buried \
                 --to nsq://HOST:PORT/TOPIC [--since T] [--until T]

Spark reads the archive, keeps the messages of topic T whose last event in some group is
`--event` (`buried`: the dead letters; `published`: the messages no consumer ever touched),
one row per message, and its partitions publish them in parallel to the target, each
partition over one connection. Each message is published at most once per replay: a
publish that fails is counted, never retried (the target may have taken it before the
error), and the task never fails, so Spark has nothing to retry either.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.archive.events import PUBLISHED
from gateway.pipeline import command
from gateway.pipeline.events import ending_with, load_events
from gateway.pipeline.session import PipelineError, check_archive, one_line
from gateway.pipeline.targets import ReplayError, Target, batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass
class Options:
    archive: Path
    topic: str
    event: str
    target: Target
    since_ns: int | None = None
    until_ns: int | None = None


@dataclass
class Result:
    read: int
    published: int
    failed: int
    error: str  # the first failure's reason ("" if none)


def select(events: DataFrame, event: str) -> DataFrame:
    """One row (id, body, size) per message whose last event is `event`: in some group, or,
    for `published`, anywhere (no consumer has seen it)."""
    from pyspark.sql import functions as F

    if event == PUBLISHED:
        keyed, keys = events, ["topic", "id"]
    else:
        keyed, keys = events.filter(F.col("group") != ""), ["topic", "group", "id"]
    chosen = ending_with(keyed, event, keys, ["body", "size"])
    return chosen.select("topic", "id", "body", "size").dropDuplicates(["topic", "id"])


def publish_partition(target: Target, rows: Iterable[Any]) -> Iterator[tuple[int, int, str]]:
    """Runs on an executor: publishes one partition's messages over one connection and
    yields (published, failed, first error). Never raises."""
    published = failed = 0
    errors: list[str] = []

    def bodies() -> Iterator[bytes]:
        nonlocal failed
        for row in rows:
            body = row["body"]
            if body is None or len(body) < row["size"]:
                failed += 1
                if not errors:
                    errors.append(
                        "the archive kept no body or only its first bytes "
                        '([archive] body must be "full" to replay)'
                    )
                continue
            yield bytes(body)

    publisher = None
    broken = False
    for batch in batches(bodies()):
        if broken:
            failed += len(batch)
            continue
        try:
            if publisher is None:
                publisher = target.publisher()
            publisher.publish(batch)
            published += len(batch)
        except Exception as exc:  # whatever the client raises: count it, never retry
            done = exc.done if isinstance(exc, ReplayError) else 0
            published += done
            failed += len(batch) - done
            errors.append(f"{target.url}: {_reason(exc)}")
            broken = True
    if publisher is not None:
        # everything it published was acknowledged before: a failed close changes nothing
        with contextlib.suppress(Exception):
            publisher.close()
    yield published, failed, errors[0] if errors else ""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def run(spark: Any, options: Options) -> Result:
    events = load_events(
        spark,
        options.archive,
        since_ns=options.since_ns,
        until_ns=options.until_ns,
        body=True,
    )
    from pyspark.sql import functions as F

    chosen = select(events.filter(F.col("topic") == options.topic), options.event)
    # one job: the partitions publish and count; an empty one never connects
    partitions = chosen.select("body", "size").repartition(spark.sparkContext.defaultParallelism)
    outcomes = partitions.rdd.mapPartitions(
        functools.partial(publish_partition, options.target)
    ).collect()
    published = sum(p for p, _, _ in outcomes)
    failed = sum(f for _, f, _ in outcomes)
    errors = [e for _, _, e in outcomes if e]
    return Result(published + failed, published, failed, errors[0] if errors else "")


def run_command(args: argparse.Namespace) -> int:
    """The job from parsed arguments (command.py's): the target probed before Spark
    starts, its outcome in a few lines, an error in one."""
    log: Path = args.spark_log or Path(tempfile.gettempdir()) / "gateway-pipeline-replay.log"
    try:
        since, until = command.times(args)
        target = Target.parse(args.to)
        target.probe()
        check_archive(args.archive)
        # a failed publish is counted, never retried: at most once per message per replay
        conf = {"spark.task.maxFailures": "1"}
        spark = command.spark_session("gateway pipeline replay", args, log, **conf)
    except PipelineError as exc:
        return command.fail(str(exc))
    try:
        options = Options(args.archive, args.topic, args.event, target, since, until)
        result = run(spark, options)
        print(f"spark application {spark.sparkContext.applicationId}")
        print(f"read {result.read}, published {result.published}, failed {result.failed}")
        if result.failed:
            return command.fail(f"{result.failed} publishes to {target.url} failed: {result.error}")
        return 0
    except PipelineError as exc:
        return command.fail(str(exc))
    except Exception as exc:
        return command.fail(f"replay failed: {one_line(exc)} (Spark's log: {log})")
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """The job as spark-submit runs it (or `gateway pipeline replay`, through cli.py)."""
    parser = argparse.ArgumentParser(prog="replay.py", description=__doc__.split("\n\n")[0])
    command.add_replay_arguments(parser)
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
