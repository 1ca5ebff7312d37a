"""Moving the jobs of a live beanstalkd somewhere else, one batch at a time: what the
`[[beanstalk_import]]` link and `gateway import` share. Where the jobs go is a
`Destination`: the gateway's broker (the link, inside the gateway) or the gateway's
beanstalkd listener (the command, outside it).

Each job is taken out of the old server's queues first (reserved: ready jobs with
`reserve-with-timeout 0`, delayed and buried ones with `peek-*`, `stats-job` and
`reserve-job`), stored at the destination, and only once the destination acknowledged it
deleted on the old server. A job the destination refused is released back, with its
priority. A crash in between leaves the job reserved on the old server, which makes it
ready again after its TTR: it may then arrive twice, never not at all.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from gateway.links import LinkStatus, settling
from gateway.links.beanstalk_client import BeanstalkClient
from gateway.links.beanstalk_codec import ProtocolError, Reply, command, yaml_dict

log = logging.getLogger("gateway.links")

BATCH = 100  # jobs reserved on the old server at once, stored with one commit
RELEASE_DELAY = 1  # s: a job the destination refused waits this long on the old server
CHECK_EVERY = 1.0  # s between looks at delayed and buried jobs and new tubes (follow)
# A reserved job in transit is touched this long before its TTR runs out, so that the old
# server does not hand it to another worker while the destination stores it. beanstalkd
# measures TTR from the reserve; touch restarts it.
_TOUCH_MARGIN = 0.5


@dataclass
class Job:
    """A job taken from the old server (reserved there under `id`)."""

    id: int
    tube: str
    body: bytes
    pri: int
    ttr: int
    delay: int = 0  # s still to wait: a delayed job's time-left
    buried: bool = False


class DestinationFailed(Exception):
    """The destination did not store every job: `stored` are those it acknowledged."""

    def __init__(self, reason: str, stored: Sequence[Job] = ()) -> None:
        super().__init__(reason)
        self.stored = list(stored)


class Destination(Protocol):
    async def store(self, jobs: Sequence[Job]) -> None:
        """Store every job, each in its tube with its priority, delay and TTR, buried
        ones buried; return once they are all acknowledged (durably stored where the
        destination stores durably). Raises DestinationFailed."""


@dataclass
class Tally:
    """What was moved, for the command's summary."""

    per_tube: Counter[str] = field(default_factory=Counter)
    delayed: int = 0
    buried: int = 0
    lost_race: int = 0  # deleted on the old server by someone else meanwhile (see _settle)


