"""`[[beanstalk_import]]`: the jobs of a live beanstalkd moved into the gateway's tubes.

A tube is the topic of the same name, and a job goes into it as a beanstalkd `put` on the
gateway would put it: its priority, its remaining delay and its TTR kept, so that the
gateway's beanstalkd workers reserve it as they would have there. A buried job is buried
in the tube's workers' group (`beanstalkd.group`), where `peek-buried` and `kick` find it.
Each job is deleted on the old server only once the gateway's store committed it
(beanstalk_mover.py); with `follow`, what producers still put there keeps coming.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from gateway.addresses import format_address
from gateway.backoff import Backoff
from gateway.broker.errors import StoreUnavailable
from gateway.links import LinkStatus
from gateway.links.beanstalk_client import BeanstalkClient
from gateway.links.beanstalk_codec import ProtocolError
from gateway.links.beanstalk_mover import DestinationFailed, Job, Mover

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.config_links import BeanstalkImportSettings
    from gateway.model import Message

log = logging.getLogger("gateway.links")


# what ends one connection's work: the connection lost or refused, a reply the mover
# cannot use, or the gateway's store refusing the jobs (they were released back)
LINK_ERRORS = (
    OSError,
    EOFError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    ProtocolError,
    DestinationFailed,
)


class BrokerDestination:
    """The gateway's own broker: a publish per job, one commit per batch."""

    def __init__(self, broker: Broker, group: str, origin: str) -> None:
        self.broker = broker
        self.group = group  # beanstalkd workers' group: where buried jobs are buried
        self.origin = origin

    async def store(self, jobs: Sequence[Job]) -> None:
        broker = self.broker
        published: list[Message] = []
        try:
            for job in jobs:
                # made before the publish, so that the job reaches it (and can be buried
                # there) whatever other groups the topic has, as RocketMQ's dead letters
                group = broker.group(job.tube, self.group) if job.buried else None
                msgs, _ = broker.publish(
                    job.tube,
                    [job.body],
                    delay=float(job.delay),
                    priority=job.pri,
                    ttr=float(job.ttr),
                    origin=self.origin,
                )
                published += msgs
                if group is not None:
                    group.bury_ready(msgs[0].id)  # buried as it is: no delivery first
            await broker.flush()
        except StoreUnavailable as exc:
            # none is acknowledged: all go back to the old server, so none may stay here
            # (the store keeps what it could not write, and writes it once it can)
            broker.withdraw(published)
            raise DestinationFailed(f"the gateway's store: {exc}") from exc


class BeanstalkImport:
    """One old beanstalkd server; reconnects with a backoff until cancelled, or, without
    `follow`, until its tubes are empty (state "done")."""

    def __init__(
        self, settings: BeanstalkImportSettings, broker: Broker, *, group: str = "beanstalk"
    ) -> None:
        self.settings = settings
        self.host, self.port = settings.address
        where = format_address(self.host, self.port)
        self.status = LinkStatus(
            kind="beanstalk_import",
            name=settings.name or f"beanstalk_import:{where}",
            upstream=settings.url,
        )
        self.destination = BrokerDestination(broker, group, f"beanstalk_import {where}")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        status = self.status
        backoff = Backoff()
        try:
            while True:
                moved_before = status.moved
                try:
                    if await self._connected():
                        status.state = "done"
                        status.lag = 0
                        log.info("%s: done, %d jobs moved", status.name, status.moved)
                        return
                except LINK_ERRORS as exc:
                    status.failed(str(exc) or exc.__class__.__name__)
                    # the first failure after a good stretch is worth a warning; the
                    # retries of a server that stays away are not
                    level = logging.WARNING if backoff.delay == backoff.first else logging.DEBUG
                    log.log(level, "%s: %s", status.name, status.last_error)
                if status.moved > moved_before:
                    backoff.reset()  # it worked for a while: start again quickly
                status.state = "backing off"
                await trio.sleep(backoff.next())
        finally:
            if status.state != "done":
                status.state = "stopped"

    async def _connected(self) -> bool:
        """One connection's work: True once done (without `follow`)."""
        settings = self.settings
        async with await BeanstalkClient.connect(self.host, self.port) as client:
            self.status.state = "connected"
            mover = Mover(client, self.destination, settings.tubes, self.status)
            await mover.run(follow=settings.follow)
        return True
