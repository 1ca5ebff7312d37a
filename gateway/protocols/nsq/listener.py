"""The NSQ listener: nsqd's settings made into the server its sessions share."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from gateway.listeners import Listener, Service
from gateway.protocols.nsq.auth import AuthClient
from gateway.protocols.nsq.codec import Limits, error_frame
from gateway.protocols.nsq.lookupd import Identity, Registrar
from gateway.protocols.nsq.negotiation import ServerFeatures
from gateway.protocols.nsq.server import NSQServer
from gateway.protocols.nsq.session import NSQSession

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.config import Settings
    from gateway.metrics import Metrics
    from gateway.tls import ListenerContexts


def service(
    settings: Settings, broker: Broker, metrics: Metrics, tls: ListenerContexts
) -> Service[NSQServer]:
    n = settings.nsqd
    # never a client certificate asked for, whatever tls.verify says: nsqd's default
    # policy (docs/security.md)
    ssl_context = tls.context("nsq", verifies=False)
    auth = None
    if n.auth_http_addresses:
        auth = AuthClient(n.auth_http_addresses, n.auth_http_request_method)
    features = ServerFeatures(
        tls_available=ssl_context is not None,
        snappy_enabled=n.snappy,
        deflate_enabled=n.deflate,
        max_deflate_level=n.max_deflate_level,
        auth_required=auth is not None,
        max_rdy_count=n.max_rdy_count,
        msg_timeout=n.msg_timeout,
        max_msg_timeout=n.max_msg_timeout,
        heartbeat_interval=n.client_timeout // 2,
        max_heartbeat_interval=n.max_heartbeat_interval,
        max_output_buffer_size=n.max_output_buffer_size,
        min_output_buffer_timeout=n.min_output_buffer_timeout,
        max_output_buffer_timeout=n.max_output_buffer_timeout,
    )
    limits = Limits(
        max_msg_size=n.max_msg_size,
        max_body_size=n.max_body_size,
        max_rdy_count=n.max_rdy_count,
        max_req_timeout=n.max_req_timeout,
        max_line_length=n.max_line_length,
    )
    server = NSQServer(
        broker=broker,
        metrics=metrics,
        limits=limits,
        features=features,
        ssl_context=ssl_context,
        tls_required=n.tls_required,
        auth=auth,
        max_req_timeout=n.max_req_timeout,
        max_msg_timeout=n.max_msg_timeout,
        max_output_bytes=n.max_output_bytes,
        turn_budget=settings.limits.turn_microseconds / 1e6,
        hostname=n.hostname if n.hostname != "localhost" else socket.gethostname(),
    )
    metrics.before_scrape.append(server.report_bytes)

    async def connection(stream: trio.SocketStream, remote: str) -> None:
        await NSQSession(server, stream, remote).run()

    listener = Listener(
        "nsq",
        settings.address("nsq"),
        connection,
        # TLS: this listener's own context, not any certificate configured elsewhere
        guarded=ssl_context is not None or auth is not None,
        refuse=_refuse,
    )
    return Service(server, [listener])


async def _refuse(stream: trio.SocketStream, remote: str) -> None:
    # nsqd has no connection limit: an error frame, as for any refused command
    await stream.send_all(error_frame(b"E_TOO_MANY_CONNECTIONS too many connections"))


def lookupd_service(
    settings: Settings, broker: Broker, metrics: Metrics, identity: Callable[[], Identity]
) -> Service[Registrar]:
    """Registration with each nsqlookupd of `nsqd.lookupd_tcp_addresses` (none: nothing
    runs). It learns the names once the store is open, and dials once every listener is
    bound: IDENTIFY names the NSQ and HTTP ports (`identity`, read at each connection)."""
    registrar = Registrar(broker, metrics, settings.nsqd.lookupd_tcp_addresses, identity)
    if not registrar.peers:
        return Service(registrar, [])
    return Service(registrar, [], before=registrar.attach, after=registrar.run)
