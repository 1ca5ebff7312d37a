"""GET /metrics: the gateway's Prometheus registry in the text exposition format.

Everything is in gateway.metrics.Metrics.registry: connections, bytes and protocol errors
(counted as they happen) and the queues (read from the broker at scrape time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.http.router import Request, Response, Router

if TYPE_CHECKING:
    from gateway.app import Gateway


def register(router: Router, gateway: Gateway) -> None:
    registry = gateway.metrics.registry

    async def metrics(request: Request) -> Response:
        # generate_latest is synchronous and walks every topic: fine for a scrape every
        # few seconds; yield first so a burst of scrapes cannot starve the connections
        await trio.lowlevel.checkpoint()
        gateway.metrics.refresh()
        return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    router.add("/metrics", metrics, "GET", "HEAD")