class Mover:
    """Moves jobs from one connection to the old server to `destination`. `tubes`: names,
    or ["*"] for every tube the server has, new ones included. Raises what the connection
    raises (OSError, EOFError, trio.BrokenResourceError), ProtocolError and
    DestinationFailed; the caller reconnects (a new Mover) or gives up."""

    def __init__(
        self,
        client: BeanstalkClient,
        destination: Destination,
        tubes: Sequence[str],
        status: LinkStatus,
        tally: Tally | None = None,
    ) -> None:
        self.client = client
        self.destination = destination
        self.every_tube = "*" in tubes
        self.configured = [t for t in tubes if t != "*"]
        self.status = status
        self.tally = tally if tally is not None else Tally()
        self.watched: list[str] = ["default"]  # a new connection watches `default`
        self.used = "default"
        # beanstalkd before 1.12 has no reserve-job: a delayed or buried job is kicked,
        # then reserved (with what it was remembered here, by id)
        self.reserve_job = True
        self._kicked: dict[int, Job] = {}
        # set to stop after the batch under way (the command's Ctrl-C), checked between
        # batches: the jobs of a batch are stored and deleted, or released, together
        self.stopping = False

    # -- the loop ----------------------------------------------------------------------

    async def run(self, *, follow: bool) -> None:
        """Move until the tubes are empty (ready, delayed and buried: 0), or, with
        `follow`, until cancelled."""
        while not self.stopping:
            moved = self.status.moved
            await self.watch_tubes()
            await self.move_held("delayed")
            await self.move_held("buried")
            while not self.stopping and await self.move_ready(0):
                pass
            lag = self.status.lag = await self.lag()
            if lag == 0 and not follow:
                return
            if (follow or self.status.moved == moved) and not self.stopping:
                # what producers put meanwhile arrives here at once; delayed and buried
                # jobs and new tubes are looked for every CHECK_EVERY. Without `follow`,
                # jobs that cannot be taken yet (a paused tube's) are waited for as well
                await self.move_ready(CHECK_EVERY)

    async def watch_tubes(self) -> list[str]:
        """Watch every tube to move (new ones too, for "*"), and only those."""
        tubes = await self.client.list_tubes() if self.every_tube else self.configured
        tubes = list(dict.fromkeys([*tubes, *self.configured]))
        new = [t for t in tubes if t not in self.watched]
        if new:
            await self._expect_all([command("watch", t) for t in new], "WATCHING")
            self.watched += new
        if "default" in self.watched and "default" not in tubes:
            await self.client.expect(command("ignore", "default"), "WATCHING")
            self.watched.remove("default")
        return tubes

    async def lag(self) -> int:
        """Jobs waiting in the tubes on the old server: ready, delayed and buried."""
        lag = 0
        for tube in self.watched:
            stats = await self.client.stats_tube(tube)
            if stats is not None:
                lag += sum(
                    int(stats.get(f"current-jobs-{state}", 0))
                    for state in ("ready", "delayed", "buried")
                )
        return lag

    # -- taking jobs ------------------------------------------------------------------

    async def move_ready(self, timeout: float) -> int:
        """One batch of ready jobs, the first waited for up to `timeout`; how many."""
        first = await self.client.call(
            command("reserve-with-timeout", math.ceil(timeout)), timeout=timeout + 30
        )
        replies = [first]
        if first.word == "RESERVED":
            replies += await self.client.calls([b"reserve-with-timeout 0\r\n"] * (BATCH - 1))
        reserved = [r for r in replies if r.word == "RESERVED"]
        for r in replies:
            if r.word not in ("RESERVED", "TIMED_OUT", "DEADLINE_SOON"):
                raise ProtocolError(f"reserve-with-timeout: {r}")
        if not reserved:
            return 0
        jobs = await self._described(reserved)
        await self._move(jobs)
        return len(jobs)

    async def move_held(self, state: str) -> int:
        """The delayed (or buried) jobs of every watched tube, a batch at a time."""
        moved = 0
        for tube in list(self.watched):
            await self._use(tube)
            while not self.stopping and (jobs := await self._take_held(state)):
                await self._move(jobs)
                moved += len(jobs)
        return moved

    async def _take_held(self, state: str) -> list[Job]:
        """Reserve up to BATCH of the used tube's delayed (buried) jobs."""
        jobs: list[Job] = []
        peek = f"peek-{state}\r\n".encode()
        while len(jobs) < BATCH:
            found = await self.client.call(peek)
            if found.word == "NOT_FOUND":
                break
            if found.word != "FOUND":
                raise ProtocolError(f"peek-{state}: {found}")
            stats = await self.client.stats_job(found.id)
            if stats is None or stats.get("state") != state:
                continue  # reserved, kicked or deleted meanwhile by someone else
            job = _job(found.id, found.data or b"", stats)
            taken = await self._reserve_job(job)
            if taken is not None:
                jobs.append(taken)
        return jobs

    async def _reserve_job(self, job: Job) -> Job | None:
        """Reserve this job, as it was when peeked; None when someone took it first."""
        if self.reserve_job:
            reply = await self.client.call(command("reserve-job", job.id))
            if reply.word == "RESERVED":
                return job
            if reply.word == "NOT_FOUND":
                return None
            if reply.word != "UNKNOWN_COMMAND":
                raise ProtocolError(f"reserve-job: {reply}")
            log.info("%s has no reserve-job (before 1.12): kicking instead", self.client.address)
            self.reserve_job = False
        # kick-job makes it ready; the reserve takes the most urgent ready job of the
        # watched tubes, which may be another one: each is moved as what it was
        self._kicked[job.id] = job
        await self.client.expect(command("kick-job", job.id), "KICKED", "NOT_FOUND")
        reply = await self.client.call(b"reserve-with-timeout 0\r\n")
        if reply.word != "RESERVED":
            return None
        (taken,) = await self._described([reply])
        return taken

    async def _described(self, reserved: Sequence[Reply]) -> list[Job]:
        """Reserved jobs with their tube, priority and TTR (stats-job)."""
        replies = await self.client.calls([command("stats-job", r.id) for r in reserved])
        jobs = []
        for r, stats in zip(reserved, replies, strict=True):
            if stats.word != "OK":  # it was just reserved here: only a server bug
                raise ProtocolError(f"stats-job {r.id}: {stats}")
            kicked = self._kicked.pop(r.id, None)
            jobs.append(kicked or _job(r.id, r.data or b"", yaml_dict(stats.data or b"")))
        return jobs

    # -- storing, then deleting -------------------------------------------------------

    async def _move(self, jobs: list[Job]) -> None:
        status = self.status
        status.in_flight += len(jobs)
        try:
            failure: DestinationFailed | None = None
            async with settling():  # a stop lets the batch under way finish, bounded
                stored, failure = await self._store(jobs)
                await self._settle(stored, delete=True)
                if failure is not None:
                    await self._settle([j for j in jobs if j not in stored], delete=False)
            if failure is not None:
                raise failure
        finally:
            status.in_flight -= len(jobs)

    async def _store(self, jobs: list[Job]) -> tuple[list[Job], DestinationFailed | None]:
        """Store at the destination, touching the jobs on the old server meanwhile."""
        failure = None
        async with trio.open_nursery() as nursery:
            touching = trio.CancelScope()
            nursery.start_soon(self._keep_reserved, jobs, touching)
            try:
                await self.destination.store(jobs)
                stored = jobs
            except DestinationFailed as exc:
                stored, failure = exc.stored, exc
            touching.cancel()
        return stored, failure

    async def _keep_reserved(self, jobs: list[Job], scope: trio.CancelScope) -> None:
        """Touch the jobs before the shortest TTR among them runs out. A touch under way is
        not cut off (its reply would then answer the next command): it is shielded."""
        ttr = max(min(job.ttr for job in jobs), 1)
        with scope:
            while True:
                await trio.sleep(max(ttr - _TOUCH_MARGIN, ttr / 2))
                with trio.CancelScope(shield=True):
                    await self.client.calls([command("touch", job.id) for job in jobs])

    async def _settle(self, jobs: list[Job], *, delete: bool) -> None:
        """Delete stored jobs on the old server; release refused ones (their priority
        kept, a moment's delay, so that a failing destination is not hammered)."""
        if not jobs:
            return
        if delete:
            commands = [command("delete", job.id) for job in jobs]
        else:
            commands = [command("release", job.id, job.pri, RELEASE_DELAY) for job in jobs]
        replies = await self.client.calls(commands)
        for job, reply in zip(jobs, replies, strict=True):
            if reply.word == "NOT_FOUND":
                # its TTR ran out and another worker took it (touches came too late):
                # that worker has it too
                self.tally.lost_race += 1
                log.warning("job %d of %s was taken by another worker", job.id, job.tube)
            elif reply.word not in ("DELETED", "RELEASED", "BURIED"):
                raise ProtocolError(f"{'delete' if delete else 'release'} {job.id}: {reply}")
        if not delete:
            return
        self.status.moved += len(jobs)
        tally = self.tally
        for job in jobs:
            tally.per_tube[job.tube] += 1
            tally.delayed += job.delay > 0
            tally.buried += job.buried

    # -- the connection's state -----------------------------------------------------------

    async def _use(self, tube: str) -> None:
        if tube != self.used:
            await self.client.expect(command("use", tube), "USING")
            self.used = tube

    async def _expect_all(self, commands: list[bytes], word: str) -> None:
        for reply in await self.client.calls(commands):
            if reply.word != word:
                raise ProtocolError(f"expected {word}, got {reply}")


def _job(job_id: int, body: bytes, stats: dict[str, str]) -> Job:
    """A job as stats-job described it (before it was reserved here)."""
    try:
        state = stats.get("state", "ready")
        return Job(
            id=job_id,
            tube=stats["tube"],
            body=body,
            pri=int(stats["pri"]),
            ttr=int(stats["ttr"]),
            delay=int(stats.get("time-left", 0)) if state == "delayed" else 0,
            buried=state == "buried",
        )
    except (KeyError, ValueError) as exc:
        raise ProtocolError(f"stats-job {job_id}: {exc!r} in {stats}") from None
