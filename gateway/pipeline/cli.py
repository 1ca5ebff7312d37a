"""`gateway pipeline report | replay`: the subcommands; each job runs its own command
(`run_command`), with the arguments and checks of command.py."""

from __future__ import annotations

import argparse
import sys

from gateway.pipeline.command import add_replay_arguments, add_report_arguments


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gateway pipeline ...` under the gateway's own subcommands."""
    pipeline = sub.add_parser("pipeline", help="Spark jobs over the message archive")
    jobs = pipeline.add_subparsers(dest="job", required=True)
    report = jobs.add_parser("report", help="traffic, latency and dead-letter report")
    add_report_arguments(report)
    replay = jobs.add_parser("replay", help="publish archived messages again")
    add_replay_arguments(replay)


def main(args: argparse.Namespace) -> int:
    # the jobs are imported when run: the report loads pyarrow, and `gateway serve` and
    # every other subcommand build this parser
    try:
        if args.job == "report":
            from gateway.pipeline import report

            return report.run_command(args)
        from gateway.pipeline import replay

        return replay.run_command(args)
    except KeyboardInterrupt:  # Ctrl-C: Spark is stopped on the way out, no traceback
        print("interrupted", file=sys.stderr)
        return 130
