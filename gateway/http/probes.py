"""/health and /ready for a sidecar's liveness and readiness probes.

/health: 200 `OK` once the broker runs and every listener is bound, and while draining (a
draining gateway is alive and must not be restarted); while it starts, 200 `OK - starting`
(it is alive: with a Redis store the HTTP listeners answer before the store is open,
while the gateway retries a Redis it cannot reach yet, for --store-wait seconds).

/ready: 200 `OK` only while the gateway takes new work; 503 while it starts (with the
reason when a store keeps it waiting), while beanstalkd drain mode (SIGUSR1) is on, and
while it stops, so an orchestrator sends traffic elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.http.router import Request, Response, Router, text

if TYPE_CHECKING:
    from gateway.app import Gateway


def register(router: Router, gateway: Gateway) -> None:
    async def health(request: Request) -> Response:
        state = gateway.state
        if state in ("serving", "draining"):
            return text("OK")
        if state == "starting":
            return text("OK - starting")
        return text(f"NOK - {state}", 503)

    async def ready(request: Request) -> Response:
        state = gateway.state
        if state == "serving":
            return text("OK")
        waiting = gateway.waiting_for if state == "starting" else None
        return text(f"NOT READY - {state}" + (f": {waiting}" if waiting else ""), 503)

    router.add("/health", health, "GET")
    router.add("/ready", ready, "GET")
