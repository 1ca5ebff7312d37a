"""`gateway import beanstalk://HOST:PORT`: move the jobs of a live beanstalkd into a
running gateway, once (or, with --follow, until Ctrl-C).

A running gateway holds its data dir locked, so the command does not open the store: it
is a beanstalkd client of the gateway (`--to`), and `put` there is acknowledged
(`INSERTED`) only once the gateway's store committed the job. Buried jobs are put with a
hold (a delay), reserved with `reserve-job` and buried, so that no worker of the gateway
reserves one in between. The moving itself is beanstalk_mover.py's, as the link's.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

import trio

from gateway.addresses import format_address
from gateway.links import LinkStatus
from gateway.links.beanstalk_client import BeanstalkClient
from gateway.links.beanstalk_codec import Reply, command, put
from gateway.links.beanstalk_import import LINK_ERRORS
from gateway.links.beanstalk_mover import DestinationFailed, Job, Mover, Tally

DEFAULT_TO = "beanstalk://127.0.0.1:11300"
# s a buried job is put delayed for, until it is reserved and buried a moment later; if
# the command dies in between, the job becomes ready there after this (and is still
# buried on the old server: it is then moved again, so it arrives twice, buried once)
BURY_HOLD = 3600


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`gateway import ...` under the gateway's own subcommands."""
    cmd = sub.add_parser(
        "import",
        help="move the jobs of a live beanstalkd into a running gateway",
        description="Move every job of a live beanstalkd into a running gateway, over its "
        "beanstalkd listener: priority, remaining delay and TTR kept, buried jobs buried. "
        "Each job is deleted on the old server once the gateway stored it.",
    )
    cmd.add_argument("source", metavar="beanstalk://HOST:PORT", help="the old beanstalkd")
    cmd.add_argument(
        "--tube",
        action="append",
        metavar="TUBE",
        help="a tube to move; repeatable (default: every tube the server has)",
    )
    cmd.add_argument(
        "--to",
        default=DEFAULT_TO,
        metavar="URL",
        help=f"the gateway's beanstalkd listener (default {DEFAULT_TO})",
    )
    cmd.add_argument(
        "--follow",
        action="store_true",
        help="keep moving what producers still put there, until Ctrl-C (or SIGTERM)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        source, target = _address(args.source), _address(args.to)
    except ValueError as exc:
        print(f"gateway import: {exc}", file=sys.stderr)
        return 2
    return trio.run(_import, source, target, args.tube or ["*"], args.follow)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "beanstalk" or not parts.hostname:
        raise ValueError(f"a beanstalkd url is beanstalk://host[:port], got {url!r}")
    return parts.hostname, parts.port or 11300


class GatewayDestination:
    """A running gateway's beanstalkd listener: the batch's puts pipelined (the gateway
    commits them together), then the buried ones reserved and buried."""

    def __init__(self, client: BeanstalkClient) -> None:
        self.client = client
        self.used = "default"

    async def store(self, jobs: Sequence[Job]) -> None:
        commands: list[bytes] = []
        for job in jobs:
            if job.tube != self.used:
                commands.append(command("use", job.tube))
                self.used = job.tube
            delay = BURY_HOLD if job.buried else job.delay
            commands.append(put(job.pri, delay, job.ttr, job.body))
        replies = await self.client.calls(commands)
        stored: list[tuple[Job, int]] = []
        failed: Reply | None = None
        pending = iter(jobs)
        for cmd, reply in zip(commands, replies, strict=True):
            if cmd.startswith(b"use "):
                if reply.word != "USING":
                    failed = failed or reply
                continue
            job = next(pending)
            # BURIED <id>: stored, but buried for want of memory (§3): it is kept
            if reply.word in ("INSERTED", "BURIED"):
                stored.append((job, reply.id))
            else:
                failed = failed or reply
        await self._bury([(job, new_id) for job, new_id in stored if job.buried])
        if failed is not None:
            self.used = "?"  # not known after a refused use
            raise DestinationFailed(f"the gateway answered {failed}", [job for job, _ in stored])

    async def _bury(self, jobs: list[tuple[Job, int]]) -> None:
        """Reserve and bury jobs put with a hold. A job some worker took first (its hold
        cut short by a kick) is left to it."""
        commands = [
            c for job, new_id in jobs for c in (command("reserve-job", new_id),
                                                command("bury", new_id, job.pri))
        ]  # fmt: skip
        await self.client.calls(commands)


async def _import(
    source: tuple[str, int], target: tuple[str, int], tubes: list[str], follow: bool
) -> int:
    old, new = format_address(*source), format_address(*target)
    try:
        from_client = await BeanstalkClient.connect(*source)
    except OSError as exc:
        print(f"gateway import: cannot reach beanstalkd at {old}: {exc}", file=sys.stderr)
        return 1
    try:
        to_client = await BeanstalkClient.connect(*target)
    except OSError as exc:
        await from_client.aclose()
        print(f"gateway import: cannot reach the gateway at {new}: {exc}", file=sys.stderr)
        return 1
    status = LinkStatus("beanstalk_import", f"import:{old}", f"beanstalk://{old}")
    tally = Tally()
    mover = Mover(from_client, GatewayDestination(to_client), tubes, status, tally)
    error = ""
    async with from_client, to_client, trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, mover, nursery.cancel_scope)
        try:
            await mover.run(follow=follow)
        except LINK_ERRORS as exc:
            error = str(exc) or exc.__class__.__name__
        nursery.cancel_scope.cancel()
    _summary(tally, old, new)
    if error:
        print(f"gateway import: stopped: {error}", file=sys.stderr)
        return 1
    return 0


async def _stop_on_signal(mover: Mover, scope: trio.CancelScope) -> None:
    """The first Ctrl-C (or SIGTERM) stops after the batch under way: its jobs are stored
    and deleted first. A second one stops at once (the old server gets back what it had
    reserved; what the gateway stored already of it arrives twice)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if mover.stopping:
                scope.cancel()
                return
            mover.stopping = True


def _summary(tally: Tally, old: str, new: str) -> None:
    total = sum(tally.per_tube.values())
    print(f"moved {total} jobs from {old} to {new}")
    for tube, n in sorted(tally.per_tube.items()):
        print(f"  {tube}: {n}")
    print(f"  of which delayed: {tally.delayed}, buried: {tally.buried}")
    if tally.lost_race:
        print(f"  taken by another worker of {old} meanwhile (moved twice): {tally.lost_race}")
