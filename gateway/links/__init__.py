"""Links: the gateway as a client of live servers, moving messages between them and its
own queues (`[[nsq_import]]`, `[[nsq_export]]`, `[[beanstalk_import]]`). Each link is an
object with a `status` and a `run()` the app starts once its listeners are bound; the
metrics and the admin page read the statuses, nothing else of a link."""

from __future__ import annotations

from collections.abc import Callable
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


def configured(settings: Settings, broker: Broker) -> Links:
    """The links of the settings, made but not started."""
    makers: list[tuple[list, Callable[..., Link]]] = []
    if settings.nsq_import:
        from gateway.links.nsq_import import NSQImport

        makers.append((settings.nsq_import, NSQImport))
    if settings.nsq_export:
        from gateway.links.nsq_export import NSQExport

        makers.append((settings.nsq_export, NSQExport))
    if settings.beanstalk_import:
        from gateway.links.beanstalk_import import BeanstalkImport

        # buried jobs are buried in the tube's workers' group, named in [beanstalkd]
        makers.append(
            (settings.beanstalk_import, partial(BeanstalkImport, group=settings.beanstalkd.group))
        )
    return Links([make(each, broker) for configs, make in makers for each in configs])
