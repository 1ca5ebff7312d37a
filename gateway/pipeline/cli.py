"""`gateway pipeline report | replay`: the arguments, the checks before Spark starts, and
one line per error (Spark's own output goes to a log file, never to the terminal)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.archive.events import BURIED, EVENTS
from gateway.pipeline.session import (
    PipelineError,
    check_archive,
    check_master,
    one_line,
    parse_time,
    start_session,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gateway pipeline ...` under the gateway's own subcommands."""
    pipeline = sub.add_parser("pipeline", help="Spark jobs over the message archive")
    jobs = pipeline.add_subparsers(dest="job", required=True)
    report = jobs.add_parser("report", help="traffic, latency and dead-letter report")
    add_report_arguments(report)
    replay = jobs.add_parser("replay", help="publish archived messages again")
    add_replay_arguments(replay)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--archive", required=True, type=Path, metavar="DIR", help="the archive's directory"
    )
    parser.add_argument(
        "--master", metavar="URL", help="Spark master URL (default local[*]; spark://HOST:PORT)"
    )
    parser.add_argument("--since", metavar="T", help="ISO time (UTC unless it says) or 2h ago")
    parser.add_argument("--until", metavar="T", help="ISO time (UTC unless it says) or 2h ago")
    parser.add_argument(
        "--spark-log", type=Path, metavar="FILE", help="where Spark's own logs go (WARN)"
    )


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="where the report goes"
    )
    parser.add_argument("--topic", metavar="PATTERN", help="fnmatch pattern: orders*")


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--topic", required=True, metavar="T", help="the archived topic")
    parser.add_argument("--event", default=BURIED, choices=EVENTS, help="the last event")
    parser.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help="nsq://H:P/topic, beanstalk://H:P/tube, nats://H:P/subject, http://H:P/topic",
    )


def main(args: argparse.Namespace) -> int:
    try:
        return run_report(args) if args.job == "report" else run_replay(args)
    except KeyboardInterrupt:  # Ctrl-C: Spark is stopped on the way out, no traceback
        print("interrupted", file=sys.stderr)
        return 130


def _times(args: argparse.Namespace) -> tuple[int | None, int | None]:
    since = parse_time(args.since, option="--since") if args.since else None
    until = parse_time(args.until, option="--until") if args.until else None
    if since is not None and until is not None and since >= until:
        raise PipelineError(f"--since {args.since} is not before --until {args.until}")
    return since, until


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _session(name: str, args: argparse.Namespace, log: Path, **conf: str) -> SparkSession:
    if args.master is not None:
        check_master(args.master)
    return start_session(name, args.master, log, conf)


def run_report(args: argparse.Namespace) -> int:
    from gateway.pipeline import report

    log: Path = args.spark_log or args.out / "spark.log"
    try:
        since, until = _times(args)
        check_archive(args.archive)
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PipelineError(f"--out {args.out}: {exc.strerror or exc}") from None
        spark = _session("gateway pipeline report", args, log)
    except PipelineError as exc:
        return _fail(str(exc))
    try:
        options = report.Options(args.archive, args.out, since, until, args.topic)
        result, html = report.run(spark, options)
        print(f"spark application {spark.sparkContext.applicationId}")
        print(f"{result.events} events, {len(result.tables['by_topic'])} topics")
        print(f"report: {html.resolve()}")
        return 0
    except PipelineError as exc:
        return _fail(str(exc))
    except Exception as exc:  # Spark's errors: one line here, the rest in its log
        return _fail(f"report failed: {one_line(exc)} (Spark's log: {log})")
    finally:
        spark.stop()


def run_replay(args: argparse.Namespace) -> int:
    from gateway.pipeline import replay
    from gateway.pipeline.targets import Target

    log: Path = args.spark_log or Path(tempfile.gettempdir()) / "gateway-pipeline-replay.log"
    try:
        since, until = _times(args)
        target = Target.parse(args.to)
        target.probe()
        check_archive(args.archive)
        # a failed publish is counted, never retried: at most once per message per replay
        spark = _session("gateway pipeline replay", args, log, **{"spark.task.maxFailures": "1"})
    except PipelineError as exc:
        return _fail(str(exc))
    try:
        options = replay.Options(args.archive, args.topic, args.event, target, since, until)
        result = replay.run(spark, options)
        print(f"spark application {spark.sparkContext.applicationId}")
        print(f"read {result.read}, published {result.published}, failed {result.failed}")
        if result.failed:
            return _fail(f"{result.failed} publishes to {target.url} failed: {result.error}")
        return 0
    except PipelineError as exc:
        return _fail(str(exc))
    except Exception as exc:
        return _fail(f"replay failed: {one_line(exc)} (Spark's log: {log})")
    finally:
        spark.stop()
