"""The RocketMQ remoting listener: nameserver and broker on one port."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from gateway.addresses import Address, format_address, parse_address
from gateway.listeners import Listener, Service
from gateway.protocols.rocketmq.server import RocketMQServer
from gateway.protocols.rocketmq.session import RocketMQSession

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.config import Settings
    from gateway.metrics import Metrics

log = logging.getLogger("gateway")


def service(settings: Settings, broker: Broker, metrics: Metrics) -> Service[RocketMQServer]:
    r = settings.rocketmq_broker
    server = RocketMQServer(
        broker,
        metrics,
        read_queues=r.read_queues,
        write_queues=r.write_queues,
        max_frame_size=r.max_frame_size,
        max_header_size=r.max_header_size,
        max_message_size=r.max_message_size,
        max_suspend=r.max_suspend,
        group_window=r.group_window,
        client_timeout=r.client_timeout,
        queue_lock_seconds=r.queue_lock_seconds,
        max_output_bytes=r.max_output_bytes,
        delay_levels=tuple(r.delay_levels),
        broker_name=r.broker_name,
        cluster_name=r.cluster_name,
    )

    async def connection(stream: trio.SocketStream, remote: str) -> None:
        await RocketMQSession(server, stream, remote).run()

    def bound(address: Address) -> None:
        server.advertised = _advertised(r.advertise, address)

    # a refusal: the close alone, since a remoting reply needs a request to answer; and
    # the protocol has neither TLS nor authentication here
    listener = Listener(
        "rocketmq", settings.address("rocketmq"), connection, guarded=False, bound=bound
    )
    return Service(server, [listener])


def _advertised(advertise: str | None, bound: Address) -> Address:
    """What routes and message ids name: the setting, else the bound address (an
    unspecified or IPv6 bind address falls back to 127.0.0.1, with a warning)."""
    if advertise:
        return parse_address(advertise)
    host, port = bound
    if host in ("0.0.0.0", "::") or ":" in host:
        log.warning(
            "rocketmq listener %s: set rocketmq_broker.advertise to the IPv4 address "
            "clients dial; routes name 127.0.0.1:%d meanwhile",
            format_address(host, port),
            port,
        )
        return "127.0.0.1", port
    return host, port
