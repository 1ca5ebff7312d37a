"""Links: the gateway as a client of live servers, moving messages between them and its
own queues (`[[nsq_import]]`, `[[nsq_export]]`, `[[beanstalk_import]]`). Each link is an
object with a `status` and a `run()` the app starts once its listeners are bound; the
metrics and the admin page read the statuses, nothing else of a link."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

if TYPE_CHECKING:
    from gateway.broker.broker import Broker
    from gateway.config import Settings


@dataclass
class LinkStatus:
    """What a link reports; it updates these fields as it goes."""

    kind: str  # "nsq_import", "nsq_export", "beanstalk_import"
    name: str  # unique among the links: the configured name, else one made from the link
    upstream: str  # the server(s) as configured, for people
    state: str = "starting"  # starting, connected, backing off, done, stopped
    moved: int = 0  # messages moved: acknowledged by the destination, settled at the source
    in_flight: int = 0  # taken from the source, not yet acknowledged by the destination
    errors: int = 0  # connections failed or lost, publishes refused, messages sent back
    lag: int | None = None  # waiting at the source, where it says (None: not known)
    last_error: str = ""

    def failed(self, why: str) -> bool:
        """Count an error: True when it is news (not the last one again), worth a warning
        rather than one more line for a server that stays away."""
        news = not self.errors or self.last_error != why
        self.errors += 1
        self.last_error = why
        return news


# s a batch under way may still take, once the link is told to stop, to be settled on both
# sides (stored here and deleted or FIN'd there)
SETTLE_LIMIT = 10.0


@asynccontextmanager
async def settling(limit: float = SETTLE_LIMIT) -> AsyncIterator[None]:
    """Shield a batch's store-then-settle from the link being stopped (the gateway shutting
    down): cut between the store's commit and the source's delete or FIN, every message of
    the batch would come back from the source and arrive twice. The shield gets a deadline
    only once the cancellation comes, `limit` s later, so a server that stopped answering
    cannot hold the shutdown: what is cut then is what a crash leaves, duplicates and no
    loss."""
    shield = trio.CancelScope(shield=True)

    async def bound_when_cancelled() -> None:
        try:
            await trio.sleep_forever()
        finally:
            shield.deadline = trio.current_time() + limit

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bound_when_cancelled)
        with shield:
            yield
        nursery.cancel_scope.cancel()


class Link(Protocol):
    status: LinkStatus

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Move messages until cancelled (or, for a one-shot link, until done)."""


class Links:
    """Every configured link; the app starts them, metrics and the admin page read them."""

    def __init__(self, links: list[Link]) -> None:
        self.links = links
        names = [link.status.name for link in links]
        if len(set(names)) != len(names):
            raise ValueError(f"two links have the same name: {sorted(names)}")

    @property
    def statuses(self) -> list[LinkStatus]:
        return [link.status for link in self.links]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for link in self.links:
                await nursery.start(link.run)
            task_status.started()


def cluster_warnings(settings: Settings) -> list[str]:
    """Imports that feed the gateway a topic under its own name while the gateway is
    registered with nsqlookupd: if it is the same cluster, its consumers find the topic on
    both the nsqds and the gateway and get each message twice (once from each), and nsqd
    makes, for a topic it makes, every channel the lookupds know of it, the gateway's
    groups included, which then fill up there with nobody reading."""
    if not settings.nsqd.lookupd_tcp_addresses:
        return []
    return [
        f"nsq_import of {link.topic}/{link.channel} publishes into the topic {link.topic}"
        f" of the same name while the gateway is registered with nsqlookupd"
        f" ({', '.join(settings.nsqd.lookupd_tcp_addresses)}): if that is the cluster it"
        f" imports from, set to_topic to another name (docs/bridging.md)"
        for link in settings.nsq_import
        if link.lookupd_http_addresses and (link.to_topic or link.topic) == link.topic
    ]


def configured(
    settings: Settings, broker: Broker, itself: Callable[[], Collection[str]] = tuple
) -> Links:
    """The links of the settings, made but not started. `itself`: where the gateway is
    registered with nsqlookupd (broadcast_address:tcp_port), which the NSQ links never
    take for an upstream nsqd."""
    makers: list[tuple[list, Callable[..., Link]]] = []
    if settings.nsq_import:
        from gateway.links.nsq_import import NSQImport

        makers.append((settings.nsq_import, partial(NSQImport, itself=itself)))
    if settings.nsq_export:
        from gateway.links.nsq_export import NSQExport

        makers.append((settings.nsq_export, partial(NSQExport, itself=itself)))
    if settings.beanstalk_import:
        from gateway.links.beanstalk_import import BeanstalkImport

        # buried jobs are buried in the tube's workers' group, named in [beanstalkd]
        makers.append(
            (settings.beanstalk_import, partial(BeanstalkImport, group=settings.beanstalkd.group))
        )
    return Links([make(each, broker) for configs, make in makers for each in configs])
