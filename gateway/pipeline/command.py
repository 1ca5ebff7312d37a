"""What the two jobs' commands share: their arguments, the checks made before Spark
starts, and one line per error.

A leaf: `gateway pipeline ...` (cli.py) and each job's own `main` (spark-submit) build
their parsers from here, and each job runs its command itself, so neither the jobs nor
the CLI import each other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.archive.events import BURIED, EVENTS
from gateway.pipeline.session import PipelineError, check_master, parse_time, start_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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


def times(args: argparse.Namespace) -> tuple[int | None, int | None]:
    since = parse_time(args.since, option="--since") if args.since else None
    until = parse_time(args.until, option="--until") if args.until else None
    if since is not None and until is not None and since >= until:
        raise PipelineError(f"--since {args.since} is not before --until {args.until}")
    return since, until


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def spark_session(name: str, args: argparse.Namespace, log: Path, **conf: str) -> SparkSession:
    if args.master is not None:
        check_master(args.master)
    return start_session(name, args.master, log, conf)
